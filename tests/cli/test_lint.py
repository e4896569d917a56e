"""`kdist lint`: exit codes, JSON, rule sets by name and file."""

import json

import keras

from kdist.rules import Rule, RuleSet, save_rules


def _unbuilt_model():
    return keras.Sequential([keras.layers.Dense(4)], name="unbuilt")


def _cli(capsys, *argv):
    from kdist.cli import main

    code = main(["lint", *argv])
    return code, capsys.readouterr()


def test_cli_clean_run_exits_0(capsys):
    code, out = _cli(capsys, "tiny-transformer", "--mesh", "2x4", "--json")
    assert code == 0, out.out
    assert json.loads(out.out)["ok"] is True


def test_cli_errors_exit_1(tmp_path, capsys):
    path = tmp_path / "rules.json"
    save_rules(RuleSet([Rule(r"(.*/)?kernel", ("...", "tensor"))], name="mine"), path)
    code, out = _cli(capsys, "tiny-transformer", "--mesh", "2x4", "--rules", str(path))
    assert code == 1
    assert "FAILED" in out.out and "KD103" in out.out


def test_cli_fail_on_warning(tmp_path, capsys):
    path = tmp_path / "rules.toml"
    save_rules(RuleSet([Rule(r"(.*/)?kernel", ("...", "model")), Rule("nothing/here", ())], name="mine"), path)
    assert _cli(capsys, "tiny-transformer", "--rules", str(path))[0] == 0
    assert _cli(capsys, "tiny-transformer", "--rules", str(path), "--fail-on", "warning")[0] == 1


def test_cli_bad_model_or_rules_exit_2(capsys):
    code, out = _cli(capsys, "no-such-model")
    assert code == 2 and "Unknown model 'no-such-model'" in out.err
    code, out = _cli(capsys, "mlp", "--rules", "no-such-rules")
    assert code == 2 and "Unknown rule set 'no-such-rules'" in out.err


def test_cli_rule_set_by_name(capsys):
    code, out = _cli(capsys, "mlp", "--rules", "keras-core", "--mesh", "1x8", "--json")
    data = json.loads(out.out)
    assert code == 0 and data["summary"]["rules"] == "keras-core"
    assert [f["code"] for f in data["findings"] if f["path"] == "mlp/d2/kernel"] == ["KD302"]


def test_cli_unbuilt_model_exits_2(capsys):
    code, out = _cli(capsys, "tests.cli.test_lint:_unbuilt_model")
    assert code == 2 and "no variables in Sequential 'unbuilt'" in out.err
