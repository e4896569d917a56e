"""Under SLURM's real `srun`, on a single-node SLURM this module starts (munged + slurmctld + slurmd):
2 tasks x 4 fake CPU devices join one 8-device job with `kdist.initialize()`.

The training gives the losses of 1 process on 8 devices; a task that raises
ends the step within seconds, also when the other task is in no collective
(srun alone would wait for it), and so does a task killed while the other
waits for it in a collective;
a task that has not joined is refused with a kdist.ClusterError. When the
daemons cannot start here, every test skips with the reason.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.cluster.engine_runs import SCRIPTS, engine_env, is_loopback, one_engine_job_at_a_time, run_engine
from tests.cluster.slurm_cluster import SlurmUnavailable, start_slurm
from tests.launch_scripts import common


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as e:
        pytest.skip(f"a single-node SLURM cannot start here: {e}")
    yield cluster
    cluster.stop()


def srun(slurm, args, n=2, devices=4, extra_env=None, timeout=300, options=()):
    env = engine_env(devices, {"SLURM_CONF": slurm.env["SLURM_CONF"], **(extra_env or {})})
    command = ["srun", "--label", "-n", str(n), "--mpi=none", *options, *args]
    return run_engine(command, env, timeout, labelled="srun")


def test_two_srun_tasks_train_as_one_8_device_job(slurm):
    run = srun(slurm, [sys.executable, str(SCRIPTS / "train.py"), "--presets", "dp,2x4"])
    assert run.returncode == 0, run.output[-3000:] + slurm.logs()
    reference = common.reference()
    results = {rank: [json.loads(r) for r in lines] for rank, lines in run.prefixed("RESULT").items()}
    assert sorted(results) == [0, 1], run.output[-3000:]
    for rank, runs in results.items():
        assert [(r["spec"], r["process"], r["processes"]) for r in runs] == [("dp", rank, 2), ("2x4", rank, 2)]
        np.testing.assert_allclose(runs[0]["losses"], reference["dp"], rtol=1e-5)
        np.testing.assert_allclose(runs[1]["losses"], reference["2x4"][:4], rtol=1e-5)


@pytest.mark.parametrize("fault, others", [("raise", "barrier"), ("raise", "sleep"), ("kill", "barrier")])
def test_a_failed_task_ends_the_srun_step_within_seconds(slurm, fault, others, tmp_path):
    """ "raise": kdist's handler ends the task and cancels the step; "sleep": the other task is in no collective, so
    only that scancel ends it. "kill": task 1 SIGKILLs itself, so no handler of its own runs; srun ends the step
    with --kill-on-bad-exit=1, as docs/clusters.md says to run. Without it the survivor's collective usually fails
    at once, but once in six runs it waited for jax's heartbeat timeout (98 s). The fault's time comes from a file:
    on a loaded CI machine srun once did not forward the failing task's FAULT line (its traceback came through)."""
    script = [sys.executable, str(SCRIPTS / "engine_fault.py"), fault, "1", others]
    options = ("--kill-on-bad-exit=1",) if fault == "kill" else ()
    fault_file = tmp_path / "fault_time"
    run = srun(slurm, script, devices=2, timeout=120, options=options, extra_env={"FAULT_TIME_FILE": str(fault_file)})
    ready = run.prefixed("READY")
    assert [ready[0][0].split()[:2], ready[1][0].split()[:2]] == [["0", "slurm"], ["1", "slurm"]], run.output
    assert run.prefixed("LISTEN")[0] and all(map(is_loopback, run.prefixed("LISTEN")[0])), run.output[-3000:]
    assert ready[0][0].split()[2].startswith("127.0.0.1:")  # one node: the coordinator is on loopback
    assert fault_file.exists(), run.output[-3000:]
    fault_time = fault_file.read_text()
    assert run.returncode != 0 and "DONE" not in run.text
    assert run.ended - float(fault_time) < 15, run.output[-3000:]  # srun alone: until the job's time limit
    if fault == "raise":
        assert "kdist: process 1 of 2 (slurm) raised RuntimeError; ending the job." in run.lines[1], run.output[-3000:]


def test_a_task_that_has_not_joined_is_refused_with_a_cluster_error(slurm):
    code = "import kdist; kdist.preset('dp'); print('TRAINED ALONE', flush=True)"
    run = srun(slurm, [sys.executable, "-c", code], timeout=120)
    assert run.returncode != 0 and "TRAINED ALONE" not in run.text
    assert "kdist.errors.ClusterError: This process is task" in run.text, run.output[-3000:]
    assert "started by SLURM (srun) (SLURM_STEP_NUM_TASKS=2, SLURM_PROCID=" in run.text


def test_an_sbatch_script_runs_the_training_with_srun(slurm, tmp_path):
    """The shape of docs/clusters.md's sbatch script: the batch step is one task, srun starts the two."""
    script = tmp_path / "train.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --ntasks=2\n"
        f"srun --label --kill-on-bad-exit=1 --mpi=none {sys.executable} {SCRIPTS / 'train.py'} --presets 2x4\n"
    )
    out = tmp_path / "out.txt"
    env = engine_env(4, {"SLURM_CONF": slurm.env["SLURM_CONF"]})
    with one_engine_job_at_a_time():
        result = subprocess.run(
            ["sbatch", "--wait", f"--output={out}", str(script)], env=env, capture_output=True, text=True, timeout=300
        )
    assert result.returncode == 0, result.stderr + (out.read_text() if out.exists() else "") + slurm.logs()
    reference = common.reference()
    for rank in (0, 1):
        (line,) = [s for s in out.read_text().splitlines() if s.startswith(f"{rank}: RESULT ")]
        result = json.loads(line.split("RESULT ", 1)[1])
        assert (result["spec"], result["process"], result["processes"]) == ("2x4", rank, 2)
        np.testing.assert_allclose(result["losses"], reference["2x4"][:4], rtol=1e-5)
