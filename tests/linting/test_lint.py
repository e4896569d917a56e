import json

import keras
import pytest
from keras.distribution import LayoutMap, ModelParallel
from rich.console import Console

import kdist
import kdist.zoo
from kdist.linting import CODES, LintReport, lint
from kdist.models import mnist_mlp, tiny_transformer
from kdist.rules import KERAS_CORE, RuleSet


@pytest.fixture(scope="module")
def transformer():
    return kdist.abstract_model(tiny_transformer)


@pytest.fixture(scope="module")
def mlp():
    return kdist.abstract_model(mnist_mlp)  # mlp/d1/kernel (784, 200), mlp/d2/kernel (200, 10)


def _lora_mlp():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, name="d")], name="lora")
    model.layers[0].enable_lora(4)  # lora/d/lora_kernel_a (32, 4), lora/d/lora_kernel_b (4, 64)
    return model


def _codes(report, code):
    return [f for f in report.findings if f.code == code]


def _layout_map(pairs, mesh=None):
    layout_map = LayoutMap(mesh)
    for key, axes in pairs:
        layout_map[key] = axes
    return layout_map


# --- one test per code, from a real rule and a real (abstract) model --------------------------


def test_kd101_several_layout_map_keys_match_a_variable(transformer):
    report = lint(
        _layout_map([(".*kernel", (None, "model")), (".*query.*", (None, "model", None))]), transformer, "2x4"
    )
    [first, *_] = _codes(report, "KD101")
    assert first.severity == "error" and first.path == "block_0_attention/query/kernel"
    assert "'.*kernel', '.*query.*'" in first.message
    assert not report.ok


def test_kd101_matches_what_keras_raises_on_layer_outputs():
    keys = [("mlp/d1/(kernel|output)", ("data", None)), (".*/output", ("data", None))]
    report = lint(_layout_map(keys), kdist.abstract_model(mnist_mlp), "2x4")
    assert [(f.code, f.path) for f in report.errors] == [("KD101", "mlp/d1/output")]
    mesh = kdist.mesh("2x4")
    distribution = ModelParallel(layout_map=_layout_map(keys, mesh), batch_dim_name="data")
    with pytest.raises(ValueError, match="matches multiple layout"), distribution.scope():
        mnist_mlp()(keras.ops.ones((8, 28, 28, 1)))


def test_kd102_layout_longer_than_rank(transformer):
    report = lint(_layout_map([(".*query/(kernel|bias)", (None, "model", None))]), transformer, "2x4")
    assert {f.path for f in _codes(report, "KD102")} == {"block_0_attention/query/bias", "block_1_attention/query/bias"}
    rules = RuleSet([(r".*_mlp_up/bias", (None, "model"))])
    [finding, _] = _codes(lint(rules, transformer, "2x4"), "KD102")
    assert finding.severity == "error" and finding.rule == r".*_mlp_up/bias" and "rank 1" in finding.message


def test_kd103_axis_not_in_mesh(transformer):
    report = lint(RuleSet([(r".*/kernel", ("...", "tensor"))]), transformer, "2x4")
    [finding] = _codes(report, "KD103")
    assert finding.severity == "error" and "'tensor'" in finding.message and "data, model" in finding.message
    report = lint(_layout_map([(r".*_mlp_up/kernel", (None, "tensor"))]), transformer, "2x4")
    assert [f.code for f in report.errors] == ["KD103"]


def test_layout_map_batch_axis_is_the_data_axis(transformer):
    # Keras's and keras-hub's data axis "batch" is read as kdist's data axis, as presets read it.
    report = lint(_layout_map([(r".*_mlp_up/kernel", ("batch", "model"))]), transformer, "2x4")
    assert not _codes(report, "KD103")
    assert report.placements["block_0_mlp_up/kernel"] == ("data", "model")


def test_kd104_layout_map_dimension_not_divisible(mlp):
    report = lint(_layout_map([(r"mlp/d2/kernel", (None, "model"))]), mlp, "2x4")
    [finding] = report.errors
    assert finding.code == "KD104" and finding.path == "mlp/d2/kernel"
    assert "dim 1 (10)" in finding.message and "model=4" in finding.message


