"""Rule files: JSON and TOML round trips, and errors that name the file and entry."""

import json

import pytest

import kdist
from kdist import RuleError, RuleSet
from kdist.meshes import ParallelDims
from kdist.rules import AUTO, KERAS_CORE, load_rules, save_rules

AXES = ParallelDims.parse("2x4", 8)
MINE = RuleSet(
    [
        (r".*/(query|key|value)/kernel", [(None, "model", None), (None, None, "model")], "column-parallel"),
        (r"it's/\d+/kernel", ("...", "model")),
        (r".*/bias", (), "replicated", "mine"),
    ],
    name="mine",
)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
@pytest.mark.parametrize("rules", [MINE, KERAS_CORE, AUTO], ids=lambda r: r.name)
def test_round_trip(tmp_path, suffix, rules):
    path = tmp_path / f"rules{suffix}"
    save_rules(rules, path)
    again = load_rules(path)
    assert again.to_dict() == rules.to_dict()
    assert [r.layouts for r in again] == [r.layouts for r in rules]


def test_toml_writes_none_as_empty_string_and_keeps_backslashes(tmp_path):
    path = tmp_path / "rules.toml"
    save_rules(MINE, path)
    text = path.read_text()
    assert "layouts = [['', 'model', ''], ['', '', 'model']]" in text
    assert "pattern = '.*/(query|key|value)/kernel'" in text  # a literal string: no escapes
    assert 'pattern = "it\'s/\\\\d+/kernel"' in text  # a quote forces a basic string, backslash escaped
    assert load_rules(path).rules[1].pattern == r"it's/\d+/kernel"


def test_hand_written_json_accepts_one_layout_or_several(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps({"rules": [{"pattern": ".*/kernel", "layouts": [None, "model"]}, {"pattern": ".*", "layouts": []}]})
    )
    rules = load_rules(path)
    assert rules.name == "mine"  # the file name when the file has none
    assert rules.place("d/kernel", (8, 8), AXES).axes == (None, "model")
    assert rules.place("d/bias", (8,), AXES).axes == (None,) and rules.rules[1].replicates


def test_preset_loads_a_rules_file(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("name = 'file'\n[[rules]]\npattern = '.*/kernel'\nlayouts = [['model', '']]\n")
    dist = kdist.preset("2x4", rules=str(path))
    assert dist.rules.name == "file"
    assert dist.place("dense/kernel", (8, 8)).axes == ("model", None)
    assert kdist.preset("2x4", rules=path).rules.name == "file"


BAD = {
    "bad.json": ("{not json", r"bad\.json' is not valid JSON"),
    "bad.toml": ("rules = [", r"bad\.toml' is not valid TOML"),
    "list.json": ("[]", r"list\.json' must be a mapping with a 'rules' list"),
    "top.json": ('{"rules": [], "extra": 1}', r"unknown top-level keys \['extra'\]"),
    "missing.json": (
        '{"rules": [{"pattern": "a"}]}',
        r"rules\[0\] of the rules file '.*missing\.json' lacks \['layouts'\]",
    ),
    "unknown.json": (
        '{"rules": [{"pattern": "a", "layouts": [], "axes": []}]}',
        r"rules\[0\] .* has unknown keys \['axes'\]",
    ),
    "regex.toml": (
        "[[rules]]\npattern = 'ok'\nlayouts = []\n[[rules]]\npattern = '(open'\nlayouts = []\n",
        r"rules\[1\] of the rules file '.*regex\.toml': Rule '\(open' is not a valid regex",
    ),
    "axis.json": (
        '{"rules": [{"pattern": "a", "layouts": [[1, "model"]]}]}',
        r"rules\[0\] .*: each layout must be a list of axis names",
    ),
    "pattern.json": ('{"rules": [{"pattern": 3, "layouts": []}]}', r"rules\[0\] .*: 'pattern' must be a string"),
    "rules.yaml": ("rules: []", r"must end in \.json or \.toml; received '\.yaml'"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_files_name_the_file_and_the_entry(tmp_path, name):
    text, message = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RuleError, match=message):
        load_rules(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(RuleError, match=r"Cannot read rules file '.*nowhere\.json'"):
        load_rules(tmp_path / "nowhere.json")


def test_rule_files_are_data_only(tmp_path):
    path = tmp_path / "evil.json"
    path.write_text(json.dumps({"rules": [{"pattern": "__import__('os').system('false')", "layouts": []}]}))
    rules = load_rules(path)  # the "code" is only a regex that matches nothing real
    assert rules.place("dense/kernel", (8, 8), AXES).source == "default"
