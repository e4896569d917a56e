"""Reading JSON and TOML that a user or another process wrote: bounded, regular files only.

Rule files, `TF_CONFIG` and checkpoint metadata are read here and nowhere
else, so that no input can hang kdist (a FIFO or a device instead of a file),
exhaust memory (a multi-gigabyte file) or end in a raw `RecursionError`
(thousands of nested brackets). Each function raises the `error` class its
caller passes, with `what` naming the input.
"""

import json
import os
import stat
import tomllib

MAX_BYTES = 256 * 2**20
MAX_DEPTH = 64


def read_text(path, what, error):
    """The UTF-8 text of the regular file `path` (at most `MAX_BYTES`)."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would wait for a writer; we refuse it after fstat instead.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"Cannot read {what}: {e.strerror or e}.") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise error(f"{_capital(what)} is not a regular file (a FIFO, a device or a directory); give a file's path.")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_BYTES:
            raise error(f"{_capital(what)} is {info.st_size} bytes, more than the {MAX_BYTES} kdist reads.")
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as e:
            raise error(f"Cannot read {what}: {e.strerror or e}.") from None
    if len(data) > MAX_BYTES:
        raise error(f"{_capital(what)} is more than the {MAX_BYTES} bytes kdist reads; check the path.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{_capital(what)} is not UTF-8 text: {e}.") from None


def parse_json(text, what, error):
    """`text` parsed as JSON, refusing nesting deeper than `MAX_DEPTH`."""
    _check_depth(text, what, error)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise error(f"{_capital(what)} is not valid JSON: {e}.") from None


def parse_toml(text, what, error):
    """`text` parsed as TOML, refusing nesting deeper than `MAX_DEPTH`."""
    _check_depth(text, what, error)
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # tomllib.TOMLDecodeError is a ValueError
        raise error(f"{_capital(what)} is not valid TOML: {e}.") from None


def read_json(path, what, error):
    """The JSON in the regular file `path`."""
    return parse_json(read_text(path, what, error), what, error)


def _check_depth(text, what, error):
    """Refuse deep nesting before the recursive parsers see it (brackets inside strings count: a bound, not a parse)."""
    if not isinstance(text, str):
        raise error(f"{_capital(what)} must be text; received {type(text).__name__}.")
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise error(f"{_capital(what)} nests {deepest} levels of brackets; kdist reads at most {MAX_DEPTH}.")


def _capital(what):
    return what[:1].upper() + what[1:]
