"""Branches of the backward that meet the rest only in weight gradients: XLA's scheduler may run them late.

In an encoder-decoder, once the decoder's cross-attention has made the
encoder output's cotangent, the decoder's query path (the cross-attention's
query gradient, the first decoder layer's self-attention, its embeddings)
and the encoder's backward need nothing of each other: they meet again only
in the token embedding's gradient. The trace runs the decoder's part first;
on a mesh of several devices XLA:GPU's latency-hiding scheduler does not
have to, and in T5's fsdp=8 compile it runs the query gradient among the
encoder's backward, so what that branch reads (the scores' gradient, the
keys) is alive beside the encoder's backward (docs/plan.md, "Branches of the
backward"). Branches that meet again at a sum (a parallel attention and MLP,
a residual shortcut) are left to the trace's order: XLA's figures do not
show it deferring them.
"""

import numpy as np

CHAIN_TERMS = ("activations", "backward")  # what the backward's kernels pass on (gradients are leaves)


def with_deferred_branches(step, curves, factor, last):
    """`curves` (live bytes per term after each event, `Step.sweep` with `factor` and `last`) with the worst of
    the branches `forks` finds run after the kernels that do not depend on it: while those run, what the branch
    reads from before its first kernel stays alive, where the trace's order has freed it."""
    n = len(next(iter(curves.values())))
    sizes = np.asarray(step.size, dtype=np.float64) * factor
    terms = np.array(step.term)
    worst, extra = np.zeros(n), {term: np.zeros(n) for term in curves}
    for (y0, y1), read in forks(step).items():
        freed = np.maximum(last[read] + 1, y0)
        read, freed = read[freed <= y1], freed[freed <= y1]
        kept = {}
        for term in curves:
            chosen = terms[read] == term
            change = np.zeros(n + 1)
            np.add.at(change, freed[chosen], sizes[read[chosen]])
            change[y1 + 1] -= sizes[read[chosen]].sum()
            kept[term] = np.cumsum(change)[:n]
        total = sum(kept.values())
        more = total > worst
        worst = np.where(more, total, worst)
        for term in curves:
            extra[term] = np.where(more, kept[term], extra[term])
    return {term: curve + extra[term] for term, curve in curves.items()}


def forks(step):
    """{(y0, y1): what the branch reads} for each branch of the backward that meets the rest only in weight
    gradients and passes a matrix product on: kernels y0..y1 are the first and last later kernels that do not
    depend on it, the values are those its kernels read that were made before its first kernel. A branch whose
    kernels meet the others' at a later kernel (one reading from both) is none. Dependencies run through the
    values kernels pass on (`CHAIN_TERMS`), not through weight gradients, nor through a value only a gradient's
    kernel reads (a 16-bit weight gradient before its cast, a norm's partial sums). Computed once per step."""
    if step._forks is None:  # the step's cache, emptied when its events are written
        step._forks = {} if step.bwd_start is None else _forks(step, step.bwd_start)
    return step._forks


def _forks(step, start):
    born = step.lifetimes()[0]
    chain = np.isin(np.array(step.term), CHAIN_TERMS)
    n = len(step.events)
    parents = {}  # event -> the backward events whose values it reads
    for w in range(start, n):
        found = sorted({int(born[b]) for b in step.events[w][1] if chain[b] and born[b] >= start})
        if found:
            parents[w] = found
    passing = {w for w in parents if chain[step.events[w][0]].any()}
    passes = {p for w in passing for p in parents[w] if p in parents}  # kernels of the branches
    ancestry, descent = {}, {u: 1 << u for u in range(start, n)}  # bitsets of events, the event included
    for w in range(start, n):
        ancestry[w] = 1 << w
        for p in parents.get(w, ()):
            ancestry[w] |= ancestry[p]
    for w in reversed(range(start, n)):
        for p in parents.get(w, ()):
            descent[p] |= descent[w]
    met = 0  # kernels whose branch meets a later kernel not depending on them
    for found in parents.values():
        for x in found:
            for y in found:
                if x != y and y in passes:
                    met |= ancestry[x] & ~ancestry[y] & ((1 << y) - 1)
    independent = sum(1 << u for u in passes)
    products = sum(1 << u for u in passes if step.event_gemms[u])
    groups = {}  # (y0, y1) -> the branch's kernels
    for u in sorted(passes):
        later = independent & ~descent[u] & ~((1 << (u + 1)) - 1)
        if later and not met >> u & 1 and descent[u] & products:
            window = ((later & -later).bit_length() - 1, later.bit_length() - 1)
            groups.setdefault(window, []).append(u)
    reads = {}
    for window, branch in groups.items():
        first = min(branch)
        reads[window] = np.array(
            sorted({b for u in branch for b in step.events[u][1] if chain[b] and 0 <= born[b] < first}), dtype=int
        )
    return reads
