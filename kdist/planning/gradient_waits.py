"""Where XLA:GPU runs the weight-gradient kernels of a step on several devices: near their combined reduction.

docs/plan.md, "Weight-gradient kernels wait for their reduction". The
operands of a waiting kernel (a layer's input and output cotangent) stay
alive until it runs, which `memory_model.memory_terms` sweeps.
"""

import math

import numpy as np

from kdist.planning import comm
from kdist.units import HALF_FLOATS


def reduction_order(step, factor, axes, remat=False):
    """(born, last) of each buffer when weight-gradient kernels wait, or None on one device (nothing waits).

    XLA:GPU combines the gradients' reductions into groups of up to
    `comm.COMBINE_THRESHOLD`, and its scheduler runs a weight-gradient kernel near the
    reduction that reads it rather than where the trace makes it. On a mesh
    with a model axis and no batch split it delays them too, among the model
    axis's all-reduces (a Bloom on model=8: a layer's norm-weight gradients
    run after the next layer's backward has begun). Modelled on every mesh of
    several devices: the kernels are grouped in the order the backward makes
    their gradients, and the operands of each (the layer's input and output
    cotangent) stay alive until the group's last kernel (docs/plan.md); a
    reduction whose sums the input gradient needs too (BatchNormalization's)
    runs at once (`Step.gradient_kernels`). A kernel that waits makes its
    outputs (the gradient, and under fsdp its whole local copy) where it runs:
    they are born there, not where the trace makes them. On a remat step over
    fsdp without a model axis a kernel waits at most until the next block's
    recomputed forward gathers its weights again: XLA's scheduler overlaps that
    all-gather with the kernels waiting (Llama 3 with remat on fsdp=8 holds only
    the running block's MLP cotangents at its peak; on fsdp=4,model=2 it holds
    the block before's too: `_next_block_gathers`).
    """
    if math.prod(axes.values()) == 1:
        return None
    traced_born, last, _, _ = step.lifetimes()
    born, last = traced_born.copy(), last.copy()
    sizes = np.asarray(step.size, dtype=np.float64) * factor
    runs_by = _next_block_gathers(step, sizes) if remat and axes.get("model", 1) == 1 else {}
    kernels = iter(step.gradient_kernels())  # the order `reduction_groups` keeps
    for t, reads in reduction_groups(step, sizes):
        for reads_of_kernel in reads:
            u, grads, _ = next(kernels)
            by = min(t, runs_by.get(u, t))
            last[reads_of_kernel] = np.maximum(last[reads_of_kernel], by)
            makers = {u, *traced_born[grads]}  # and the cast making a 16-bit gradient float32 (`kernel_making`)
            made = [g for e in makers for g in step.events[e][0] if step.term[g] in ("gradients", "unreduced")]
            born[made], last[made] = by, np.maximum(last[made], by)
    return born, last


def kernel_making(step, t, grads, start, born):
    """(kernel, gradients): the kernel making the weight gradients `grads` that event `t` makes. Where `t` only
    casts a 16-bit gradient up to its float32 variable's dtype (mixed precision), the matrix product or reduction
    making that 16-bit gradient: XLA:GPU fuses the cast into the optimizer update and runs the product where it
    runs in float32, so its operands wait (`reduction_order`), and the cast's gradient is made where it runs."""
    read = [u for u in step.events[t][1] if step.term[u] != "external"]
    if step.event_kinds[t] != "elementwise" or len(read) != 1 or born[read[0]] < start:
        return t, grads
    source = int(born[read[0]])
    same_size = math.prod(step.shape[read[0]]) == math.prod(step.shape[grads[0]])
    cast_up = step.dtype[read[0]] in HALF_FLOATS and step.dtype[grads[0]] == "float32"
    if not (same_size and cast_up) or not (step.event_gemms[source] or step.event_kinds[source] == "reduction"):
        return t, grads
    return source, grads


