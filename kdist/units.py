"""Units: reading sizes ("80GB", "80GiB", "8e10"), writing bytes and seconds, and dtype sizes."""

import functools
import math
import re

import jax.numpy as jnp
import numpy as np

from kdist.checks import shown
from kdist.errors import SizeError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)(/s)?")
SIZE_FORMS = (
    'a number of bytes (80000000000, "8e10"), or a number with a unit: decimal '
    '"KB", "MB", "GB", "TB" (powers of 1000) or binary "KiB", "MiB", "GiB", "TiB" '
    '(powers of 1024), e.g. "80GB" or "80GiB"'
)


def parse_size(value, name="size"):
    """Bytes in `value`: an int, a float, or a string such as "80GB", "80GiB", "8e10".

    Units are case-insensitive; "GB" is 10**9 bytes, "GiB" 2**30. A trailing
    "/s" is accepted, so bandwidths read the same way ("100GB/s").

    Example:

    >>> parse_size("80GB"), parse_size("80GiB"), parse_size("8e10"), parse_size(1024)
    (80000000000, 85899345920, 80000000000, 1024)

    Args:
        value: the size.
        name: what the size is for, named in errors (e.g. "memory_per_device").

    Raises:
        SizeError: `value` is not a size, or is not positive.
    """
    if isinstance(value, bool):
        raise SizeError(f"{name}={shown(value)} is not a size. Give {SIZE_FORMS}.")
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip().lower().replace(" ", ""))
        if match is None or match.group(3) not in _UNITS:
            raise SizeError(f"{name}={shown(value)} is not a size. Give {SIZE_FORMS}.")
        mantissa, exponent, unit, _ = match.groups()
        # float() of the text, never 10 ** int(exponent): "1e999999999" is inf, not an hour of arithmetic.
        number = float(f"{mantissa}e{exponent or 0}") * _UNITS[unit]
    else:
        raise SizeError(
            f"{name} must be a number or a string such as '80GB'; received {type(value).__name__} {shown(value)}."
        )
    if not math.isfinite(number) or number <= 0:
        raise SizeError(f"{name}={shown(value)} must be a positive, finite size. Give {SIZE_FORMS}.")
    if number < 1:
        raise SizeError(f"{name}={shown(value)} is {number:g} bytes, less than one byte. Give {SIZE_FORMS}.")
    return int(round(number))


def human_bytes(n):
    """Three significant digits: "800 B", "1.95 KiB", "153 KiB", "1002 MiB"."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            digits = 0 if unit == "B" or abs(n) >= 100 else (1 if abs(n) >= 10 else 2)
            return f"{n:.{digits}f} {unit}"
        n /= 1024


def short_bytes(n):
    """A compact size for narrow columns: "512B", "1.5K", "3.2G"."""
    n = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.3g}{unit}"
        n /= 1024


def human_seconds(seconds):
    """ "1.23 s" from a second up, "4.56 ms" below."""
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


HALF_FLOATS = frozenset(("bfloat16", "float16"))  # 16-bit floating-point dtype names


@functools.lru_cache(maxsize=None)
def itemsize(dtype):
    """Bytes per element of `dtype` (a name, numpy or jax dtype; bfloat16 included)."""
    return _np_dtype(dtype).itemsize


@functools.lru_cache(maxsize=None)
def is_float(dtype):
    """True for floating-point dtypes (bfloat16 and float8 included)."""
    dtype = _np_dtype(dtype)
    return dtype.kind == "f" or "float" in dtype.name


def dtype_name(dtype):
    """The canonical name of a dtype: "float32", "bfloat16", "int32"."""
    return _np_dtype(dtype).name


def _np_dtype(dtype):
    return jnp.dtype(dtype)  # jax's knows bfloat16 and the float8 types
