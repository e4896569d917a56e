"""XLA's buffer rules, written down: which values of a traced program are written to device memory.

A jaxpr value is not a buffer. XLA fuses chains of elementwise operations
into the kernels that read them, turns reshapes and transposes into
bitcasts, and writes out only what a kernel it cannot fuse into (a matmul, a
convolution, a custom call) reads, what a reduction makes, and what would
cost more to recompute than to store. `analyse` applies those rules to one
program; the table in docs/plan.md ("Which values are buffers") gives the
source of each rule.
"""

import dataclasses
import math

from kdist.planning import weight_reads
from kdist.planning.batched_gathers import constant_values, index_scales
from kdist.planning.column_reductions import side_outputs, strided_normalizations, widened_products
from kdist.planning.primitives import (
    ALIASES,
    CHEAP_IN_F32,
    ELEMENTWISE,
    ERROR_FUNCTIONS,
    EXPENSIVE,
    IN_PLACE_KERNELS,
    POOL_GRADIENT,
    REDUCTIONS,
)
from kdist.planning.zero_pads import folds_within
from kdist.units import HALF_FLOATS


@dataclasses.dataclass(frozen=True)
class Rules:
    """The compiler behaviours the memory model assumes: five switches, each a fact about XLA, not a fitted number.

    platform: "gpu" (XLA:GPU, checked against an H100), "tpu" (the same
        fusion model, not checked), "cpu" (not calibrated).
    logistic_cheap: XLA:GPU expands logistic to exp/divide (LogisticExpander), cheap in f32.
    tanh_cheap_f32: f32 tanh is one instruction on GPU, duplicated freely.
    rng_expensive: dropout's random bits are not recomputed: the bool keep-mask is a buffer.
    broadcast_into_gemm: a GEMM reads a broadcast operand (GQA's repeated keys and values) from its
        source; False: the broadcast is written out for cuBLAS (what the H100 data shows).
    bandwidth_fusion: an elementwise value is fused into several readers only when re-reading its
        roots costs less than writing and reading it (GPU priority fusion's cost model).
    """

    platform: str = "gpu"
    logistic_cheap: bool = True
    tanh_cheap_f32: bool = True
    rng_expensive: bool = True
    broadcast_into_gemm: bool = False
    bandwidth_fusion: bool = True

    def cheap(self, prim, dtype):
        """Whether XLA duplicates `prim` into each reader rather than writing it once (IsExpensive, inverted)."""
        single = dtype == "float32"
        if prim in ("random_bits", "threefry2x32"):
            return not self.rng_expensive
        if self.platform == "gpu":
            if prim == "logistic":
                return self.logistic_cheap and single
            if prim == "tanh":
                return self.tanh_cheap_f32 and single
            if prim in CHEAP_IN_F32:
                return single
        return prim not in EXPENSIVE and prim not in CHEAP_IN_F32


SWITCHES = ("logistic_cheap", "tanh_cheap_f32", "rng_expensive", "broadcast_into_gemm", "bandwidth_fusion")


def is_relu(eqn):
    """Whether traced equation `eqn` is a ReLU: a max of one array with a constant."""
    return eqn[0] == "max" and len(eqn[1]) == 1


def fuse_into_readers(n_readers, root_bytes, out_bytes):
    """GPU priority fusion's bandwidth test: is recomputing a value in each of its readers cheaper than storing it?

    Fused: each of n readers reads the roots (R bytes); stored: the roots are
    read once, the value written once and read n times. Fuse iff
    (n - 1) R < (n + 1) V: one reader always fuses, a residual add (R = 2V)
    fuses into at most 2 readers, a normalisation (R ~ V) into any number.
    """
    return (n_readers - 1) * root_bytes < (n_readers + 1) * out_bytes