def normalizes_a_product(step):
    """Whether a reduction makes a weight gradient from a matrix product's output of rank 3 alone (directly, or
    through a sum the reduction finishes): the scale gradient of a norm that takes a sublayer's output projection
    (Gemma's post-attention and post-MLP norms), or of a layer scale (DINOv2's). A query or key norm's input has a
    heads dimension; a norm of the residual stream sums it too. On a model axis XLA:GPU ran Gemma 3's weight-gradient
    kernels and its norms' scale-gradient sums after its whole backward (docs/plan.md, "A norm's scale gradient,
    waiting"), which the estimate does not follow: `calibration.PRODUCT_NORM_HIGH`."""
    born, start = step.lifetimes()[0], step.bwd_start or 0
    for t, (made, read, _) in enumerate(step.events[start:], start=start):
        if step.event_kinds[t] != "reduction" or not any(step.term[g] == "gradients" for g in made):
            continue
        summed = list(read)
        inner = [u for u in read if step.term[u] != "external"]
        if len(inner) == 1 and born[inner[0]] >= start and step.event_kinds[born[inner[0]]] == "reduction":
            summed += step.events[born[inner[0]]][1]  # a sum finishing a sum: the first reads the batch buffers
        # the one rank-3 value it sums of the forward's (a norm of a product and the residual stream sums two)
        values = [u for u in set(summed) if step.term[u] in ("activations", "external") and len(step.shape[u]) == 3]
        if len(values) == 1 and born[values[0]] >= 0 and step.event_gemms[born[values[0]]]:
            return True
    return False


def gates(step):
    """Whether a forward elementwise kernel reads two buffers of one shape made from matrix products of one input
    (directly or through elementwise kernels): a gated linear unit (Gemma's and Llama's MLPs,
    act(x Wg) * (x Wu)).

    XLA:GPU's DotMerger merges their weight-gradient GEMMs, and its fusion
    cost model decides, by activation, whether the merged GEMM's operand
    (the two cotangents side by side) is written from the cotangents or
    computed again from what they are computed from (the products'
    outputs and the gradient of their product), kept until it runs: the
    estimate keeps the cotangents (docs/plan.md, "Gated products";
    `calibration.GATED_PRODUCT_HIGH`).
    """
    start = step.bwd_start if step.bwd_start is not None else len(step.events)
    source, inputs = {}, {}  # forward buffer -> the matrix product's output it is made from; that product's reads
    for t, (made, read, _) in enumerate(step.events[:start]):
        reads = [r for r in read if r not in step.weight_of]  # not weights or their copies
        if step.event_gemms[t]:
            source.update((g, g) for g in made)
            inputs.update((g, frozenset(reads)) for g in made)
            continue
        found = {source[r] for r in reads if r in source}
        source.update((g, None) for g in made)
        if step.event_kinds[t] != "elementwise":  # a fused attention reads q and k, made alike: no product
            continue
        if len(found) == 1 and all(r in source for r in reads):
            source.update((g, next(iter(found))) for g in made)
            continue
        products = sorted(found - {None})
        for i, a in enumerate(products):
            for b in products[i + 1 :]:
                if step.shape[a] == step.shape[b] and inputs[a] & inputs[b]:
                    return True
    return False


def _next_block_gathers(step, sizes):
    """{weight-gradient kernel's event: the first event after it where another block's recomputed forward gathers
    an FSDP-split weight again (a gathered copy born in the backward, `sizes` > 0)}, for the kernels that have one.
    A block is a layer call of the trace (the first part of a `Step.sublayer_spans` key)."""
    born = step.lifetimes()[0]
    gathered = np.flatnonzero((np.array(step.term) == "gathered") & (born >= (step.bwd_start or 0)) & (sizes > 0))
    gathers = np.unique(born[gathered])
    if not len(gathers) or not step.sublayer_spans:
        return {}
    firsts = np.array([f for f, _, _ in step.sublayer_spans])
    blocks = np.array([key[0] for _, _, key in step.sublayer_spans])

    def block(events):  # the layer call of the last span starting at or before each event
        return blocks[np.maximum(np.searchsorted(firsts, events, side="right") - 1, 0)]

    gather_blocks = block(gathers)
    out = {}
    for u, _, _ in step.gradient_kernels():
        later = (gathers > u) & (gather_blocks != block(u))
        if later.any():
            out[u] = int(gathers[later.argmax()])
    return out


def reduction_groups(step, sizes):
    """The weight-gradient kernels (`Step.gradient_kernels`) in groups whose gradients XLA:GPU reduces in one
    combined collective, up to `comm.COMBINE_THRESHOLD` of `sizes` each, in the order the backward makes them:
    (event of the group's last kernel, where its reduction starts; the buffers each kernel reads) per group."""
    groups, reads, group_bytes = [], [], 0.0
    kernels = step.gradient_kernels()
    for i, (t, grads, reads_of_kernel) in enumerate(kernels):
        reads.append(reads_of_kernel)
        group_bytes += float(sizes[grads].sum())
        if group_bytes >= comm.COMBINE_THRESHOLD or i == len(kernels) - 1:
            groups.append((t, reads))
            reads, group_bytes = [], 0.0
    return groups
