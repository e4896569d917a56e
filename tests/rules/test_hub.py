"""keras-hub family rules on every covered backbone, built abstractly at a tiny config."""

import math
import re

import keras
import pytest

import kdist
from kdist.rules import AUTO, FAMILIES, get_rules
from kdist.rules.hub import BACKBONES
from kdist.zoo import tiny_entries

keras_hub = pytest.importorskip("keras_hub")

MESHES = ["1x8", "2x4", "4x2", "8x1"]
TINY = tiny_entries()


@pytest.fixture(scope="module")
def backbones(tiny_backbones):
    """Family -> list of (path, shape) of its tiny backbone's variables."""
    return {family: [(v.path, tuple(v.shape)) for v in model.weights] for family, model in tiny_backbones.items()}


NORM_OR_BIAS = re.compile(r".*(bias|(norm|ln)[^/]*/(scale|gamma|beta|weight))")


def test_covers_at_least_25_backbones_including_the_required_ones():
    required = {
        "gemma",
        "gemma2",
        "gemma3",
        "llama",
        "llama3",
        "mistral",
        "mixtral",
        "qwen",
        "qwen2",
        "qwen3",
        "qwen_moe",
        "qwen3_moe",
        "phi3",
        "gpt2",
        "bert",
        "roberta",
        "distil_bert",
        "t5",
        "vit",
        "clip",
        "siglip",
    }
    assert required <= set(FAMILIES)
    assert len(set(BACKBONES.values())) >= 25
    assert list(TINY) == list(FAMILIES) == list(BACKBONES)


def test_every_family_places_every_variable_and_shards_90_percent(backbones):
    problems = []
    for family, variables in backbones.items():
        for spec in MESHES:
            problems += _check(family, variables, spec)
    assert not problems, "\n".join(problems)


def _check(family, variables, spec):
    dist = kdist.preset(spec, rules=FAMILIES[family])
    problems, total, sharded = [], 0, 0
    for path, shape in variables:
        placement = dist.place(path, shape)
        if placement.source == "default":
            problems.append(f"{family} on {spec}: no rule for {path} {shape}")
            continue
        if family not in placement.rule.families:
            problems.append(f"{family}: {path} placed by a rule of {placement.rule.family}")
        for size, axis in zip(shape, placement.axes):
            if axis is not None and size % dist.dims.axis_sizes[axis]:
                problems.append(f"{family} on {spec}: {path} {shape} -> {placement.axes} does not divide")
        if NORM_OR_BIAS.fullmatch(path):
            if not placement.rule.replicates:
                problems.append(f"{family}: {path} should be replicated by an explicit rule")
        else:
            total += math.prod(shape)
            sharded += math.prod(shape) if "model" in placement.axes else 0
    if dist.dims.size_of("model") > 1 and sharded < 0.9 * total:
        problems.append(f"{family} on {spec}: only {sharded / total:.1%} of the bytes outside norms and biases sharded")
    return problems


def test_auto_rules_pick_the_family_from_paths(backbones):
    own = {family: kdist.preset("2x4", rules=rules) for family, rules in FAMILIES.items()}
    auto = kdist.preset("2x4")
    assert auto.rules is AUTO
    problems = []
    for family, variables in backbones.items():
        for path, shape in variables:
            mine, picked = own[family].place(path, shape), auto.place(path, shape)
            if picked.axes != mine.axes or family not in picked.rule.families:
                problems.append(f"{family}: {path} auto {picked.axes} ({picked.rule.family}), family {mine.axes}")
    assert not problems, "\n".join(problems)


def test_indivisible_key_value_heads_fall_back_and_say_why(backbones):
    dist = kdist.preset("2x4", rules="llama")
    placement = dist.place("transformer_layer_0/self_attention/key/kernel", (64, 2, 8))
    assert placement.axes == (None, None, "model")  # 2 kv heads on model=4: head_dim instead
    assert placement.source == "fallback"
    assert "dim 1 (2) not divisible by model=4" in placement.reason
    gemma = kdist.preset("1x8", rules="gemma").place("decoder_block_0/attention/key/kernel", (1, 64, 8))
    assert gemma.axes == (None, None, "model") and gemma.source == "fallback"  # multi-query attention


def test_expert_weights_go_on_the_expert_axis_else_model():
    path = "transformer_layer_0/mixtral_sparse_moe_block/experts/expert_feedforward_gate_dense"
    with_expert = kdist.preset("data=2,expert=2,model=2", rules="mixtral").place(path, (4, 64, 128))
    assert with_expert.axes == ("expert", None, "model") and with_expert.source == "rule"
    without = kdist.preset("2x4", rules="mixtral").place(path, (4, 64, 128))
    assert without.axes == ("model", None, None)
    assert "the mesh has no 'expert' axis" in without.reason
    eight = kdist.preset("1x8", rules="mixtral").place(path, (4, 64, 128))
    assert eight.axes == (None, None, "model")  # 4 experts do not divide 8: the inner features do


def test_lora_adapters_are_replicated_unless_asked():
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = kdist.abstract_model(TINY["llama"])
    with keras.StatelessScope(initialize_variables=False):
        model.enable_lora(4)
    lora = [(v.path, tuple(v.shape)) for v in model.weights if "lora_kernel" in v.path]
    assert lora
    default, sharded = kdist.preset("2x4"), kdist.preset("2x4", rules=get_rules("auto", lora=True))
    for path, shape in lora:
        placement = default.place(path, shape)
        assert not placement.sharded and placement.rule.replicates, path
    query_a = sharded.place("transformer_layer_0/self_attention/query/lora_kernel_a", (64, 8, 4))
    assert query_a.axes == (None, "model", None)


def test_placements_name_their_family_and_note():
    placement = kdist.preset("2x4").place("decoder_block_0/attention/query/kernel", (8, 64, 8))
    assert placement.rule.families == ("gemma", "gemma2", "gemma3")
    assert "column-parallel" in placement.rule.note


def test_keras_core_layers_still_use_the_core_rules():
    placement = kdist.preset("2x4").place("mlp/d1/kernel", (784, 200))
    assert placement.rule.family == "keras-core" and placement.axes == (None, "model")
