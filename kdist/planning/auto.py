"""`kdist.preset`: an explicit spec, or "auto", which asks the planner for the best mesh of the devices."""

from kdist.devices import resolve_devices
from kdist.errors import ArgumentError, PlanError, SpecError
from kdist.meshes.spec import AUTO_NEEDS
from kdist.planning.planner import plan
from kdist.presets import build_preset


def preset(spec, *, devices=None, axis_names=None, rules=None, model=None, **plan_options):
    """Build a `keras.distribution.Distribution` from a spec string.

    Presets with a model or expert axis shard variables with layout rules:
    by default kdist's rules for keras-hub families and Keras core layers
    (Dense, EinsumDense, Embedding, MultiHeadAttention, Conv). "dp" replicates
    the weights (like `tf.distribute.MirroredStrategy`); "fsdp" shards weights
    and optimizer state over the data-parallel devices (ZeRO-3 style).

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
        rules: a `kdist.RuleSet`, a `keras.distribution.LayoutMap` (Keras's
            lookup is kept: exact key, then `re.fullmatch`, several matches are
            an error; "<layer>/output" keys lay out activations), a list of
            `(pattern, axes)` pairs, the name of a rule set ("llama", "gemma",
            "keras-core", ...: see `kdist.get_rules`), the path of a `.json` or
            `.toml` rules file, or None / "auto" (the default): every keras-hub
            family's rules, then the Keras core rules, so the variable paths
            pick the family.
        model: with "auto": the model to plan for (built, possibly abstractly).
        **plan_options: with "auto": `batch_size` (required) and the other
            keyword arguments of `kdist.plan` (sequence_length, optimizer,
            memory_per_device, target, remat, margin, ...): the mesh is the
            plan's recommendation, from the same memory model.
    """
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        spec = _auto_spec(model, devices, rules, plan_options)
    elif model is not None or plan_options:
        raise ArgumentError(
            f'model= and plan options ({sorted(plan_options)}) are for kdist.preset("auto", ...); received spec '
            f"{spec!r}."
        )
    return build_preset(spec, devices=devices, axis_names=axis_names, rules=rules)


def _auto_spec(model, devices, rules, plan_options):
    if model is None or "batch_size" not in plan_options:
        raise SpecError(AUTO_NEEDS)
    result = plan(model, len(resolve_devices(devices)), rules=rules, **plan_options)
    if result.recommendation is None:
        raise PlanError(f'kdist.preset("auto"): {result.advice}')
    return result.recommendation.spec