def analyse(p, rules):
    """Decide which values of program `p` are buffers, and which buffers each kernel reads.

    Sets on `p`: `mat` (per id: a buffer), `roots` (the buffers a value is
    computed from), `kernels` [(eqn index, buffers made, layer outputs made
    if kept, buffers read, those of them it may overwrite: an elementwise
    kernel's or a scatter's, but not a normalization's)], `out_info` (per
    output / input cotangent: "buffer", "alias" of one buffer or of a "cond" value, or "cond":
    decided on the whole graph, since XLA fuses across layer boundaries), `in_needs_buffer` and
    `in_readers` (per input), `weight_copy` (buffers that are copies of one
    weight: mixed precision's casts, gradients), `lookups` (weights and
    casts only an embedding lookup reads), `merged` (forward GEMMs XLA merges),
    `side_outputs` (values a small column reduction writes out, `column_reductions`), `widened` (float32
    products a 16-bit norm's scale gradient sums late, `column_reductions.widened_products`),
    `zero_grads`, `kinds`, `producer_index`, `constants` and `index_scales` (`batched_gathers`).
    """
    f = p.flat
    n = len(f.size)
    producer, consumers = [None] * n, [[] for _ in range(n)]
    for i, (_, ins, outs) in enumerate(f.eqns):
        for o in outs:
            producer[o] = i
        for x in ins:
            consumers[x].append(i)
    external = set(p.w) | set(p.c) | set(p.a) | set(p.ct)
    kinds = [_kind(prim) for prim, _, _ in f.eqns]
    for i, (prim, ins, _) in enumerate(f.eqns):
        if prim == "dynamic_update_slice" and _pads(ins, f, producer, external):
            kinds[i] = "elementwise"
        elif prim == "pad" and folds_within(i, p, consumers):
            kinds[i] = "alias"
    always, conditional = set(p.gw), set(p.out) | set(p.ga)

    def readers_of(x):
        out = []
        for i in consumers[x]:
            if kinds[i] == "alias":
                for o in f.eqns[i][2]:
                    out.extend(readers_of(o))
            else:
                out.append(i)
        return out

    status = [_status(x, p, f, producer, kinds, readers_of, external, always, conditional, consumers, rules)
              for x in range(n)]  # fmt: skip
    if rules.broadcast_into_gemm:
        _keep_broadcast_sources(f, producer, kinds, readers_of, status)
    p.widened = widened_products(p, producer, kinds, status) if rules.platform == "gpu" else []
    for x, _ in p.widened:
        status[x] = "mat"
    reach = _kernels_reached(f, kinds, consumers, status)
    roots, costly = _roots(f, status, reach, rules)
    mat = [s in ("mat", "ext") for s in status]
    cond = {x: (costly[x], len(reach[x])) for x in range(n) if status[x] == "cond"}
    kernels = []
    for i, (_, ins, outs) in enumerate(f.eqns):
        made, maybe = [o for o in outs if mat[o]], [o for o in outs if o in cond]
        if made or maybe or kinds[i] == "kernel":
            used = tuple(sorted({r for x in ins for r in roots[x]}))
            in_place = ()
            if kinds[i] in ("elementwise", "alias") or f.eqns[i][0] in IN_PLACE_KERNELS:
                normalized = _normalized_operands(used, f, producer, kinds, roots, reach)
                in_place = tuple(r for r in used if r not in normalized)
            kernels.append((i, made, maybe, used, in_place))
    p.in_needs_buffer, p.in_readers = {}, {}
    for x in external:
        readers = readers_of(x)
        p.in_needs_buffer[x] = any(
            kinds[r] == "kernel" and f.eqns[r][0] not in (POOL_GRADIENT, "broadcast_in_dim") for r in readers
        )
        p.in_readers[x] = len(reach[x])
    p.out_info = {}
    for o in list(p.out) + list(p.ga):
        source = _view_source(o, f, producer, kinds)
        if mat[o]:
            p.out_info[o] = ("buffer", None)
        elif o in cond:
            p.out_info[o] = ("cond", cond[o])
        elif source in cond:  # a reshape / squeeze of a value decided globally (`x[:, 0]`: slice, then squeeze)
            p.out_info[source] = ("cond", cond[source])
            p.out_info[o] = ("alias", source)
        elif roots[o] is not None and len(roots[o]) == 1:
            p.out_info[o] = ("alias", roots[o][0])
        else:
            mat[o] = True  # computed from several buffers: cannot be a bitcast of one
            p.out_info[o] = ("buffer", None)
    weight_copy = weight_reads.weight_copies(p, f, kinds, mat)
    p.zero_grads = set()
    for g in p.gw:
        i = producer[g]
        if i is not None and kinds[i] in ("elementwise", "alias") and not f.eqns[i][1]:
            p.zero_grads.add(g)  # a broadcast zero: this call does not use the variable
            mat[g], roots[g] = False, ()
    p.kernels = [
        (i, [o for o in made if o not in p.zero_grads], maybe, used, ip) for i, made, maybe, used, ip in kernels
    ]
    p.weight_copy = {**weight_copy, **dict(zip(p.gw, p.w))}
    p.lookups = weight_reads.lookups(f, set(p.w) | set(p.c), readers_of)
    p.mat, p.roots, p.kinds = mat, roots, kinds
    p.side_outputs = []
    if rules.platform == "gpu":
        p.side_outputs = side_outputs(p, producer, kinds, status, reach)
        p.side_outputs += strided_normalizations(p, producer, consumers, kinds, status, reach)
    p.merged = _merged_gemms(p, mat, producer, consumers)
    p.producer_index = {x: i for x, i in enumerate(producer) if i is not None}
    p.constants, p.index_scales = constant_values(f, producer, external), index_scales(f, roots)
    return p


