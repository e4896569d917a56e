"""Verification: XLA's memory analysis of the real Keras training step compiled for each candidate mesh."""

import math

import jax
import keras
from jax.sharding import NamedSharding, PartitionSpec

from kdist.errors import PlanError, cause
from kdist.inspection.inspector import inspect, planned_optimizer
from kdist.jax_internals import (
    MEMORY_FIELDS,
    compile_train_step,
    compile_train_step_with_options,
    devices_seen_as,
    xla_memory,
)
from kdist.keras_internals import KerasTensor, deferred, rematerialize_nodes, symbolic_build
from kdist.planning.trace import TRACE_BATCH, label_shape, loss_reads
from kdist.presets import build_preset
from kdist.units import is_float


def verify(result, facts, specs=None, progress=None, devices=None, compiler_options=None):
    """Compile the step of every valid candidate (or those in `specs`) and record XLA's memory in `candidate.compiled`.

    `progress(spec)` is called before each candidate is compiled. `devices`:
    compile-only devices to compile for (a deviceless GPU topology), with
    `compiler_options` for XLA; default: this machine's devices.
    """
    n = result.devices
    if devices is None and jax.device_count() < n:
        raise PlanError(
            f"verify=True compiles on {n} devices, but JAX has {jax.device_count()}. Call "
            f"kdist.fake_devices({n}) before importing jax or keras, or run `kdist plan ... --verify --fake-devices "
            f"{n}`."
        )
    if not facts.is_model:
        raise PlanError(
            "verify=True compiles the model's training step, but the plan was given its variables: pass the model "
            "(or a function that builds it) to verify, or leave verify out to plan the variables' state."
        )
    if facts.inputs is None:
        raise PlanError(
            f"verify=True compiles the model's training step, which needs the shapes of its inputs, and model "
            f"{facts.name!r} has none: it is not a functional Keras model (no keras.Input). Build it as a functional "
            "or Sequential model from keras.Input to verify it, or leave verify out (the plan then counts its "
            "variables' state, not its activations)."
        )
    unknown = (specs or set()) - {c.spec for c in result.candidates} - {c.shape for c in result.candidates}
    if unknown:
        raise PlanError(
            f"verify names {sorted(unknown)}, which are not candidates: {[c.spec for c in result.candidates]}."
        )
    for c in result.candidates:
        if c.valid and (specs is None or c.spec in specs or c.shape in specs):
            if progress is not None:
                progress(c.spec)
            c.compiled = compiled_memory(facts, c, result.batch_size, devices, compiler_options)


def compiled_memory(facts, candidate, batch_size, devices=None, compiler_options=None):
    """XLA's memory analysis of the Keras training step of the model on `candidate`'s mesh.

    The model is rebuilt abstractly, compiled with the planned optimizer and a
    softmax cross-entropy loss on each float output of rank 2 or more (a mean
    squared error on one of rank 1, none on an integer one), and `model.train_step` is
    lowered from `jax.ShapeDtypeStruct`s carrying the candidate's shardings:
    nothing is allocated. With the plan's `remat=True` each node of the
    model's graph recomputes its forward in the backward, as the estimate
    has it. "backend" names the platform it was compiled for
    (on fake CPU devices the figure is a CPU proxy of an accelerator's) and
    "device_kind" the device. With compile-only `devices` (a deviceless GPU
    topology), `jax.devices()` answers them while the model is rebuilt and
    compiled, so code that probes the platform sees the GPU.
    """
    if devices is None:
        return _compiled_memory(facts, candidate, batch_size, jax.devices(), None)
    with devices_seen_as(devices):
        return {**_compiled_memory(facts, candidate, batch_size, devices, compiler_options), "deviceless": True}


