"""Run a script as N cooperating JAX processes on this machine, each with its own fake CPU devices; always end.

`kdist.launch` (and `kdist launch`) start the processes the way a cluster
scheduler would start one per host: each gets the KERAS_DISTRIBUTION_*
variables that `kdist.initialize()` reads, a coordinator on loopback and CPU
collectives (gloo), so a script written for N hosts runs unchanged on one.

The run always ends: when a process raises, exits non-zero, is killed, or
hangs (no output and no progress for `hang_timeout` seconds, or no
heartbeat), the launcher stops every process and everything they started
(`process_tree`), and names the process and its last output lines. Python
targets run under `launch_child`, which reports an uncaught exception and
ends the process at once (a JAX process would otherwise wait for its peers).
"""

import contextlib
import dataclasses
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

from kdist.checks import MAX_FAKE_DEVICES
from kdist.cluster import launch_child
from kdist.cluster.join import BIND_ADDRESS, CPU_COLLECTIVES, TF_CONFIG, ClusterConfig
from kdist.cluster.launch_args import (
    Options,
    argv_of,
    count,
    cwd_of,
    extra_env,
    flag,
    seconds,
    stream_of,
    wrong_kind,
)
from kdist.cluster.launch_watch import Watch
from kdist.cluster.process_tree import MARKER, ProcessTree
from kdist.devices import ENV_VAR as FAKE_DEVICES_VAR
from kdist.devices import fake_devices_env, xla_flags_without_device_count
from kdist.errors import LaunchError

RANK_VAR = "KDIST_PROCESS_RANK"
MAX_PROCESSES = 1024  # one machine: more is a typo
DEFAULT_HANG_TIMEOUT = 300.0
DEFAULT_GRACE_PERIOD = 5.0
# After a process fails, how long the launcher waits for others' exits before naming one: a process killed from
# outside (`EXTERNAL_SIGNALS`: the OOM killer's, a scheduler's, a user's) is named before one that failed meanwhile
# (its peers' distributed runtime raises or aborts once it is gone, and on a busy machine their exits can be seen
# first). SIGABRT and SIGSEGV come from the process itself: a runtime that aborts when its peer died sends SIGABRT.
SIGNAL_WINDOW = 0.5
EXTERNAL_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
QUIET = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}  # TensorFlow's start-up notices
# Gloo (the CPU collectives) prints to stdout, for every device, every time a communicator forms:
# "[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7", from several
# threads at once, so pieces of such lines interleave ("[Gloo] Rank [Gloo] Rank 6 is connected ..." then
# "7 is connected to ..."). A line made only of those pieces (not only of numbers) is one of them. Gloo writes
# " peer ranks. " and "Expected number ..." as two pieces, so another line can come between them too.
GLOO_PIECES = re.compile(
    r"(?:\[Gloo\] Rank |\d+| is connected to | peer ranks\. ?|Expected number of connected peer ranks is : )+"
)
SHOW_GLOO = "KDIST_SHOW_GLOO"  # set to 1 (in the launcher's environment) to relay those lines anyway
with open(launch_child.__file__, encoding="utf-8") as _source:
    BOOTSTRAP = _source.read()


@dataclasses.dataclass
class LaunchResult:
    """How a launched run ended.

    Attributes:
        returncode: 0 if every process succeeded; else the failing process's
            exit code (1 if it raised or was killed by a signal), 124 when a
            process hung or the run timed out, 130/143 when the launcher
            itself was interrupted.
        returncodes: each process's exit code (negative: killed by that signal).
        failed_rank: the rank that failed (or hung) first, or None.
        message: a one-line account of how the run ended.
        outputs: each rank's output lines (only with `capture=True`).
        pids: each rank's process id (also its process group id).
        last_lines: each rank's last output lines (up to 20), kept even without `capture`.
        cause: "ok", "exception", "exit", "signal", "hang", "timeout" or "interrupted".
    """

    returncode: int
    returncodes: list
    failed_rank: object
    message: str
    outputs: list
    pids: list
    last_lines: list = dataclasses.field(default_factory=list)
    cause: str = "ok"

    def report(self):
        """The message, then the failed process's last output lines."""
        lines = [self.message]
        rank = self.failed_rank
        if rank is not None and rank < len(self.last_lines) and self.last_lines[rank]:
            lines.append(f"last {len(self.last_lines[rank])} output lines of process {rank}:")
            lines += [f"  [rank {rank}] {line}" for line in self.last_lines[rank]]
        return "\n".join(lines)