def _normalized_operands(used, f, producer, kinds, roots, reach):
    """Buffers an elementwise kernel reading `used` reads both directly and through a last-axis reduction of them.

    That is a normalization (a softmax or its backward, a norm's backward, the
    loss's gradient over the logits): XLA:GPU fuses the reductions and the
    elementwise kernel into one kernel (SoftmaxRewriterTriton's normalization
    diamond), which reads its operands twice and does not write its output
    over them. A reduction other kernels read too is computed again inside it
    (the loss's gradient takes the logits' row maximum again).
    """
    reduced, todo, seen = set(), list(used), set()
    while todo:
        r = todo.pop()
        j = producer[r]
        if r in seen or j is None or kinds[j] != "reduction":
            continue
        seen.add(r)
        ins = f.eqns[j][1]
        if ins and tuple(f.shape[r]) == tuple(f.shape[ins[0]][:-1]):
            sources = {b for x in ins for b in roots[x]}
            reduced |= sources
            todo.extend(b for b in sources if reach[b] == {j})
    return reduced & set(used)


def _pads(ins, f, producer, external):
    """Whether a dynamic_update_slice is a pad: it writes into a broadcast scalar at constant start indices.

    XLA's algebraic simplifier rewrites it so (the backward of `ops.slice`:
    XLNet's relative shift, "Which values are buffers" in docs/plan.md), and a
    pad fuses into its readers like any elementwise operation.
    """

    def constant(x):
        i = producer[x]
        return x not in external and (i is None or all(constant(y) for y in f.eqns[i][1]))

    if len(ins) < 2:  # a literal operand or update
        return False
    operand, _, *starts = ins
    i = producer[operand]
    return i is not None and f.eqns[i][0] == "broadcast_in_dim" and all(constant(y) for y in (*f.eqns[i][1], *starts))


def _kind(prim):
    if prim in ALIASES:
        return "alias"
    if prim in ELEMENTWISE:
        return "elementwise"
    if prim in REDUCTIONS:
        return "reduction"
    return "kernel"


def _status(x, p, f, producer, kinds, readers_of, external, always, conditional, consumers, rules):
    """The first decision on value x: "ext", "mat" (a buffer), "alias", "cond" (decided globally) or "virt"."""
    if x in external:
        return "ext"
    i = producer[x]
    if i is None:
        return "mat"  # a constant
    if kinds[i] == "alias":
        return "alias"
    if kinds[i] in ("kernel", "reduction") or x in always:
        return "mat"
    readers, prim = readers_of(x), f.eqns[i][0]
    kernel_readers = [r for r in readers if kinds[r] == "kernel" and f.eqns[r][0] != POOL_GRADIENT]
    broadcast_read_in_place = (
        rules.broadcast_into_gemm
        and prim == "broadcast_in_dim"
        and all(f.eqns[r][0] == "dot_general" for r in kernel_readers)
    )
    if kernel_readers and not broadcast_read_in_place:
        return "mat"  # a GEMM / conv operand: cuBLAS and cuDNN read materialized operands
    if not rules.cheap(prim, f.dtype[x]) and len(set(readers)) > 1:
        return "mat"
    if rules.platform == "gpu" and f.dtype[x] in HALF_FLOATS and len(set(readers)) > 1:
        if any(f.eqns[r][0] in ERROR_FUNCTIONS for r in readers):
            return "mat"  # a 16-bit error function's operand that other kernels read too
    views = _views(x, consumers, f, kinds)
    if x in conditional or any(y in conditional for y in views):
        return "cond"
    if any(y in always for y in views):
        return "mat"
    return "virt"


def _keep_broadcast_sources(f, producer, kinds, readers_of, status):
    """A GEMM reading a broadcast in place (zero stride) reads the broadcast's source: that is a buffer."""
    for x, i in enumerate(producer):
        if status[x] != "virt" or i is None or f.eqns[i][0] != "broadcast_in_dim" or not f.eqns[i][1]:
            continue
        if not any(kinds[r] == "kernel" for r in readers_of(x)):
            continue
        source = f.eqns[i][1][0]
        while source is not None and status[source] == "alias":
            source = f.eqns[producer[source]][1][0]
        if source is not None and status[source] in ("virt", "cond"):
            status[source] = "mat"


def _view_source(x, f, producer, kinds):
    """The value x is a bitcast of (through reshapes and transposes), or x itself."""
    while producer[x] is not None and kinds[producer[x]] == "alias" and f.eqns[producer[x]][1]:
        x = f.eqns[producer[x]][1][0]
    return x


def _views(x, consumers, f, kinds):
    """Values that are bitcasts of x (reshapes and transposes of it, transitively)."""
    out, todo = [], [x]
    while todo:
        y = todo.pop()
        for i in consumers[y]:
            if kinds[i] == "alias":
                out.extend(f.eqns[i][2])
                todo.extend(f.eqns[i][2])
    return out


