"""Weights read straight into their shards: each device gets only its slices, one variable at a time.

`Staging` collects, for a chosen set of variables, a new sharded array per
variable without touching the variables: an HDF5 dataset (`H5Weight`, from
Keras's weight loading, see `keras_internals.intercepted_weight_loads`) is
read slice by slice, `dataset[index]` for each device's index, so not even
the whole variable need sit in host memory; any other value (a layer that
computes its weights on load) is cut into slices from host memory. Only when
everything has been read does `commit` give the variables their arrays: a
load that fails leaves every variable as it was.
"""

import jax
import ml_dtypes
import numpy as np

from kdist.checkpoint.peak_memory import sample_active
from kdist.checkpoint.restore import assign_all
from kdist.errors import CheckpointError, cause
from kdist.keras_internals import array_of, own_layout
from kdist.keras_internals.loading import is_deferred, materialize


class H5Weight:
    """An HDF5 dataset not read yet: its shape, dtype and any slice of it on demand.

    Keras stores bfloat16 weights as 16-bit data marked "bfloat16"; those
    are read as `ml_dtypes.bfloat16`, as Keras reads them.
    """

    def __init__(self, dataset, stored_dtype=None):
        self.dataset = dataset
        self.name = dataset.name
        self.shape = tuple(dataset.shape)
        self.dtype = np.dtype(ml_dtypes.bfloat16) if stored_dtype == "bfloat16" else dataset.dtype

    def read(self, index=()):
        """The slice `index` (a tuple of slices) as a numpy array of `self.dtype`."""
        data = self.dataset[index] if self.shape else self.dataset[()]
        return np.asarray(data).view(self.dtype) if self.dtype == ml_dtypes.bfloat16 else np.asarray(data)

    def __array__(self, dtype=None, copy=None):
        # A layer that computes on the stored value (not a plain assign) reads it whole: one variable on host.
        data = self.read()
        return data if dtype is None else data.astype(dtype)

    def __repr__(self):
        return f"<H5Weight {self.name} {self.shape} {self.dtype}>"


class Staging:
    """New arrays for `variables`, built one at a time on each one's target sharding, assigned only by `commit`.

    `resolve(variable)` gives the target of a variable this load owns,
    `(variable, layout, sharding)` (see `target_of`), or None for one it does
    not (its `assign` then runs as usual).
    """

    def __init__(self, resolve, source):
        self.resolve = resolve
        self.source = source
        self.targets = {}  # id(variable) -> (variable, layout, sharding), for each staged variable
        self.arrays = {}  # id(variable) -> its new array
        self.error = None  # the first error raised while staging (Keras wraps it in its own)

    def stage(self, variable, value):
        """Read `value` into a new array for `variable`; False for a variable this load does not own."""
        target = self.targets.get(id(variable)) or self.resolve(variable)
        if target is None:
            return False
        self.targets[id(variable)] = target
        try:
            self.arrays[id(variable)] = self._read(variable, value, target[2])
        except CheckpointError as e:
            self.error = self.error or e
            raise
        except Exception as e:
            self.error = self.error or CheckpointError(
                f"Cannot read the value of {variable.path!r} from {self.source}: {cause(e)}"
            )
            raise self.error from e
        sample_active()
        return True

    def _read(self, variable, value, sharding):
        shape, dtype = tuple(variable.shape), np.dtype(jax.numpy.dtype(variable.dtype))
        if tuple(getattr(value, "shape", ())) != shape:
            raise CheckpointError(
                f"{self.source} does not fit the model: {getattr(value, 'name', 'its value')} has shape "
                f"{tuple(getattr(value, 'shape', ()))}, the model's variable {variable.path!r} has shape {shape}."
            )
        if isinstance(value, jax.Array):
            value = value.astype(dtype)
            return value if sharding is None else jax.device_put(value, sharding)
        read = value.read if isinstance(value, H5Weight) else np.asarray(value).__getitem__
        if sharding is None:
            return jax.numpy.asarray(np.asarray(read(())).astype(dtype, copy=False))
        slices = {}  # one read per distinct slice: replicated devices share it

        def callback(index):
            key = tuple((s.start, s.stop, s.step) for s in index)
            if key not in slices:
                slices[key] = np.asarray(read(tuple(index))).astype(dtype, copy=False)
                sample_active()
            return slices[key]

        return jax.make_array_from_callback(shape, sharding, callback)

    def put(self, target, array):
        """Stage an array read elsewhere (a sharded checkpoint) for `target`'s variable."""
        self.targets[id(target[0])] = target
        self.arrays[id(target[0])] = array

    def commit(self):
        """Give every staged variable its new array: deferred ones take theirs with their layout, live ones all
        or nothing (every live variable is put back if one assignment fails)."""
        live = {}
        for key, array in self.arrays.items():
            variable, layout, _ = self.targets[key]
            if is_deferred(variable):
                materialize(variable, layout, array)
            else:
                live[key] = (variable, array)
        assign_all({k: v for k, (v, _) in live.items()}, {k: a for k, (_, a) in live.items()})
        self.arrays.clear()


def target_of(variable, distribution):
    """(variable, layout, sharding) to load `variable` onto.

    A live variable is read onto the sharding of the array it holds (its own
    layout kept; an uncommitted array stays uncommitted: sharding None); a
    deferred one onto the layout `distribution` gives it (no distribution:
    one device, uncommitted, as Keras keeps arrays without one).
    """
    value = array_of(variable)
    if value is not None:
        committed = own_layout(variable) is not None or value.committed
        return variable, own_layout(variable), value.sharding if committed else None
    if distribution is None:
        return variable, None, None
    layout = distribution.get_variable_layout(variable)
    return variable, layout, getattr(layout, "backend_layout", layout)