def test_kd105_invalid_regex(transformer):
    report = lint(_layout_map([("[unclosed", ())]), transformer, "2x4")
    assert [f.code for f in report.errors] == ["KD105"]
    report = lint([("(.*/)?kernel", ("...", "model")), ("bias(", ())], transformer, "2x4")
    [finding] = report.errors
    assert finding.code == "KD105" and finding.rule == "bias("


def test_kd201_rule_matches_nothing(transformer):
    rules = RuleSet([(r"(.*/)?kernel", ("...", "model")), (r"decoder/ffn_in/kernel", (None, "model"))])
    [finding] = _codes(lint(rules, transformer, "2x4"), "KD201")
    assert finding.severity == "warning" and finding.rule == "decoder/ffn_in/kernel"
    # Library rules for layers the model lacks are expected: one info, not a warning per rule.
    [library] = _codes(lint(KERAS_CORE, transformer, "2x4"), "KD201")
    assert library.severity == "info"


def test_kd202_partial_match_only(mlp):
    rules = RuleSet([(r"d1/kernel", (None, "model"))])
    [finding] = _codes(lint(rules, mlp, "2x4"), "KD202")
    assert finding.severity == "warning" and finding.path == "mlp/d1/kernel"
    assert lint(_layout_map([("d1/kernel", (None, "model"))]), mlp, "2x4").codes("warning") == {"KD202"}
    # What the warning says: Keras >= 3.14 no longer applies such a key.
    assert _layout_map([("d1/kernel", (None, "model"))])["mlp/d1/kernel"] is None


def test_kd203_and_kd204_large_variables_left_replicated(transformer):
    rules = RuleSet([(r"token_embedding/embeddings", ()), (r"(.*/)?kernel", ("...", "model"))])
    report = lint(rules, transformer, "2x4", size_threshold=100_000)
    [finding] = _codes(report, "KD203")
    assert finding.path == "token_embedding/embeddings" and finding.rule == "token_embedding/embeddings"
    share = 512 * 64 * 4 / report.summary["total_bytes"]
    assert report.summary["replicated_share"] == pytest.approx(share)
    assert report.summary["top_replicated"][0]["path"] == "token_embedding/embeddings"
    [summary] = _codes(report, "KD204")
    assert f"{share:.1%}" in summary.message
    # Under the tolerance, no KD204; above the threshold only.
    assert not _codes(lint(rules, transformer, "2x4", size_threshold=100_000, tolerance=0.5), "KD204")
    assert not _codes(lint(rules, transformer, "2x4"), "KD203")


def test_no_replication_warning_without_a_weight_axis(transformer):
    report = lint(RuleSet([]), transformer, "8x1", size_threshold=0)
    assert report.summary["weight_axes"] == [] and not report.codes("warning")


def test_kd205_lora_weights_sharded():
    model = kdist.abstract_model(_lora_mlp)
    report = lint(RuleSet([(r"(.*/)?(lora_)?kernel(_[ab])?", ("...", "model"))]), model, "2x4")
    assert {f.path for f in _codes(report, "KD205")} == {"lora/d/lora_kernel_a", "lora/d/lora_kernel_b"}
    assert not _codes(lint(KERAS_CORE, model, "2x4"), "KD205")  # KERAS_CORE replicates them
    report = lint(_layout_map([(".*kernel.*", (None, "model"))]), model, "2x4")
    assert len(_codes(report, "KD205")) == 2


def test_kd205_is_info_when_asked_for_with_lora():
    pytest.importorskip("keras_hub")

    def lora_llama():
        backbone = kdist.zoo.tiny_entries()["llama"]()
        backbone.enable_lora(4)
        return backbone

    backbone = kdist.abstract_model(lora_llama)
    assert not _codes(lint("auto", backbone, "2x4"), "KD205")  # replicated by default
    report = lint(kdist.rules.with_lora(kdist.rules.FAMILIES["llama"]), backbone, "2x4")
    assert _codes(report, "KD205") and {f.severity for f in _codes(report, "KD205")} == {"info"}


