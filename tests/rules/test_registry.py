"""Rule sets by name."""

import pytest

import kdist
from kdist import RuleError
from kdist.rules import AUTO, FAMILIES, KERAS_CORE, RULE_SETS, get_rules


def test_names_resolve_to_rule_sets():
    assert get_rules("auto") is AUTO
    assert get_rules("keras-core") is KERAS_CORE
    assert get_rules("llama") is FAMILIES["llama"]
    assert set(FAMILIES) < set(RULE_SETS)


def test_preset_takes_a_family_name():
    dist = kdist.preset("2x4", rules="gemma")
    assert dist.rules is FAMILIES["gemma"]
    assert dist.place("decoder_block_0/attention/query/kernel", (8, 64, 8)).axes == ("model", None, None)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(RuleError, match=r"Unknown rule set 'lama'\. Name one of .*keras-core.*llama.*\.json or \.toml"):
        get_rules("lama")
    with pytest.raises(RuleError, match="Unknown rule set 'lama'"):
        kdist.preset("2x4", rules="lama")
    with pytest.raises(TypeError, match="must be a string or a path"):
        get_rules(3)


def test_lora_option_shards_adapters_like_their_kernels():
    rules = get_rules("llama", lora=True)
    axes = "1x4"
    assert rules.name == "llama+lora"
    # column-parallel kernel (in, out): A (in, rank) replicated, B (rank, out) on model
    assert rules.place("transformer_layer_0/feedforward_gate_dense/lora_kernel_b", (4, 128), axes).axes == (
        None,
        "model",
    )
    assert not rules.place("transformer_layer_0/feedforward_gate_dense/lora_kernel_a", (64, 4), axes).sharded
    # row-parallel kernel (in, out): A (in, rank) on model
    assert rules.place("transformer_layer_0/feedforward_output_dense/lora_kernel_a", (128, 4), axes).axes == (
        "model",
        None,
    )
    assert (
        not get_rules("llama")
        .place("transformer_layer_0/feedforward_output_dense/lora_kernel_a", (128, 4), axes)
        .sharded
    )


def test_lora_option_covers_keras_core_dense_layers():
    dist = kdist.preset("2x4", rules=get_rules("keras-core", lora=True))
    with dist.scope():
        model = kdist.models.mnist_mlp()
        model.get_layer("d1").enable_lora(4)
    layer = model.get_layer("d1")
    assert tuple(layer.lora_kernel_b.value.sharding.spec) == (None, "model")  # column-parallel kernel: B on model
    assert layer.lora_kernel_a.value.sharding.is_fully_replicated
    replicated = kdist.preset("2x4", rules=get_rules("keras-core"))
    assert not replicated.place(layer.lora_kernel_b.path, (4, 200)).sharded
