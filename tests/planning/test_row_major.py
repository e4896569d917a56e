"""How a traced value lies in memory: row-major as the value it is computed from, through layouts and casts."""

import jax
import jax.numpy as jnp

from kdist.planning import row_major, trace

X = jax.ShapeDtypeStruct((2, 3, 5), jnp.bfloat16)


def _last_value(fn):
    """The program `fn` traces to (one bfloat16 input), and its output's value id."""
    p = trace.trace_program(lambda trainable, diff, const: [fn(diff[0])], [], [], [X])
    producer = {o: i for i, (_, _, outs) in enumerate(p.flat.eqns) for o in outs}
    return p.flat, producer, p.flat.eqns[p.n_fwd - 1][2][0]


def test_a_value_lies_as_the_value_it_is_computed_from_through_transposes_casts_and_elementwise_operations():
    """Gemma 2's bfloat16 scores, transposed, cast up for a float32 softmax: they lie as the product wrote them."""
    f, producer, out = _last_value(lambda x: jnp.exp(jnp.transpose(x, (0, 2, 1)).astype(jnp.float32)) * 2.0)
    assert f.shape[out] == (2, 5, 3) and f.dtype[out] == "float32"
    assert row_major.lies(out, f, producer) == (0, 2, 1)  # its dimension 1 innermost: x's last


def test_a_kernels_output_lies_row_major():
    """A matrix product writes its output in its own order, whatever its operand's layout."""
    f, producer, out = _last_value(lambda x: jnp.transpose(x, (0, 2, 1)) @ jnp.ones((3, 4), x.dtype))
    assert f.shape[out] == (2, 5, 4) and row_major.lies(out, f, producer) == (0, 1, 2)
