"""Numpy inputs in multi-process runs: 2 launched processes x 4 fake CPU devices against 8 devices in this process.

Two launches (about 15-25 s each on 2 shared cores): the README's first
example, verbatim, and `launch_scripts/numpy_inputs.py` (fit, evaluate,
predict, own-rows inputs, processes passing different data); and the README
example under `mpirun -n 2` where Open MPI is installed (about 30 s).
"""

import contextlib
import io
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import kdist
from kdist.cluster.launcher import is_gloo_noise
from kdist.global_batches import check_same_in_every_process, gather_outputs
from tests.cluster.engine_runs import one_engine_job_at_a_time
from tests.launch_scripts import numpy_inputs
from tests.subprocess_utils import clean_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "launch_scripts"
README_SCRIPT = SCRIPTS / "readme.py"
MPIRUN = shutil.which("mpirun")
PRINT_LOSSES = (  # the README example as `python readme.py` runs it, then its losses
    "import runpy; ns = runpy.run_path('readme.py', run_name='__main__'); "
    "print('LOSSES', ns['model'].history.history['loss'])"
)


def _launch(command):
    terminal = io.StringIO()  # what `kdist launch` would show
    result = kdist.launch(
        command, num_processes=2, devices_per_process=4, cwd=str(SCRIPTS), capture=True, stream=terminal, timeout=240
    )
    assert result.returncode == 0, result.report()
    return result, terminal.getvalue()


def _tagged(result, tag):
    """Each rank's lines starting with `tag`, without it."""
    return [[line[len(tag) :].strip() for line in out if line.startswith(tag)] for out in result.outputs]


def _readme_example():
    text = (ROOT / "README.md").read_text()
    return re.search(r"^```python\n(.*?)^```", text, re.S | re.M).group(1)


def test_the_readme_script_is_the_readmes_first_example_verbatim():
    script = README_SCRIPT.read_text()
    assert script.splitlines()[0].startswith("# ruff: noqa")  # a header line for the linter, then the example
    assert script.split("\n", 1)[1] == _readme_example()
    assert "model.fit(x, y, batch_size=64)" in script  # numpy arrays, not a dataset


@pytest.fixture(scope="module")
def readme_run():
    return _launch(["-c", PRINT_LOSSES])


@pytest.fixture(scope="module")
def readme_alone():
    """The README example's losses in this process, on 8 devices."""
    with contextlib.redirect_stdout(io.StringIO()):
        return runpy.run_path(str(README_SCRIPT), run_name="__main__")["model"].history.history["loss"]


def _losses(lines):
    return [json.loads(tagged[-1].replace("'", '"')) for tagged in lines]


def test_the_readme_example_trains_as_two_processes_with_the_losses_of_one(readme_run, readme_alone):
    result, terminal = readme_run
    launched = _losses(_tagged(result, "LOSSES"))
    assert len(readme_alone) == 1 and launched[0] == launched[1]
    np.testing.assert_allclose(launched[0], readme_alone, rtol=1e-6)
    assert "Memory per device (mesh data=2, model=4)" in terminal


@pytest.mark.skipif(MPIRUN is None, reason="Open MPI's mpirun is not installed")
def test_the_readme_example_under_mpirun_has_the_losses_of_one_process(readme_alone, tmp_path):
    env = clean_env()
    env.update(KDIST_FAKE_DEVICES="4", PYTHONPATH=str(ROOT))  # the example's own kdist.initialize() joins the job
    # Each rank's output in a file of its own: on mpirun's merged stdout the ranks' lines can interleave.
    outputs = tmp_path / "ranks"
    command = [
        *(MPIRUN, "-n", "2", "--allow-run-as-root", "--oversubscribe", "--output-filename", str(outputs)),
        *(sys.executable, "-c", PRINT_LOSSES),
    ]
    with (
        one_engine_job_at_a_time(),
        subprocess.Popen(
            command, env=env, cwd=SCRIPTS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        ) as proc,
    ):
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail("mpirun -n 2 did not end within 240 s:\n" + output.decode(errors="replace")[-3000:])
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    ranks = [(outputs / "1" / f"rank.{rank}" / "stdout").read_text().splitlines() for rank in (0, 1)]
    launched = _losses([[line[len("LOSSES") :] for line in lines if line.startswith("LOSSES")] for lines in ranks])
    assert len(launched) == 2 and launched[0] == launched[1], text[-3000:]
    np.testing.assert_allclose(launched[0], readme_alone, rtol=1e-6)


