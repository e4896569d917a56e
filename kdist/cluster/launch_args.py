"""The checks of `kdist.launch`'s arguments: each returns the value normalised or raises a kdist error.

Wrong kinds raise `ArgumentTypeError`, unusable values `LaunchError`; each
message names the argument, the value and what is accepted.
"""

import dataclasses
import os
import sys
from collections.abc import Mapping

from kdist.checks import is_int, non_negative_number, positive_int, positive_number, shown
from kdist.errors import ArgumentTypeError, LaunchError


@dataclasses.dataclass
class Options:
    """The checked options of one launch."""

    env: dict
    cwd: object
    timeout: object
    hang_timeout: object
    grace: float
    stream: object
    capture: bool


def argv_of(command, cwd, bootstrap):
    """(argv to start, whether it runs under the `bootstrap` source: Python targets do)."""
    if isinstance(command, (str, os.PathLike)):
        command = [command]
    if not isinstance(command, (list, tuple)):
        wrong_kind("command", command, 'a script path or an argv list such as ["train.py", "--epochs", "2"]')
    for part in command:
        if not isinstance(part, (str, os.PathLike)) or not isinstance(os.fspath(part), str):
            wrong_kind("command", command, "a list of strings (or paths)")
    command = [os.fspath(c) for c in command]
    if not command or not command[0].strip():
        raise LaunchError(f"launch needs a command: a script path or an argv list; received command={command!r}.")
    if any("\x00" in part for part in command):
        raise LaunchError(f"command contains a NUL character; received command={command!r}.")
    first = command[0]
    if first in ("-m", "-c"):
        if len(command) < 2 or not command[1].strip():
            what = "a module name" if first == "-m" else "the code to run"
            raise LaunchError(f"command {command!r}: {first} must be followed by {what}.")
        kind = "module" if first == "-m" else "code"
        return [sys.executable, "-c", bootstrap, kind, *command[1:]], True
    if first.endswith(".py"):
        where = cwd_of(cwd) or os.getcwd()
        if not os.path.isfile(os.path.join(where, first)):
            raise LaunchError(f"Script {first!r} does not exist (working directory {where}).")
        return [sys.executable, "-c", bootstrap, "script", *command], True
    return command, False


def count(value, name, maximum, also=""):
    """`value` as an int from 1 to `maximum`."""
    if not is_int(value):
        wrong_kind(name, value, f"a positive integer{' ' + also if also else ''}")
    return positive_int(value, name, maximum=maximum, error=LaunchError)


def seconds(value, name, *, allow_none=False, zero=False):
    """`value` as float seconds: > 0 (>= 0 with `zero`), or None when `allow_none`."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        accepted = f"a number of seconds{' >= 0' if zero else ' > 0'}{' or None' if allow_none else ''}"
        wrong_kind(name, value, accepted)
    if zero:
        return non_negative_number(value, name, unit="seconds", error=LaunchError)
    return positive_number(value, name, unit="seconds", allow_none=allow_none, error=LaunchError)


def extra_env(env):
    """`env` as a dict of valid environment variables ({} for None)."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        wrong_kind("env", env, "a dict of environment variables {name: value} or None")
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            wrong_kind("env", env, "a dict whose names and values are strings")
        if not name or "=" in name or "\x00" in name or "\x00" in value:
            raise LaunchError(
                f"env: {name!r}={value!r} is not a valid environment variable (a non-empty name without '=' "
                "and no NUL characters)."
            )
    return dict(env)


def cwd_of(cwd):
    """`cwd` as a path string, or None; it must be an existing directory."""
    if cwd is None:
        return None
    if not isinstance(cwd, (str, os.PathLike)):
        wrong_kind("cwd", cwd, "a directory path or None")
    path = os.fspath(cwd)
    if not isinstance(path, str) or not os.path.isdir(path):
        raise LaunchError(f"cwd={cwd!r} is not an existing directory.")
    return path


def stream_of(stream):
    """Where output lines go: a file object or None."""
    if stream is None or hasattr(stream, "write"):
        return stream
    if isinstance(stream, str) and stream in ("stdout", "stderr"):
        return getattr(sys, stream)
    if isinstance(stream, str):
        raise LaunchError(f"stream must be 'stdout', 'stderr', a file object or None; received stream={stream!r}.")
    wrong_kind("stream", stream, "'stdout', 'stderr', a file object or None")


def flag(value, name):
    """`value` if it is a bool."""
    if not isinstance(value, bool):
        wrong_kind(name, value, "True or False")
    return value


def wrong_kind(name, value, accepted):
    """Raise ArgumentTypeError naming the argument, the value and its type, and what is accepted."""
    raise ArgumentTypeError(
        f"launch: {name} must be {accepted}; received {name}={shown(value)} ({type(value).__name__})."
    )
