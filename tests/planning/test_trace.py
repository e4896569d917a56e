"""Tracing a call into a flat program: a loop stays one operation, its body kept for propagation and FLOPs."""

import jax
import jax.numpy as jnp
import keras

from kdist.planning import buffers, trace

STEPS, BATCH, WIDTH = 5, 4, 8


def _recurrence(tw, da, cs):
    """A state multiplied by a weight and added to the step's input, STEPS times (`jax.lax.scan`)."""
    (w,), (x,) = tw, da

    def step(state, x_t):
        state = jnp.tanh(state @ w + x_t)
        return state, state

    return [jax.lax.scan(step, jnp.zeros((BATCH, WIDTH)), x)[1]]


def test_a_scan_is_one_operation_whose_flops_are_its_bodys_times_its_length():
    p = trace.trace_program(
        _recurrence,
        [jax.ShapeDtypeStruct((WIDTH, WIDTH), "float32")],
        [],
        [jax.ShapeDtypeStruct((STEPS, BATCH, WIDTH), "float32")],
    )
    scans = [i for i, (name, _, _) in enumerate(p.flat.eqns) if name == "scan"]
    assert len(scans) == 2 and scans[0] < p.n_fwd <= scans[1]  # the forward loop and its transpose
    product = 2 * BATCH * WIDTH * WIDTH
    assert p.flat.flops[scans[0]] == STEPS * product
    assert p.flat.flops[scans[1]] == STEPS * 2 * product  # the state's and the weight's gradients, each step
    assert all(isinstance(p.flat.params[i], trace.Loop) for i in scans)


def test_the_surrogate_losss_labels_drop_the_class_dimension_unless_it_is_one():
    assert trace.label_shape((None, 16, 32)) == (None, 16)  # token logits: a label per token
    assert trace.label_shape((None, 8, 8, 1)) == (None, 8, 8, 1)  # a one-channel map: Keras squeezes the label
    assert trace.label_shape((None, 1)) == (None, 1)
    assert trace.label_shape(()) == ()  # a scalar output (verify labels every output)


def _branches(fixed):
    """x @ w, or x x 0, chosen by a static size (as keras-hub's SAM 3 picks its box encoder) or by x's values."""

    def call(tw, da, cs):
        (w,), (x,) = tw, da
        pick = keras.ops.equal(keras.ops.shape(x)[1], 0) if fixed else jnp.sum(x) > 0
        return [keras.ops.cond(pick, lambda: x * 0.0, lambda: x @ w)]

    return call


def test_a_cond_whose_index_is_fixed_at_trace_time_is_the_branch_it_takes():
    shapes = [jax.ShapeDtypeStruct((WIDTH, WIDTH), "float32")], [], [jax.ShapeDtypeStruct((BATCH, WIDTH), "float32")]
    fixed = trace.trace_program(_branches(fixed=True), *shapes)
    names = [name for name, _, _ in fixed.flat.eqns]
    assert "cond" not in names and names[: fixed.n_fwd].count("dot_general") == 1
    assert sum(fixed.flat.flops[: fixed.n_fwd]) == 2 * BATCH * WIDTH * WIDTH
    chosen_at_run_time = trace.trace_program(_branches(fixed=False), *shapes)
    assert "cond" in [name for name, _, _ in chosen_at_run_time.flat.eqns]  # XLA keeps both branches: one operation


def _attention(tw, da, cs):
    """jax's own attention in bfloat16: its products ask for BF16_BF16_F32, float32 scores from bfloat16 inputs."""
    return [jax.nn.dot_product_attention(*da, implementation="xla")]


def test_a_float32_operand_of_a_product_that_rounds_to_bfloat16_is_read_as_one_bfloat16_cast():
    qkv = [jax.ShapeDtypeStruct((BATCH, 16, 2, WIDTH), "bfloat16")] * 3
    p = buffers.analyse(trace.trace_program(_attention, [], [], qkv), buffers.Rules())
    f = p.flat
    products = [i for i, (name, _, _) in enumerate(f.eqns) if name == "dot_general"]
    read = [x for i in products for x in f.eqns[i][1]]
    assert len(products) == 6 and {f.dtype[x] for x in read} == {"bfloat16"}
    casts = [i for i, (_, _, outs) in enumerate(f.eqns) if outs and outs[0] in f.rounded.values()]
    # the score gradient, read by the query's and the key's gradient products: cast once, written in 16 bits
    assert len(casts) == 1 and casts[0] >= p.n_fwd
    (score_gradient,), (cast,) = f.eqns[casts[0]][1:]
    assert f.dtype[score_gradient] == "float32" and not p.mat[score_gradient]
    assert p.mat[cast] and sum(x == cast for x in read) == 2
