"""keras-hub `generate()` with any number of prompts under any preset: the tokens of one device (greedy sampler,
tiny randomly initialised models). One prompt on 8 data-parallel devices is laid out whole; see docs/batches.md."""

import contextlib

import keras
import numpy as np
import pytest

import kdist

keras_hub = pytest.importorskip("keras_hub")

SEQ, PROMPT = 8, 3
IDS = np.random.default_rng(1).integers(1, 64, (3, SEQ)).astype("int32")


def _prompts(n):
    mask = np.zeros((n, SEQ), bool)
    mask[:, :PROMPT] = True  # 3 prompt tokens, then 5 generated
    return {"token_ids": IDS[:n], "padding_mask": mask}


def gpt2():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=64, num_layers=1, num_heads=4, hidden_dim=64, intermediate_dim=128, max_sequence_length=16
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def gemma():
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=64,
        num_layers=1,
        hidden_dim=64,
        intermediate_dim=128,
        num_query_heads=4,
        num_key_value_heads=4,
        head_dim=8,
    )
    return keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)


def generated(build, distribution, counts=(1, 2, 3)):
    """{number of prompts: generated token ids} of `build()` (seed 0) under `distribution` (None: one device)."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        lm = build()
        lm.compile(sampler="greedy")
        return {n: np.asarray(lm.generate(_prompts(n), stop_token_ids=None)["token_ids"]) for n in counts}


def test_generate_with_1_2_and_3_prompts_under_every_preset_equals_one_device():
    expected = generated(gpt2, None)
    assert not all((tokens[:, PROMPT:] == tokens[0, PROMPT]).all() for tokens in expected.values())  # not constant
    for spec in ("fsdp", "2x4", "dp"):
        got = generated(gpt2, kdist.preset(spec))
        for n in expected:
            np.testing.assert_array_equal(got[n], expected[n], err_msg=f"{spec}, {n} prompt(s)")


def test_gemma_with_keras_hubs_own_map_generates_one_prompt_under_every_preset():
    # The keras-hub tutorial's flow: the backbone's own LayoutMap (axes "batch" and "model"), one prompt.
    keras_mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    layout_map = keras_hub.models.GemmaBackbone.get_layout_map(keras_mesh)
    expected = generated(gemma, None, counts=(1,))
    embedding = {"2x4": ("model", "data"), "2x2x2": ("model", "data"), "dp": (None, "data"), "fsdp": ("fsdp", None)}
    for spec, axes in embedding.items():
        distribution = kdist.preset(spec, rules=layout_map)
        got = generated(gemma, distribution, counts=(1,))
        np.testing.assert_array_equal(got[1], expected[1], err_msg=spec)
        assert distribution.placements["token_embedding/embeddings"].axes == axes, spec  # the map, read on spec
