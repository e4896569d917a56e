"""Keras internals that only the planner's attention trace reaches: the platform probes it answers for its target.

Checked against keras 3.15.1 and keras-hub 0.32.0, like the package (`kdist.keras_internals.CHECKED`).
"""

import contextlib
import functools
import sys

from kdist.keras_internals import check_internals, missing_module

try:
    from keras.src.backend.jax import nn as backend_nn
    from keras.src.ops import nn as ops_nn
except ImportError as e:
    raise missing_module(e) from e

check_internals(
    {
        "keras.src.backend.jax.nn": (backend_nn, ("dot_product_attention",)),
        "keras.src.ops.nn": (ops_nn, ("dot_product_attention",)),
    }
)


@contextlib.contextmanager
def attention_decision(keras_attention, fused, platform):
    """Answer Keras's and keras-hub's attention platform probes for `platform`, not the host, inside the block.

    Replaces the JAX backend's `dot_product_attention` (`keras.src.backend.jax.nn`,
    which `keras.ops.dot_product_attention` calls) with
    `keras_attention(original, query, key, value, **kwargs)`, its flash check
    `_can_use_flash_attention` with one answering `fused`, and keras-hub's `running_on_gpu` / `running_on_tpu` /
    `gpu_supports_fused_attention_op` (imported by name into each attention
    module, so patched in every loaded `keras_hub` module) with answers for
    `platform` ("gpu", "tpu" or "cpu"). On a "tpu" platform, `keras.ops.dot_product_attention`
    also takes `attn_logits_soft_cap` (Gemma 2's attention passes it there), which Keras
    itself refuses on any host but a TPU. Checked against keras 3.15.1 and keras-hub 0.32.0.
    """
    saved = []

    def patch(owner, name, value):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    original = backend_nn.dot_product_attention

    def attention(query, key, value, **kwargs):
        return keras_attention(original, query, key, value, **kwargs)

    original_ops = ops_nn.dot_product_attention

    @functools.wraps(original_ops)  # keras-hub reads its signature for the soft cap
    def ops_attention(*args, **kwargs):
        if platform == "tpu" and kwargs.get("attn_logits_soft_cap") is not None:
            return attention(*args, **kwargs)  # past the host check: Splash takes the cap on a TPU
        return original_ops(*args, **kwargs)

    try:
        patch(backend_nn, "dot_product_attention", attention)
        patch(backend_nn, "_can_use_flash_attention", lambda *args, **kwargs: fused)
        for module in (
            sys.modules.get(name) for name in ("keras.src.ops.nn", "keras.src.ops", "keras.ops.nn", "keras.ops")
        ):
            if getattr(module, "dot_product_attention", None) is original_ops:
                patch(module, "dot_product_attention", ops_attention)
        for module in list(sys.modules.values()):
            if not (getattr(module, "__name__", "") or "").startswith("keras_hub"):
                continue
            for name, answer in (
                ("running_on_gpu", platform == "gpu"),
                ("running_on_tpu", platform == "tpu"),
                ("gpu_supports_fused_attention_op", True),
            ):
                if callable(getattr(module, name, None)):
                    patch(module, name, lambda answer=answer: answer)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
