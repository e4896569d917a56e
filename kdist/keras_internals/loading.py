"""Keras internals that only `kdist.load` reaches: its weight-file reads, variable creation and assignment.

Checked against keras 3.15.1, like the package (`kdist.keras_internals.CHECKED`).
"""

import contextlib

import keras

from kdist.keras_internals import check_internals, missing_module, patched, set_array

try:
    from keras.src.saving import saving_lib
except ImportError as e:
    raise missing_module(e) from e

check_internals({"keras.src.saving.saving_lib": (saving_lib, ("H5IOStore", "safe_get_h5_dataset"))})


@contextlib.contextmanager
def intercepted_weight_loads(wrap_dataset, stage):
    """Inside the block, Keras's weight loading hands each HDF5 dataset to `stage` instead of reading it.

    Keras's `load_weights` (and keras-hub's `from_preset`, which calls it)
    walks the model and, per layer, calls `variable.assign(store[str(i)])`,
    where `saving.saving_lib.H5IOStore.__getitem__` reads the whole dataset
    into host memory. Here `__getitem__` returns `wrap_dataset(dataset, dtype)`
    (the h5py dataset, after Keras's own safety checks, and "bfloat16" when
    Keras stored it as such, else None) without reading it, and
    `keras.Variable.assign(variable, value)` calls `stage(variable, value)`;
    when it returns False, the real `assign` runs. Checked against keras 3.15.1.
    """
    original_assign = keras.Variable.assign

    def getitem(self, key):
        dataset = saving_lib.safe_get_h5_dataset(self._h5_entry_group, key)
        dtype = "bfloat16" if dataset.attrs.get("dtype") == "bfloat16" else None
        return wrap_dataset(dataset, dtype)

    def assign(variable, value):
        if stage(variable, value):
            return value
        return original_assign(variable, value)

    with patched(saving_lib.H5IOStore, "__getitem__", getitem), patched(keras.Variable, "assign", assign):
        yield


def is_deferred(variable):
    """Whether a variable was made under `deferred()` and has no value yet (`_value`, `_initializer`)."""
    return getattr(variable, "_value", None) is None and getattr(variable, "_initializer", None) is not None


def materialize(variable, layout, value):
    """Give a deferred (or live) variable its array and layout; a deferred one forgets its initializer."""
    variable._initializer = None
    set_array(variable, layout, value)


def initialize_deferred(variable):
    """Run a deferred variable's initializer now, under the current distribution (`_deferred_initialize`)."""
    variable._deferred_initialize()
