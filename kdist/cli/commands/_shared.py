"""Argument types and helpers shared by the commands."""

import argparse

from kdist.checks import MAX_FAKE_DEVICES
from kdist.errors import SpecError
from kdist.meshes.spec import parse_spec

# A mesh with a -1 axis ("dp", "data=-1,model=2") absorbs this many fake devices by default.
ABSORB_DEVICES = 8


def positive(text):
    """argparse type: an integer >= 1."""
    return _integer(text, 1)


def non_negative(text):
    """argparse type: an integer >= 0."""
    return _integer(text, 0)


def sequence_lengths(text):
    """argparse type: a length >= 1, or lengths by input name: "enc=512,dec=128" ("masks=0x64x64": one per dimension).

    >>> sequence_lengths("512"), sequence_lengths("encoder_token_ids=512, masks=0x64x64")
    (512, {'encoder_token_ids': 512, 'masks': (0, 64, 64)})
    """
    if "=" not in text:
        return positive(text)
    lengths = {}
    for item in text.split(","):
        name, _, value = (part.strip() for part in item.partition("="))
        dims = value.split("x")
        if not name or not all(d.isdigit() for d in dims):
            raise argparse.ArgumentTypeError(
                f"expected NAME=LENGTH pairs separated by commas (LENGTH an integer >= 0, or AxB for one per "
                f"dimension), got {item.strip()!r}"
            )
        lengths[name] = int(dims[0]) if len(dims) == 1 else tuple(int(d) for d in dims)
    return lengths


def seconds(text):
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def _integer(text, smallest):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < smallest:
        raise argparse.ArgumentTypeError(f"expected an integer >= {smallest}, got {value}")
    return value


def devices_for(spec):
    """Fake devices a mesh spec needs: its size, or a multiple of it (>= 8) when one axis is -1.

    >>> devices_for("2x4"), devices_for("4x8"), devices_for("data=-1,model=2"), devices_for("dp")
    (8, 32, 8, 8)
    """
    if spec.strip().lower() == "auto":
        return ABSORB_DEVICES
    needed = parse_spec(spec).devices_needed(ABSORB_DEVICES)
    if needed > MAX_FAKE_DEVICES:
        raise SpecError(
            f"Mesh {spec!r} needs {needed} devices; kdist makes at most {MAX_FAKE_DEVICES} fake CPU devices. "
            "Check the spec for a typo, or plan a mesh that large with `kdist plan` (it needs no devices)."
        )
    return needed
