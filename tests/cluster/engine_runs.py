"""Running the launch scripts under a real cluster engine (mpirun, srun) from a test, and reading their output."""

import contextlib
import dataclasses
import fcntl
import ipaddress
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from tests.subprocess_utils import clean_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "launch_scripts"
_TAG = re.compile(r"\[\d+,(\d+)\]<(\w+)>:")  # mpirun --tag-output: "[job,rank]<stdout>:" before each chunk written
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")  # srun --label: "rank: text"
_ENGINE_JOBS_LOCK = Path(tempfile.gettempdir()) / "kdist-tests-engine-jobs.lock"


@dataclasses.dataclass
class EngineRun:
    returncode: int
    output: str
    lines: dict  # rank -> its output lines
    started: float
    ended: float

    @property
    def text(self):
        """Every rank's lines, rank by rank, without the engine's labels (for searching messages)."""
        return "\n".join(line for rank in sorted(self.lines) for line in self.lines[rank])

    def prefixed(self, prefix):
        """rank -> the text after `prefix` of each of its lines that starts with it."""
        return {
            r: [line[len(prefix) :].strip() for line in ls if line.startswith(prefix)] for r, ls in self.lines.items()
        }


def engine_env(devices_per_process, extra=None):
    """The tasks' environment: this checkout's kdist, `devices_per_process` fake CPU devices, a quiet TensorFlow."""
    env = clean_env()
    for name in list(env):
        if (
            name.startswith(("KERAS_DISTRIBUTION_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "KDIST_"))
            or name == "TF_CONFIG"
        ):
            del env[name]  # nothing of an outer job or launch leaks into the one under test
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)]),
            "KDIST_FAKE_DEVICES": str(devices_per_process),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_ENABLE_ONEDNN_OPTS": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def one_engine_job_at_a_time():
    """Held while an mpirun, srun or sbatch job of the tests runs, by every pytest-xdist worker (a file lock).

    jax derives such a job's coordinator port from its job id (SLURM: 61440 + id % 4096; Open MPI 4: 61440 + one
    of 256 multiples of 16), so two jobs at once could get the same port, and `kdist.initialize()` refuses a
    coordinator port another process listens on. The lock is released when the job ends, or when its holder dies.
    """
    with open(_ENGINE_JOBS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_engine(command, env, timeout, labelled):
    """Run an engine's command line; returns an `EngineRun` with each rank's lines (from the engine's labels)."""
    with one_engine_job_at_a_time():
        started = time.time()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=SCRIPTS)
        ended = time.time()
    output = proc.stdout + proc.stderr
    lines = {}
    if labelled == "mpirun":
        lines = _untag(proc.stdout, _untag(proc.stderr, {}))
    else:
        for line in output.splitlines():
            if match := _LABEL.match(line):
                lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return EngineRun(proc.returncode, output, lines, started, ended)


def is_loopback(hex_address):
    """Whether an address as /proc/net/tcp or tcp6 writes it is a loopback address."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        address = ipaddress.IPv4Address(raw[::-1])
    else:  # tcp6: four 32-bit words, each in host (little-endian) order
        address = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
        address = address.ipv4_mapped or address
    return address.is_loopback


def _untag(output, lines):
    """Each rank's lines from mpirun's tagged output, where a tag starts every chunk a process wrote.

    An unbuffered `print("A", "B")` is three writes, so one line can come as
    several tagged chunks: the chunks of each rank and stream are joined
    before being split into lines.
    """
    pieces = _TAG.split(output)  # [before, rank, stream, text, rank, stream, text, ...]
    streams = {}
    for i in range(1, len(pieces) - 2, 3):
        streams.setdefault((int(pieces[i]), pieces[i + 1]), []).append(pieces[i + 2])
    for (rank, _), chunks in sorted(streams.items()):
        lines.setdefault(rank, []).extend("".join(chunks).splitlines())
    return lines
