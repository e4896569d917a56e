"""Which traced buffers the model and expert axes split: the weights' layouts followed through the step.

XLA's sharding propagation (GSPMD) starts from the weights' shardings and
carries each split dimension through the operations that read it.
`split_axes` does the same over every call of the step in the order it runs
(a layer's inputs take their producer's split, and where the producer
wrote the value as a view of another shape than its buffer, a transpose
the layer returns, the view's own):

- forward, operation by operation: an elementwise operation keeps a split,
  a matrix product keeps the splits of its free and batch dimensions and
  drops those it contracts (a partial sum, then an all-reduce or a
  reduce-scatter), a reduction drops the split of a reduced dimension, a
  reshape, transpose, broadcast or table lookup moves it (a dimension a
  reshape takes apart keeps it on the leading part, as far as the part and
  the axis both divide, and where the axis outnumbers that part, on the
  next: grouped-query heads), a slice that cuts the devices' shares moves
  it to the dimension before, an FFT keeps it (over a split batch XLA
  transforms a gathered copy and slices its part back, a model axis's split
  alone it transforms in parts: `Step.unpartitioned`). Where two operands
  of a matrix product bring one axis on different dimensions the larger
  operand's wins, the left one's if they are alike (XLA's rule);
- back from readers: a value an elementwise operation combines with a split
  one of the same shape is split too (a dropout's random bits and mask), and
  a gather's indices, back through reshapes, where the operand's split
  dimension is indexed by an iota over one of theirs or is a batching
  dimension (`take_along_axis`'s heads: `gather_indices`);
- a loop (scan, while) through its body: its state takes the splits the body
  gives it, and so does its initial value (`_loop`);
- a buffer a matrix product contracts on a split dimension the other operand
  does not split is gathered whole before it (a normalized residual stream
  read by a projection whose kernel splits its output): counted whole, as
  XLA keeps the gathered copy for the backward on some meshes (docs/plan.md);
  its split is kept aside, for the meshes where XLA gathers it again instead
  (`memory_model.regathered`, its share from `model_splits.regather_shares`).
  A convolution gathers an input split on the channels it reads whole (its
  kernel splits its output channels: XLA:GPU keeps that copy for the weight
  gradient on every mesh); a grouped (depthwise) one convolves each
  device's own channels (`conv_splits`);
- a convolution whose kernel splits the channels it contracts makes a
  partial sum: whole, whatever reads it, and where it is the gradient of a
  split input, counted twice: XLA reduce-scatters it to the input's split
  from a copy with the channels leading (cuDNN writes them last), at once:
  its readers read it with the input's split (`partial_sums.reduced_at_once`
  keeps the whole copies alive until the reduce-scatter is done); two such
  sums that are added stay whole until then, and their sum is reduced. A matrix
  product's partial sum is counted as its readers split it: counted whole,
  the transformers whose residual stream is split went further over XLA's
  figure (docs/plan.md, "Following the model axis through the step").

A model whose rules put the hidden size of a position table on 'model' has
its residual stream split over 'model', as in XLA's compile; one whose rules
split only heads and MLP widths keeps it whole. Only the model-parallel axes
are followed: a batch dimension is split over data x fsdp
(`memory_model.buffer_factors`), a weight and its copies as its placement
says. An operation without a rule here makes whole outputs.
"""

import math

from kdist.planning import conv_splits
from kdist.planning.gather_indices import gather_index_splits, gather_output_split, index_views
from kdist.planning.zero_pads import folded_operand, gather_padded

AXES = ("model", "expert")

# Operations whose output has the operand's dimensions in the same positions (sizes may differ: slicing, padding).
_SAME_POSITIONS = frozenset(
    """add add_any sub mul div neg max min abs sign exp exp2 log log1p expm1 tanh logistic erf erfc erf_inv sin cos
    tan sqrt rsqrt cbrt pow integer_pow square select_n convert_element_type eq ne lt le gt ge and or not xor floor
    ceil round is_finite nextafter clamp shift_left shift_right_logical shift_right_arithmetic bitcast_convert_type
    copy copy_p atan2 rem stop_gradient reduce_precision pad dynamic_update_slice rev mul_add one_minus_square
    polynomial logaddexp cumsum cumlogsumexp cummax cummin cumprod optimization_barrier select_and_gather_add tile sort
    select_and_scatter_add real imag complex conj fft
    scatter scatter-add scatter_add scatter-sub scatter_sub scatter-mul scatter_mul scatter-min scatter_min
    scatter-max scatter_max""".split()
)
_SLICES = frozenset(("slice", "dynamic_slice", "split"))
LOOPS = frozenset(("scan", "while"))  # kept whole by `trace.flatten`, their bodies beside them (`trace.Loop`)
_REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin".split())
# The parameters the rules below read, kept per traced operation by `trace.flatten`.
PARAMS = {
    "dot_general": "dimension_numbers",
    "broadcast_in_dim": "broadcast_dimensions",
    "transpose": "permutation",
    "squeeze": "dimensions",
    "concatenate": "dimension",
    "stack": "axis",
    "unstack": "axis",
    "gather": "dimension_numbers",
    "iota": "dimension",
    "conv_general_dilated": "dimension_numbers",
    **{r: "axes" for r in _REDUCTIONS},
}


