"""Bad input to rules, rule sets, rule files and rule-set names: a kdist error naming what is wrong."""

import os

import pytest

import kdist
from kdist.errors import ArgumentTypeError, RuleError
from kdist.meshes import ParallelDims
from kdist.rules import LayoutMapRules, Placer, Rule, RuleSet, get_rules, load_rules, save_rules
from tests.helpers import raises_clearly

DIMS = ParallelDims.parse("2x4", 8)
CASES = [
    (lambda: Rule(".*/kernel", "model"), RuleError, "layouts must be one layout", "'model'", "('...', 'model')"),
    (lambda: Rule(".*/kernel", {"a": 1}), RuleError, "layouts must be", "dict"),
    (lambda: Rule(".*/kernel", [("model",), 3]), RuleError, "the layout int 3"),
    (lambda: Rule(".*/kernel", ("", "model")), RuleError, "layouts must be"),
    (lambda: Rule(b".*/kernel", ("model",)), RuleError, "pattern must be a regex string", "bytes"),
    (lambda: Rule("(open", ()), RuleError, "'(open' is not a valid regex"),
    (lambda: Rule(".*", ("...", "...")), RuleError, "more than one '...'", "can appear once", "('...', 'model')"),
    (lambda: Rule(3, ("model",)), RuleError, "pattern must be a regex string", "int 3"),
    (lambda: RuleSet([]) + [(7, ())], RuleError, "pattern must be a regex string", "int 7"),
    (lambda: RuleSet([]) + 5, RuleError, "list of Rules", "int 5"),
    (lambda: RuleSet(_nested(10_000)), RuleError, "a (pattern, layouts) pair", "[[[...]]]"),
    (lambda: Rule(".*", [], "note"), RuleError, "has no layout"),
    (lambda: Rule(".*", (), 3), RuleError, "note must be a string"),
    (lambda: Rule(".*", (), follows=("kernel", "up")), RuleError, "follows must be", "trailing"),
    (lambda: Rule(".*", (), follows=3), RuleError, "follows must be", "received 3"),
    (lambda: Rule(".*", (), follows="kernel"), RuleError, "follows must be", "'kernel'"),
    (lambda: RuleSet("(.*)"), RuleError, "list of Rules", "str"),
    (lambda: RuleSet([42]), RuleError, "a (pattern, layouts) pair", "int 42"),
    (lambda: RuleSet([], name=3), RuleError, "name must be a string"),
    (lambda: RuleSet.from_dict([]), RuleError, "must be a mapping with a 'rules' list"),
    (lambda: RuleSet([("w", ("tensor",))]).place("w", (8,), DIMS), RuleError, "'tensor'", "neither a role"),
    (lambda: RuleSet([("b", (None, "model"))]).place("b", (8,), DIMS), RuleError, "rank 1"),
    (lambda: get_rules(3), ArgumentTypeError, "must be a string or a path"),
    (lambda: get_rules("lama"), RuleError, "Unknown rule set 'lama'", "llama"),
    (lambda: load_rules(5), RuleError, "must be a non-empty string or path", "5"),
    (lambda: load_rules("rules.yaml"), RuleError, "must end in .json or .toml", ".yaml"),
    (lambda: save_rules("not rules", "r.json"), RuleError, "writes a kdist.RuleSet", "str"),
    (lambda: LayoutMapRules([("a", None)]), RuleError, "LayoutMap or a dict", "list"),
    (lambda: LayoutMapRules({"a": 7}), RuleError, "layout 7", "TensorLayout or a tuple"),
    (lambda: LayoutMapRules({3: ("model",)}), RuleError, "keys must be strings", "3"),
    (
        lambda: LayoutMapRules({"x/.*": ("model",), ".*/a": ("model",)}).place("x/a", (8,), DIMS),
        RuleError,
        "multiple",
        "'x/.*'",
    ),
    (lambda: Placer("auto", DIMS), RuleError, "RuleSet or LayoutMapRules", "str"),
    (
        lambda: kdist.preset("2x4", rules={"w": (None, "model")}).place("w", (8, 6)),
        RuleError,
        "dimension 1 (6)",
        "model=4",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call, error, *words = case
    raises_clearly(call, error, *words)


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return [value]


def test_a_list_adds_to_a_rule_set():
    added = RuleSet([(".*/kernel", ("model",))], name="mine") + [(".*", ())]
    assert [r.pattern for r in added] == [".*/kernel", ".*"] and added.name == "mine+added"


@pytest.mark.parametrize("fmt", [".json", ".toml"])
def test_deeply_nested_rules_file_is_refused(tmp_path, fmt):
    path = tmp_path / f"deep{fmt}"
    path.write_text(("" if fmt == ".json" else "rules = ") + "[" * 100_000 + "]" * 100_000)
    raises_clearly(lambda: load_rules(path), RuleError, "nests 100000 levels", "at most 64")


def test_a_fifo_rules_file_is_refused_without_blocking(tmp_path):
    path = tmp_path / "rules.json"
    os.mkfifo(path)
    raises_clearly(lambda: load_rules(path), RuleError, "not a regular file", "rules.json")


def test_save_rules_refuses_a_directory_and_leaves_it(tmp_path):
    (tmp_path / "r.json").mkdir()
    raises_clearly(lambda: save_rules(RuleSet([]), tmp_path / "r.json"), RuleError, "not a regular file")
    assert (tmp_path / "r.json").is_dir()


def test_a_missing_rules_file_is_named(tmp_path):
    raises_clearly(lambda: load_rules(tmp_path / "none.toml"), RuleError, "Cannot read rules file", "none.toml")


def test_an_optimizers_own_state_of_lower_rank_is_replicated_saying_why_where_a_weight_is_refused():
    placer = Placer(RuleSet([("(.*/)?embeddings", (None, "model"))]), DIMS)
    raises_clearly(lambda: placer.place("adafactor/embeddings", (256,)), RuleError, "rank 1")
    placement = placer.place("adafactor/embeddings", (256,), optimizer_state=True)
    assert placement.axes == (None,) and placement.source == "default"
    assert "optimizer state of rank 1" in placement.reason and "'(.*/)?embeddings'" in placement.reason
    assert placer.place("token/embeddings", (256, 64), optimizer_state=True).axes == (None, "model")
