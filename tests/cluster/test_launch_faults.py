"""The launcher always ends: a process that raises, exits, is killed or hangs stops the whole run, promptly.

Four 2-process runs (each process joins JAX's distributed runtime with
`kdist.initialize()`, so JAX would keep a failing process alive at exit)
serve every assertion: process 1 raises, process 0 raises, process 1 exits
with code 3, process 1 hangs. Each process starts grandchildren (one in its
process group, one in a new session, one double-forked daemon), all of which
must be gone when the launcher returns. A fifth run forgets
`kdist.initialize()`. The SIGKILL case is in test_launcher.py.
"""

import ipaddress
import os
import time
import uuid
from pathlib import Path

import pytest

import kdist
from kdist.cluster.launcher import process_env

SCRIPT = Path(__file__).parent.parent / "launch_scripts" / "faults.py"
FAULTS = {"raise1": ("raise", 1), "raise0": ("raise", 0), "exit1": ("exit", 1), "hang1": ("hang", 1)}
HANG_TIMEOUT = 15.0  # a loaded CI machine stalled a process 4 s inside one import before its first line


def _processes_with(token):
    """Pids of the processes whose command line holds `token`."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if token.encode() in f.read().split(b"\0"):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def _children_of_this_process():
    children = set()
    for name in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            children.add(int(name))
    return children


def _lines(result, prefix):
    return [[line[len(prefix) :].strip() for line in out if line.startswith(prefix)] for out in result.outputs]


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, (fault, rank) in FAULTS.items():
        token = f"kdist-test-{uuid.uuid4().hex}"
        before = _children_of_this_process()
        result = kdist.launch(
            [str(SCRIPT), fault, str(rank), token],
            num_processes=2,
            devices_per_process=2,
            capture=True,
            stream=None,
            timeout=120,
            hang_timeout=HANG_TIMEOUT,
            env={"JAX_COORDINATOR_BIND_ADDRESS": ""},  # so the binding tested is kdist.initialize()'s own
        )
        out[name] = {
            "result": result,
            "end": time.time(),
            "left": _processes_with(token),
            "new_children": _children_of_this_process() - before,
        }
    return out


@pytest.mark.parametrize("name", list(FAULTS))
def test_the_launcher_ends_within_10_s_of_the_fault_and_names_the_process(runs, name):
    run, (fault, rank) = runs[name], FAULTS[name]
    result = run["result"]
    assert result.failed_rank == rank, result.report()
    assert result.returncode != 0
    (fault_time,) = _lines(result, "FAULT")[rank]
    visible = float(fault_time) + (HANG_TIMEOUT if fault == "hang" else 0.0)
    assert run["end"] - visible < 10, result.report()
    assert result.message.startswith(f"process {rank} (pid {result.pids[rank]}) ")


def test_an_exception_is_reported_with_its_traceback(runs):
    for name, rank in (("raise1", 1), ("raise0", 0)):
        result = runs[name]["result"]
        assert result.cause == "exception" and result.returncode == 1
        assert f"raised RuntimeError: boom in process {rank}; stopped the others" in result.message
        assert result.last_lines[rank][-1] == f"RuntimeError: boom in process {rank}"
        assert any("faults.py" in line for line in result.last_lines[rank])  # the user's frames
        assert not any("launch_child" in line or "runpy" in line for line in result.last_lines[rank])
        report = result.report()
        assert f"output lines of process {rank}:" in report and f"[rank {rank}] RuntimeError: boom" in report


def test_an_exit_code_and_a_hang_are_named(runs):
    exited = runs["exit1"]["result"]
    assert (exited.returncode, exited.cause) == (3, "exit")
    assert "exited with code 3" in exited.message
    hung = runs["hang1"]["result"]
    assert (hung.returncode, hung.cause) == (124, "hang")
    assert "hung: it printed nothing while its main thread stayed at" in hung.message
    assert "faults.py:" in hung.message and f"hang_timeout={HANG_TIMEOUT:g} s" in hung.message


def test_no_process_is_left_behind(runs):
    for name, run in runs.items():
        children = [int(pid) for lines in _lines(run["result"], "CHILD") for pid in lines]
        assert len(children) == 6, (name, run["result"].report())  # 3 grandchildren per process
        assert run["left"] == [], name  # nothing with the run's token: grandchildren in new sessions included
        assert run["new_children"] == set(), name  # this process's own children: as before the run
        assert all(code is not None for code in run["result"].returncodes)


def _loopback(hex_address):
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        address = ipaddress.IPv4Address(raw[::-1])
    else:  # /proc/net/tcp6: four 32-bit words, each in host (little-endian) order
        address = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
        address = address.ipv4_mapped or address
    return address.is_loopback


def test_the_coordinator_listens_on_loopback_only(runs):
    listening = _lines(runs["raise1"]["result"], "LISTEN")[0]
    assert listening, "no socket listens on the coordinator's port"
    assert all(_loopback(a) for a in listening), listening


def test_children_get_the_bind_address_and_a_quiet_tensorflow():
    env = process_env(0, 2, 1, "127.0.0.1:1234", base={})
    assert env["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:1234"
    assert (env["TF_ENABLE_ONEDNN_OPTS"], env["TF_CPP_MIN_LOG_LEVEL"]) == ("0", "2")
    caller = process_env(0, 2, 1, "127.0.0.1:1234", base={"TF_CPP_MIN_LOG_LEVEL": "0"}, extra={"X": "1"})
    assert caller["TF_CPP_MIN_LOG_LEVEL"] == "0" and caller["X"] == "1"


def test_a_script_that_forgot_initialize_is_told_to_call_it():
    code = "import kdist; kdist.preset('2x4')"
    result = kdist.launch(["-c", code], num_processes=2, devices_per_process=4, stream=None, timeout=120)
    assert result.cause == "exception" and result.failed_rank in (0, 1)
    assert "never joined the run" in result.message and "call kdist.initialize() first" in result.message


def test_python_faults_without_jax_are_named_at_once():
    code = "import os, sys, time; r = int(os.environ['KDIST_PROCESS_RANK']); time.sleep(r / 2); sys.exit(f'bad {r}')"
    result = kdist.launch(["-c", code], num_processes=3, devices_per_process=1, stream=None)
    assert (result.returncode, result.failed_rank, result.cause) == (1, 0, "exit")
    assert result.last_lines[0] == ["bad 0"]  # sys.exit("message") prints it, as Python does


def test_a_silent_command_that_is_not_python_counts_as_hung():
    start = time.monotonic()
    result = kdist.launch(["sleep", "60"], num_processes=2, stream=None, hang_timeout=1, grace_period=0)
    assert time.monotonic() - start < 10
    assert result.cause == "hang" and result.returncode == 124 and result.failed_rank in (0, 1)
    assert "printed nothing for" in result.message


def test_a_stopped_process_sends_no_heartbeat():
    code = "import os, signal; print('stopping', flush=True); os.kill(os.getpid(), signal.SIGSTOP)"
    result = kdist.launch(["-c", code], num_processes=1, stream=None, hang_timeout=2, grace_period=0)
    assert result.cause == "hang" and "sent no heartbeat" in result.message


def test_a_process_that_returned_is_not_hung_while_its_peers_work():
    code = (
        "import os, time; r = int(os.environ['KDIST_PROCESS_RANK'])\n"
        "for _ in range(6 * r): print('step', flush=True); time.sleep(0.5)\n"
    )
    result = kdist.launch(["-c", code], num_processes=2, stream=None, hang_timeout=1.5)
    assert result.returncode == 0, result.report()


def test_the_script_runs_as_python_would_run_it(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "main.py").write_text(
        "import sys, helper\nprint('ARGS', sys.argv, helper.VALUE, __name__, flush=True)\n"
    )
    result = kdist.launch(["main.py", "a", "b"], num_processes=1, cwd=tmp_path, stream=None, capture=True)
    assert result.returncode == 0, result.report()
    assert result.outputs[0] == ["ARGS ['main.py', 'a', 'b'] 7 __main__"]
    module = kdist.launch(["-m", "json.tool", "--help"], num_processes=1, stream=None, capture=True)
    assert module.returncode == 0 and any("json.tool" in line for line in module.outputs[0]), module.report()


def test_a_line_printed_from_c_in_pieces_stays_whole():
    code = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None)\n"
        "out = ctypes.c_void_p.in_dll(libc, 'stdout')\n"
        "libc.fputs(b'[C] one line, ', out)\n"  # as Gloo prints its lines: a write per piece
        "os.write(1, b'PYTHON\\n')\n"  # another thread's line, between the pieces
        "libc.fputs(b'in two pieces\\n', out)\n"
        "libc.fputs(b'unfinished', out)\n"
        "sys.exit(2)\n"
    )
    result = kdist.launch(["-c", code], num_processes=1, stream=None, capture=True)
    assert result.returncode == 2, result.report()
    assert result.outputs[0] == ["PYTHON", "[C] one line, in two pieces", "unfinished"]
