"""Bad input to rules, rule sets, rule files and rule-set names: a kdist error naming what is wrong."""

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
    (lambda: Rule(".*", ("...", "...")), RuleError, "more than one '...'"),
    (lambda: Rule(".*", [], "note"), RuleError, "has no layout"),
    (lambda: Rule(".*", (), 3), RuleError, "note must be a string"),
    (lambda: Rule(".*", (), follows=("kernel", "up")), RuleError, "follows must be", "trailing"),
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


def test_a_missing_rules_file_is_named(tmp_path):
    raises_clearly(lambda: load_rules(tmp_path / "none.toml"), RuleError, "Cannot read rules file", "none.toml")