def split_axes(step, weight_splits, sizes=None):
    """Per buffer of `step`: {axis: dimension} of the model-parallel axes that split it ({} when none); the
    buffers a device holds more of -> {axis: times}: a convolution's partial sum that is a split input's gradient
    twice (two layouts), a folded zero pad's gathered operand padded (`zero_pads`); the buffers a matrix
    product gathers whole -> the split they have before it; and those partial sums -> the input's split, which
    the reduce-scatter gives them at once and their readers read.

    `weight_splits`: per variable index (`step.weight_of`), {axis: dimension}
    of its layout on the candidate mesh; `sizes`: {axis: devices} of that
    mesh (a dimension a reshape takes apart is split only as far as the axis
    and its leading part both divide, `_reshape`; default: as if they did).
    A call whose inputs are split as an earlier call's of the same program
    were (a Llama's identical blocks) reuses that call's result.
    """
    sizes = sizes or {}
    splits = [{} for _ in step.size]
    for g, var in step.weight_of.items():
        if step.term[g] == "external":
            splits[g] = dict(weight_splits[var])
    forward = {}  # per call (its mapping): its forward run's key and local splits, read by its backward run
    memo = {}  # run key -> what `_run` gives for it
    gathered = {}  # buffer -> the axes a matrix product or a convolution gathers it over
    by_products = set()  # those a matrix product gathers
    summed = set()  # convolutions' partial sums and sums of them: whole until their reduction, whatever reads them
    enlarged = {}  # a split input's gradient -> {axis: 2}: reduce-scattered from a features-first copy
    reduced = {}  # such a gradient -> the input's split: what the reduce-scatter leaves, and its readers read
    views = {}  # buffer -> {shape: split} of the values of other shapes a call wrote it as (a transpose's view)
    for item in step.agenda:
        if item[0] == "acc":
            # a part may be a view of the sum's shape (a reader took the tensor through a reshape)
            parts = [_fit(reduced.get(x, splits[x]), step.shape[x], step.shape[item[1]], sizes) for x in item[2]]
            splits[item[1]] = _merged(parts)
            views.pop(item[1], None)
            if all(x in reduced and step.shape[x] == step.shape[item[1]] for x in item[2]):
                # XLA adds the partial sums whole and reduce-scatters their sum once (ReduceScatterReassociate)
                for x in item[2]:
                    del reduced[x]
                    enlarged.pop(x, None)  # whole in one layout until they are added
                reduced[item[1]], splits[item[1]] = splits[item[1]], {}
                summed.add(item[1])
        if item[0] != "run":
            continue
        _, (p, mapping), lo, hi = item
        before, env = forward.get(id(mapping), (None, {}))
        fixed = frozenset(x for x, g in mapping.items() if g is not None and _fixed(step, g))
        given = {  # a partial sum reduced at once is read with its reduced split
            x: _given(reduced.get(g, splits[g]), views, g, step.shape[g], p.flat.shape[x], sizes)
            for x in (*p.w, *p.c, *p.a, *p.ct)
            if (g := mapping.get(x)) is not None
        }
        key = (
            id(p),
            lo,
            before,
            fixed,
            tuple(sorted((x, tuple(sorted(s.items(), key=str))) for x, s in given.items())),
        )
        if key not in memo:
            memo[key] = _run(p.flat, lo, hi, dict(env), given, fixed, sizes)
        env, gathered_here, summed_here, products_here = memo[key]
        forward[id(mapping)] = (key, env)
        for x in summed_here:
            if mapping.get(x) is None:
                continue
            summed.add(mapping[x])
            primal = mapping.get(p.a[p.ga.index(x)]) if x in p.ga else None
            if primal is not None and splits[primal]:  # XLA gives an input's gradient the input's split
                enlarged[mapping[x]] = {a: 2.0 for a in splits[primal]}
                reduced[mapping[x]] = _fit(splits[primal], step.shape[primal], step.shape[mapping[x]], sizes)
        own = set()  # buffers a value of their own shape split here: a view of another shape (a transpose's) keeps it
        written = {}  # buffer -> {shape: split} of the views of other shapes written here
        for x, s in env.items():
            g = mapping.get(x)
            if g is None or _fixed(step, g) or g in summed:
                continue
            if tuple(p.flat.shape[x]) != tuple(step.shape[g]):
                written.setdefault(g, {})[tuple(p.flat.shape[x])] = s
            if g in own:
                continue
            splits[g] = _fit(s, p.flat.shape[x], step.shape[g], sizes)
            if s and tuple(p.flat.shape[x]) == tuple(step.shape[g]):
                own.add(g)
            views.pop(g, None)
        views.update(written)
        for x, axes in gathered_here.items():
            if (g := mapping[x] if x in mapping else folded_operand(p, x, mapping)) is not None:  # or a pad's operand
                gathered.setdefault(g, set()).update(axes)
                if x in products_here:
                    by_products.add(g)
    gather_padded(step, gathered, enlarged)
    before = {}
    for g, axes in gathered.items():  # read whole by a contraction: XLA keeps the gathered copy
        if not _fixed(step, g):
            if g in by_products:
                before[g] = splits[g]
            splits[g] = {a: d for a, d in splits[g].items() if a not in axes}
    for g, source in step.derived.items():
        splits[g] = dict(splits[source])
    return splits, enlarged, before, reduced