def launch(
    command,
    num_processes=2,
    devices_per_process=4,
    *,
    coordinator_address=None,
    env=None,
    cwd=None,
    timeout=None,
    hang_timeout=DEFAULT_HANG_TIMEOUT,
    grace_period=DEFAULT_GRACE_PERIOD,
    stream="stdout",
    capture=False,
):
    """Start `command` as `num_processes` processes of one JAX run on this machine, and stop them all at the end.

    Each process gets `devices_per_process` fake CPU devices, its rank in
    KERAS_DISTRIBUTION_PROCESS_ID (and KDIST_PROCESS_RANK), the process count,
    and the coordinator address (127.0.0.1 and a free port unless given; the
    coordinator listens there only). Output lines are prefixed with
    "[rank N] "; the CPU collectives' "[Gloo] Rank N is connected to ..."
    lines are dropped (KDIST_SHOW_GLOO=1 keeps them). When a process fails
    (an exception, a non-zero exit, a signal) or hangs, the others and
    everything they started are stopped (SIGTERM, SIGKILL after
    `grace_period` seconds); Ctrl-C or SIGTERM to the launcher stops them all too.

    Example:

    ```python
    result = kdist.launch("train.py", num_processes=2, devices_per_process=4)
    assert result.returncode == 0, result.report()
    ```

    Args:
        command: a script path ("train.py"), or an argv list: ["train.py", "--epochs", "2"],
            ["-m", "pkg.module"] or ["-c", "code"] run with this Python (with fault reports and a
            heartbeat); any other list (["bash", "run.sh"]) runs as is.
        num_processes: number of processes (1 to 1024).
        devices_per_process: fake CPU devices per process (1 to 4096); None for none: the
            processes see the machine's real devices (fake-device variables
            inherited from this process are removed).
        coordinator_address: "host:port" for process 0's coordinator.
        env: extra environment variables for every process ({name: value}, strings).
        cwd: working directory of the processes (an existing directory).
        timeout: seconds after which all processes are stopped (> 0, or None: no limit).
        hang_timeout: seconds after which a process counts as hung (> 0, or None: never):
            a Python target that prints nothing while its main thread stays on
            one line, or sends no heartbeat; any other command that prints nothing.
        grace_period: seconds between SIGTERM and SIGKILL when stopping processes (>= 0).
        stream: where prefixed output goes: "stdout", "stderr", a file object, or None.
        capture: keep each rank's output lines in `result.outputs`.

    Returns:
        A `LaunchResult`; `returncode` is 0 only if every process exited 0.

    Raises:
        LaunchError: an argument has a value the launcher cannot use (the message says which).
        ArgumentTypeError: an argument is of the wrong kind.
        ClusterError: `coordinator_address` is not "host:port".
    """
    argv, bootstrapped = argv_of(command, cwd, BOOTSTRAP)
    num_processes = count(num_processes, "num_processes", MAX_PROCESSES)
    if devices_per_process is not None:
        devices_per_process = count(devices_per_process, "devices_per_process", MAX_FAKE_DEVICES, "or None")
    if coordinator_address is not None and not isinstance(coordinator_address, str):
        wrong_kind("coordinator_address", coordinator_address, 'a "host:port" string or None')
    address = coordinator_address or f"127.0.0.1:{free_port()}"
    ClusterConfig(address, num_processes, 0, source="coordinator_address")  # validates the address
    options = Options(
        env=extra_env(env),
        cwd=cwd_of(cwd),
        timeout=seconds(timeout, "timeout", allow_none=True),
        hang_timeout=seconds(hang_timeout, "hang_timeout", allow_none=True),
        grace=seconds(grace_period, "grace_period", zero=True),
        stream=stream_of(stream),
        capture=flag(capture, "capture"),
    )
    return _Run(argv, bootstrapped, num_processes, devices_per_process, address, options).run()


