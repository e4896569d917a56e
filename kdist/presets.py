"""Mesh presets: a spec string in, a Keras `DeviceMesh` or `Distribution` out.

`kdist.preset(spec)` itself also takes "auto", which asks the planner:
that entry point lives in `kdist.planning.auto`, above the planner, and
calls `build_preset` here for every explicit spec.
"""

import os

import jax
from jax.experimental import mesh_utils
from keras.distribution import DeviceMesh

from kdist.devices import resolve_devices
from kdist.distribution import ShardedDistribution
from kdist.errors import SpecError
from kdist.meshes.spec import ParallelDims, parse_spec

NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"  # what `kdist launch` and Keras's initialize() read


def mesh(spec, *, devices=None, axis_names=None):
    """Build a `keras.distribution.DeviceMesh` from a spec string.

    Devices are ordered by `jax.experimental.mesh_utils` so that the last axis
    (the model axis, which communicates most) maps to the best interconnect.

    Example:

    ```python
    kdist.fake_devices(8)
    m = kdist.mesh("2x4")                                   # axes ("data", "model")
    m = kdist.mesh("data=-1,model=2")                      # shape (4, 2)
    m = kdist.mesh("2x4", axis_names=("batch", "model"))   # Keras's naming
    ```

    Args:
        spec: "NxM", "NxFxM", "dp", "tp", "fsdp" or named axes ("data=2,model=4").
        devices: the devices to use (jax devices or Keras strings such as
            "cpu:0"); defaults to all devices.
        axis_names: mesh axis names, one per axis; defaults to the roles
            ("data", "fsdp", "model", "expert").
    """
    return build_mesh(spec, devices, axis_names)[1]


def build_mesh(spec, devices=None, axis_names=None):
    """`(ParallelDims, DeviceMesh)` of `spec` on `devices` (all by default)."""
    parsed = parse_spec(spec)  # a malformed spec fails before any device is touched
    chosen = devices
    devices = resolve_devices(devices)
    try:
        dims = parsed.resolve(len(devices))
    except SpecError:
        if chosen is None:
            _check_cluster_joined(spec, len(devices))
        raise
    if axis_names is not None:
        if isinstance(axis_names, str) or not hasattr(axis_names, "__iter__"):
            axis_names = (axis_names,)
        dims = ParallelDims(dims.spec, dims.axes, tuple(axis_names))
    ordered = mesh_utils.create_device_mesh(dims.shape, devices, allow_split_physical_axes=True)
    return dims, DeviceMesh(dims.shape, list(dims.names), ordered)


def build_preset(spec, *, devices=None, axis_names=None, rules=None):
    """A `ShardedDistribution` for an explicit spec (not "auto"): see `kdist.preset`."""
    dims, device_mesh = build_mesh(spec, devices, axis_names)
    return ShardedDistribution(device_mesh, rules, roles=dims.roles, spec=spec)


def _check_cluster_joined(spec, num_devices):
    """A launched process that forgot `kdist.initialize()` sees only its own devices: say so, not "too few"."""
    processes = os.environ.get(NUM_PROCESSES, "1")
    if jax.process_count() == 1 and processes.isdigit() and int(processes) > 1:
        raise SpecError(
            f"Mesh spec {spec!r} needs more than the {num_devices} device(s) this process sees, and this process is "
            f"one of {processes} of a multi-process run ({NUM_PROCESSES}={processes}) that it has not joined: call "
            "kdist.initialize() first thing in the script, before building a preset, so that JAX sees the devices "
            "of every process."
        ) from None
