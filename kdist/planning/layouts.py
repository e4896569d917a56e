"""XLA:GPU's layouts for batched matrix products: a value read in an order it does not lie in is written again.

cuBLAS reads each operand of a batched matrix product as a (batch, rows,
columns) array: the batch dimensions outermost, then two runs of
dimensions, each in its order. XLA:GPU's layout assignment keeps an
operand's layout when it has that form (either run first) and otherwise
has it written in (batch, free, contracted) order for a left operand and
(batch, contracted, free) for a right one
(`GpuLayoutAssignment::SetDotOperandLayout`). Three cases are met:

- A value an elementwise kernel makes and two such products read in
  different orders is written once per order, by that kernel (multi-output
  fusion). Gemma's grouped attention (`einsum("btkgh,bskh->bkgts")`, the
  groups before the queries): the gradient of its scores, which the
  backward's two products read in two orders, is two buffers
  (`xla_buffers_at_peak.json`), one more than the estimate counted before.
- A forward matrix product's output (through reshapes) is written as the
  GEMM lays it out, so each order a batched product reads it in is a copy,
  made where the first product reading that order runs: a forward order's
  copy serves the backward's products that read it in that order, an order
  only the backward reads is copied there from the product's output, which
  lives until then. T5's attention (q, k and v projected without a bias,
  split into heads by a reshape): XLA keeps q's and v's copies for the
  backward and writes k again there from the merged q/k/v output
  (`buffers._merged_gemms`), which it keeps on a mesh of several devices
  (docs/plan.md, "Copies of a projection's heads").
- A forward elementwise value a backward product cannot read as the forward
  wrote it is copied there, right before that product, from the value kept
  since the forward. Where the forward wrote it is followed back through
  transposes, casts and elementwise operations to the value it is computed
  from, which lies row-major (`row_major.lies`): Gemma 2's attention probabilities lie as
  its scores' GEMM wrote them, (b, k, s, t, g); the gradient of the values
  (contracting g and t, in that order) cannot read them so, and XLA:GPU
  transposes a copy of the kept probabilities in the backward
  (`wrapped_transpose`, one per layer). Not modelled: a softmax over the
  dimension innermost as it lies (Gemma 3's, whose scores lie (b, k, t, g,
  s)) is one normalization kernel, which XLA:GPU runs again in the
  backward from the scores instead, and the forward's probabilities are
  not kept (docs/plan.md, "Probabilities read again in the backward").

`copy_operands` writes an elementwise value's extra orders within its part
of the step as its equation again, the others as copies, each followed by
a transpose (a layout, not a kernel: `primitives.ALIASES`). Within its part a
value is taken to lie in its row-major order (XLA's default layout), seen
through transposes. Not modelled: products without batch dimensions (MoE
experts' weight products), for which XLA computed the value again inside
each reader's kernel (GPT-OSS on data=8), and a backward product's output
(RoBERTa's compiled step writes the output projection's input gradient by
heads at once; copied, ELECTRA's and the Llama 3's estimates went 1.5-1.8%
further over XLA's figures).
"""

import jax

from kdist.planning.primitives import ELEMENTWISE
from kdist.planning.row_major import broadcast, lies


