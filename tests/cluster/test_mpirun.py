"""Under Open MPI's real `mpirun`: 2 tasks x 4 fake CPU devices join one 8-device job with `kdist.initialize()`.

One run trains "dp" and "2x4" (the losses of 1 process on 8 devices) and
then trains "2x4" with kdist.BackupAndRestore until task 1 SIGKILLs itself;
`mpirun -n 1` (1 task, 4 devices) resumes it under "dp". Other runs: a
task that raises or exits ends the job within seconds, a task that has not
joined is refused with a kdist.ClusterError, KDIST_ALONE=1 runs alone.
Skipped when mpirun is not installed.
"""

import json
import os
import shutil
import sys

import numpy as np
import pytest

import kdist
from tests.cluster.engine_runs import SCRIPTS, engine_env, is_loopback, run_engine
from tests.launch_scripts import common

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason="Open MPI's mpirun is not installed (apt-get install openmpi-bin)"
)
KILL = ("1", "1", "3")  # task 1, epoch 1, batch 3: after the backup at epoch 1 batch 1 (save_freq=3)


def mpirun(args, n=2, devices=4, extra_env=None, timeout=300):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    command = [MPIRUN, *root, "--oversubscribe", "--tag-output", "-n", str(n), *args]
    return run_engine(command, engine_env(devices, extra_env), timeout, labelled="mpirun")


def python(script, *args):
    return [sys.executable, str(SCRIPTS / script), *args]


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mpirun")
    backup, out = tmp / "backup", tmp / "final"
    killed = mpirun(
        python("train.py", "--presets", "dp,2x4", "--resume", "2x4", str(backup), str(out), "--kill", *KILL)
    )
    resumed = mpirun(python("train.py", "--resume", "dp", str(backup), str(out)), n=1, devices=4)
    return {"killed": killed, "resumed": resumed, "out": out}


@pytest.fixture(scope="module")
def reference():
    return common.reference()


def test_two_mpirun_tasks_train_as_one_8_device_job(training, reference):
    run = training["killed"]
    results = {rank: [json.loads(r) for r in lines] for rank, lines in run.prefixed("RESULT").items()}
    assert sorted(results) == [0, 1], run.output[-3000:]
    for rank, runs in results.items():
        assert [(r["spec"], r["process"], r["processes"]) for r in runs] == [("dp", rank, 2), ("2x4", rank, 2)]
        np.testing.assert_allclose(runs[0]["losses"], reference["dp"], rtol=1e-5)
        np.testing.assert_allclose(runs[1]["losses"], reference["2x4"][:4], rtol=1e-5)
        assert run.prefixed("GLOBAL_BATCH")[rank] == ["32 8"]  # dp: 8 replicas over both tasks


def test_a_killed_task_ends_the_mpirun_job_and_the_backup_resumes_on_1_task_and_4_devices(training, reference):
    killed, resumed = training["killed"], training["resumed"]
    assert killed.returncode != 0
    (line,) = killed.prefixed("KILLING")[1]
    assert killed.ended - float(line.rsplit("time ", 1)[1]) < 15, killed.output[-2000:]
    steps = {(int(e), int(b)): float(loss) for e, b, loss in (s.split() for s in resumed.prefixed("STEP")[0])}
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert sorted(steps) == [(1, 2), (1, 3)]
    np.testing.assert_allclose([steps[1, 2], steps[1, 3]], reference["2x4"][6:], rtol=1e-5)
    with kdist.preset("dp").scope():
        model = common.build()
        kdist.load_sharded(model, str(training["out"]))
    state = common.state(model)
    for path, value in reference["state"].items():
        np.testing.assert_allclose(state[path], value, rtol=1e-5, atol=1e-6, err_msg=path)


@pytest.mark.parametrize("fault", ["raise", "exit"])
def test_a_task_that_raises_or_exits_ends_the_mpirun_job_within_seconds(fault, tmp_path):
    """The fault's time comes from a file: Gloo's C++ log line once landed inside the forwarded FAULT line."""
    fault_file = tmp_path / "fault_time"
    run = mpirun(
        python("engine_fault.py", fault, "1"), devices=2, extra_env={"FAULT_TIME_FILE": str(fault_file)}, timeout=120
    )
    ready = run.prefixed("READY")
    assert [ready[0][0].split()[:2], ready[1][0].split()[:2]] == [["0", "openmpi"], ["1", "openmpi"]], run.output
    assert run.prefixed("LISTEN")[0] and all(map(is_loopback, run.prefixed("LISTEN")[0])), run.output[-3000:]
    assert ready[0][0].split()[2].startswith("127.0.0.1:")  # one host: the coordinator is on loopback
    assert fault_file.exists(), run.output[-3000:]
    assert run.returncode != 0 and "DONE" not in run.text
    assert run.ended - float(fault_file.read_text()) < 10, run.output[-3000:]  # jax's shutdown barrier would wait 300 s
    said = "raised RuntimeError" if fault == "raise" else "exited with code 3"
    assert f"kdist: process 1 of 2 (openmpi) {said}; ending the job." in run.lines[1], run.output[-3000:]


def test_a_task_that_has_not_joined_is_refused_with_a_cluster_error():
    code = "import kdist; kdist.preset('dp'); print('TRAINED ALONE', flush=True)"
    run = mpirun([sys.executable, "-c", code], devices=4, timeout=120)
    assert run.returncode != 0 and "TRAINED ALONE" not in run.text
    assert "kdist.errors.ClusterError: This process is task" in run.text, run.output[-3000:]
    assert "started by Open MPI (mpirun) (OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=" in run.text
    assert "call kdist.initialize() first thing in the script" in run.text and "KDIST_ALONE=1" in run.text


def test_initialize_after_jax_started_its_devices_is_refused_under_mpirun():
    code = "import kdist, jax; jax.devices(); kdist.initialize()"
    run = mpirun([sys.executable, "-c", code], devices=4, timeout=120)
    assert run.returncode != 0
    assert "kdist.errors.ClusterError: kdist.initialize() was called after JAX had initialised its devices" in run.text
    assert "(OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK" in run.text, run.output[-3000:]


def test_kdist_alone_runs_each_task_alone():
    code = "import kdist, jax; print('ALONE', kdist.initialize(), len(kdist.preset('dp').device_mesh.devices.flat))"
    run = mpirun([sys.executable, "-c", code], devices=4, extra_env={"KDIST_ALONE": "1"}, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    assert run.prefixed("ALONE") == {0: ["None 4"], 1: ["None 4"]}
