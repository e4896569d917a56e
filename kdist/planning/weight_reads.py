"""How a traced program reads its weights: the buffers that are copies of one weight, and the tables only lookups read.

Both are facts `buffers.analyse` records on a program (`weight_copy`,
`lookups`) for the timeline: a weight's copies (mixed precision's casts)
take its shard's size on a mesh, and a table only embedding lookups read is
never all-gathered under fsdp.
"""

import math


def lookups(f, weights, readers_of):
    """Weights (and their casts) that only gathers read: XLA's SPMD partitioner gathers from the table's shard.

    An embedding lookup on a table split over fsdp is a gather on each
    device's shard, masked, and a reduction of the looked-up rows: the table
    is never all-gathered for it (`Step._add_gathers` skips those reads).
    """
    memo = {}

    def only_gathered(x):
        if x not in memo:
            readers = readers_of(x)
            memo[x] = bool(readers) and all(
                f.eqns[i][0] == "gather"
                or (f.eqns[i][0] == "convert_element_type" and all(only_gathered(o) for o in f.eqns[i][2]))
                for i in readers
            )
        return memo[x]

    for w in weights:
        only_gathered(w)
    return {x for x, ok in memo.items() if ok}


def weight_copies(p, f, kinds, mat):
    """Buffers that are elementwise copies of one weight (the compute-dtype cast of mixed precision)."""
    weights = set(p.w) | set(p.c)
    source = {w: w for w in weights}
    for i, (_, ins, outs) in enumerate(f.eqns):
        if kinds[i] not in ("elementwise", "alias"):
            continue
        sources = {source[x] for x in ins if x in source}
        big = [x for x in ins if f.size[x] > 64 and x not in source]
        if len(sources) == 1 and not big:
            w = next(iter(sources))
            for o in outs:
                if math.prod(f.shape[o]) == math.prod(f.shape[w]):  # a cast or bitcast, not a broadcast
                    source[o] = w
    return {x: w for x, w in source.items() if x not in weights and mat[x]}
