"""The private-API modules: what they reach is checked at import, and a missing internal is named."""

import types

import pytest

import kdist
from kdist import jax_internals, keras_internals


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
