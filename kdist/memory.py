"""Memory: reading sizes ("80GB", "80GiB", "8e10"), XLA's memory analysis of a compiled training step, and
tracing what a training step keeps for its backward pass."""

import functools
import math
import re

from kdist.abstract import deferred
from kdist.errors import KdistError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)(/s)?")
TRACE_BATCH = 7919  # a prime batch size, so batch dimensions are recognisable in traced shapes
MEMORY_FIELDS = ("argument", "output", "alias", "temp")  # the *_size_in_bytes of XLA's memory analysis
SIZE_FORMS = (
    'a number of bytes (80000000000, "8e10"), or a number with a unit: decimal '
    '"KB", "MB", "GB", "TB" (powers of 1000) or binary "KiB", "MiB", "GiB", "TiB" '
    '(powers of 1024), e.g. "80GB" or "80GiB"'
)


class SizeError(KdistError, ValueError):
    """A memory size or bandwidth such as "80GB" could not be read."""


def parse_size(value, name="size"):
    """Bytes in `value`: an int, a float, or a string such as "80GB", "80GiB", "8e10".

    Units are case-insensitive; "GB" is 10**9 bytes, "GiB" 2**30. A trailing
    "/s" is accepted, so bandwidths read the same way ("100GB/s").

    Example:

    >>> parse_size("80GB"), parse_size("80GiB"), parse_size("8e10"), parse_size(1024)
    (80000000000, 85899345920, 80000000000, 1024)

    Args:
        value: the size.
        name: what the size is for, named in errors (e.g. "memory_per_device").

    Raises:
        SizeError: `value` is not a size, or is not positive.
    """
    if isinstance(value, bool):
        raise SizeError(f"{name}={value!r} is not a size. Give {SIZE_FORMS}.")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip().lower().replace(" ", ""))
        if match is None or match.group(3) not in _UNITS:
            raise SizeError(f"{name}={value!r} is not a size. Give {SIZE_FORMS}.")
        mantissa, exponent, unit, _ = match.groups()
        number = float(mantissa) * 10 ** int(exponent or 0) * _UNITS[unit]
    else:
        raise SizeError(f"{name} must be a number or a string such as '80GB'; received {type(value).__name__} {value!r}.")
    if not math.isfinite(number) or number <= 0:
        raise SizeError(f"{name}={value!r} must be a positive size. Give {SIZE_FORMS}.")
    return int(round(number))


def compile_train_step(model, state, batch):
    """`model.train_step` compiled ahead of time as Keras's `make_train_function` jits it.

    The state (trainable, non-trainable, optimizer and metric values) is
    donated and keeps its shardings. `state` and `batch` are arrays or
    `jax.ShapeDtypeStruct`s carrying shardings (then nothing is allocated).
    """
    import jax

    shardings = jax.tree.map(lambda a: a.sharding, state)
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, shardings))
    return step.lower(state, batch).compile()


def xla_memory(compiled):
    """XLA's memory analysis of a compiled step, in bytes per device; {} where jax reports none.

    The MEMORY_FIELDS, "total" = argument + output - alias + temp (every buffer
    of the step counted once), and "peak" where jax reports one (the CPU
    backend's leaves temporaries out).
    """
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    memory = {k: int(getattr(analysis, f"{k}_size_in_bytes")) for k in MEMORY_FIELDS}
    memory["total"] = memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
    peak = getattr(analysis, "peak_memory_in_bytes", None)
    if peak is not None:
        memory["peak"] = int(peak)
    return memory


