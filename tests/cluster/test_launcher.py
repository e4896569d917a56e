"""Multi-process runs on one machine: 2 processes x 4 fake CPU devices, compared with 8 devices in this process.

Launching is expensive on a small machine, so two launched runs serve every
multi-process assertion: the first trains under "dp", then under "2x4" with
kdist.BackupAndRestore until process 1 is SIGKILLed mid-epoch; the second
resumes it. A third, in-process run resumes the same checkpoint on another
mesh and process count.
"""

import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import kdist
from kdist.cluster.launcher import process_env
from tests.launch_scripts import common
from tests.launch_scripts.common import build, train

SCRIPT = Path(__file__).parent.parent / "launch_scripts" / "train.py"
KILL = (1, 1, 3)  # process 1, epoch 1, batch 3: after the save at epoch 1 batch 1 (save_freq=3)


def _launch(*args):
    result = kdist.launch(
        [str(SCRIPT), *args], num_processes=2, devices_per_process=4, capture=True, stream=None, timeout=240
    )
    return result, time.time()


def _lines(result, prefix):
    return [[line[len(prefix) :].strip() for line in out if line.startswith(prefix)] for out in result.outputs]


def _steps(result):
    return [
        {(int(e), int(b)): float(loss) for e, b, loss in (s.split() for s in lines)} for lines in _lines(result, "STEP")
    ]


def _assert_same_state(state, reference):
    assert list(state) == list(reference)
    for p, v in state.items():
        np.testing.assert_allclose(v, reference[p], rtol=1e-5, atol=1e-6, err_msg=p)


def _saved_state(path):
    """The model and optimizer state of a checkpoint saved by the launched processes, read in this process."""
    with kdist.preset("dp").scope():
        model = build()
        kdist.load_sharded(model, path)
    return common.state(model)


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("launch")
    backup, out = tmp / "backup", tmp / "final"
    resume = ["--resume", "2x4", str(backup), str(out)]
    killed, killed_end = _launch("--presets", "dp", *resume, "--kill", *map(str, KILL))
    shutil.copytree(backup, tmp / "backup_copy")
    resumed, _ = _launch(*resume)
    return {"killed": killed, "killed_end": killed_end, "resumed": resumed, "tmp": tmp, "out": out}


@pytest.fixture(scope="module")
def reference():
    """The same training in this process, on 8 devices, never interrupted."""
    return common.reference()


def test_every_process_reports_the_losses_of_a_single_process_run(runs, reference):
    results = [json.loads(r[0]) for r in _lines(runs["killed"], "RESULT")]
    assert [(r["spec"], r["process"], r["processes"]) for r in results] == [("dp", 0, 2), ("dp", 1, 2)]
    for r in results:
        np.testing.assert_allclose(r["losses"], reference["dp"], rtol=1e-5)
    # "2x4": steps 0-6 ran before process 1 was killed, steps 6-7 after the restart.
    ref = {(e, b): reference["2x4"][4 * e + b] for e in range(2) for b in range(4)}
    before, after = _steps(runs["killed"]), _steps(runs["resumed"])
    for rank in range(2):
        assert sorted(before[rank]) == sorted(k for k in ref if k < (1, 3)), rank
        assert sorted(after[rank]) == [(1, 2), (1, 3)], rank
        for step, loss in {**before[rank], **after[rank]}.items():
            np.testing.assert_allclose(loss, ref[step], rtol=1e-5, err_msg=f"rank {rank} step {step}")


def test_data_helpers_see_the_processes_of_the_run(runs):
    for rank in range(2):
        assert _lines(runs["killed"], "GLOBAL_BATCH")[rank] == ["32 8"]  # dp: 8 replicas; 2x4: 2
        assert _lines(runs["killed"], "CHECK_FIT")[rank] == ["accepted ndarray"]  # kdist feeds each process its rows


def test_a_killed_process_stops_the_run_and_is_named(runs):
    killed = runs["killed"]
    assert killed.returncode != 0
    assert killed.failed_rank == 1
    assert killed.message.startswith("process 1 (pid ") and "killed by SIGKILL" in killed.message
    assert killed.returncodes[1] == -signal.SIGKILL
    (line,) = _lines(killed, "KILLING")[1]
    assert line.startswith("process 1 at epoch 1 batch 3")
    assert runs["killed_end"] - float(line.rsplit("time ", 1)[1]) < 10  # from the kill to the launcher's return
    assert not [pid for pid in killed.pids if _alive(pid)]


def test_a_run_killed_mid_epoch_resumes_where_it_stopped(runs, reference):
    assert [line[0] for line in _lines(runs["resumed"], "DONE")] == ["2 steps", "2 steps"]
    _assert_same_state(_saved_state(runs["out"]), reference["state"])


