"""Variables that follow their kernel's actual placement: LoRA adapters (fallbacks included) and biases."""

import pytest

import kdist
from kdist.meshes import ParallelDims
from kdist.rules import AUTO, FAMILIES, Placer, Rule, RuleSet, get_rules, with_lora


def _place_all(rules, model, spec):
    placer = Placer(rules, ParallelDims.parse(spec, 8))
    return {v.path: placer.place(v.path, v.shape) for v in model.variables}


def _gemma_with_lora():
    from kdist.zoo import tiny_entries

    backbone = tiny_entries()["gemma"]()  # one key/value head: the value kernel falls back to head_dim
    backbone.enable_lora(4)
    return backbone


@pytest.fixture(scope="module")
def gemma():
    pytest.importorskip("keras_hub")
    return kdist.abstract_model(_gemma_with_lora)


@pytest.mark.parametrize("spec", ["1x8", "2x4"])
def test_lora_adapters_follow_their_kernels_fallback(gemma, spec):
    placed = _place_all(get_rules("auto", lora=True), gemma, spec)
    prefix = "decoder_block_0/attention/value/"
    kernel = placed[prefix + "kernel"]
    assert kernel.source == "fallback" and kernel.axes == (None, None, "model")  # 1 kv head: head_dim on model
    assert placed[prefix + "lora_kernel_b"].axes == (None, "model")  # the kernel's last (head_dim) axis
    assert placed[prefix + "lora_kernel_a"].axes == (None, None, None)
    assert "follows " + prefix + "kernel" in placed[prefix + "lora_kernel_b"].reason
    query = "decoder_block_0/attention/query/"
    assert placed[query + "kernel"].axes == ("model", None, None)  # 8 query heads, heads first
    assert placed[query + "lora_kernel_a"].axes == ("model", None, None)
    assert placed[query + "lora_kernel_b"].axes == (None, None)


def test_lora_adapters_are_replicated_unless_asked(gemma):
    placed = _place_all(AUTO, gemma, "2x4")
    assert not any(p.sharded for path, p in placed.items() if "lora_kernel" in path)


def test_lint_and_preset_agree_on_followed_placements(gemma):
    rules = with_lora(FAMILIES["gemma"])
    report = kdist.lint(rules, gemma, "2x4")
    assert report.ok
    placed = _place_all(rules, gemma, "2x4")
    assert {p: placed[p].axes for p in report.placements} == report.placements


def test_column_parallel_biases_follow_the_kernel_output_split(tiny_backbones):
    placed = _place_all(AUTO, tiny_backbones["bert"], "2x4")
    layer = "transformer_layer_0/self_attention_layer/"
    assert placed[layer + "query/kernel"].axes == (None, "model", None)
    assert placed[layer + "query/bias"].axes == ("model", None)
    assert placed[layer + "attention_output/bias"].axes == (None,)  # row-parallel kernel: its bias is whole
    assert placed["transformer_layer_0/feedforward_intermediate_dense/bias"].axes == ("model",)
    assert placed["transformer_layer_0/feedforward_output_dense/bias"].axes == (None,)


def test_a_follower_without_its_sibling_uses_its_layouts():
    rules = RuleSet([Rule(r".*/bias", (), follows=("kernel", "trailing"))])
    assert rules.place("d/bias", (8,), "1x4").axes == (None,)
    assert rules.place("d/bias", (8,), "1x4", placed={"d/kernel": (None, "model")}).axes == ("model",)
    indivisible = rules.place("d/bias", (6,), "1x4", placed={"d/kernel": (None, "model")})
    assert indivisible.axes == (None,) and indivisible.replicated_dims == (0,)


@pytest.mark.parametrize("follows", [("kernel",), ("kernel", "sideways"), ("", "trailing"), "kernel"])
def test_bad_follows_are_refused(follows):
    with pytest.raises(kdist.RuleError, match="follows must be"):
        Rule(r".*/bias", (), follows=follows)


def test_follows_round_trip_through_rule_files(tmp_path):
    from kdist.rules import load_rules, save_rules

    rules = with_lora(FAMILIES["llama"])
    for suffix in (".json", ".toml"):
        save_rules(rules, tmp_path / f"r{suffix}")
        assert load_rules(tmp_path / f"r{suffix}").to_dict() == {**rules.to_dict(), "name": rules.name}
