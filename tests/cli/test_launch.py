"""`kdist launch`: rank-prefixed output, and Ctrl-C stopping every process and its children."""

import os
import signal
import subprocess
import sys
import time

from tests.runtime.test_launcher import _alive
from tests.subprocess_utils import _INHERITED


def test_cli_prefixes_output_and_sigint_stops_every_process_and_grandchild():
    child = (
        "import os, subprocess, time; g = subprocess.Popen(['sleep', '600']); "
        "print('ready', os.getpid(), g.pid, os.environ['KERAS_DISTRIBUTION_PROCESS_ID'], flush=True); time.sleep(600)"
    )
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "kdist.cli", "launch", "-n", "2", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ready = {}
    try:
        while len(ready) < 2:
            line = launcher.stdout.readline()
            assert line, launcher.stderr.read()
            if " ready " not in line:
                continue
            prefix, pid, grandchild, rank = line.split(" ready ")[0], *line.split(" ready ")[1].split()
            assert prefix == f"[rank {rank}]", line
            ready[int(rank)] = (int(pid), int(grandchild))
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(timeout=30)
    finally:
        launcher.kill()
    assert code == 128 + signal.SIGINT
    assert "received SIGINT: stopped all 2 processes" in launcher.stderr.read()
    deadline = time.monotonic() + 5
    while any(_alive(p) for pids in ready.values() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for pids in ready.values() for p in pids if _alive(p)]
