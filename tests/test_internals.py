"""The private-API modules: what they reach is checked at import, and a missing internal is named."""

import types

import pytest

import kdist
from kdist import jax_internals, keras_internals
from tests.subprocess_utils import run_python


@pytest.mark.parametrize("module", [keras_internals, jax_internals])
def test_every_needed_internal_is_there(module):
    module.check_internals()
    assert all(hasattr(obj, name) for obj, names in module.NEEDED.values() for name in names)


@pytest.mark.parametrize("module, library", [(keras_internals, "keras"), (jax_internals, "jax")])
def test_a_missing_internal_is_named_with_the_checked_version(module, library):
    gone = {"somewhere.private": (types.SimpleNamespace(), ("hook",))}
    with pytest.raises(kdist.VersionError) as caught:
        module.check_internals(gone)
    message = str(caught.value)
    assert "somewhere.private.hook" in message and f"{library}=={module.CHECKED}" in message


def test_keras_functions_are_wrapped_once_however_many_distributions_are_made():
    """Two wrappers share `distribute_tensor`; each must see the other's mark, or every preset adds a layer."""
    kdist.preset("fsdp")
    wrapped = keras_internals.jax_distribution_lib.distribute_tensor
    for spec in ("2x4", "fsdp=4,model=2", "dp"):
        kdist.preset(spec)
    assert keras_internals.jax_distribution_lib.distribute_tensor is wrapped


def test_planning_a_keras_model_does_not_import_tensorflow_and_reads_the_same_layer_configs():
    """Keras's serializer imports TensorFlow (4 s) only to check values for TF types; the planner's configs skip it."""
    code = """
import sys
import kdist
from kdist import keras_internals
from keras.src.utils import module_utils

model = kdist.abstract_model(kdist.models.tiny_transformer)
kdist.plan(model, devices=8, batch_size=16)
print("IMPORTED", "tensorflow" in sys.modules, module_utils.tensorflow._available)
without = [repr(keras_internals.layer_config(layer)) for layer in model.layers]
assert without, "the model has no layers to compare"
import tensorflow  # now Keras's serializer checks every value against TF's types
print("SAME", without == [repr(layer.get_config()) for layer in model.layers])
"""
    result = run_python(code, env={"KDIST_FAKE_DEVICES": "8"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IMPORTED False None" in result.stdout and "SAME True" in result.stdout, result.stdout
