import re

import keras
import pytest

import kdist
import kdist.models
from kdist import Rule, RuleError, RuleSet
from kdist.meshes import ParallelDims
from kdist.rules import KERAS_CORE

AXES = ParallelDims.parse("2x4", 8)


def test_first_matching_rule_wins():
    rules = RuleSet([(r".*/special/kernel", (None, "data")), (r".*/kernel", (None, "model"))])
    assert rules.place("net/special/kernel", (8, 8), AXES).axes == (None, "data")
    assert rules.place("net/other/kernel", (8, 8), AXES).axes == (None, "model")


def test_rules_match_whole_paths_only():
    rules = RuleSet([(r"d1/kernel", (None, "model"))])
    assert rules.place("sequential/d1/kernel", (8, 8), AXES).source == "default"


def test_ellipsis_fits_any_rank():
    rules = RuleSet([(r".*kernel", ("...", "model"))])
    assert rules.place("conv/kernel", (3, 3, 16, 32), AXES).axes == (None, None, None, "model")
    assert rules.place("dense/kernel", (16, 32), AXES).axes == (None, "model")


def test_shorter_layout_replicates_trailing_dimensions():
    assert RuleSet([(r"w", ("model",))]).place("w", (8, 3), AXES).axes == ("model", None)


def test_candidate_layouts_fall_back_and_say_why():
    rule = Rule(r".*/key/kernel", [(None, "model", None), (None, None, "model")])
    placement = RuleSet([rule]).place("attn/key/kernel", (64, 2, 32), AXES)
    assert placement.axes == (None, None, "model")
    assert placement.source == "fallback"
    assert "dim 1 (2) not divisible by model=4" in placement.reason


def test_no_candidate_divides_replicates_those_dimensions():
    placement = RuleSet([(r"w", (None, "model"))]).place("w", (8, 6), AXES)
    assert placement.axes == (None, None)
    assert placement.source == "fallback" and "replicated" in placement.reason


def test_roles_missing_from_the_mesh_bind_to_nothing():
    assert RuleSet([(r"w", ("expert", "model"))]).place("w", (8, 8), AXES).axes == (None, "model")


def test_unknown_axis_is_an_error_naming_the_rule():
    with pytest.raises(RuleError, match=r"Rule 'w' uses axis 'tensor'"):
        RuleSet([(r"w", ("tensor",))]).place("w", (8,), AXES)


def test_layout_longer_than_rank_is_an_error_naming_rule_and_variable():
    with pytest.raises(RuleError, match=r"Rule 'b' matches variable 'b' of shape \(8,\)"):
        RuleSet([(r"b", (None, "model"))]).place("b", (8,), AXES)


def test_invalid_regex_is_an_error():
    with pytest.raises(RuleError, match="not a valid regex"):
        Rule(r"(unclosed", ())


def test_mesh_roles_are_inferred_from_keras_names():
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], list(range(8)))
    dims = ParallelDims.from_device_mesh(mesh)
    assert (dims.bind("data"), dims.size_of("data")) == ("batch", 2) and (
        dims.bind("model"),
        dims.size_of("model"),
    ) == ("model", 4)


def test_layout_map_export_keeps_first_match_order():
    mesh = kdist.mesh("2x4")
    rules = RuleSet([(r".*/special/kernel", (None, "data")), (r".*/kernel", (None, "model"))])
    layout_map = rules.to_layout_map(mesh)
    assert isinstance(layout_map, keras.distribution.LayoutMap)
    assert layout_map["net/special/kernel"].axes == (None, "data")
    assert layout_map["net/other/kernel"].axes == (None, "model")
    # The keys are anchored, so pre-3.14 partial matching (re.search) gives the same answer.
    assert not any(re.search(key, "net/special/kernel_scale") for key in layout_map)


def test_layout_map_export_for_variables_resolves_fallbacks():
    dist = kdist.preset("2x4")
    with dist.scope():
        model = kdist.models.mnist_mlp()
    layout_map = KERAS_CORE.to_layout_map(dist.device_mesh, variables=model.variables)
    assert layout_map["mlp/d2/kernel"].axes == ("model", None)  # 10 outputs do not divide by 4
    same = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")
    with same.scope():
        again = kdist.models.mnist_mlp()
    for a, b in zip(model.variables, again.variables):
        assert a.value.sharding.spec == b.value.sharding.spec, a.path


def test_rule_set_dict_round_trip():
    data = KERAS_CORE.to_dict()
    again = RuleSet.from_dict(data)
    assert again.to_dict() == data


def test_candidates_naming_a_missing_role_are_passed_over():
    rule = Rule(r"experts", [("expert", None, "model"), ("model", None, None)])
    placement = RuleSet([rule]).place("experts", (8, 16, 32), AXES)
    assert placement.axes == ("model", None, None) and placement.source == "fallback"
    assert "the mesh has no 'expert' axis" in placement.reason
    with_expert = ParallelDims.from_sizes({"data": 2, "model": 4, "expert": 2})
    assert RuleSet([rule]).place("experts", (8, 16, 32), with_expert).axes == ("expert", None, "model")
    # When every candidate names a missing role, they bind as before (missing roles replicate).
    assert RuleSet([(r"w", ("expert", "model"))]).place("w", (8, 8), AXES).axes == (None, "model")


def test_rule_family_tag_round_trips():
    rule = Rule(r".*/kernel", ("...", "model"), "note", "llama,mistral")
    assert rule.families == ("llama", "mistral")
    assert RuleSet.from_dict(RuleSet([rule]).to_dict()).rules[0] == rule


def test_layout_map_export_without_variables_refuses_rank_dependent_layouts():
    rules = RuleSet([(r".*/kernel", ("...", "model"))])
    with pytest.raises(RuleError, match=r"Rule '\.\*/kernel' has layout .*Pass variables=model\.variables"):
        rules.to_layout_map(kdist.mesh("2x4"))
