"""The model zoo: keras-hub entries with published and tiny configs."""

import os
import sys

import keras
import numpy as np
import pytest

from kdist import zoo
from kdist.rules import FAMILIES
from tests.subprocess_utils import run_python

pytest.importorskip("keras_hub")


def count(model):
    return sum(int(np.prod(v.shape)) for v in model.weights)


def test_one_tiny_entry_per_family():
    assert list(zoo.tiny_entries()) == list(FAMILIES)
    assert "tiny-llama3" in zoo.ENTRIES and "tiny-qwen3-moe" in zoo.ENTRIES


@pytest.mark.parametrize(
    "name, parameters",
    [
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.55e9),
        ("mixtral-8x7b", 46.70e9),
        ("gemma-2b", 2.51e9),
        ("bert-base", 0.1095e9),
        ("qwen3-moe-30b", 30.53e9),
    ],
)
def test_published_configs_build_abstractly_with_their_parameter_counts(name, parameters):
    keras.backend.clear_session(free_memory=False)
    model = zoo.load_model(name)  # abstract: nothing allocated
    assert count(model) == pytest.approx(parameters, rel=0.005)


def test_missing_keras_hub_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # makes `import keras_hub` fail
    with pytest.raises(ImportError, match=r"pip install --no-deps keras-hub.*kdist\[hub\]"):
        zoo.load_model("tiny-llama")


# A program's own run: which modules keras-hub's import brings in is decided once per process.
LINT_THEN_TENSORFLOW = """
import sys
from kdist.cli.main import main
assert main(["lint", "tiny-llama3", "--mesh", "2x4"]) == 0
print("tensorflow after the command:", "tensorflow" in sys.modules)
import tensorflow as tf
print("then importable:", hasattr(tf, "data"))
"""
LIBRARY = """
import sys
from kdist import zoo
with zoo.hub_models_only():
    pass
zoo.keras_hub()
print("tensorflow:", "tensorflow" in sys.modules)
"""


# A keras-hub that needs TensorFlow to start: the zoo imports it with TensorFlow after all.
NEEDS_TENSORFLOW = """
import sys
from kdist import zoo
with zoo.hub_models_only():
    hub = zoo.keras_hub()
print("tensorflow:", "tensorflow" in sys.modules, hub.TF_VERSION == sys.modules["tensorflow"].__version__)
"""


def _python(code, env=None):
    result = run_python(code, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_command_line_builds_keras_hub_models_without_importing_tensorflow():
    out = _python(LINT_THEN_TENSORFLOW)
    assert "tensorflow after the command: False" in out and "then importable: True" in out, out


def test_as_a_library_and_after_the_block_keras_hub_imports_as_it_always_does():
    assert "tensorflow: True" in _python(LIBRARY)  # its tokenizers keep TensorFlow


def test_a_keras_hub_that_needs_tensorflow_to_start_gets_it(tmp_path):
    (tmp_path / "keras_hub").mkdir()
    (tmp_path / "keras_hub" / "__init__.py").write_text("import tensorflow\nTF_VERSION = tensorflow.__version__\n")
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    assert "tensorflow: True True" in _python(NEEDS_TENSORFLOW, env={"PYTHONPATH": pythonpath})
