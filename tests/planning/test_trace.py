"""Tracing a call into a flat program: a loop stays one operation, its body kept for propagation and FLOPs."""

import jax
import jax.numpy as jnp

from kdist.planning import trace

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