def test_the_checkpoint_resumes_on_another_mesh_and_process_count(runs, reference, tmp_path):
    backup = runs["tmp"] / "backup_copy"
    callback = kdist.BackupAndRestore(str(backup), save_freq=3)
    losses, model = train("dp", epochs=2, callbacks=[callback])  # 1 process x 8 devices, data parallel
    assert callback.restored["epoch"] == 1 and callback.restored["batches_done"] == 2
    np.testing.assert_allclose(losses, reference["2x4"][6:], rtol=1e-5)
    _assert_same_state(common.state(model), reference["state"])


def test_child_environment_gets_its_own_devices_and_cluster():
    parent = {
        "KDIST_FAKE_DEVICES": "8",
        "JAX_NUM_CPU_DEVICES": "8",
        "TF_CONFIG": "{}",
        "XLA_FLAGS": "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8",
    }
    env = process_env(1, 2, 4, "127.0.0.1:1234", base=parent)
    assert env["KDIST_FAKE_DEVICES"] == env["JAX_NUM_CPU_DEVICES"] == "4"
    assert env["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
    assert "TF_CONFIG" not in env
    assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "127.0.0.1:1234"
    assert (env["KERAS_DISTRIBUTION_NUM_PROCESSES"], env["KERAS_DISTRIBUTION_PROCESS_ID"]) == ("2", "1")
    assert env["KDIST_CPU_COLLECTIVES"] == "gloo"
    real = process_env(0, 2, None, "127.0.0.1:1234", base=parent)  # no fake devices: the parent's are not inherited
    assert "KDIST_FAKE_DEVICES" not in real and "JAX_NUM_CPU_DEVICES" not in real
    assert real["XLA_FLAGS"] == "--xla_cpu_foo=1"


def test_bad_launch_arguments_are_rejected():
    with pytest.raises(kdist.LaunchError, match="does not exist"):
        kdist.launch("no_such_script.py")
    with pytest.raises(kdist.LaunchError, match="num_processes must be a positive integer"):
        kdist.launch(["-c", "pass"], num_processes=0)
    with pytest.raises(kdist.ClusterError, match="not of the form"):
        kdist.launch(["-c", "pass"], coordinator_address="localhost")


def test_the_heartbeat_thread_has_ended_before_the_interpreter_exits():
    """A daemon thread still running at exit is ended by CPython wherever it is: inside a C++ destructor that
    aborts the process. The launched script sees, at exit, the threads that are still alive."""
    code = (
        "import atexit, threading, time; time.sleep(1.5); "
        "atexit.register(lambda: print('ALIVE', sorted(t.name for t in threading.enumerate())))"
    )
    result = kdist.launch(["-c", code], num_processes=2, devices_per_process=1, capture=True, stream=None)
    assert result.returncode == 0, result.report()
    assert [[line for line in out if line.startswith("ALIVE")] for out in result.outputs] == [
        ["ALIVE ['MainThread']"]
    ] * 2


def test_a_process_killed_from_outside_is_named_before_one_that_exits_just_before_its_kill_is_seen():
    """A peer's distributed runtime errors once a process is killed, and on a busy machine its exit can be seen first:
    a kill from outside (SIGKILL) seen within `SIGNAL_WINDOW` of another failure is named instead (rank 0 exits with
    3 while rank 1 is killed 0.1 s later); a process that aborts (SIGABRT, as a runtime whose peer died does) is not
    preferred."""
    code = (
        "import os, signal, sys, time; r = int(os.environ['KDIST_PROCESS_RANK']); time.sleep(1.0 + 0.1 * r);"
        "os.kill(os.getpid(), signal.SIGKILL) if r else sys.exit(3)"
    )
    result = kdist.launch(["-c", code], num_processes=2, devices_per_process=1, stream=None)
    assert result.failed_rank == 1 and "killed by SIGKILL" in result.message
    assert result.returncodes == [3, -signal.SIGKILL]
    aborts = code.replace("SIGKILL", "SIGABRT")
    result = kdist.launch(["-c", aborts], num_processes=2, devices_per_process=1, stream=None)
    assert result.failed_rank == 0 and "exited with code 3" in result.message


def test_the_first_process_to_fail_is_named_and_timeouts_stop_the_run():
    code = "import os, sys, time; r = int(os.environ['KDIST_PROCESS_RANK']); time.sleep(1.5 - r); sys.exit(5 + r)"
    result = kdist.launch(["-c", code], num_processes=2, devices_per_process=1, stream=None)
    assert (result.returncode, result.failed_rank) == (6, 1)
    assert result.message.startswith("process 1 (pid ") and "exited with code 6" in result.message
    result = kdist.launch(
        ["-c", "import time; time.sleep(60)"], num_processes=2, stream=None, timeout=1, grace_period=1
    )
    assert result.returncode == 124 and "timed out after 1 s with processes [0, 1] still running" in result.message
    assert result.returncodes == [-signal.SIGTERM, -signal.SIGTERM]
