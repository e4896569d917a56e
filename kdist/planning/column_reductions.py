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

from kdist.units import HALF_FLOATS

RACE_FREE_COLUMNS = 32 * 128
_WIDENINGS = {(half, "float32") for half in HALF_FLOATS}
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
        rows_per_example = _column_rows(f, i)
        if rows_per_example is None:
            continue
        operand = f.eqns[i][1][0]
        shape = f.shape[operand]
        for v in _fused_chain(operand, f, producer, kinds, status):
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


def widened_products(p, producer, kinds, status):
    """[(value, rows per example)]: fused float32 values of program `p`'s backward that a weight gradient's column
    reduction sums, products computed through a cast up from 16 bits (a 16-bit norm's scale gradient,
    sum(cotangent x normalised input); not an offset's, which sums a cast alone).

    Where a device sums at most `RACE_FREE_COLUMNS` rows the column reduction
    is a kernel of its own, and XLA:GPU writes the product out as a second
    output of the fusion that makes the norm's input gradient, to be summed
    later with the weight gradients' reductions (Qwen3 in bfloat16: 1024 rows
    on data=8, 4096 on fsdp=2,model=4, an f32[b,s,h] per norm alive until the
    reduction). Where the tree-reduction rewriter splits it (8192 rows on
    model=8), its first half is fused into that fusion, and nothing is
    written. In float32 XLA keeps the forward's normalised input instead,
    which the estimate counts already. Which meshes write it is decided per
    mesh, as for the side outputs above (`Step.column_rows`; docs/plan.md,
    "Which values are buffers").
    """
    f, found = p.flat, []
    gradient_sources = _gradient_sources(p, producer)
    for i in range(p.n_fwd, len(f.eqns)):
        _, ins, outs = f.eqns[i]
        rows_per_example = _column_rows(f, i)
        if rows_per_example is None or outs[0] not in gradient_sources:
            continue
        x = ins[0]
        if status[x] != "virt" or f.dtype[x] != "float32" or f.eqns[producer[x]][0] != "mul":
            continue  # a cast alone (an offset's gradient: the cotangent summed) is read in place
        chain = _fused_chain(x, f, producer, kinds, status)
        if any(_cast_up(f.eqns[producer[v]], f) for v in chain):
            found.append((x, rows_per_example))
    return found


def _column_rows(f, i):
    """Rows per batch example that equation i sums where it is a column reduction (a sum over its operand's
    leading dimensions, the batch's first, not all of them), else None."""
    prim, ins, _ = f.eqns[i]
    if prim != "reduce_sum" or not ins:
        return None
    axes, shape = tuple(f.params[i] or ()), f.shape[ins[0]]
    if not axes or axes != tuple(range(len(axes))) or len(axes) >= len(shape):
        return None
    return math.prod(shape[1 : len(axes)])


def _gradient_sources(p, producer):
    """Values each weight gradient of `p` is, through casts and what keeps its elements (a reshape, a sum over
    dimensions of one): a 16-bit weight's gradient is a cast of a float32 sum."""
    f, out = p.flat, set()
    for g in p.gw:
        while g is not None and g not in out:
            out.add(g)
            i = producer[g]
            if i is None or len(f.eqns[i][1]) != 1 or math.prod(f.shape[f.eqns[i][1][0]]) != math.prod(f.shape[g]):
                break
            g = f.eqns[i][1][0]
    return out


def _cast_up(eqn, f):
    """Whether equation `eqn` casts a 16-bit value to float32."""
    prim, ins, outs = eqn
    return prim == "convert_element_type" and bool(ins) and (f.dtype[ins[0]], f.dtype[outs[0]]) in _WIDENINGS