def test_kd206_no_candidate_divides(mlp):
    report = lint(RuleSet([(r".*/kernel", (None, "model"))]), mlp, "1x8")
    [finding] = _codes(report, "KD206")
    assert (
        finding.severity == "warning"
        and finding.path == "mlp/d2/kernel"
        and "not divisible by model=8" in finding.message
    )
    assert report.placements["mlp/d2/kernel"] == (None, None)


def test_kd207_weights_replicated_over_the_data_axis(transformer):
    [finding] = _codes(lint(KERAS_CORE, transformer, "2x4", size_threshold=1024), "KD207")
    assert finding.severity == "info" and "'fsdp=2,model=4'" in finding.message and "data=2" in finding.message
    assert not _codes(lint(KERAS_CORE, transformer, "1x8", size_threshold=1024), "KD207")  # no data axis
    assert not _codes(lint(KERAS_CORE, transformer, "2x2x2", size_threshold=1024), "KD207")  # already fsdp
    assert not _codes(lint(KERAS_CORE, transformer, "2x4"), "KD207")  # saves less than the 1 MiB threshold


def test_kd301_rule_shadowed_by_an_earlier_one(transformer):
    rules = RuleSet([(r".*/kernel", ("...", "model")), (r".*_mlp_up/kernel", ())])
    [finding] = _codes(lint(rules, transformer, "2x4"), "KD301")
    assert finding.severity == "info" and finding.rule == r".*_mlp_up/kernel" and "'.*/kernel'" in finding.message


def test_kd302_later_candidate_used(mlp):
    report = lint(KERAS_CORE, mlp, "2x4")
    [finding] = _codes(report, "KD302")
    assert finding.path == "mlp/d2/kernel" and finding.severity == "info"
    assert report.placements["mlp/d2/kernel"] == ("model", None)


def test_kd303_role_missing_from_mesh(transformer):
    rules = RuleSet([(r".*_mlp_up/kernel", ("expert", None)), (r".*", ())])
    [finding] = _codes(lint(rules, transformer, "2x4"), "KD303")
    assert finding.severity == "info" and "'expert'" in finding.message
    assert not _codes(lint(rules, transformer, "data=2,expert=4"), "KD303")


def test_kd304_variable_matched_by_no_rule(mlp):
    report = lint(RuleSet([(r".*/kernel", ("...", "model"))]), mlp, "2x4")
    unmatched = {"mlp/d1/bias", "mlp/d2/bias", "seed_generator/seed_generator_state"}  # the last is Dropout's
    assert {f.path for f in _codes(report, "KD304")} == unmatched


def test_every_code_has_a_test():
    tested = {code for name in globals() if name.startswith("test_kd") for code in CODES if code.lower() in name}
    assert tested == set(CODES)


# --- clean runs, inputs and agreement with what Keras and kdist do -------------------------------


def test_clean_run_has_no_errors(transformer, mlp):
    for model in (transformer, mlp):
        for mesh in ("1x8", "2x4", "4x2", "8x1"):
            report = lint(KERAS_CORE, model, mesh)
            assert report.ok and not report.warnings, report


def test_placements_match_the_distribution():
    for spec in ("2x4", "2x2x2"):
        distribution = kdist.preset(spec)
        keras.backend.clear_session()  # the same layer names in both builds
        report = lint(distribution, kdist.abstract_model(mnist_mlp))
        keras.backend.clear_session()
        with distribution.scope():
            mnist_mlp()
        assert report.placements == {p: pl.axes for p, pl in distribution.placements.items()}
        assert report.summary["mesh"] == dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))