def process_env(rank, num_processes, devices_per_process, coordinator_address, base=None, extra=None):
    """The environment of process `rank` of a launched run (see `launch`)."""
    env = dict(os.environ if base is None else base)
    env.pop(TF_CONFIG, None)  # the KERAS_DISTRIBUTION_* variables below describe the cluster
    flags = xla_flags_without_device_count(env.get("XLA_FLAGS", ""))
    for name in (FAKE_DEVICES_VAR, "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"):  # the parent's own fake devices
        env.pop(name, None)
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    if devices_per_process is not None:
        env[FAKE_DEVICES_VAR] = str(devices_per_process)
        env.update(fake_devices_env(devices_per_process, env.get("XLA_FLAGS", "")))
    env.update(ClusterConfig(coordinator_address, num_processes, rank, source="launch").env())
    collectives = env.get(CPU_COLLECTIVES, "gloo")
    env.update(
        {
            RANK_VAR: str(rank),
            CPU_COLLECTIVES: collectives,
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": collectives,
            "KERAS_BACKEND": "jax",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault(BIND_ADDRESS, coordinator_address)  # jax's default is every interface
    for name, value in QUIET.items():
        env.setdefault(name, value)
    env.update(extra or {})
    return env


def is_gloo_noise(line):
    """Whether an output line is (pieces of) Gloo's "[Gloo] Rank N is connected to M peer ranks ..." lines."""
    return GLOO_PIECES.fullmatch(line) is not None and not line.strip().isdigit()


def free_port(host="127.0.0.1"):
    """A TCP port that is free on `host` now (it may be taken again before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --- The run --------------------------------------------------------------------------------------


class _Run:
    def __init__(self, argv, bootstrapped, n, devices, address, options):
        self.argv, self.bootstrapped, self.n, self.devices, self.address = argv, bootstrapped, n, devices, address
        self.options = options
        self.launch_id = uuid.uuid4().hex
        self.tree = ProcessTree(self.launch_id)
        self.watch = Watch(n, bootstrapped, options.hang_timeout)
        self.outputs = [[] for _ in range(n)]
        self.procs, self.threads = [], []
        self.exits = queue.Queue()  # (rank, code) in the order the processes ended
        self.lock = threading.Lock()
        self.interrupted = None
        self.faults = None

    def run(self):
        handlers = self._install_signal_handlers()
        self.faults = tempfile.mkdtemp(prefix="kdist-launch-")
        try:
            self._start()
            code, rank, message, cause = self._wait()
        finally:
            self.tree.stop(self.options.grace)
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):  # killed, but stuck in the kernel (D state)
                    p.wait(timeout=10)
            for t in self.threads:
                t.join(timeout=2)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            shutil.rmtree(self.faults, ignore_errors=True)
        return LaunchResult(
            code,
            [p.returncode for p in self.procs],
            rank,
            message,
            self.outputs,
            [p.pid for p in self.procs],
            [list(w.tail) for w in self.watch.ranks],
            cause,
        )

    def _start(self):
        for rank in range(self.n):
            env = process_env(rank, self.n, self.devices, self.address, extra=self.options.env)
            env[MARKER] = self.launch_id
            beat_read = beat_write = None
            if self.bootstrapped:
                beat_read, beat_write = os.pipe()
                env[launch_child.HEARTBEAT_FD] = str(beat_write)
                env[launch_child.FAULT_FILE] = self._fault_file(rank)
            try:
                proc = subprocess.Popen(
                    self.argv,
                    env=env,
                    cwd=self.options.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: killpg reaches its children
                    pass_fds=(beat_write,) if beat_write is not None else (),
                )
            except OSError as e:
                if beat_read is not None:
                    os.close(beat_read)
                raise LaunchError(
                    f"Cannot start process {rank}: command {self.argv[0]!r} is not a .py script, and running it "
                    f"failed: {e}."
                ) from None
            finally:
                if beat_write is not None:
                    os.close(beat_write)
            self.procs.append(proc)
            self.tree.add(proc.pid)
            self._thread(self._forward, rank, proc.stdout)
            if beat_read is not None:
                self._thread(self._heartbeats, rank, beat_read)
            # A waiter per process records exits in the order they happen, so the first failure is named.
            self._thread(lambda r=rank, p=proc: self.exits.put((r, p.wait())))

    def _thread(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _forward(self, rank, pipe):
        quiet = os.environ.get(SHOW_GLOO, "") in ("", "0")
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            if quiet and is_gloo_noise(line):
                continue
            self.watch.output(rank, line)
            with self.lock:
                if self.options.capture:
                    self.outputs[rank].append(line)
                if self.options.stream is not None:
                    try:
                        self.options.stream.write(f"[rank {rank}] {line}\n")
                        self.options.stream.flush()
                    except (OSError, ValueError):  # a closed stream: keep reading, or the process would block
                        pass
        pipe.close()

    def _heartbeats(self, rank, fd):
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:
                self.watch.beat(rank, raw.decode(errors="replace").rstrip("\n"))

    def _wait(self):
        """(return code, failed rank or None, message, cause) once the run is over; processes may still run."""
        start = time.monotonic()
        finished, next_scan = set(), 0.0
        while True:
            if self.interrupted is not None:
                name = signal.Signals(self.interrupted).name
                message = f"launcher received {name}: stopped all {self.n} processes"
                return 128 + self.interrupted, None, message, "interrupted"
            try:
                rank, code = self.exits.get(timeout=0.1)
            except queue.Empty:
                now = time.monotonic()
                if now >= next_scan:
                    self.tree.scan()  # keeps track of children that leave their process group
                    next_scan = now + 0.5
                timeout = self.options.timeout
                if timeout is not None and now - start > timeout:
                    running = sorted(set(range(self.n)) - finished)
                    message = f"timed out after {timeout:g} s with processes {running} still running; stopped them"
                    return 124, None, message, "timeout"
                hung = self.watch.hung(now, finished)
                if hung is not None:
                    rank, what = hung
                    return 124, rank, f"process {rank} (pid {self.procs[rank].pid}) {what}; stopped the run", "hang"
                continue
            finished.add(rank)
            if code != 0:
                return self._failure(*self._killed_instead(rank, code, finished))
            if len(finished) == self.n:
                return 0, None, f"all {self.n} processes exited with code 0", "ok"

    def _killed_instead(self, rank, code, finished):
        """(rank, code) of the failure to name: a process killed from outside, seen within `SIGNAL_WINDOW` of the
        first failure `rank`, `code`, before it."""
        external = {-int(sig) for sig in EXTERNAL_SIGNALS}
        deadline = time.monotonic() + SIGNAL_WINDOW
        while code not in external and time.monotonic() < deadline:
            try:
                other, other_code = self.exits.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            finished.add(other)
            if other_code in external:
                return other, other_code
        return rank, code

    def _failure(self, rank, code):
        fault = {}
        try:
            with open(self._fault_file(rank), encoding="utf-8") as f:
                fault = json.load(f)
        except (OSError, ValueError):
            pass
        if code < 0:
            how, cause = f"was killed by {_signal_name(-code)}", "signal"
        elif fault.get("exception"):
            how, cause = f"raised {fault['exception']}", "exception"
            if fault.get("hint"):
                how += f" ({fault['hint']})"
        else:
            how, cause = f"exited with code {code}", "exit"
        message = f"process {rank} (pid {self.procs[rank].pid}) {how}; stopped the others"
        return (code if code > 0 else 1), rank, message, cause

    def _fault_file(self, rank):
        return os.path.join(self.faults, f"rank{rank}.json")

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum, frame):
            self.interrupted = signum

        return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
