"""What autodiff keeps for the backward pass: residuals traced layer by layer with `saved_residuals`.

Each layer of the functional graph is traced once per distinct (class,
weight shapes, input shapes): a Llama with 126 identical blocks traces one
block. Tracing needs no devices and allocates nothing.
"""

import jax
import keras

from kdist.jax_internals import saved_residuals
from kdist.keras_internals import KerasTensor, deferred, input_struct, nodes_by_depth, operation_fn, output_struct
from kdist.units import is_float, itemsize

TRACE_BATCH = 7919  # a prime batch size, so batch dimensions are recognisable in traced shapes


def saved_activations(model, inputs):
    """What autodiff saves for the backward pass of one step at batch TRACE_BATCH.

    Returns [(shape, itemsize, count, is_float)], or None for a model without a layer graph.
    """
    by_depth = nodes_by_depth(model)
    if not by_depth:
        return None
    inputs_struct = input_struct(model)
    structs = dict(zip((id(t) for t in keras.tree.flatten(inputs_struct)), keras.tree.flatten(inputs)))
    seq = next((s.shape[1] for s in structs.values() if len(s.shape) > 1), 1)

    def struct(t):
        if id(t) in structs:
            return structs[id(t)]
        dims = [TRACE_BATCH if (d is None and i == 0) else d for i, d in enumerate(t.shape)]
        return jax.ShapeDtypeStruct(tuple(seq if d is None else d for d in dims), t.dtype)

    cache, counts = {}, {}
    aliases = {id(t) for t in keras.tree.flatten(inputs_struct)}  # the batch itself is counted as input
    with deferred():
        for depth in sorted(by_depth, reverse=True):
            for node in by_depth[depth]:
                if node.is_input or node.operation is None:
                    continue
                op = node.operation
                raw = (node.arguments.args, node.arguments.kwargs)
                args = keras.tree.map_structure(lambda x: struct(x) if isinstance(x, KerasTensor) else x, raw)
                tensors = [
                    x
                    for x in jax.tree.leaves(raw, is_leaf=lambda x: isinstance(x, KerasTensor))
                    if isinstance(x, KerasTensor)
                ]
                inputs_here = tuple(i for i, t in enumerate(tensors) if id(t) in aliases)
                if inputs_here and type(op).__name__ in ("Flatten", "Reshape"):
                    aliases.update(id(t) for t in node.outputs)  # a view of the input batch, not a copy
                variables = list(getattr(op, "trainable_variables", [])) + list(
                    getattr(op, "non_trainable_variables", [])
                )
                key = (
                    type(op).__name__,
                    tuple((tuple(v.shape), str(v.dtype)) for v in variables),
                    repr(args),
                    inputs_here,
                )
                counts[key] = counts.get(key, 0) + 1
                if key not in cache:
                    cache[key] = _layer_residuals(op, variables, args, inputs_here)
        loss_residuals = _loss_residuals([struct(o) for o in keras.tree.flatten(output_struct(model))])
    merged = {}
    for key, residuals in cache.items():
        for r in residuals:
            merged[r] = merged.get(r, 0) + counts[key]
    for r in loss_residuals:
        merged[r] = merged.get(r, 0) + 1
    return [(shape, size, count, floating) for (shape, size, floating), count in merged.items()]


def _layer_residuals(op, variables, args, batch_inputs=()):
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


def _loss_residuals(outputs):
    """Residuals of the surrogate loss: softmax cross-entropy over each output's last dimension."""

    def loss(ys):
        return sum(keras.ops.mean(keras.ops.logsumexp(keras.ops.cast(y, "float32"), axis=-1)) for y in ys)

    floats = [o for o in outputs if is_float(o.dtype) and len(o.shape) >= 2]
    if not floats:
        return []
    return [
        _residual_key(aval)
        for aval, why in saved_residuals(loss, floats)
        if "from the argument" not in why and aval.shape
    ]


def _residual_key(aval):
    return (tuple(aval.shape), itemsize(aval.dtype), is_float(aval.dtype))