def test_layout_map_placements_match_keras(transformer):
    mesh = kdist.mesh("2x4")
    layout_map = _layout_map([(r".*_mlp_(up|down)/kernel", (None, "model")), ("lm_head/kernel", (None, "model"))], mesh)
    report = lint(ModelParallel(layout_map=layout_map, batch_dim_name="data"), transformer)
    assert report.ok
    assert report.placements["block_0_mlp_up/kernel"] == (None, "model")
    assert report.placements["final_norm/gamma"] == (None,)


def test_mesh_needs_no_devices(transformer):
    report = lint(KERAS_CORE, transformer, "4x16")  # 64 devices; the tests have 8
    assert report.summary["mesh"] == {"data": 4, "model": 16}
    assert lint(KERAS_CORE, transformer, kdist.mesh("data=-1,model=2")).summary["mesh"] == {"data": 4, "model": 2}


def test_bad_inputs_name_the_fix(transformer):
    with pytest.raises(ValueError, match="needs a mesh"):
        lint(KERAS_CORE, transformer)
    with pytest.raises(TypeError, match="received dict"):
        lint({"a": 1}, transformer, "2x4")
    with pytest.raises(kdist.SpecError, match="'2x3x'"):
        lint(KERAS_CORE, transformer, "2x3x")


def test_variables_as_tuples():
    report = lint(KERAS_CORE, [("block/query/kernel", (1024, 16, 64), "bfloat16"), ("head/kernel", (1024, 10))], "1x8")
    assert report.summary["total_bytes"] == 1024 * 16 * 64 * 2 + 1024 * 10 * 4
    assert report.placements["block/query/kernel"] == (None, "model", None)


def test_auto_rules_on_a_keras_hub_backbone():
    keras_hub = pytest.importorskip("keras_hub")
    backbone = kdist.abstract_model(
        keras_hub.models.LlamaBackbone,
        vocabulary_size=256,
        num_layers=2,
        num_query_heads=8,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
    )
    report = lint("auto", backbone, "2x4", size_threshold=1024)
    assert report.ok, report
    assert report.summary["sharded_share"] > 0.9


@pytest.mark.parametrize("family", list(kdist.zoo.tiny_entries()))
def test_auto_rules_lint_clean_on_every_covered_backbone(family, tiny_backbones):
    backbone = tiny_backbones[family]
    for mesh in ("1x8", "2x4", "4x2", "8x1"):
        report = lint("auto", backbone, mesh)
        assert report.ok, report
        # Only the tiny models' size can make a warning; no rule is unused, partial or indivisible.
        assert report.codes("warning") <= {"KD203", "KD204"}, report


# --- rendering --------------------------------------------------------------------------------


def test_json_and_rich_rendering(mlp):
    report = lint(_layout_map([(r"mlp/d2/kernel", (None, "model")), ("d1/kernel", ())]), mlp, "2x4")
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["counts"] == {"error": 1, "warning": 1, "info": 0}
    assert {(f["code"], f["name"], f["severity"]) for f in data["findings"]} == {
        ("KD104", "indivisible", "error"),
        ("KD202", "partial-match-only", "warning"),
    }
    console = Console(record=True, width=160)
    console.print(report)
    text = console.export_text()
    assert "FAILED" in text and "KD104" in text and "mlp/d2/kernel" in text and "partial-match-only" in text
    assert str(report).startswith("kdist lint: 1 error(s), 1 warning(s)")
    assert isinstance(report, LintReport)


def test_rich_rendering_collapses_repeated_findings(transformer):
    report = lint(RuleSet([(r".*/(query|key|value)/kernel", (None, "model", None))]), transformer, "1x8")
    assert len(_codes(report, "KD206")) == 6
    console = Console(record=True, width=200)
    console.print(report)
    assert "... and 3 more" in console.export_text()


# --- CLI ---------------------------------------------------------------------------------------


def _unbuilt_model():
    return keras.Sequential([keras.layers.Dense(4)], name="unbuilt")


def test_unbuilt_model_error_names_the_model():
    with pytest.raises(ValueError, match=r"no variables in Sequential 'unbuilt'.*build the model"):
        lint("auto", _unbuilt_model(), mesh="2x4")
