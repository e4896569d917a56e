"""A value XLA:GPU writes out beside a small column reduction: a BatchNormalization's centred input on small maps.

A reduction over the leading dimensions of its operand (a column reduction:
BatchNormalization's variance over the batch, height and width) is one
kernel on XLA:GPU when it reduces at most `RACE_FREE_COLUMNS` rows per
kept element (`ReductionIsRaceFree`: a warp of 32 threads x 128 rows);
a longer one the tree-reduction rewriter splits into two reductions. The
one-kernel reduction is a multi-output fusion: a value of its operand's
shape that it computes and another kernel reads too (the centred input
`x - mean` of `jnp.var`, which the variance's gradient reads in the backward)
is written out as its second output and kept until that reader. In the
split reduction every reader computes it again. How many rows a device
reduces depends on its batch shard, so the plan of each mesh decides
(`memory_model.buffer_factors`; docs/plan.md, "Which values are buffers").
"""

import math

RACE_FREE_COLUMNS = 32 * 128
# Seen in XLA:GPU's dumps, not sourced: MobileNetV3's centred inputs of 128 rows (4 x 4 maps, 8 images a device) are
# not written out, those of 512 rows and more are (docs/plan.md, "Convolutional steps").
FEWEST_ROWS = 512


def side_outputs(p, producer, kinds, status, reach):
    """[(value, reduction, last reader, rows per example)] of program `p`'s forward column reductions.

    `value` is a fused value of the reduction's operand shape on its input
    chain that a kernel outside the reduction reads too, `reduction` and
    `last reader` are equation indices, `rows per example` is what the
    reduction sums per batch example (it reduces the batch dimension, the
    first).
    """
    f, found = p.flat, []
    for i in range(p.n_fwd):
        prim, ins, _ = f.eqns[i]
        if prim != "reduce_sum" or not ins:
            continue
        axes, shape = tuple(f.params[i] or ()), f.shape[ins[0]]
        if not axes or axes != tuple(range(len(axes))) or len(axes) >= len(shape):
            continue
        rows_per_example = math.prod(shape[1 : len(axes)])
        for v in _fused_chain(ins[0], f, producer, kinds, status):
            # a reader: a kernel, or the equation making a layer output or input cotangent it is fused into
            readers = {r if isinstance(r, int) else producer[r[1]] for r in reach[v]}
            cast = f.eqns[producer[v]][0] == "convert_element_type"  # mixed precision's float32 copy: recomputed
            if f.shape[v] == shape and len(readers) > 1 and not cast:
                found.append((v, i, max(readers), rows_per_example))
    return found


def _fused_chain(x, f, producer, kinds, status):
    """The fused (elementwise, not written out) values `x` is computed from, `x` included, back to buffers."""
    out, todo, seen = [], [x], set()
    while todo:
        v = todo.pop()
        if v in seen or status[v] not in ("virt", "cond") or producer[v] is None:
            continue
        seen.add(v)
        out.append(v)
        if kinds[producer[v]] in ("elementwise", "alias"):
            todo.extend(f.eqns[producer[v]][1])
    return out
