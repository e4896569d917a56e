"""Bad inputs to `kdist.launch` and `kdist launch`: each is refused before any process starts, with a kdist error
that names the argument, the value and what is accepted."""

import math

import pytest

import kdist
from kdist.cli import main

OK = ["-c", "pass"]

CASES = [
    # (arguments, error class, words the message must contain)
    ({"command": []}, kdist.LaunchError, ["needs a command", "[]"]),
    ({"command": ""}, kdist.LaunchError, ["needs a command"]),
    ({"command": "  "}, kdist.LaunchError, ["needs a command"]),
    ({"command": None}, kdist.ArgumentTypeError, ["command", "None", "script path"]),
    ({"command": 42}, kdist.ArgumentTypeError, ["command", "42", "int"]),
    ({"command": ["-c", 3]}, kdist.ArgumentTypeError, ["command", "list of strings"]),
    ({"command": [b"x.py"]}, kdist.ArgumentTypeError, ["command", "list of strings"]),
    ({"command": ["-c"]}, kdist.LaunchError, ["-c must be followed by the code"]),
    ({"command": ["-m", ""]}, kdist.LaunchError, ["-m must be followed by a module name"]),
    ({"command": ["-c", "pass\x00"]}, kdist.LaunchError, ["NUL"]),
    ({"command": "no_such_script.py"}, kdist.LaunchError, ["no_such_script.py", "does not exist"]),
    ({"command": ["no-such-command-kdist"]}, kdist.LaunchError, ["no-such-command-kdist", "failed"]),
    ({"num_processes": 0}, kdist.LaunchError, ["num_processes", "positive integer", "0"]),
    ({"num_processes": -2}, kdist.LaunchError, ["num_processes", "-2"]),
    ({"num_processes": 10**6}, kdist.LaunchError, ["num_processes=1000000", "1024"]),
    ({"num_processes": 2.0}, kdist.ArgumentTypeError, ["num_processes", "2.0", "positive integer"]),
    ({"num_processes": "2"}, kdist.ArgumentTypeError, ["num_processes", "'2'", "str"]),
    ({"num_processes": True}, kdist.ArgumentTypeError, ["num_processes", "True", "bool"]),
    ({"num_processes": None}, kdist.ArgumentTypeError, ["num_processes", "None"]),
    ({"devices_per_process": 0}, kdist.LaunchError, ["devices_per_process", "positive integer", "0"]),
    ({"devices_per_process": 10**9}, kdist.LaunchError, ["devices_per_process=1000000000", "4096"]),
    ({"devices_per_process": "4"}, kdist.ArgumentTypeError, ["devices_per_process", "or None"]),
    ({"coordinator_address": "localhost"}, kdist.ClusterError, ["localhost", "host:port"]),
    ({"coordinator_address": "h:0"}, kdist.ClusterError, ["'h:0'", "1 to 65535"]),
    ({"coordinator_address": "h:70000"}, kdist.ClusterError, ["'h:70000'"]),
    ({"coordinator_address": "a b:1"}, kdist.ClusterError, ["'a b:1'", "host:port"]),
    ({"coordinator_address": ":1234"}, kdist.ClusterError, ["':1234'"]),
    ({"coordinator_address": 1234}, kdist.ArgumentTypeError, ["coordinator_address", "1234", "host:port"]),
    ({"env": ["A=1"]}, kdist.ArgumentTypeError, ["env", "dict"]),
    ({"env": {"A": 1}}, kdist.ArgumentTypeError, ["env", "strings"]),
    ({"env": {1: "a"}}, kdist.ArgumentTypeError, ["env", "strings"]),
    ({"env": {"": "a"}}, kdist.LaunchError, ["env", "non-empty name"]),
    ({"env": {"A=B": "a"}}, kdist.LaunchError, ["'A=B'", "without '='"]),
    ({"env": {"A": "x\x00y"}}, kdist.LaunchError, ["NUL"]),
    ({"cwd": "/no/such/directory"}, kdist.LaunchError, ["cwd", "/no/such/directory", "not an existing directory"]),
    ({"cwd": 3}, kdist.ArgumentTypeError, ["cwd", "3", "directory path"]),
    ({"timeout": 0}, kdist.LaunchError, ["timeout", "positive number of seconds", "0"]),
    ({"timeout": -1}, kdist.LaunchError, ["timeout=-1"]),
    ({"timeout": math.inf}, kdist.LaunchError, ["timeout=inf"]),
    ({"timeout": math.nan}, kdist.LaunchError, ["timeout=nan"]),
    ({"timeout": "10"}, kdist.ArgumentTypeError, ["timeout", "'10'", "seconds > 0 or None"]),
    ({"timeout": True}, kdist.ArgumentTypeError, ["timeout", "True"]),
    ({"hang_timeout": 0}, kdist.LaunchError, ["hang_timeout", "positive number"]),
    ({"hang_timeout": -5.0}, kdist.LaunchError, ["hang_timeout=-5.0"]),
    ({"hang_timeout": [1]}, kdist.ArgumentTypeError, ["hang_timeout", "[1]"]),
    ({"grace_period": -1}, kdist.LaunchError, ["grace_period", ">= 0", "-1"]),
    ({"grace_period": math.inf}, kdist.LaunchError, ["grace_period=inf"]),
    ({"grace_period": None}, kdist.ArgumentTypeError, ["grace_period", "None", ">= 0"]),
    ({"stream": "stdot"}, kdist.LaunchError, ["stream", "'stdot'", "'stdout'"]),
    ({"stream": 1}, kdist.ArgumentTypeError, ["stream", "file object"]),
    ({"capture": "yes"}, kdist.ArgumentTypeError, ["capture", "'yes'", "True or False"]),
    ({"capture": 1}, kdist.ArgumentTypeError, ["capture", "True or False"]),
]


@pytest.mark.parametrize("arguments, error, words", CASES, ids=[repr(c[0])[:60] for c in CASES])
def test_bad_launch_arguments_are_refused_with_a_clear_error(arguments, error, words):
    arguments = {"command": OK, "num_processes": 1, "devices_per_process": 1, "stream": None, **arguments}
    with pytest.raises(error) as caught:
        kdist.launch(arguments.pop("command"), **arguments)
    assert isinstance(caught.value, kdist.KdistError)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--timeout", "0"], ["--timeout", "> 0"]),
        (["--timeout", "-3"], ["--timeout"]),
        (["--timeout", "soon"], ["--timeout", "'soon'"]),
        (["--grace-period", "-1"], ["--grace-period", ">= 0"]),
        (["--grace-period", "nan"], ["--grace-period", ">= 0"]),
        (["--hang-timeout", "-1"], ["--hang-timeout"]),
        (["-n", "0"], ["--num-processes", ">= 1"]),
        (["--devices-per-process", "-1"], ["--devices-per-process"]),
    ],
)
def test_bad_cli_options_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["launch", *argv, "--", "true"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


def test_cli_reports_a_bad_coordinator_and_a_missing_command(capsys):
    assert main(["launch", "--coordinator", "nohost", "--", "true"]) == 2
    assert "kdist: error:" in capsys.readouterr().err
    assert main(["launch"]) == 2
    assert "give a script to run" in capsys.readouterr().err


def test_cli_accepts_zero_grace_and_no_hang_timeout(capsys):
    code = main(["launch", "-n", "1", "--grace-period", "0", "--hang-timeout", "off", "--", "true"])
    assert code == 0
    assert "all 1 processes exited with code 0" in capsys.readouterr().err
