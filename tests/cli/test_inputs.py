"""Every command refuses bad input with `kdist: error: ...` (or argparse's usage error) and exit 2, no traceback."""

import pytest

from kdist.cli import main

CASES = [
    (["demo", "--mesh", "2x3"], "Mesh spec '2x3' asks for 6 devices"),
    (["demo", "--steps", "0"], "expected an integer >= 1"),
    (["demo", "--fake-devices", "-1"], "expected a device count >= 0"),
    (["demo", "--fake-devices", "four"], "expected a device count"),
    (["inspect", "no-such-model"], "Unknown model 'no-such-model'"),
    (["inspect", "mlp", "--mesh", "200x200"], "needs 40000 devices"),
    (["inspect", "mlp", "--optimizer", "adamz"], "Unknown optimizer 'adamz'"),
    (["inspect", "mlp", "--rules", "nope"], "Unknown rule set 'nope'"),
    (["inspect", "mlp", "--limit", "0"], "expected an integer >= 1"),
    (["inspect", "mlp", "--grid", "mlp/d9/kernel"], "No variable 'mlp/d9/kernel'"),
    (["lint", "no-such-model"], "Unknown model 'no-such-model'"),
    (["lint", "mlp", "--rules", "missing.toml"], "Cannot read rules file"),
    (["lint", "mlp", "--mesh", "2x3x"], "Malformed mesh spec '2x3x'"),
    (["lint", "mlp", "--size-threshold", "-5"], "expected an integer >= 0"),
    (["lint", "no_module_here:build"], "Cannot import module 'no_module_here'"),
    (["plan", "nosuch", "--devices", "8", "--batch-size", "8"], "Unknown model 'nosuch'"),
    (["plan", "mlp", "--devices", "0", "--batch-size", "8"], "expected an integer >= 1"),
    (["plan", "mlp", "--devices", "10000000000", "--batch-size", "8"], "devices=10000000000 is more than"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--memory", "eighty"], "--memory='eighty' is not a size"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--memory", ""], "--memory='' is not a size"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--optimizer", "adamz"], "Unknown optimizer 'adamz'"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--dtype", "int8"], "dtype must be a floating-point"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--bandwidth", "lots"], "bandwidth='lots' is not a size"),
    (["plan", "mlp", "--devices", "8"], "the following arguments are required: --batch-size"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--seq-len", "0"], "expected an integer >= 1"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--seq-len", "a=1,b"], "NAME=LENGTH pairs separated"),
    (["plan", "mlp", "--devices", "8", "--batch-size", "8", "--seq-len", "a=1x-2"], "got 'a=1x-2'"),
    (
        ["plan", "tiny-whisper", "--devices", "8", "--batch-size", "8", "--seq-len", "encoder_features=32"],
        "gives no length to input(s) ['decoder_padding_mask', 'decoder_token_ids']",
    ),
    (["sweep", "no-such-model"], "Unknown model 'no-such-model'"),
    (["sweep", "mlp", "--devices", "0"], "expected an integer >= 1"),
    (["sweep", "mlp", "--top", "2", "--meshes", "8x1"], "--top 2 picks the meshes from the plan"),
    (["sweep", "mlp", "--top", "0"], "expected an integer >= 1"),
    (["sweep", "mlp", "--meshes", "2x3", "--steps", "1", "--warmup", "0"], None),  # a failed shape is a row, exit 1
    (["launch"], "give a script to run"),
    (["launch", "-n", "0", "x.py"], "expected an integer >= 1"),
    (["launch", "--timeout", "0", "x.py"], "expected a number of seconds > 0"),
    (["launch", "--coordinator", "localhost", "--", "true"], "not of the form"),
    (["launch", "no_such_script.py"], "does not exist"),
    (["zoo", "--fancy"], "unrecognized arguments: --fancy"),
    (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
]


@pytest.mark.parametrize("argv, words", CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_bad_input_exits_2_with_one_clear_line(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if words is None:
        assert code == 1
        return
    assert code == 2, err
    assert words in err, err
    lines = [line for line in err.splitlines() if line.startswith(("kdist: error:", "kdist ")) or "error:" in line]
    assert len([line for line in lines if "error:" in line]) == 1, err
