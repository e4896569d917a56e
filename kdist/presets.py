"""Mesh presets: a spec string in, a Keras DeviceMesh or Distribution out."""

import numpy as np

from kdist.distribution import ShardedDistribution
from kdist.errors import SpecError
from kdist.parallel_dims import AUTO_NEEDS, ParallelDims
from kdist.rules import AUTO, Rule, RuleSet, get_rules


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
    return _build(spec, devices, axis_names)[1]


def preset(spec, *, devices=None, axis_names=None, rules=None, model=None, **plan_options):
    """Build a `keras.distribution.Distribution` from a spec string.

    Presets with a model or expert axis shard variables with layout rules:
    by default kdist's rules for Keras core layers (Dense, EinsumDense,
    Embedding, MultiHeadAttention, Conv). "dp" replicates the weights (like
    `tf.distribute.MirroredStrategy`); "fsdp" shards weights and optimizer
    state over the data-parallel devices (ZeRO-3 style).

    Example:

    ```python
    import kdist, keras
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256), keras.layers.Dense(10)])
    ```

    Args:
        spec: see `kdist.mesh`. "auto" asks `kdist.plan` for the best mesh of
            the devices for `model` and uses its recommendation:
            `kdist.preset("auto", model=model, batch_size=64)`.
        devices: see `kdist.mesh`.
        axis_names: see `kdist.mesh`.
        rules: a `kdist.RuleSet`, a `keras.distribution.LayoutMap`, a list of
            `(pattern, axes)` pairs, the name of a rule set ("llama", "gemma",
            "keras-core", ...: see `kdist.get_rules`), the path of a `.json` or
            `.toml` rules file, or None / "auto" (the default): every keras-hub
            family's rules, then the Keras core rules, so the variable paths
            pick the family.
        model: with "auto": the model to plan for (built, possibly abstractly).
        **plan_options: with "auto": `batch_size` (required) and the other
            keyword arguments of `kdist.plan` (sequence_length, optimizer,
            memory_per_device, ...).
    """
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        spec = _auto_spec(model, devices, rules, plan_options)
    elif model is not None or plan_options:
        raise TypeError(f"model= and plan options ({sorted(plan_options)}) are for kdist.preset(\"auto\", ...); received spec {spec!r}.")
    dims, device_mesh = _build(spec, devices, axis_names)
    return ShardedDistribution(device_mesh, resolve_rules(rules, dims), roles=dims.roles, spec=spec)


def _auto_spec(model, devices, rules, plan_options):
    if model is None or "batch_size" not in plan_options:
        raise SpecError(AUTO_NEEDS)
    from kdist.planner import PlanError, plan

    result = plan(model, len(_jax_devices(devices)), rules=rules, **plan_options)
    if result.recommendation is None:
        raise PlanError(f'kdist.preset("auto"): {result.advice}')
    return result.recommendation.spec


def _build(spec, devices, axis_names):
    from jax.experimental import mesh_utils
    from keras.distribution import DeviceMesh

    devices = _jax_devices(devices)
    dims = ParallelDims.parse(spec, len(devices))
    names = _axis_names(spec, dims, axis_names)
    ordered = mesh_utils.create_device_mesh(dims.shape, devices, allow_split_physical_axes=True)
    return dims, DeviceMesh(dims.shape, names, ordered)


def _axis_names(spec, dims, axis_names):
    if axis_names is None:
        return list(dims.roles)
    axis_names = list(axis_names)
    if len(axis_names) != len(dims.axes) or len(set(axis_names)) != len(axis_names):
        raise SpecError(
            f"Mesh spec {spec!r} has axes {list(dims.roles)}, so axis_names needs "
            f"{len(dims.axes)} distinct names; received axis_names={axis_names}."
        )
    return axis_names


def _jax_devices(devices):
    """The jax devices named by `devices` (jax devices or strings such as "cpu:0"); all of them for None."""
    import jax

    if devices is None:
        return jax.devices()
    by_name = {f"{d.platform}:{d.id}": d for d in jax.devices()}
    resolved = []
    for d in devices:
        if isinstance(d, str):
            if d.lower() not in by_name:
                raise SpecError(f"Unknown device {d!r}; known devices are {sorted(by_name)}.")
            d = by_name[d.lower()]
        resolved.append(d)
    return np.array(resolved).ravel().tolist()


def resolve_rules(rules, dims):
    from keras.distribution import LayoutMap

    if rules is None or (isinstance(rules, str) and rules == "auto"):
        uses_rules = any(role in ("model", "expert") for role in dims.roles)
        return AUTO if uses_rules else RuleSet(name="none")
    if isinstance(rules, str) or hasattr(rules, "__fspath__"):
        return get_rules(rules)
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, LayoutMap):
        return RuleSet([Rule(key, tuple(layout.axes)) for key, layout in rules._layout_map.items()], name="layout-map")
    if isinstance(rules, (list, tuple)):
        return RuleSet(rules)
    raise TypeError(
        "rules must be a kdist.RuleSet, a keras.distribution.LayoutMap, a list of "
        "(pattern, axes) pairs, a rule set name or rules file path, None or 'auto'; "
        f"received {type(rules).__name__}."
    )
