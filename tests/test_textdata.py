"""kdist.textdata: JSON and TOML from users and other processes, bounded and from regular files only."""

import os

import pytest

from kdist import textdata
from kdist.errors import RuleError


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "a.json").write_text('{"a": [1, {"b": null}]}')
    assert textdata.read_json(tmp_path / "a.json", "the file", RuleError) == {"a": [1, {"b": None}]}


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_special_files_are_refused_at_once(tmp_path, kind):
    path = tmp_path / "x.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(RuleError, match="The file is not a regular file"):
        textdata.read_text(path, "the file", RuleError)


def test_a_file_over_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(textdata, "MAX_BYTES", 10)
    (tmp_path / "big.json").write_text("[" + "1," * 20 + "1]")
    with pytest.raises(RuleError, match="more than the 10 kdist reads"):
        textdata.read_json(tmp_path / "big.json", "the file", RuleError)


@pytest.mark.parametrize("parse", [textdata.parse_json, textdata.parse_toml])
def test_deep_nesting_is_refused_before_parsing(parse):
    text = ("" if parse is textdata.parse_json else "a = ") + "[" * 65 + "]" * 65
    with pytest.raises(RuleError, match="nests 65 levels of brackets; kdist reads at most 64"):
        parse(text, "the text", RuleError)
    assert parse(("" if parse is textdata.parse_json else "a = ") + "[" * 64 + "]" * 64, "t", RuleError)


def test_bad_text_names_the_input(tmp_path):
    (tmp_path / "b.json").write_bytes(b"\xff\xfe")
    with pytest.raises(RuleError, match="The file is not UTF-8 text"):
        textdata.read_json(tmp_path / "b.json", "the file", RuleError)
    with pytest.raises(RuleError, match="The text is not valid TOML"):
        textdata.parse_toml("a = = 1", "the text", RuleError)
