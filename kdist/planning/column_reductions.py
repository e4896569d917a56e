"""Values XLA:GPU writes out beside column reductions: a BatchNormalization's centred input on small maps, a 16-bit
norm's float32 scale-gradient product, the input of a softmax over a dimension that does not lie innermost.

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
A softmax's input (`strided_normalizations`) is counted on every mesh.
"""

import math

from kdist.planning.row_major import lies
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


def _computed_from(x, f, n_fwd, kinds, consumers):
    """The forward values of x's shape computed from x through elementwise operations, x included."""
    out, todo = set(), [x]
    while todo:
        v = todo.pop()
        if v not in out:
            out.add(v)
            todo += [o for j in consumers[v] if j < n_fwd and kinds[j] == "elementwise" for o in f.eqns[j][2]]
    return {v for v in out if f.shape[v] == f.shape[x]}


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


def strided_normalizations(p, producer, consumers, kinds, status, reach):
    """[(value, reduction, last reader, None)]: the input of program `p`'s forward normalizations (a maximum and a sum
    over the same dimensions of one fused chain: a softmax) that sum a dimension not innermost as it lies.

    SoftmaxRewriterTriton fuses a softmax over the innermost dimension into
    one kernel; over another dimension (Gemma 2's scores, which lie with the
    query groups innermost) the maximum and the sum are column reductions,
    and XLA:GPU writes a value of their fused input chain out as a second
    output, kept to the backward, which computes the probabilities again
    from it: Gemma 2 in float32 the masked capped scores beside the maximum
    (`input_reduce_select_fusion` on data=8, fsdp=8, data=4,model=2), in
    bfloat16 on data=8 the float32 exponentials beside the sum. Which value,
    and whether any, is its fusion cost model's choice by sizes the
    estimate cannot read off (none in bfloat16 on Gemma 2's model meshes,
    none in float32 from 11 examples of 256 tokens a device, where it fuses
    the soft cap's tanh into the maximum and writes the tanh's output): the
    estimate counts one value of the maximum's input, the safe side, and
    the band reaches down to what XLA took then (`calibration.STRIDED_LOW`).
    Not where the sum is longer than `RACE_FREE_COLUMNS` rows (split in two
    reductions).
    """
    f, n_fwd = p.flat, p.n_fwd
    made_by = {x: j for x, j in enumerate(producer) if j is not None}
    reductions = {}
    for i in range(n_fwd):
        prim, ins, _ = f.eqns[i]
        if prim in ("reduce_max", "reduce_sum") and ins and status[ins[0]] in ("virt", "cond"):
            reductions.setdefault(prim, []).append((i, ins[0], tuple(int(a) for a in f.params[i] or ())))
    found = []
    for i, x, axes in reductions.get("reduce_max", []):
        shape = f.shape[x]
        computed = _computed_from(x, f, n_fwd, kinds, consumers)
        normalizes = any(axes == other and y in computed for _, y, other in reductions.get("reduce_sum", []))
        inner = [d for d in lies(x, f, made_by) if shape[d] != 1][-1:]
        rows = math.prod(shape[a] for a in axes)  # 1: a softmax over one class (a loss's), nothing reduced
        if normalizes and inner and inner[0] not in axes and 1 < rows <= RACE_FREE_COLUMNS:
            readers = {r if isinstance(r, int) else producer[r[1]] for v in computed for r in reach[v]}
            found.append((x, i, max(readers), None))
    return found
