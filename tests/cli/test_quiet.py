"""Quiet by default: commands start without TensorFlow's start-up lines, and importing kdist prints nothing."""

import subprocess
import sys

from tests.subprocess_utils import clean_env

NOISE = ("oneDNN", "absl::InitializeLog", "cuda_", "TF_ENABLE_ONEDNN_OPTS", "computation_placer")


def _clean_env():
    env = {k: v for k, v in clean_env().items() if not k.startswith("TF_")}
    env["COLUMNS"] = "100"
    return env


def test_a_command_that_loads_tensorflow_prints_none_of_its_start_up_lines(tmp_path):
    (tmp_path / "tf_model.py").write_text(
        "import tensorflow  # noqa: F401  (a user's module that imports TensorFlow)\n"
        "import kdist\n\n\ndef build():\n    return kdist.models.mnist_mlp()\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "kdist", "lint", "tf_model:build", "--mesh", "2x4"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stderr.splitlines() if any(word in line for word in NOISE)], result.stderr


def test_importing_kdist_prints_nothing():
    result = subprocess.run(
        [sys.executable, "-c", "import kdist"], capture_output=True, text=True, env=_clean_env(), timeout=120
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stderr


def test_version_and_python_dash_m():
    import kdist

    result = subprocess.run(
        [sys.executable, "-m", "kdist", "--version"], capture_output=True, text=True, env=_clean_env(), timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == f"kdist {kdist.__version__}"