def _run(f, lo, hi, env, given, fixed, sizes):
    """Operations lo..hi of program `f`: the local splits after them (`env` extended), the values gathered, the
    convolutions' partial sums and the values a matrix product gathers."""
    gathered, summed, by_products = {}, set(), set()
    for i in range(lo, hi):
        name, ins, outs = f.eqns[i]
        operands = []
        for x in ins:
            if x not in env:
                env[x] = given.get(x, {})
            operands.append(env[x])
        shapes = [f.shape[x] for x in ins]
        made = _rule(name, f.params[i], operands, shapes, [f.shape[o] for o in outs], sizes)
        for o, s in zip(outs, made):
            env[o] = s
        if name == "dot_general":
            found = _gathered(f.params[i], operands)
            by_products.update(x for x, axes in zip(ins, found) if axes)
        elif name == "conv_general_dilated":
            found = conv_splits.gathered_inputs(f.params[i], operands, shapes)
            if conv_splits.partial_sum(f.params[i], operands, shapes):
                summed.update(outs)
        else:
            continue
        for x, axes in zip(ins, found):
            if axes:
                gathered.setdefault(x, set()).update(axes)
    for i in range(hi - 1, lo - 1, -1):  # back from readers: a value an elementwise reader splits is split
        name, ins, outs = f.eqns[i]
        if name in _SAME_POSITIONS and outs and env[outs[0]]:
            for x in ins:
                if not env[x] and f.shape[x] == f.shape[outs[0]] and x not in fixed:
                    env[x] = env[outs[0]]
        elif name == "gather" and env[ins[0]] and not env[ins[1]] and ins[1] not in fixed:  # an iota's index
            env[ins[1]] = gather_index_splits(f, f.params[i], ins[0], env[ins[0]], ins[1])
            env.update((y, s) for y, s in index_views(f, i, ins[1], env[ins[1]]) if not env[y] and y not in fixed)
        elif name in LOOPS:  # a loop's initial state takes the state's split
            for x, out in _carried(f.params[i], ins, outs):
                if not env[x] and x not in fixed:
                    env[x] = env[out]
    return env, gathered, summed, by_products


def _given(split, views, g, buffer_shape, shape, sizes):
    """The split a call's value of `shape` takes from buffer `g` (split `split`): a view's own where a call wrote `g`
    as one of that shape (a transpose's: its dimensions are the buffer's in another order), else `split`, fitted."""
    seen = views.get(g, {})
    return seen[tuple(shape)] if tuple(shape) in seen else _fit(split, buffer_shape, shape, sizes)


def _fit(split, shape, buffer_shape, sizes):
    """`split` of a value of `shape` on the buffer it is a view of (a squeeze or reshape aliases its source)."""
    return split if tuple(shape) == tuple(buffer_shape) else _reshape(split, shape, buffer_shape, sizes)


def _fixed(step, g):
    """Whether buffer `g` keeps the split it starts with: a weight or a copy of one, a model input."""
    return step.term[g] == "external" or g in step.weight_of


