"""The attention implementation a target takes, forced while tracing so the answer never follows the host.

`keras.ops.dot_product_attention(flash_attention=None)` decides from the
machine it runs on (cuDNN present, compute capability, bfloat16 inputs; TPU
always), and keras-hub's attention layers ask `running_on_gpu()` first. The
planner traces for a target instead: `forced_attention` answers those probes
for the target and routes the fused path to `flash_attention`, an abstract
stand-in for the cuDNN / Splash kernels that saves what they save.
"""

import contextlib

import jax
import jax.numpy as jnp
from jax.core import ShapedArray
from jax.extend.core import Primitive

from kdist.keras_internals import patched
from kdist.keras_internals.attention import attention_decision
from kdist.units import HALF_FLOATS

ATTENTION = ("fused", "materialized")


def default_attention(platform, compute_dtype):
    """What Keras picks on `platform` for `compute_dtype`: "fused" or "materialized".

    TPU: always fused (Splash). GPU: fused for float16/bfloat16 only (jax's
    cuDNN `check_layout` rejects float32). CPU: never.

    >>> default_attention("gpu", "bfloat16"), default_attention("gpu", "float32")
    ('fused', 'materialized')
    """
    if platform == "tpu" or (platform == "gpu" and str(compute_dtype) in HALF_FLOATS):
        return "fused"
    return "materialized"


def _forward_shapes(q, k, v, *bias):
    batch, length, heads, _ = q.shape
    return ShapedArray((*q.shape[:3], v.shape[3]), q.dtype), ShapedArray((batch, heads, length), jnp.float32)


_forward = Primitive("flash_attention_fwd")
_forward.multiple_results = True
_forward.def_abstract_eval(_forward_shapes)
_backward = Primitive("flash_attention_bwd")
_backward.multiple_results = True
_backward.def_abstract_eval(
    lambda q, k, v, o, lse, do, *bias: (
        ShapedArray(q.shape, q.dtype),
        ShapedArray(k.shape, k.dtype),
        ShapedArray(v.shape, v.dtype),
    )
)


@jax.custom_vjp
def _flash(q, k, v):
    return _forward.bind(q, k, v)[0]


def _flash_forward(q, k, v):
    o, lse = _forward.bind(q, k, v)
    return o, (q, k, v, o, lse)  # what cuDNN / Splash keep: inputs, output, the (B, N, T) logsumexp


_flash.defvjp(_flash_forward, lambda saved, do: tuple(_backward.bind(*saved, do)))


@jax.custom_vjp
def _flash_biased(q, k, v, bias):
    return _forward.bind(q, k, v, bias)[0]


def _flash_biased_forward(q, k, v, bias):
    o, lse = _forward.bind(q, k, v, bias)
    return o, (q, k, v, o, lse, bias)  # an additive bias (a mask) is a kernel operand, kept too


def _flash_biased_backward(saved, do):
    q, k, v, o, lse, bias = saved
    return (*_backward.bind(q, k, v, o, lse, do, bias), jnp.zeros_like(bias))


_flash_biased.defvjp(_flash_biased_forward, _flash_biased_backward)


def fused_flops(eqn):
    """FLOPs (2 per multiply-add) of a traced fused-attention primitive, every query against every key.

    The forward makes the scores (Q K^T) and the output (P V): 2 x pairs x
    (d + dv), pairs = batch x query heads x queries x keys. The backward
    makes the scores again, then dV = P^T dO, dP = dO V^T, dQ = dS K and
    dK = dS^T Q: 2 x pairs x (3 d + 2 dv), 2.5 times the forward where
    d = dv, as FlashAttention-2 counts it. A causal kernel skips the masked
    blocks (about half); the mask is an operand here, so they are counted.

    >>> from types import SimpleNamespace as N
    >>> shaped = lambda *s: N(aval=N(shape=s))
    >>> q, k = shaped(2, 128, 8, 64), shaped(2, 128, 2, 64)   # 8 query heads on 2 key/value heads
    >>> fused_flops(N(primitive=_forward, invars=[q, k, k])) == 2 * (2 * 8 * 128 * 128) * 128
    True
    """
    q, k, v = (tuple(x.aval.shape) for x in eqn.invars[:3])
    batch, queries, heads, depth = q
    pairs = batch * heads * queries * k[1]
    if eqn.primitive is _forward:
        return 2 * pairs * (depth + v[3])
    return 2 * pairs * (3 * depth + 2 * v[3])


FUSED = (_forward, _backward)  # the primitives `fused_flops` counts


def flash_attention(q, k, v, bias=None):
    """Abstract fused attention over (batch, length, heads, head_dim) inputs: no (length x length) buffer.

    Only traced, never run: its primitives have shapes and no implementation.
    """
    return _flash(q, k, v) if bias is None else _flash_biased(q, k, v, bias)


def _with_mask(bias, mask, dtype):
    """jax's `combine_bias_and_mask`: a boolean mask becomes an additive bias the kernel reads."""
    if mask is None:
        return bias
    negative = jnp.asarray(-1e9 if dtype == jnp.float32 else -3e4, dtype)
    additive = jnp.where(jnp.asarray(mask).astype(bool), jnp.asarray(0, dtype), negative)
    return additive if bias is None else jnp.asarray(bias, dtype) + additive


@contextlib.contextmanager
def forced_attention(mode, platform):
    """Trace attention as `mode` ("fused" or "materialized") would run on `platform`; yields the set of paths taken.

    A layer's explicit `flash_attention=True/False` still wins, as in Keras.
    Layers that compute their own scores (Keras MultiHeadAttention with
    dropout) never reach `dot_product_attention`: the set then stays empty.
    """
    fused = mode == "fused"
    taken = set()

    def keras_attention(original, query, key, value, bias=None, mask=None, **kwargs):
        explicit = kwargs.pop("flash_attention", None)
        use_flash = fused if explicit is None else bool(explicit)
        if use_flash:  # a logit soft cap (TPU only) is applied inside Splash: it keeps no more
            dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
            q, k, v = (jnp.asarray(t).astype(dtype) for t in (query, key, value))
            taken.add("fused")
            return flash_attention(q, k, v, _with_mask(bias, mask, dtype))
        taken.add("materialized")
        return original(query, key, value, bias=bias, mask=mask, flash_attention=False, **kwargs)

    original_jax = jax.nn.dot_product_attention

    def jax_attention(query, key, value, bias=None, mask=None, *, implementation=None, **kwargs):
        if implementation == "cudnn" or (implementation is None and fused):
            taken.add("fused")
            return flash_attention(query, key, value, _with_mask(bias, mask, query.dtype))
        taken.add("materialized")
        return original_jax(query, key, value, bias=bias, mask=mask, implementation="xla", **kwargs)

    with patched(jax.nn, "dot_product_attention", jax_attention), attention_decision(keras_attention, fused, platform):
        yield taken