def test_the_launcher_shows_no_gloo_lines(readme_run):
    result, terminal = readme_run
    assert "[rank 0] " in terminal and "[rank 1] " in terminal
    assert "Gloo" not in terminal and not any("Gloo" in line for out in result.outputs for line in out)


def test_gloo_lines_are_recognised_even_when_their_pieces_interleave():
    full = "[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"
    interleaved = [
        "[Gloo] Rank [Gloo] Rank 6 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
        "7 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
        "[Gloo] Rank 4 is connected to [Gloo] Rank 5 is connected to 7 peer ranks. Expected number of connected "
        "peer ranks is : 7",
        "7 peer ranks. Expected number of connected peer ranks is : 7",
        "[Gloo] Rank 1 is connected to 1 peer ranks. [Gloo] Rank 1 is connected to 1 peer ranks. Expected number of "
        "connected peer ranks is : 1",
        "Expected number of connected peer ranks is : 1",
    ]  # as seen from launched processes (Gloo writes "peer ranks. " and "Expected number ..." separately)
    assert is_gloo_noise(full) and all(is_gloo_noise(line) for line in interleaved)
    for own in ("7", "Rank 3", "loss 7 is connected to", "", "[Gloo] something else"):
        assert not is_gloo_noise(own), own


@pytest.fixture(scope="module")
def numpy_run():
    result, _ = _launch(["numpy_inputs.py"])
    return [json.loads(lines[-1]) for lines in _tagged(result, "RESULT")]


def test_fit_evaluate_predict_on_numpy_arrays_as_two_processes_match_one(numpy_run):
    reference = numpy_inputs.global_results()  # this process: 8 devices
    for got in numpy_run:
        assert got["processes"] == 2
        for key in ("shuffled", "in_order", "evaluate"):
            np.testing.assert_allclose(got[key], reference[key], rtol=1e-5, err_msg=key)
        for key in ("predict", "predict_on_batch"):  # every process gets the whole output
            np.testing.assert_allclose(got[key], reference[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert np.shape(numpy_run[0]["predict"]) == (64, 4) and np.shape(numpy_run[0]["predict_on_batch"]) == (16, 4)


def test_processes_passing_their_own_rows_with_auto_shard_dataset_false_train_alike(numpy_run):
    for got in numpy_run:
        np.testing.assert_allclose(got["own_rows"], got["in_order"], rtol=1e-5)


def test_processes_passing_different_data_get_a_kdist_error_in_every_process(numpy_run):
    for got in numpy_run:
        assert got["mismatch"].startswith("ArgumentError: The processes of this run passed different input data")
        assert "differs between process 0 and process(es) [1]" in got["mismatch"]
        assert "keras.utils.set_random_seed" in got["mismatch"] and "auto_shard_dataset=False" in got["mismatch"]


# --- In this process (one process, 8 devices) ---------------------------------------------------------


def _keras_trainer():
    from keras.src.backend.jax.trainer import JAXTrainer  # a private Keras class, for this test only

    return JAXTrainer


def _keras_distribution_lib():
    from keras.src.backend.jax import distribution_lib  # a private Keras module, for this test only

    return distribution_lib


@pytest.mark.parametrize(
    "owner, where, name",
    [
        (_keras_distribution_lib, "keras.src.backend.jax.distribution_lib", "distribute_data_input"),
        (_keras_trainer, "keras.src.backend.jax.trainer.JAXTrainer", "make_predict_function"),
    ],
)
def test_a_keras_without_the_hooks_kdist_needs_gets_a_kdist_error_naming_the_versions(monkeypatch, owner, where, name):
    import keras

    monkeypatch.delattr(owner(), name)
    with pytest.raises(
        kdist.VersionError,
        match=rf"needs Keras's {re.escape(where)}\.{name}, which keras {re.escape(keras.__version__)} does not "
        r"have; kdist was checked with keras 3\.15\.1",
    ):
        kdist.preset("dp")


def test_one_process_lays_out_batches_as_keras_does_and_predicts_whole_outputs():
    dist = kdist.preset("2x4")
    x = np.random.default_rng(0).random((16, 28, 28, 1), dtype=np.float32)
    with dist.scope():
        model = kdist.models.mnist_mlp()
        predicted = model.predict(x, batch_size=8, verbose=0)
        assert isinstance(predicted, np.ndarray) and predicted.shape == (16, 10)
        np.testing.assert_allclose(model.predict_on_batch(x), predicted, rtol=1e-5, atol=1e-6)
    check_same_in_every_process(x)  # one process: nothing to differ from
    array = jax.device_put(x, dist.get_data_layout(x.shape).backend_layout)
    assert gather_outputs({"out": array})["out"] is array  # fully addressable: left alone
