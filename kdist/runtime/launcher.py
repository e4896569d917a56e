"""Run a script as N cooperating JAX processes on this machine, each with its own fake CPU devices.

`kdist.launch` (and `kdist launch`) start the processes the way a cluster
scheduler would start one per host: each gets the KERAS_DISTRIBUTION_*
variables that `kdist.initialize()` reads, a coordinator on loopback and CPU
collectives (gloo), so a script written for N hosts runs unchanged on one.
"""

import dataclasses
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from kdist.devices import ENV_VAR as FAKE_DEVICES_VAR
from kdist.devices import fake_devices_env, xla_flags_without_device_count
from kdist.errors import LaunchError
from kdist.runtime.cluster import CPU_COLLECTIVES, TF_CONFIG, ClusterConfig

RANK_VAR = "KDIST_PROCESS_RANK"


@dataclasses.dataclass
class LaunchResult:
    """How a launched run ended.

    Attributes:
        returncode: 0 if every process succeeded; else the failing process's
            exit code (1 if it was killed by a signal), or 130/143 when the
            launcher itself was interrupted, 124 on timeout.
        returncodes: each process's exit code (negative: killed by that signal).
        failed_rank: the rank that failed first, or None.
        message: a one-line account of how the run ended.
        outputs: each rank's output lines (only with `capture=True`).
        pids: each rank's process id (also its process group id).
    """

    returncode: int
    returncodes: list
    failed_rank: object
    message: str
    outputs: list
    pids: list


def launch(
    command,
    num_processes=2,
    devices_per_process=4,
    *,
    coordinator_address=None,
    env=None,
    cwd=None,
    timeout=None,
    grace_period=5.0,
    stream="stdout",
    capture=False,
):
    """Start `command` as `num_processes` processes of one JAX run on this machine.

    Each process gets `devices_per_process` fake CPU devices, its rank in
    KERAS_DISTRIBUTION_PROCESS_ID (and KDIST_PROCESS_RANK), the process count,
    and the coordinator address (127.0.0.1 and a free port unless given).
    Output lines are prefixed with "[rank N] ". When a process fails, the
    others are stopped (SIGTERM to their process groups, SIGKILL after
    `grace_period` seconds); Ctrl-C or SIGTERM to the launcher stops them all.

    Example:

    ```python
    result = kdist.launch("train.py", num_processes=2, devices_per_process=4)
    assert result.returncode == 0, result.message
    ```

    Args:
        command: a script path ("train.py"), or an argv list: ["train.py", "--epochs", "2"],
            ["-m", "pkg.module"] or ["-c", "code"] run with this Python; any other
            list (["bash", "run.sh"]) runs as is.
        num_processes: number of processes (>= 1).
        devices_per_process: fake CPU devices per process; None for none: the
            processes see the machine's real devices (fake-device variables
            inherited from this process are removed).
        coordinator_address: "host:port" for process 0's coordinator.
        env: extra environment variables for every process.
        cwd: working directory of the processes.
        timeout: seconds after which all processes are stopped (None: no limit).
        grace_period: seconds between SIGTERM and SIGKILL when stopping processes.
        stream: where prefixed output goes: "stdout", a file object, or None.
        capture: keep each rank's output lines in `result.outputs`.

    Returns:
        A `LaunchResult`; `returncode` is 0 only if every process exited 0.
    """
    argv = _argv(command, cwd)
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise LaunchError(f"num_processes must be a positive integer; received {num_processes!r}.")
    if devices_per_process is not None and (
        isinstance(devices_per_process, bool) or not isinstance(devices_per_process, int) or devices_per_process < 1
    ):
        raise LaunchError(f"devices_per_process must be a positive integer or None; received {devices_per_process!r}.")
    address = coordinator_address or f"127.0.0.1:{free_port()}"
    ClusterConfig(address, num_processes, 0, source="coordinator_address")  # validates the address
    stream = sys.stdout if stream == "stdout" else stream
    return _Run(
        argv, num_processes, devices_per_process, address, env, cwd, timeout, grace_period, stream, capture
    ).run()


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
    env.update(extra or {})
    return env


