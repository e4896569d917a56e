"""XLA:GPU's layouts for batched matrix products: a value read in an order it does not lie in is written again.

cuBLAS reads each operand of a batched matrix product as a (batch, rows,
columns) array: the batch dimensions outermost, then two runs of
dimensions, each in its order. XLA:GPU's layout assignment keeps an
operand's layout when it has that form (either run first) and otherwise
has it written in (batch, free, contracted) order for a left operand and
(batch, contracted, free) for a right one
(`GpuLayoutAssignment::SetDotOperandLayout`). Two cases are met:

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

`copy_operands` writes an elementwise value's extra orders as its equation
again, and a product's as a copy, each followed by a transpose (a layout,
not a kernel: `buffers.ALIASES`). A value is taken to lie in its row-major
order (XLA's default layout), seen through transposes. Not modelled:
products without batch dimensions (MoE experts' weight products), for
which XLA computed the value again inside each reader's kernel (GPT-OSS on
data=8), an elementwise value read in the backward, and a backward
product's output (RoBERTa's compiled step writes the output projection's
input gradient by heads at once; copied, ELECTRA's and the Llama 3's
estimates went 1.5-1.8% further over XLA's figures).
"""

import jax

from kdist.planning.buffers import ELEMENTWISE


def copy_operands(p):
    """Write each value of program `p` once more per order in which a batched product reads it.

    An elementwise value: the first product that cannot read it as it lies
    takes the order XLA writes it in; each other order is the value's
    equation again and a transpose, right after that equation, read by the
    products of the value's part of the step (forward or backward) that
    need it. A forward matrix product's output: each order is a copy and a
    transpose, after the output's equation where a forward product reads
    that order, else right before the first backward product that does.
    Loop bodies are left as they are. Returns `p`, changed in place (its
    equations, `n_fwd` and `sublayers`).
    """
    f = p.flat
    producer = {o: i for i, (_, _, outs) in enumerate(f.eqns) for o in outs}
    needs = {}  # source -> [(product, side, view, order)] of the batched products that cannot read it in place
    made_by_product = {}  # the same, for a forward matrix product's output (through reshapes), from either part
    for i, (prim, ins, _) in enumerate(f.eqns):
        if prim != "dot_general" or len(ins) != 2:
            continue
        contracting, batch = f.params[i]
        for side in range(2):
            source, view = _source(ins[side], f, producer)
            orders = _orders(view, contracting[side], batch[side], f.shape[source])
            j = producer.get(source)
            if orders is None or not batch[side] or j is None:
                continue
            if _kernel(j, f, producer) == "dot_general" and j < p.n_fwd:
                made_by_product.setdefault(source, []).append((i, side, view, orders[side]))
            if (j < p.n_fwd) != (i < p.n_fwd):
                continue
            if f.eqns[j][0] in ELEMENTWISE and len(f.eqns[j][2]) == 1:
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
    for source, readers in made_by_product.items():
        for order in dict.fromkeys(order for _, _, _, order in readers):
            reading = [(i, side, view) for i, side, view, o in readers if o == order]
            place = producer[source] if reading[0][0] < p.n_fwd else reading[0][0] - 1
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
    if after:
        _insert(p, after)
    return p


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
    free = [d for d in range(len(view)) if d not in contracting and d not in batch]
    orders = [
        tuple(view[d] for d in (*batch, *first, *second) if shape[view[d]] != 1)
        for first, second in ((free, contracting), (contracting, free))
    ]
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