def _compiled_memory(facts, candidate, batch_size, devices, compiler_options):
    if facts.optimizer is None:
        raise PlanError(
            "verify=True compiles a training step, which needs an optimizer: pass optimizer='adam' (or another)."
        )
    dist = build_preset(candidate.spec, devices=devices[: math.prod(candidate.axes.values())], rules=facts.rules_arg)
    mesh = dist.device_mesh.backend_mesh
    clone = _rebuild(facts)
    x = keras.tree.map_structure(lambda s: jax.ShapeDtypeStruct((batch_size, *s.shape[1:]), s.dtype), facts.inputs)
    optimizer = planned_optimizer(facts.optimizer)  # its scalars hold values: made outside the deferred scope
    try:
        y = _build_step(clone, x, optimizer, facts.traced.labels if facts.traced is not None else ())
    except Exception as e:  # Keras refusing the model's compiled step (a layer's own code, a loss per output)
        raise PlanError(
            f"verify could not build the training step of {clone.name!r} for {candidate.spec}: {cause(e, lines=3)}. "
            "The estimate does not need it: plan with verify=False, or report the model."
        ) from None
    if facts.remat:  # after the build: Keras builds the model by calling it symbolically, which a checkpoint refuses
        rematerialize_nodes(clone)
    specs = {r.path: r.spec for r in inspect(clone, dist).variables}

    def sharded(v):
        return jax.ShapeDtypeStruct(
            tuple(v.shape), v.dtype, sharding=NamedSharding(mesh, PartitionSpec(*specs[v.path]))
        )

    groups = (
        clone.trainable_variables,
        clone.non_trainable_variables,
        clone.optimizer.variables,
        clone.metrics_variables,
    )
    state = tuple([sharded(v) for v in group] for group in groups)

    def data_struct(s):
        if s is None:  # the labels of an output no loss reads
            return None
        axes = dist.get_data_layout(s.shape).axes
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))

    data = keras.tree.map_structure(data_struct, (x, y))
    with dist.scope():
        if compiler_options:
            compiled = compile_train_step_with_options(clone, state, data, compiler_options)
        else:
            compiled = compile_train_step(clone, state, data)
    memory = xla_memory(compiled)
    # "peak" is XLA's total, argument + output - alias + temp: every buffer of the step counted
    # once (the CPU backend's peak_memory_in_bytes leaves temporaries out, so it is not used).
    return {
        **{k: memory[k] for k in MEMORY_FIELDS},
        "xla_peak_memory": memory.get("peak") or 0,
        "peak": memory["total"],
        "backend": devices[0].platform,
        "device_kind": devices[0].device_kind,
        **_cost(compiled),
    }


def _build_step(clone, x, optimizer, traced):
    """Compile `clone` with Keras's sparse cross-entropy on every output and build it and its optimizer abstractly
    for inputs `x`; return the labels' structure. `traced`: the traced step's labels of each output its loss reads
    (`TracedStep.labels`), for the lengths and batch an output's spec does not know (PARSeq's decoder, SAM)."""
    with deferred():  # each output's own length (Whisper's encoder halves its frames), not the sequence given
        outputs = clone.compute_output_spec(keras.tree.map_structure(lambda s: KerasTensor(s.shape, s.dtype), x))
    batch = keras.tree.flatten(x)[0].shape[0]  # an output whose spec lost it (VideoPrism's reshapes) still has it
    traced = iter(traced)

    def labels(t):
        if not is_float(t.dtype):
            return None  # an integer output (an argmax): no gradient reaches the model through it
        if not loss_reads(t):  # a float output of rank 1 (a regression's): float targets
            return jax.ShapeDtypeStruct((batch, *t.shape[1:]), t.dtype)
        known = next(traced, (TRACE_BATCH, *label_shape(t.shape)[1:]))
        examples = batch if known[0] == TRACE_BATCH else known[0]  # 1: an output the batch shares (SAM's)
        return jax.ShapeDtypeStruct((examples, *known[1:]), "int32")  # known: what the layers make (SAM 3's logits)

    def loss(t):
        if not is_float(t.dtype):
            return None
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True) if loss_reads(t) else "mse"

    y = keras.tree.map_structure(labels, outputs)
    loss = keras.tree.map_structure(loss, outputs)
    if clone.dtype_policy.name == "mixed_float16":  # what compile() would wrap it in, inside the deferred scope
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    with deferred():
        clone.compile(optimizer=optimizer, loss=loss)
        symbolic_build(clone, (x, y))
        clone.optimizer.build(clone.trainable_variables)
    return y


def _cost(compiled):
    """XLA's cost analysis of the compiled step per device: "flops" and "bytes_accessed" ({} where it has none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # a backend without cost analysis: the figures are extras, not a reason to fail
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    out = {}
    if "flops" in cost:
        out["flops"] = float(cost["flops"])
    if "bytes accessed" in cost:
        out["bytes_accessed"] = float(cost["bytes accessed"])
    return out


def _rebuild(facts):
    if facts.build is not None:
        with deferred():
            return facts.build()
    model = facts.model
    try:
        with deferred():
            return model.__class__.from_config(model.get_config())
    except Exception as e:  # any failure of a user's get_config/from_config: say what to pass instead
        raise PlanError(
            f"verify=True rebuilds the model for each mesh, and {model.name!r} cannot be rebuilt from its config "
            f"({e}). "
            "Pass the function that builds it instead of the model: kdist.plan(build_fn, ...)."
        ) from None