def factors(splits, shapes, axes, enlarged=None):
    """Per buffer: the share of it one device holds, its split dimensions divided by `axes` (role -> size).

    A dimension of n split m ways is padded to a multiple of m: a device holds ceil(n / m) of its n. Where a
    reshape left the split on a dimension of k < m that k divides, the rest of the axis (m / k ways) splits the
    dimension after it (its key `(axis, k)`, `_reshape`).
    `enlarged`: buffer -> {axis: times} (`split_axes`'s second result), applied where that axis has several devices.
    """
    more = enlarged or {}
    out = [max([t for a, t in more.get(g, {}).items() if axes.get(a, 1) > 1], default=1.0) for g in range(len(splits))]
    for g, s in enumerate(splits):
        for key, d in s.items():
            n, m = shapes[g][d], _ways(key, axes)
            if n and m > 1:
                out[g] *= -(-n // m) / n
    return out


def _ways(key, axes):
    """How many ways `key` splits its dimension on a mesh of `axes`: an axis's size, or the rest of it (`_reshape`)."""
    if isinstance(key, str):
        return axes.get(key, 1)
    if len(key) == 3:  # (axis, "of", n): a part of n elements split as far as n and the axis both allow
        return math.gcd(axes.get(key[0], 1), key[2])
    axis, major = key
    m = axes.get(axis, 1)
    return m // major if m > major and m % major == 0 else 1


def _merged(operands):
    """The splits of several operands of one operation together (the first operand's dimension for each axis)."""
    out = {}
    for s in operands:
        for axis, d in s.items():
            out.setdefault(axis, d)
    return out


def _rule(name, params, operands, in_shapes, out_shapes, sizes=None):
    """The split of each output of one operation, from its operands' splits and shapes."""
    if not any(operands):
        return [{} for _ in out_shapes]
    rank = len(out_shapes[0]) if out_shapes else 0
    if name == "dot_general":
        return [_dot(params, operands, in_shapes)]
    if name == "broadcast_in_dim":
        return [{a: params[d] for a, d in operands[0].items()}]
    if name == "transpose":
        return [{a: list(params).index(d) for a, d in operands[0].items()}]
    if name in _REDUCTIONS or name == "squeeze":
        dropped = set(params)
        return [{a: d - sum(r < d for r in dropped) for a, d in operands[0].items() if d not in dropped}]
    if name == "reshape":
        return [_reshape(operands[0], in_shapes[0], out_shapes[0], sizes)]
    if name == "concatenate":
        return [{a: d for a, d in _merged(operands).items() if d != params}]
    if name == "stack":  # a new dimension at `params`
        return [{a: d + (d >= params) for a, d in _merged(operands).items()}]
    if name == "unstack":  # dimension `params` taken apart
        return [{a: d - (d > params) for a, d in operands[0].items() if d != params} for _ in out_shapes]
    if name == "gather":
        return [gather_output_split(params, operands[0], in_shapes[0], len(out_shapes[0]))]
    if name == "conv_general_dilated":
        return [conv_splits.output_split(params, operands)]
    if name in LOOPS:
        return _loop(params, operands, sizes)
    if name in _SLICES:
        return [_slice(operands[0], in_shapes[0], shape, sizes) for shape in out_shapes]
    if name in _SAME_POSITIONS:
        same = [s for s, shape in zip(operands, in_shapes) if len(shape) == rank]
        return [_merged(same) for _ in out_shapes]
    return [{} for _ in out_shapes]  # an operation not followed: its outputs are counted whole


def _loop(loop, operands, sizes):
    """A loop's outputs: its body followed with the operands' splits, the carry's until they stop changing.

    A scan's stacked inputs are read a step at a time (their leading
    dimension dropped) and its per-step results stacked (one added). The
    carry takes the splits its body gives it (a recurrent state that starts
    as zeros and is updated from split heads), as GSPMD gives a loop's
    state, body and results one sharding.
    """
    given = {x: s for x, s in zip(loop.reads, operands) if x is not None}
    n_in = loop.consts + loop.carry
    for x in loop.ins[n_in:]:
        given[x] = {a: d - 1 for a, d in given.get(x, {}).items() if d > 0}
    carry_in, carry_out = loop.ins[loop.consts : n_in], loop.outs[: loop.carry]
    for _ in range(len(AXES) * len(carry_in) + 1):  # a round that changes something adds an axis to a carry
        env = _run(loop.body, 0, len(loop.body.eqns), {}, dict(given), frozenset(), sizes)[0]
        merged = {x: _merged([given.get(x, {}), env.get(o, {})]) for x, o in zip(carry_in, carry_out)}
        if all(merged[x] == given.get(x, {}) for x in carry_in):
            break
        given.update(merged)
    result = [given.get(x, {}) for x in carry_in]
    return result + [{a: d + 1 for a, d in env.get(o, given.get(o, {})).items()} for o in loop.outs[loop.carry :]]


def _carried(loop, ins, outs):
    """(operand, output) pairs of a loop's operation: each initial state and the state the loop ends with."""
    carry = loop.ins[loop.consts : loop.consts + loop.carry]
    return [(x, outs[carry.index(b)]) for x, b in zip(ins, loop.reads) if b in carry]


def _dot(params, operands, in_shapes):
    """The output's splits: batch dimensions first, then the left operand's free ones, then the right's.

    Where both operands bring one axis on different dimensions, the larger operand's split wins, the left one's
    if they are alike (XLA's sharding propagation, `InferDotShardingFromOperands`): an attention's score gradient
    keeps its heads' split, the keys it multiplies are gathered.
    """
    (lc, rc), (lb, rb) = params
    lhs, rhs = operands[0], operands[1] if len(operands) > 1 else {}
    lfree = [d for d in range(len(in_shapes[0])) if d not in lc and d not in lb]
    rfree = [d for d in range(len(in_shapes[1])) if d not in rc and d not in rb]
    position = {}
    sides = [(lhs, lb, lfree, len(lb)), (rhs, rb, rfree, len(lb) + len(lfree))]
    if math.prod(in_shapes[0]) < math.prod(in_shapes[1]):
        sides.reverse()
    for side, batch, free, offset in sides:
        for axis, d in side.items():
            if d in batch:
                position.setdefault(axis, list(batch).index(d))
            elif d in free:
                position.setdefault(axis, offset + free.index(d))
    return position


def _gathered(params, operands):
    """Per operand of a matrix product: the axes it is gathered over (split on a dimension it contracts alone)."""
    (lc, rc), _ = params
    lhs, rhs = operands[0], operands[1] if len(operands) > 1 else {}
    out = []
    for side, other, mine, theirs in ((lhs, rhs, lc, rc), (rhs, lhs, rc, lc)):
        out.append({a for a, d in side.items() if d in mine and other.get(a) != theirs[list(mine).index(d)]})
    return out


def _reshape(split, shape, new_shape, sizes=None):
    """A split dimension keeps its split where the reshape keeps it leading: same elements before it.

    A dimension taken apart (8 query heads into 2 key/value heads x 4) keeps
    the split on its leading part; GSPMD splits the next part too when the
    axis has more devices than the leading part has elements (4 devices: the
    2 heads and each head's 4 queries 2 ways). That rest is kept under the
    key `(axis, size of the leading part)`; `factors` says how many ways it splits.
    Where the axis has `sizes[axis]` devices and neither that number nor the
    leading part divides the other (a flat projection of 8 heads split 3 or 6
    ways, reshaped to heads x head size: T5's), GSPMD splits the leading part
    only as many ways as both divide, and the value is that much less split
    (3 ways: whole; 6 ways: 4 of the 8 heads on each device). That split is
    kept under the key `(axis, "of", size of the leading part)`.
    """
    starts = {math.prod(new_shape[:e]): e for e in range(len(new_shape)) if new_shape[e] > 1}
    out = {}
    for key, d in split.items():
        e = starts.get(math.prod(shape[:d]))
        if e is None or (new_shape[e] % shape[d] and shape[d] % new_shape[e]):
            continue
        taken_apart = isinstance(key, str) and new_shape[e] < shape[d]
        devices = (sizes or {}).get(key, 1) if taken_apart else 1
        if new_shape[e] % devices and devices % new_shape[e]:  # as far as both allow: their gcd
            out[(key, "of", new_shape[e])] = e
            continue
        out[key] = e
        if taken_apart:  # the rest on the next part
            rest = next((r for r in range(e + 1, len(new_shape)) if new_shape[r] > 1), None)
            if rest is not None:
                out[(key, new_shape[e])] = rest
    return out


def _slice(split, shape, new_shape, sizes=None):
    """A slice keeps a split whose shares it takes whole; one that cuts them (GPT-NeoX's queries, 32 of each head's
    fused 96 split 16 ways) moves it to the dimension before (the heads), as far as both divide, as GSPMD does: under
    the key `(axis, "of", its size)`, as `_reshape` keeps such a split (docs/plan.md)."""
    out = {}
    for key, d in split.items():
        n, m = shape[d], _ways(key, sizes or {})
        if new_shape[d] == n or m <= 1 or new_shape[d] % -(-n // m) == 0:
            out[key] = d
            continue
        before = next((e for e in range(d - 1, -1, -1) if new_shape[e] > 1), None)
        if isinstance(key, str) and before is not None and before not in out.values():
            out[(key, "of", new_shape[before])] = before
    return out
