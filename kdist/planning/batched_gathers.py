"""Gathers with batching dimensions (`take_along_axis`) and the values every call of a program computes alike.

XLA:GPU rewrites a gather with batching dimensions into one without
(`BatchedGatherScatterNormalizer`): it concatenates an iota per batching
dimension to the index vector, so the index buffer the gather and its
backward scatter read is `1 + batching dimensions` times the traced one
(DeBERTa-v3's disentangled attention: s32[4,8,256,256,4] where jax traced
s32[4,8,256,256,1]). And XLA's common-subexpression elimination makes one
value of what several calls of one layer compute from constants alone (the
same relative positions in every layer): one buffer, read by all of them.
"""

RANDOM = frozenset("random_bits random_seed random_wrap random_fold_in random_split threefry2x32 rng_uniform".split())


def constant_values(f, producer, external):
    """Local ids of flat program `f` computed from no input of the call (iotas, literals), randomness aside."""
    constant = [x not in external and producer[x] is None for x in range(len(f.size))]
    for prim, ins, outs in f.eqns:
        for o in outs:
            constant[o] = prim not in RANDOM and all(constant[x] for x in ins)
    return {x for x, c in enumerate(constant) if c}


def index_scales(f, roots):
    """{buffer: times}: the buffers a gather with batching dimensions reads as its indices (through views), and
    how many times their traced size XLA's explicit indices are."""
    out = {}
    for i, (prim, ins, _) in enumerate(f.eqns):
        if prim != "gather" or len(ins) < 2:
            continue
        times = 1 + len(getattr(f.params[i], "operand_batching_dims", ()))
        if times == 1:
            continue
        for b in roots[ins[1]] or ():
            out[b] = max(out.get(b, 1), times)
    return out
