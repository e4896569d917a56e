"""Keras internals that only the planner's attention trace reaches: the platform probes it answers for its target.

Checked against keras 3.15.1 and keras-hub 0.32.0, like the package (`kdist.keras_internals.CHECKED`).
"""

import contextlib
import sys

from kdist.keras_internals import check_internals, missing_module

try:
    from keras.src.backend.jax import nn as backend_nn
except ImportError as e:
    raise missing_module(e) from e

check_internals({"keras.src.backend.jax.nn": (backend_nn, ("dot_product_attention",))})


@contextlib.contextmanager
def attention_decision(keras_attention, fused, platform):
    """Answer Keras's and keras-hub's attention platform probes for `platform`, not the host, inside the block.

    Replaces the JAX backend's `dot_product_attention` (`keras.src.backend.jax.nn`,
    which `keras.ops.dot_product_attention` calls) with
    `keras_attention(original, query, key, value, **kwargs)`, its flash check
    `_can_use_flash_attention` with one answering `fused`, and keras-hub's `running_on_gpu` / `running_on_tpu` /
    `gpu_supports_fused_attention_op` (imported by name into each attention
    module, so patched in every loaded `keras_hub` module) with answers for
    `platform` ("gpu", "tpu" or "cpu"). Checked against keras 3.15.1 and
    keras-hub 0.32.0.
    """
    saved = []

    def patch(owner, name, value):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    original = backend_nn.dot_product_attention

    def attention(query, key, value, **kwargs):
        return keras_attention(original, query, key, value, **kwargs)

    try:
        patch(backend_nn, "dot_product_attention", attention)
        patch(backend_nn, "_can_use_flash_attention", lambda *args, **kwargs: fused)
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