def copy_operands(p):
    """Write each value of program `p` once more per order in which a batched product reads it.

    An elementwise value: the first product that cannot read it as it lies
    takes the order XLA writes it in; each other order is the value's
    equation again and a transpose, right after that equation, read by the
    products of the value's part of the step (forward or backward) that
    need it; a forward one that a backward product cannot read as the
    forward wrote it, a copy and a transpose right before that product. A
    forward matrix product's output: each order is a copy and a
    transpose, after the output's equation where a forward product reads
    that order, else right before the first backward product that does.
    Loop bodies are left as they are. Returns `p`, changed in place (its
    equations, `n_fwd` and `sublayers`).
    """
    f = p.flat
    producer = {o: i for i, (_, _, outs) in enumerate(f.eqns) for o in outs}
    needs = {}  # source -> [(product, side, view, order)] of the batched products that cannot read it in place
    made_by_product = {}  # the same, for a forward matrix product's output (through reshapes), from either part
    forward_values = {}  # forward elementwise value -> [(product, side, view, contracted, batch)]: every such reader
    for i, (prim, ins, _) in enumerate(f.eqns):
        if prim != "dot_general" or len(ins) != 2:
            continue
        contracting, batch = f.params[i]
        for side in range(2):
            source, view = _source(ins[side], f, producer)
            j = producer.get(source)
            if not batch[side] or j is None:
                continue
            if j < p.n_fwd and _elementwise(j, f):
                forward_values.setdefault(source, []).append((i, side, view, contracting[side], batch[side]))
            orders = _orders(view, contracting[side], batch[side], f.shape[source])
            if orders is None:
                continue
            if _kernel(j, f, producer) == "dot_general" and j < p.n_fwd:
                made_by_product.setdefault(source, []).append((i, side, view, orders[side]))
            if (j < p.n_fwd) != (i < p.n_fwd):
                continue
            if _elementwise(j, f):
                needs.setdefault(source, []).append((i, side, view, orders[side]))
    copies, after = {}, {}  # (source, view, order) -> the copy; equation index -> [equations to place after it]
    for source, readers in needs.items():
        j, first = producer[source], readers[0][3]
        for i, side, view, order in readers:
            if order == first:
                continue
            if (source, view, order) not in copies:
                prim, ins, _ = f.eqns[j]
                again = c = _new_like(f, source)
                after.setdefault(j, []).append((prim, list(ins), [again], f.params[j]))
                if view != tuple(range(len(view))):
                    c = _new_like(f, f.eqns[i][1][side])
                    after[j].append(("transpose", [again], [c], view))
                copies[source, view, order] = c
            f.eqns[i][1][side] = copies[source, view, order]
    for source, readers in forward_values.items():
        _copy_before_readers(f, source, _read_otherwise_in_backward(source, readers, p, producer), after)
    for source, readers in made_by_product.items():
        _copy_before_readers(f, source, readers, after, at=producer[source], n_fwd=p.n_fwd)
    if after:
        _insert(p, after)
    return p


def _copy_before_readers(f, source, readers, after, at=None, n_fwd=0):
    """Copy `source` once per order its `readers` [(product, side, view, order)] read it in, each copy followed
    by the transposes they read: right after equation `at` where a forward product reads that order, else right
    before the first product that does."""
    for order in dict.fromkeys(order for _, _, _, order in readers):
        reading = [(i, side, view) for i, side, view, o in readers if o == order]
        place = at if at is not None and reading[0][0] < n_fwd else reading[0][0] - 1
        copied = _new_like(f, source)
        after.setdefault(place, []).append(("copy", [source], [copied], None))
        views = {}
        for i, side, view in reading:
            if view not in views:
                views[view] = copied
                if view != tuple(range(len(view))):
                    views[view] = _new_like(f, f.eqns[i][1][side])
                    after[place].append(("transpose", [copied], [views[view]], view))
            f.eqns[i][1][side] = views[view]


def _read_otherwise_in_backward(x, readers, p, producer):
    """[(backward product, side, view, order)]: those of forward elementwise value x's batched `readers` [(product,
    side, view, contracted, batch)] in the backward that cannot read x as the forward wrote it, none where x is a
    normalization over the dimension innermost there, which XLA:GPU computes again instead (not modelled: the
    module's docstring). The forward writes x as it lies (`row_major.lies`), or where a forward product cannot read
    that, in the order the first such product reads."""
    f, shape = p.flat, p.flat.shape[x]
    lying = lies(x, f, producer)
    written = next(
        (
            _order(view, contracted, batch, side, shape)
            for i, side, view, contracted, batch in readers
            if i < p.n_fwd and not _readable(lying, view, contracted, batch, shape)
        ),
        lying,
    )
    if _normalizes_innermost(x, f, producer, written):
        return []
    return [
        (i, side, view, _order(view, contracted, batch, side, shape))
        for i, side, view, contracted, batch in readers
        if i >= p.n_fwd and not _readable(written, view, contracted, batch, shape)
    ]


def _elementwise(j, f):
    """Whether equation j is an elementwise operation with one output (a fused kernel's value)."""
    return f.eqns[j][0] in ELEMENTWISE and len(f.eqns[j][2]) == 1


