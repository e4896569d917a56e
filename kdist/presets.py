"""Mesh presets: a spec string in, a Keras `DeviceMesh` or `Distribution` out.

`kdist.preset(spec)` itself also takes "auto", which asks the planner:
that entry point lives in `kdist.planning.auto`, above the planner, and
calls `build_preset` here for every explicit spec.
"""

from jax.experimental import mesh_utils
from keras.distribution import DeviceMesh

from kdist.cluster.engines import check_not_alone
from kdist.devices import resolve_devices
from kdist.distribution import ShardedDistribution
from kdist.meshes.spec import ParallelDims, parse_spec


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
    check_not_alone(f"the mesh {spec!r}")  # one of several tasks of a job it has not joined: say so
    devices = resolve_devices(devices)
    dims = parsed.resolve(len(devices))
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
