"""XLA:GPU's layouts for batched matrix products: which values are written once more, in another order, and where."""

import jax
import jax.numpy as jnp

from kdist.planning import buffers, layouts, trace
from tests.helpers import SOFTMAX_BACKWARD_READS_PROBABILITIES

B, T, K, G, H = 3, 16, 2, 4, 8
QUERIES = jax.ShapeDtypeStruct((B, T, K, G, H), jnp.float32)
KEYS = jax.ShapeDtypeStruct((B, T, K, H), jnp.float32)
SCORES = B * K * G * T * T * 4  # bytes


def _grouped_attention(scores):
    """Gemma's grouped attention with its scores in `scores` order ("bkgts" or "bktgs"), traced forward and
    backward."""

    def fn(trainable, diff, const):
        q, k, v = diff
        p = jax.nn.softmax(jnp.einsum(f"btkgh,bskh->{scores}", q, k), axis=-1)
        return [jnp.einsum(f"{scores},bskh->btkgh", p, v)]

    return trace.trace_program(fn, [], [], [QUERIES, KEYS, KEYS])


def _written_again(before, after):
    """The equations of `after` that `before` did not have, by (index in `after`, equation)."""
    old = {(prim, tuple(outs)) for prim, _, outs in before}
    return [(i, e) for i, e in enumerate(after) if (e[0], tuple(e[2])) not in old]


def test_gemmas_score_gradient_is_written_in_each_order_its_two_products_read():
    """ "bkgts" puts the groups before the queries: the backward's two products read the scores' gradient in two
    orders, neither its own; XLA writes it in both, from one kernel."""
    p = _grouped_attention("bkgts")
    before = list(p.flat.eqns)
    layouts.copy_operands(p)
    added = [(i, e) for i, e in _written_again(before, p.flat.eqns) if e[0] != "copy"]  # the probabilities' below
    # the gradient's equation again (an add_any where jax 0.12.1's softmax backward makes it), then its new order
    assert [e[0] for _, e in added] == ["add_any" if SOFTMAX_BACKWARD_READS_PROBABILITIES else "mul", "transpose"]
    (i, again), (_, transposed) = added
    source = p.flat.eqns[i - 1]  # right after the equation that makes the gradient, the same computation
    assert source[0] == again[0] and source[1] == again[1] and p.flat.size[again[2][0]] == SCORES
    assert i - 1 >= p.n_fwd  # in the backward, where both are made
    products = [ins for prim, ins, _ in p.flat.eqns[p.n_fwd :] if prim == "dot_general"]
    assert sum(transposed[2][0] in ins for ins in products) == 1


def test_probabilities_lying_otherwise_are_copied_where_the_value_gradient_reads_them():
    """jax makes "bkgts" as (b, k, s, t, g), transposed: the probabilities lie so, which the forward's product
    (contracting s) reads, and the values' gradient (contracting g then t) cannot. XLA:GPU transposes a copy in
    the backward (Gemma 2's `wrapped_transpose`): right before that product, from the forward's probabilities."""
    p = _grouped_attention("bkgts")
    before = list(p.flat.eqns)
    layouts.copy_operands(p)
    f = p.flat
    ((i, (_, (probabilities,), (copied,))),) = [(i, e) for i, e in _written_again(before, f.eqns) if e[0] == "copy"]
    forward_products = [ins for prim, ins, _ in f.eqns[: p.n_fwd] if prim == "dot_general"]
    assert i >= p.n_fwd and f.size[copied] == SCORES and any(probabilities in ins for ins in forward_products)
    reader = f.eqns[i + 1]
    assert reader[0] == "dot_general" and copied in reader[1] and f.params[i + 1][0][reader[1].index(copied)] == (2, 3)
    assert not any(probabilities in ins for prim, ins, _ in f.eqns[p.n_fwd :] if prim == "dot_general")


def test_probabilities_cast_down_lie_as_the_scores_they_are_computed_from():
    """Gemma 2 in bfloat16: the scores cast up, a float32 softmax, the probabilities cast down for the values'
    product. A cast keeps its operand's layout, so they lie as in float32 and are copied for the values' gradient
    (Gemma 2's bfloat16 step on data=8 transposes a bfloat16 copy there, `wrapped_transpose`)."""

    def fn(trainable, diff, const):
        q, k, v = diff
        scores = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32)
        p = jax.nn.softmax(scores, axis=-1).astype(jnp.bfloat16)
        return [jnp.einsum("bkgts,bskh->btkgh", p, v)]

    p = trace.trace_program(fn, [], [], [jax.ShapeDtypeStruct(s.shape, jnp.bfloat16) for s in (QUERIES, KEYS, KEYS)])
    before = list(p.flat.eqns)
    f = layouts.copy_operands(p).flat
    ((_, (_, _, (copied,))),) = [(i, e) for i, e in _written_again(before, f.eqns) if e[0] == "copy"]
    assert f.dtype[copied] == "bfloat16" and f.size[copied] == SCORES // 2