def _kernels_reached(f, kinds, consumers, status):
    """Per value: the kernels reading it, directly or through values fused into them (a layer output: one)."""
    n = len(f.size)
    reach = [None] * n
    for x in reversed(range(n)):
        ks = set()
        for i in consumers[x]:
            outs = f.eqns[i][2]
            if kinds[i] in ("kernel", "reduction") or any(status[o] == "mat" for o in outs):
                ks.add(i)
                continue
            for o in outs:
                if status[o] == "cond":
                    ks.add(("out", o))
                if reach[o] is not None:
                    ks.update(reach[o])
        reach[x] = ks
    return reach


def _roots(f, status, reach, rules):
    """Per value: the buffers it is computed from (itself if it is one); fused values may still become buffers."""
    n = len(f.size)
    roots, costly = [None] * n, [False] * n
    for x in range(n):
        if status[x] in ("mat", "ext"):
            roots[x] = (x,)
    for prim, ins, outs in f.eqns:
        for o in outs:
            if roots[o] is not None:
                continue
            rs = tuple(sorted({r for x in ins for r in (roots[x] if roots[x] is not None else (x,))}))
            costly[o] = not rules.cheap(prim, f.dtype[o]) or any(costly[x] for x in ins if roots[x] != (x,))
            if status[o] == "virt" and f.size[o] > 0:
                duplicated_expensive = costly[o] and len(reach[o]) > 1
                stored_cheaper = rules.bandwidth_fusion and not fuse_into_readers(
                    len(reach[o]), sum(f.size[r] for r in rs), f.size[o]
                )
                if duplicated_expensive or stored_cheaper:
                    status[o], rs = "mat", (o,)
            roots[o] = rs
    return roots, costly


def _merged_gemms(p, mat, producer, consumers):
    """Forward matrix products one GEMM could make: [(the input they share, their outputs, their biased sums)].

    XLA's DotMerger merges GEMMs that read the same input with the same
    dimension numbers (an attention's q, k and v projections) into one, whose
    output lives as long as the longest-lived of theirs
    (xla/service/dot_merger.h). Biased ones are kept only where each output's
    one reader adds a bias (a broadcast weight), and where a GEMM reads one
    of the sums as it is beside another projection (the scores, q·kᵀ, not a
    rotary embedding's output): `memory_model.merged_gemm_lasts` says why.
    Projections of a weight (or its cast: `p.weight_copy`) that no reader
    adds to are merged too where their outputs have one shape, the outputs
    standing for their sums (T5's q, k and v; PaliGemma's compiled step keeps none of its
    grouped-query projections' outputs, q's wider than k's and v's).
    """
    f, groups, projections, unbiased = p.flat, {}, set(), {}
    weights = set(p.w) | set(p.weight_copy)
    gemms = [i for i in range(p.n_fwd) if f.eqns[i][0] == "dot_general"]
    for i in gemms:
        _, ins, outs = f.eqns[i]
        projections.add(outs[0])
        readers = consumers[outs[0]]
        if mat[outs[0]] and ins[1] in weights and all(f.eqns[r][0] != "add" for r in readers):
            key = (ins[0], repr(f.params[i]), f.dtype[outs[0]], tuple(f.shape[outs[0]]))
            unbiased.setdefault(key, []).append((outs[0], outs[0]))
        if not mat[outs[0]] or len(readers) != 1 or f.eqns[readers[0]][0] != "add":
            continue
        add = f.eqns[readers[0]]
        bias = [x for x in add[1] if x != outs[0]]
        source = [producer[x] for x in bias]
        if len(bias) == 1 and source[0] is not None and f.eqns[source[0]][0] == "broadcast_in_dim":
            if f.eqns[source[0]][1][0] in weights:
                key = (ins[0], repr(f.params[i]), f.dtype[outs[0]])
                groups.setdefault(key, []).append((outs[0], add[2][0]))
                projections.add(add[2][0])
    read_together = [{_as_it_is(x, f, producer) for x in f.eqns[i][1]} for i in gemms]
    merged = []
    for key, members in groups.items():
        sums = {total for _, total in members}
        if len(members) > 1 and any(pair & sums and len(pair & projections) == 2 for pair in read_together):
            merged.append((key[0], *zip(*members)))
    merged += [(key[0], *zip(*members)) for key, members in unbiased.items() if len(members) > 1]
    return merged


def _as_it_is(x, f, producer):
    """The value x is, through reshapes, transposes, casts and scalings by one number (a GEMM operand's source)."""
    while producer[x] is not None:
        prim, ins, _ = f.eqns[producer[x]]
        arrays = [v for v in ins if math.prod(f.shape[v]) > 1]
        if prim not in ALIASES | {"convert_element_type", "mul", "div"} or len(arrays) != 1:
            return x
        x = arrays[0]
    return x