def saved_activations(model, inputs):
    """What autodiff saves for the backward pass of one step at batch TRACE_BATCH.

    Each layer of the functional graph is traced once per distinct (class,
    weight shapes, input shapes) with `saved_residuals`: a Llama with 126
    identical blocks traces one block. Returns [(shape, itemsize, count,
    is_float)], or None for a model without a layer graph.
    """
    import jax
    import keras
    from jax._src.ad_checkpoint import saved_residuals
    from keras.src.backend.common.keras_tensor import KerasTensor
    from keras.src.models.functional import operation_fn

    functional = getattr(model, "_functional", None) or model
    nodes_by_depth = getattr(functional, "_nodes_by_depth", None)
    if not nodes_by_depth:
        return None
    structs = dict(zip((id(t) for t in keras.tree.flatten(functional._inputs_struct)), keras.tree.flatten(inputs)))

    def struct(t):
        if id(t) in structs:
            return structs[id(t)]
        dims = [TRACE_BATCH if (d is None and i == 0) else d for i, d in enumerate(t.shape)]
        seq = next((s.shape[1] for s in structs.values() if len(s.shape) > 1), 1)
        return jax.ShapeDtypeStruct(tuple(seq if d is None else d for d in dims), t.dtype)

    cache, counts = {}, {}
    aliases = {id(t) for t in keras.tree.flatten(functional._inputs_struct)}  # the batch itself is counted as input
    with deferred():
        for depth in sorted(nodes_by_depth, reverse=True):
            for node in nodes_by_depth[depth]:
                if node.is_input or node.operation is None:
                    continue
                op = node.operation
                raw = (node.arguments.args, node.arguments.kwargs)
                args = keras.tree.map_structure(lambda x: struct(x) if isinstance(x, KerasTensor) else x, raw)
                tensors = [x for x in jax.tree.leaves(raw, is_leaf=lambda x: isinstance(x, KerasTensor)) if isinstance(x, KerasTensor)]
                inputs_here = tuple(i for i, t in enumerate(tensors) if id(t) in aliases)
                if inputs_here and type(op).__name__ in ("Flatten", "Reshape"):
                    aliases.update(id(t) for t in node.outputs)  # a view of the input batch, not a copy
                variables = list(getattr(op, "trainable_variables", [])) + list(getattr(op, "non_trainable_variables", []))
                key = (type(op).__name__, tuple((tuple(v.shape), str(v.dtype)) for v in variables), repr(args), inputs_here)
                counts[key] = counts.get(key, 0) + 1
                if key not in cache:
                    cache[key] = _layer_residuals(op, variables, args, operation_fn, saved_residuals, inputs_here)
        outputs = keras.tree.flatten(functional._outputs_struct)
        loss_residuals = _loss_residuals([struct(o) for o in outputs], saved_residuals)
    merged = {}
    for key, residuals in cache.items():
        for r in residuals:
            merged[r] = merged.get(r, 0) + counts[key]
    for r in loss_residuals:
        merged[r] = merged.get(r, 0) + 1
    return [(shape, size, count, floating) for (shape, size, floating), count in merged.items()]


def _layer_residuals(op, variables, args, operation_fn, saved_residuals, batch_inputs=()):
    import jax
    import keras

    leaves, treedef = jax.tree.flatten(args)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]

    def call(weights, arrays):
        full = list(leaves)
        for i, a in zip(positions, arrays):
            full[i] = a
        a, kw = jax.tree.unflatten(treedef, full)
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            return operation_fn(op, training=True)(*a, **kw)

    weights = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]
    saved = saved_residuals(call, weights, [leaves[i] for i in positions])
    # XLA fuses chains of elementwise ops, so a layer keeps one buffer per distinct
    # shape, not one per traced op; the weights themselves are counted as weights.
    skip = ("argument weights", *(f"argument arrays[{i}]" for i in batch_inputs))
    return list({_residual_key(aval) for aval, why in saved if not any(s in why for s in skip) and aval.shape})


def _loss_residuals(outputs, saved_residuals):
    """Residuals of the surrogate loss: softmax cross-entropy over each output's last dimension."""
    import keras

    def loss(ys):
        return sum(keras.ops.mean(keras.ops.logsumexp(keras.ops.cast(y, "float32"), axis=-1)) for y in ys)

    floats = [o for o in outputs if is_float(o.dtype) and len(o.shape) >= 2]
    if not floats:
        return []
    return [_residual_key(aval) for aval, why in saved_residuals(loss, floats) if "from the argument" not in why and aval.shape]


def _residual_key(aval):
    return (tuple(aval.shape), itemsize(aval.dtype), is_float(aval.dtype))


@functools.lru_cache(maxsize=None)
def itemsize(dtype):
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def is_float(dtype):
    import jax.numpy as jnp

    return bool(jnp.issubdtype(jnp.dtype(dtype), jnp.floating))
