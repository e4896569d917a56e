"""Convolutions' partial sums that XLA reduce-scatters at once, and their whole copies until it has.

A convolution whose kernel splits the input channels it contracts (the input
gradient of one whose kernel splits its output channels) makes a whole
partial sum over the model axis. Where it is the gradient of an input the
axis splits, XLA:GPU reduce-scatters it to that split, and the kernels after
read the split value (`propagation.split_axes` finds such sums and their
split, `model_splits.reduced_shares` sizes them); two of them that are added
are added whole and reduce-scattered once (XLA's ReduceScatterReassociate).
docs/plan.md, "A convolution's partial sum, reduced at once".
"""

import numpy as np

from kdist.planning import model_splits


def reduced_at_once(facts, rows, axes, factor, batch_split):
    """(`factor` with each such sum counted at the share the reduce-scatter leaves, the bytes of their whole copies
    per event).

    The kernel making a convolution's partial sum writes it in cuDNN's layout
    and again with the channels leading, which the reduce-scatter reads: both
    are counted where it runs, the channels-first one until the reduce-scatter
    is done. Where nothing else can run beside it (`batch_split` false: no
    weight-gradient kernel waits for a reduction) that is before the next
    kernel reading the sum: keras-hub's ResNet on model=8 of 8 deviceless
    H100s holds each whole f32[64,32,32,64] input gradient for 4 to 13 of its
    350 instructions. Where weight-gradient kernels wait, XLA's scheduler may
    run them beside the reduce-scatter (a small CNN on data=2,model=4: 24
    instructions) or not (ResNet50 on data=2,model=4): the longer is taken,
    until the next partial sum's reduce-scatter or the backward's end. A
    sum of partial sums is written channels first beside its parts, where the
    timeline writes it over one of them (ResNet50 on model=8: two
    f32[256,56,56,256] input gradients and their sum alive together at XLA's
    peak).
    """
    step = facts.traced.step
    copies = np.zeros(len(step.events) + 1)
    shares, layout = model_splits.reduced_shares(facts, rows, axes)
    kept = factor * shares
    sums = np.flatnonzero(kept < factor)
    if not len(sums):
        return factor, copies
    sizes, born = np.asarray(step.size, dtype=np.float64), step.lifetimes()[0]
    sums = sums[np.argsort(born[sums], kind="stable")]
    later = np.append(born[sums][1:], len(step.events) - 1)  # the next sum's reduce-scatter waits for this one's
    events, buffers = step.reads()
    written_over = {new: old for old, new in step.lifetimes()[3]}
    for g, end in zip(sums, later):
        if not batch_split:  # nothing waits to run beside the reduce-scatter: done before the next reader
            readers = events[(buffers == g) & (events > born[g])]
            end = min(end, readers.min() - 1) if len(readers) else end
        if g in written_over and layout[g] == 1:  # a sum of partial sums, written channels first beside its parts
            copies[born[g]] += sizes[written_over[g]] * factor[written_over[g]]
        copies[born[g]] += sizes[g] * (factor[g] - kept[g])  # every layout where the kernel writes it
        copies[born[g] + 1 : max(end, born[g] + 1) + 1] += sizes[g] * (factor[g] * layout[g] - kept[g])  # one
    return kept, copies
