"""XLA's buffer rules on small traced programs: which kernels may write over the buffers they read."""

import jax
import jax.numpy as jnp

from kdist.planning import buffers, trace

SCORES, VALUES = jax.ShapeDtypeStruct((7, 64, 64), jnp.float32), jax.ShapeDtypeStruct((64, 32), jnp.float32)


def _input_gradient_kernel(activation):
    """The analysed program of `activation(x) @ v`, and (buffers read, buffers it may overwrite) of x's gradient."""

    def fn(trainable, diff, const):
        return [activation(diff[0]) @ const[0]]

    p = buffers.analyse(trace.trace_program(fn, [], [VALUES], [SCORES]), buffers.Rules())
    (gradient,) = p.ga
    (kernel,) = [k for k in p.kernels if gradient in k[1] + k[2]]
    return p, kernel[3], kernel[4]


def _score_gradient(p):
    """The backward GEMM's output: the gradient of the activation's output."""
    (x,) = [
        outs[0]
        for prim, _, outs in p.flat.eqns[p.n_fwd :]
        if prim == "dot_general" and tuple(p.flat.shape[outs[0]]) == SCORES.shape
    ]
    return x


def test_a_softmax_backward_does_not_write_over_the_gradient_it_normalizes():
    """XLA:GPU fuses the row sums and the elementwise part into one kernel that reads its operands twice."""
    p, read, writable = _input_gradient_kernel(lambda x: jax.nn.softmax(x, axis=-1))
    g = _score_gradient(p)
    assert g in read
    assert g not in writable