def _readable(order, view, contracting, batch, shape):
    """Whether a batched product reads an operand (per dimension, its source's: `view`) of a source lying in `order`
    as it lies: the batch dimensions outermost in their order, then the contracted ones in their order before or
    after the free ones (dimensions of size 1 lie anywhere)."""
    big = [d for d in order if shape[d] != 1]
    b = [view[d] for d in batch if shape[view[d]] != 1]
    c = [view[d] for d in contracting if shape[view[d]] != 1]
    rest = big[len(b) :]
    return big[: len(b)] == b and (rest[: len(c)] == c or rest[len(rest) - len(c) :] == c)


def _order(view, contracting, batch, side, shape):
    """The order a batched product reads an operand in that does not lie so: (batch, free, contracted) for a left
    operand, (batch, contracted, free) for a right one, each in its order, without dimensions of size 1."""
    free = [d for d in range(len(view)) if d not in contracting and d not in batch]
    runs = (free, contracting) if side == 0 else (contracting, free)
    return tuple(view[d] for d in (*batch, *runs[0], *runs[1]) if shape[view[d]] != 1)


def _normalizes_innermost(x, f, producer, order):
    """Whether x is a normalization over its innermost dimension in `order` (a softmax's output): an elementwise
    value of x's shape made from a reduction over that dimension alone of another on its way."""
    chain, todo = set(), [x]
    while todo:
        v = todo.pop()
        if v in chain or v not in producer or f.eqns[producer[v]][0] not in ELEMENTWISE or broadcast(v, f, producer):
            continue
        chain.add(v)
        todo.extend(u for u in f.eqns[producer[v]][1] if f.shape[u] == f.shape[x])
    inner = [d for d in order if f.shape[x][d] != 1][-1:]
    return any(
        prim in ("reduce_sum", "reduce_max") and ins[0] in chain and [int(a) for a in axes] == inner
        for (prim, ins, _), axes in zip(f.eqns, f.params)
    )


def _kernel(j, f, producer):
    """The primitive of the kernel that made equation j's output, seen through reshapes."""
    while f.eqns[j][0] in ("reshape", "squeeze", "expand_dims") and f.eqns[j][1][0] in producer:
        j = producer[f.eqns[j][1][0]]
    return f.eqns[j][0]


def _source(x, f, producer):
    """The value operand x is a transpose of (or x), and for each dimension of x the dimension of that value."""
    view = tuple(range(len(f.shape[x])))
    while x in producer and f.eqns[producer[x]][0] == "transpose":
        j = producer[x]
        view = tuple(f.params[j][d] for d in view)
        x = f.eqns[j][1][0]
    return x, view


def _orders(view, contracting, batch, shape):
    """The orders of its source's dimensions in which a product can read an operand; None if they lie so.

    `view`: per operand dimension, its source's; `shape`: the source's
    shape. Returns ((batch, free, contracted), (batch, contracted, free)),
    each in its order (the first a left operand's own, the second a right
    one's), without dimensions of size 1, which lie anywhere.
    """
    orders = [_order(view, contracting, batch, side, shape) for side in range(2)]
    return None if any(list(order) == sorted(order) for order in orders) else orders


def _new_like(f, x):
    return f.new(jax.ShapeDtypeStruct(f.shape[x], f.dtype[x]))


def _insert(p, after):
    """Rebuild `p`'s equation lists with the equations of `after` placed after those they follow, in their part
    of the step, with their scope and sublayer."""
    f = p.flat
    rows, n_fwd = [], p.n_fwd
    for i, row in enumerate(zip(f.eqns, f.scopes, f.params, f.flops, p.sublayers or [None] * len(f.eqns))):
        _, scope, _, _, sublayer = row
        rows += [row] + [((prim, ins, outs), scope, param, 0, sublayer) for prim, ins, outs, param in after.get(i, [])]
        n_fwd += len(after.get(i, [])) * (i < p.n_fwd)
    eqns, scopes, params, flops, sublayers = (list(column) for column in zip(*rows))
    f.eqns, f.scopes, f.params, f.flops, p.n_fwd = eqns, scopes, params, flops, n_fwd
    if p.sublayers:
        p.sublayers = sublayers