def test_a_softmax_over_the_innermost_dimension_is_not_copied():
    """Scores made as (b, k, t, g, s) (Gemma 3's, by a vmapped product) and seen as "bkgts": the softmax sums the
    dimension innermost as they lie, one normalization kernel, which XLA:GPU runs again in the backward instead
    of keeping the probabilities (not modelled): no copy is added, the backward reads the forward's."""

    def fn(trainable, diff, const):
        q, k, v = diff
        scores = jax.lax.dot_general(q, k, (((4,), (3,)), ((0, 2), (0, 2))))  # (b, k, t, g, s)
        p = jax.nn.softmax(jnp.transpose(scores, (0, 1, 3, 2, 4)), axis=-1)
        return [jnp.einsum("bkgts,bskh->btkgh", p, v)]

    p = trace.trace_program(fn, [], [], [QUERIES, KEYS, KEYS])
    before = list(p.flat.eqns)
    assert [e for _, e in _written_again(before, layouts.copy_operands(p).flat.eqns) if e[0] == "copy"] == []


def test_scores_in_the_queries_order_are_read_in_place():
    p = _grouped_attention("bktgs")
    before = list(p.flat.eqns)
    assert _written_again(before, layouts.copy_operands(p).flat.eqns) == []


def test_products_without_batch_dimensions_and_matrices_read_transposed_are_left_alone():
    """A product over two contracted dimensions that are not adjacent (an MoE expert's gradient) is left to the
    fusion rules; a matrix read transposed needs no other order (cuBLAS reads either run first)."""

    def experts(trainable, diff, const):
        h = jnp.tanh(diff[0])  # (experts, tokens, width)
        return [jnp.einsum("etw,ewd->td", h, const[0]), jnp.einsum("etw,td->ew", h, const[1])]

    tokens = jax.ShapeDtypeStruct((4, 32, 8), jnp.float32)
    weights = [jax.ShapeDtypeStruct((4, 8, 6), jnp.float32), jax.ShapeDtypeStruct((32, 6), jnp.float32)]

    def transposed(trainable, diff, const):
        return [jnp.tanh(diff[0]) @ jnp.swapaxes(jnp.tanh(diff[1]), -1, -2)]

    matrices = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    programs = (
        trace.trace_program(experts, [], weights, [tokens]),
        trace.trace_program(transposed, [], [], [matrices] * 2),
    )
    for p in programs:
        before = list(p.flat.eqns)
        assert _written_again(before, layouts.copy_operands(p).flat.eqns) == []


def test_the_orders_are_added_once_and_keep_the_program_whole():
    p = layouts.copy_operands(_grouped_attention("bkgts"))
    n, n_fwd = len(p.flat.eqns), p.n_fwd
    assert len(layouts.copy_operands(p).flat.eqns) == n and p.n_fwd == n_fwd
    assert len(p.flat.scopes) == len(p.flat.params) == len(p.flat.flops) == n
    producer = {o: i for i, (_, _, outs) in enumerate(p.flat.eqns) for o in outs}
    assert all(producer.get(x, -1) < i for i, (_, ins, _) in enumerate(p.flat.eqns) for x in ins)  # made, then read
    buffers.analyse(p, buffers.Rules())
    written = [outs[0] for prim, _, outs in p.flat.eqns[p.n_fwd :] if p.flat.size[outs[0]] == SCORES]
    assert sum(p.mat[x] for x in written) >= 3  # the probabilities' gradient and the scores' in two orders


def _projected_attention():
    """T5's attention: q, k and v made by matrix products without a bias, split into heads by a reshape and read as
    they are by the scores' and the output's products."""

    def fn(trainable, diff, const):
        x = diff[0]
        q, k, v = ((x @ w).reshape(B, T, K, H) for w in trainable)
        p = jax.nn.softmax(jnp.einsum("bqnd,bknd->bnqk", q, k), axis=-1)
        return [jnp.einsum("bnqk,bknd->bqnd", p, v)]

    weight = jax.ShapeDtypeStruct((K * H, K * H), jnp.float32)
    return trace.trace_program(fn, [weight] * 3, [], [jax.ShapeDtypeStruct((B, T, K * H), jnp.float32)])


def test_a_products_output_is_copied_once_per_order_the_batched_products_read_it_in():
    """A GEMM writes its output in its own order: the batched products reading q, k and v by heads read copies.
    q's and v's copies serve the backward's products too; k is read in another order there, copied there again
    from the projection's output, which the backward reads for it."""
    p = layouts.copy_operands(_projected_attention())
    f = p.flat
    copies = [(i, ins[0], outs[0]) for i, (prim, ins, outs) in enumerate(f.eqns) if prim == "copy"]
    by_heads = [outs[0] for prim, _, outs in f.eqns[: p.n_fwd] if prim == "reshape"][:3]  # q, k and v
    assert [value for i, value, _ in copies if i < p.n_fwd] == by_heads
    q, k, v = (copy for i, _, copy in copies if i < p.n_fwd)
    batched = [(i, ins) for i, (prim, ins, _) in enumerate(f.eqns) if prim == "dot_general" and f.params[i][1][0]]

    def read_in_forward(x):
        return [i < p.n_fwd for i, ins in batched if x in ins]

    assert read_in_forward(q) == read_in_forward(v) == [True, False] and read_in_forward(k) == [True]
    ((i, value, again),) = [c for c in copies if c[0] >= p.n_fwd]
    assert value == by_heads[1] and read_in_forward(again) == [False]
    assert not any(x in by_heads for _, ins in batched for x in ins)  # no product reads a GEMM's output by heads
