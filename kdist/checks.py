"""Argument checks shared by every public entry point: one place, one error style.

Each check returns the value normalised (a Python int, a float) or raises a
kdist error that names the argument, the value received and what is accepted.
"""

import numbers
import reprlib

from kdist.errors import ArgumentError

# No machine has more accelerators than this; larger counts are typos and are
# refused before any work (planning 1e10 devices would enumerate for hours).
MAX_DEVICES = 1 << 20
# XLA's CPU client starts one thread pool per device: tens of thousands crash it.
MAX_FAKE_DEVICES = 4096
# A global batch of more examples than this is a typo (byte counts of its buffers would overflow 64 bits).
MAX_BATCH = 1 << 40
# A collective step slower than this is a unit slip (milliseconds given as seconds); step times would overflow.
MAX_LATENCY_SECONDS = 60.0


_SHOWN = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 80, 80


def shown(value):
    """`repr(value)` cut to a readable length, safe for any nesting depth and failing `__repr__`s (for errors)."""
    return _SHOWN.repr(value)


def missing_attributes(needed):
    """ "where.name" for each name in `needed` ({where: (object, names)}) that its object lacks."""
    return [f"{where}.{name}" for where, (obj, names) in needed.items() for name in names if not hasattr(obj, name)]


def is_int(value):
    """True for Python and numpy integers, False for bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(value, name, *, maximum=None, error=ArgumentError):
    """`value` as an int >= 1 (and <= `maximum`), else `error` naming `name`."""
    if not is_int(value) or value < 1:
        raise error(f"{name} must be a positive integer; received {shown(value)}.")
    if maximum is not None and value > maximum:
        raise error(f"{name}={value} is more than the {maximum} kdist accepts; check for a typo.")
    return int(value)


def non_negative_int(value, name, *, error=ArgumentError):
    """`value` as an int >= 0, else `error` naming `name`."""
    if not is_int(value) or value < 0:
        raise error(f"{name} must be an integer >= 0; received {name}={shown(value)}.")
    return int(value)


def positive_number(value, name, *, unit="", allow_none=False, error=ArgumentError):
    """`value` as a float > 0 (finite), or None when `allow_none`."""
    if value is None and allow_none:
        return None
    if not is_real(value) or not 0 < value < float("inf"):
        accepted = f"a positive number{f' of {unit}' if unit else ''}" + (" or None" if allow_none else "")
        raise error(f"{name} must be {accepted}; received {name}={shown(value)}.")
    return float(value)


def non_negative_number(value, name, *, unit="", maximum=None, error=ArgumentError):
    """`value` as a float >= 0 (finite, and <= `maximum`)."""
    if not is_real(value) or not 0 <= value < float("inf"):
        raise error(f"{name} must be a number >= 0{f' of {unit}' if unit else ''}; received {name}={shown(value)}.")
    if maximum is not None and value > maximum:
        unit = f" {unit}" if unit else ""
        raise error(f"{name}={value} is more than the {maximum:g}{unit} kdist accepts; check the unit.")
    return float(value)


def one_of(value, name, choices, *, error=ArgumentError):
    """`value` if it is one of `choices`, else `error` listing them."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise error(f"{name} must be one of {listed}; received {name}={shown(value)}.")
    return value


def is_real(value):
    """Whether `value` is a real number (a numpy scalar too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