def test_the_loss_gradient_does_not_write_over_the_logits_though_the_forward_reads_their_maximum_too():
    """XLA:GPU takes the row maximum again inside the gradient's kernel, which then reads the logits twice."""
    hidden, labels = jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((64, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((32, 128), jnp.float32)

    def fn(trainable, diff, const):
        return [-jnp.sum(jax.nn.log_softmax(const[0] @ diff[0], axis=-1) * const[1])]

    p = buffers.analyse(trace.trace_program(fn, [], [hidden, labels], [w]), buffers.Rules())
    (logits,) = [outs[0] for prim, _, outs in p.flat.eqns[: p.n_fwd] if prim == "dot_general"]
    readers = [k for k in p.kernels if k[0] >= p.n_fwd and logits in k[3]]
    assert readers and all(logits not in writable for *_, writable in readers)


def test_an_activations_derivative_is_elementwise_whatever_primitives_jax_writes_it_with():
    """The only kernels of `activation(x) @ v` and its gradient are the matrix products: jax 0.12 writes tanh's
    derivative as `one_minus_square` and the exact GELU's series as `polynomial`, elementwise like the rest (until
    they were in `primitives.ELEMENTWISE` each was a kernel of its own, its operand a buffer)."""
    activations = (jnp.tanh, jax.nn.gelu, lambda x: jax.nn.gelu(x, approximate=False), jax.nn.silu, jax.nn.sigmoid)
    for activation in activations:
        p, _, _ = _input_gradient_kernel(activation)
        kernels = {prim for prim, _, _ in p.flat.eqns if buffers._kind(prim) == "kernel"}
        assert kernels == {"dot_general"}, kernels


def test_an_elementwise_backward_writes_over_the_gradient_it_reads_last():
    p, read, writable = _input_gradient_kernel(jnp.tanh)
    g = _score_gradient(p)
    assert g in read
    assert g in writable


def _erfc_operand(dtype, rules=buffers.Rules()):
    """The analysed `gelu(x @ w) @ v` (jax's exact GELU) in `dtype`: whether the erfc's operand is a buffer."""
    x, w = jax.ShapeDtypeStruct((64, 32), dtype), jax.ShapeDtypeStruct((32, 128), dtype)
    v = jax.ShapeDtypeStruct((128, 16), dtype)

    def fn(trainable, diff, const):
        return [jax.nn.gelu(const[0] @ diff[0], approximate=False) @ const[1]]

    p = buffers.analyse(trace.trace_program(fn, [], [x, v], [w]), rules)
    (operand,) = {ins[0] for prim, ins, _ in p.flat.eqns[: p.n_fwd] if prim == "erfc"}
    return p.mat[operand]


def test_a_16_bit_error_functions_operand_that_the_backward_reads_again_is_a_buffer_on_a_gpu():
    """XLA:GPU writes -x/sqrt(2) out beside the GELU in bfloat16 (Falcon's, RoBERTa's compiled steps), not in
    float32, and the rule is the GPU's."""
    assert _erfc_operand(jnp.bfloat16)
    assert _erfc_operand(jnp.float16)
    assert not _erfc_operand(jnp.float32)
    assert not _erfc_operand(jnp.bfloat16, buffers.Rules(platform="tpu"))


def _exp_kept(dtype):
    """The analysed `(exp(x) * 3) @ v` in `dtype`: whether exp's output (read again by its derivative) is a buffer."""
    x, v = jax.ShapeDtypeStruct((64, 32), dtype), jax.ShapeDtypeStruct((32, 16), dtype)

    def fn(trainable, diff, const):
        return [(jnp.exp(diff[0]) * 3) @ const[0]]

    p = buffers.analyse(trace.trace_program(fn, [], [v], [x]), buffers.Rules())
    (output,) = {outs[0] for prim, _, outs in p.flat.eqns[: p.n_fwd] if prim == "exp"}
    return p.mat[output]


def test_a_16_bit_exp_read_by_two_kernels_is_written_once_on_a_gpu():
    """float32 exp is recomputed in each reader; XLA:GPU keeps float16's, as it keeps bfloat16's (the compiled
    mixed_float16 and mixed_bfloat16 steps of eight keras-hub families)."""
    assert not _exp_kept(jnp.float32)
    assert _exp_kept(jnp.bfloat16)
    assert _exp_kept(jnp.float16)


def _scaled(divisor):
    """The analysed bfloat16 `x / divisor`, read by two reductions: (the quotient is a buffer, the backward's
    primitives)."""
    x = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16)

    def fn(trainable, diff, const):
        q = diff[0] / (0.9 if divisor == "constant" else const[0])
        return [jnp.sum(q, axis=-1), jnp.sum(q, axis=0)]

    p = buffers.analyse(trace.trace_program(fn, [], [x], [x]), buffers.Rules())
    (quotient,) = [outs[0] for prim, _, outs in p.flat.eqns[: p.n_fwd] if prim in ("div", "mul")]
    return p.mat[quotient], [prim for prim, _, _ in p.flat.eqns[p.n_fwd :]]


def test_a_16_bit_division_by_a_constant_is_a_multiplication_that_fuses_into_each_reader():
    """XLA rewrites A / Const as A * (1 / Const) (dropout's scaling in bfloat16: RoBERTa's compiled step keeps no
    quotient); a 16-bit division by a tensor is written once for its two readers."""
    kept, backward = _scaled("constant")
    assert not kept and "div" not in backward and "mul" in backward  # the backward's division too
    kept, backward = _scaled("tensor")
    assert kept and "div" in backward


def _slice_gradient(start):
    """The analysed `dynamic_slice(x, start) @ v`: x's gradient is a dynamic_update_slice into zeros."""
    x, v = jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((32, 16), jnp.float32)
    offset = jax.ShapeDtypeStruct((), jnp.int32)

    def fn(trainable, diff, const):
        first = 1 if start == "constant" else const[1]
        return [jax.lax.dynamic_slice(diff[0], (first, 0), (63, 32)) @ const[0]]

    p = buffers.analyse(trace.trace_program(fn, [], [v, offset], [x]), buffers.Rules())
    (i,) = [i for i, (prim, _, _) in enumerate(p.flat.eqns) if prim == "dynamic_update_slice"]
    zeros = p.flat.eqns[i][1][0]
    return p.kinds[i], p.mat[zeros]


def test_a_slices_gradient_at_constant_starts_is_a_pad_that_fuses():
    """XLA rewrites a dynamic_update_slice into broadcast zeros at constant starts as a pad (XLNet's relative
    shift: `ops.slice`), fused into its reader; at a start only known at run time it stays a kernel of its own."""
    assert _slice_gradient("constant") == ("elementwise", False)
    assert _slice_gradient("run time") == ("kernel", True)


def _merged_groups(rotate=False, key_bias=True):
    """The merged GEMM groups of one attention over 64 tokens of width 32 whose q, k and v projections add biases."""
    tokens, angles = jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((64, 32), jnp.float32)
    kernel, bias = jax.ShapeDtypeStruct((32, 32), jnp.float32), jax.ShapeDtypeStruct((32,), jnp.float32)

    def fn(trainable, diff, const):
        wq, wk, wv, bq, bk, bv = trainable
        x = diff[0]
        q, k, v = x @ wq + bq, x @ wk + bk if key_bias else x @ wk, x @ wv + bv
        if rotate:  # a rotary embedding: products with a table of sines and cosines
            q, k = q * const[0], k * const[0]
        return [jax.nn.softmax((q * 0.125) @ k.T, axis=-1) @ v]

    p = buffers.analyse(trace.trace_program(fn, [kernel] * 3 + [bias] * 3, [angles], [tokens]), buffers.Rules())
    return [len(sums) for _, _, sums in p.merged]


def test_biased_projections_are_merged_where_the_scores_read_their_sums_as_they_are():
    """XLA re-makes a biased key from the merged output for the backward, so the merged output lives until then.

    Behind a rotary embedding the scores read the rotated q and k, which XLA
    writes out: the merged output dies in the forward (ESM, DINOv3, Qwen2).
    """
    assert _merged_groups() == [3]
    assert _merged_groups(key_bias=False) == [2]  # Whisper's key has no bias; the scores read it as the GEMM made it
    assert _merged_groups(rotate=True) == []


def _unbiased_groups(key_width):
    """The merged GEMM groups of one attention over 64 tokens of width 32 whose projections add no bias."""
    tokens = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    kernels = [jax.ShapeDtypeStruct((32, width), jnp.float32) for width in (32, key_width, key_width)]

    def fn(trainable, diff, const):
        q, k, v = (diff[0] @ w for w in trainable)
        k, v = (jnp.tile(x, (1, 32 // key_width)) for x in (k, v))  # grouped-query attention: k and v repeated
        return [jax.nn.softmax(q @ k.T, axis=-1) @ v + diff[0] @ const[0]]  # a product of a constant: no projection

    p = buffers.analyse(trace.trace_program(fn, kernels, [kernels[0]], [tokens]), buffers.Rules())
    return [(shared, list(outs), list(sums)) for shared, outs, sums in p.merged], p.flat.eqns[0][1][0]


def test_projections_without_a_bias_are_merged_where_their_outputs_have_one_shape():
    """T5's q, k and v: one GEMM in XLA's step, whose output lives until the last read of any part of it. A
    grouped-query attention's narrower k and v are left apart from q (PaliGemma's step keeps none of them)."""
    ((shared, outs, sums),), tokens = _unbiased_groups(32)
    assert len(outs) == 3 and sums == outs and shared == tokens
    ((shared, outs, sums),), tokens = _unbiased_groups(8)
    assert len(outs) == 2 and sums == outs and shared == tokens  # k and v, of one shape