def free_port(host="127.0.0.1"):
    """A TCP port that is free on `host` now (it may be taken again before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _argv(command, cwd=None):
    if isinstance(command, (str, os.PathLike)):
        command = [os.fspath(command)]
    command = [os.fspath(c) for c in command]
    if not command:
        raise LaunchError("launch needs a command: a script path or an argv list; received an empty command.")
    first = command[0]
    if first in ("-m", "-c") or first.endswith(".py"):
        where = cwd or os.getcwd()
        if first.endswith(".py") and not os.path.exists(os.path.join(where, first)):
            raise LaunchError(f"Script {first!r} does not exist (working directory {where}).")
        return [sys.executable, *command]
    return command


class _Run:
    def __init__(self, argv, n, devices, address, env, cwd, timeout, grace_period, stream, capture):
        self.argv, self.n, self.devices, self.address = argv, n, devices, address
        self.extra_env, self.cwd, self.timeout, self.grace = env, cwd, timeout, grace_period
        self.stream, self.capture = stream, capture
        self.outputs = [[] for _ in range(n)]
        self.procs, self.readers = [], []
        self.exits = queue.Queue()  # (rank, code) in the order the processes ended
        self.lock = threading.Lock()
        self.interrupted = None

    def run(self):
        handlers = self._install_signal_handlers()
        try:
            self._start()
            code, rank, message = self._wait()
        finally:
            self._stop_all()
            for t in self.readers:
                t.join(timeout=2)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return LaunchResult(
            code, [p.returncode for p in self.procs], rank, message, self.outputs, [p.pid for p in self.procs]
        )

    def _start(self):
        for rank in range(self.n):
            env = process_env(rank, self.n, self.devices, self.address, extra=self.extra_env)
            try:
                proc = subprocess.Popen(
                    self.argv,
                    env=env,
                    cwd=self.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: killpg reaches its children
                )
            except OSError as e:
                raise LaunchError(f"Cannot start process {rank} with command {self.argv}: {e}") from None
            self.procs.append(proc)
            reader = threading.Thread(target=self._forward, args=(rank, proc.stdout), daemon=True)
            reader.start()
            self.readers.append(reader)
            # A waiter per process records exits in the order they happen, so the first failure is named.
            threading.Thread(target=lambda r=rank, p=proc: self.exits.put((r, p.wait())), daemon=True).start()

    def _forward(self, rank, pipe):
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self.lock:
                if self.capture:
                    self.outputs[rank].append(line)
                if self.stream is not None:
                    self.stream.write(f"[rank {rank}] {line}\n")
                    self.stream.flush()
        pipe.close()

    def _wait(self):
        """(return code, failed rank or None, message) once the run is over; the processes may still be running."""
        start = time.monotonic()
        finished = set()
        while True:
            if self.interrupted is not None:
                name = signal.Signals(self.interrupted).name
                return 128 + self.interrupted, None, f"launcher received {name}: stopped all {self.n} processes"
            try:
                rank, code = self.exits.get(timeout=0.05)
            except queue.Empty:
                if self.timeout is not None and time.monotonic() - start > self.timeout:
                    running = sorted(set(range(self.n)) - finished)
                    return (
                        124,
                        None,
                        f"timed out after {self.timeout} s with processes {running} still running; stopped them",
                    )
                continue
            finished.add(rank)
            if code != 0:
                how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
                return (
                    code if code > 0 else 1,
                    rank,
                    f"process {rank} (pid {self.procs[rank].pid}) {how}; stopped the others",
                )
            if len(finished) == self.n:
                return 0, None, f"all {self.n} processes exited with code 0"

    def _stop_all(self):
        alive = [p for p in self.procs if p.poll() is None]
        for p in alive:
            _killpg(p, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for p in alive:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            _killpg(p, signal.SIGKILL)  # also reaps grandchildren left in the group
            p.wait()

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum, frame):
            self.interrupted = signum

        return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def _killpg(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
