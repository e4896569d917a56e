"""keras-hub tasks as users write them, tiny and with random weights: causal LMs training and generating under
"2x4" and "fsdp", and the Gemma LoRA tuning flow on "1x8" and "2x4", each against one device."""

import contextlib

import keras
import numpy as np
import pytest

import kdist
from kdist.demo import fit_steps
from kdist.rules import get_rules

keras_hub = pytest.importorskip("keras_hub")

SEQ, BATCH, STEPS = 8, 8, 2
IDS = np.random.default_rng(0).integers(1, 64, (BATCH * STEPS, SEQ + 1)).astype("int32")
X = {"token_ids": IDS[:, :-1], "padding_mask": np.ones((BATCH * STEPS, SEQ), "bool")}
Y = IDS[:, 1:]
LM = dict(vocabulary_size=64, num_layers=1, hidden_dim=64, intermediate_dim=128)  # weights >= fsdp_min_size
CAUSAL_LMS = {
    "gpt2": lambda: keras_hub.models.GPT2CausalLM(
        keras_hub.models.GPT2Backbone(**LM, num_heads=4, max_sequence_length=32), preprocessor=None
    ),
    "llama": lambda: keras_hub.models.LlamaCausalLM(
        keras_hub.models.LlamaBackbone(**LM, num_query_heads=4, num_key_value_heads=2), preprocessor=None
    ),
    "mistral": lambda: keras_hub.models.MistralCausalLM(
        keras_hub.models.MistralBackbone(**LM, num_query_heads=4, num_key_value_heads=2), preprocessor=None
    ),
    "qwen": lambda: keras_hub.models.QwenCausalLM(
        keras_hub.models.QwenBackbone(**LM, num_query_heads=4, num_key_value_heads=2), preprocessor=None
    ),
}


def gemma_with_lora():
    backbone = keras_hub.models.GemmaBackbone(**LM, num_query_heads=4, num_key_value_heads=1, head_dim=8)
    lm = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    backbone.enable_lora(rank=4)
    return lm


def run(build, distribution, generate=False):
    """Per-step losses of `build()` trained under `distribution` (None: one device), greedy tokens, and the model."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        lm = build()
        lm.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[],
            sampler="greedy",
        )
        losses = fit_steps(lm, X, Y, BATCH)
        tokens = None
        if generate:
            prompts = {"token_ids": X["token_ids"][:BATCH].copy(), "padding_mask": np.zeros((BATCH, SEQ), "bool")}
            prompts["padding_mask"][:, :4] = True  # 4 prompt tokens, then 4 generated
            tokens = np.asarray(lm.generate(prompts, stop_token_ids=None)["token_ids"])
    return losses, tokens, lm


@pytest.mark.parametrize("family", list(CAUSAL_LMS))
def test_causal_lms_train_and_generate_like_one_device(family):
    generate = family in ("gpt2", "llama")
    reference_losses, reference_tokens, _ = run(CAUSAL_LMS[family], None, generate)
    for spec in ("2x4", "fsdp"):
        losses, tokens, lm = run(CAUSAL_LMS[family], kdist.preset(spec), generate)
        np.testing.assert_allclose(losses, reference_losses, rtol=2e-5, err_msg=f"{family} {spec}")
        if generate:
            np.testing.assert_array_equal(tokens, reference_tokens, err_msg=f"{family} {spec}")
        big = [v for v in lm.backbone.weights if v.value.size >= 4096]  # fsdp leaves smaller ones whole
        assert big and all(any(a is not None for a in v.value.sharding.spec) for v in big), (family, spec)


@pytest.mark.parametrize("spec", ["1x8", "2x4"])
def test_gemma_lora_tuning_like_one_device_with_the_adapters_placed(spec):
    reference, _, _ = run(gemma_with_lora, None)
    distribution = kdist.preset(spec, rules=get_rules("auto", lora=True))
    losses, _, lm = run(gemma_with_lora, distribution)
    np.testing.assert_allclose(losses, reference, rtol=2e-5)
    trainable = {v.path for v in lm.trainable_weights}
    assert trainable and all("lora_kernel" in p for p in trainable)  # only the adapters train
    placements = distribution.placements
    value = "decoder_block_0/attention/value/"
    assert placements[value + "kernel"].axes == (None, None, "model")  # 1 key/value head: head_dim on model
    assert placements[value + "lora_kernel_b"].axes == (None, "model")  # follows the kernel's fallback
    query = "decoder_block_0/attention/query/"  # 4 heads: on model for "2x4", head_dim for "1x8"
    assert placements[query + "lora_kernel_a"].axes == placements[query + "kernel"].axes[:-1] + (None,)
    assert placements[query + "lora_kernel_b"].axes == (None, placements[query + "kernel"].axes[-1])
