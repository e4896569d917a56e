"""`kdist launch`: rank-prefixed output, and Ctrl-C stopping every process and its children."""

import signal
import subprocess
import sys
import time

from kdist.cli import main
from tests.cluster.test_launcher import _alive
from tests.subprocess_utils import clean_env


def test_cli_prefixes_output_and_sigint_stops_every_process_and_grandchild():
    child = (
        "import os, subprocess, time; g = subprocess.Popen(['sleep', '600']); "
        "print('ready', os.getpid(), g.pid, os.environ['KERAS_DISTRIBUTION_PROCESS_ID'], flush=True); time.sleep(600)"
    )
    env = clean_env()
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


def test_cli_names_the_failed_process_and_its_last_lines(tmp_path, capsys, monkeypatch):
    (tmp_path / "fail.py").write_text(
        "import os\nrank = os.environ['KDIST_PROCESS_RANK']\nprint('working', rank)\nif rank == '1':\n"
        "    raise ValueError('bad shard')\nimport time; time.sleep(60)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "-n", "2", "--devices-per-process", "1", "--grace-period", "0", "fail.py"]) == 1
    captured = capsys.readouterr()
    assert "[rank 1] working 1" in captured.out
    err = captured.err.splitlines()
    assert err[0].startswith("kdist launch: process 1 (pid ")
    assert err[0].endswith("raised ValueError: bad shard; stopped the others")
    assert "kdist launch: last 5 output lines of process 1:" in err
    assert err[-1] == "kdist launch:   [rank 1] ValueError: bad shard"
