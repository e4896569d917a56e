"""kdist.checks: argument checks and the bounded repr every error message uses."""

import numpy as np
import pytest

from kdist.checks import positive_int, shown
from kdist.errors import ArgumentError


class BrokenRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


def test_shown_is_bounded_for_deep_long_and_broken_values():
    deep = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "[[[[...]]]]"
    assert len(shown("x" * 10_000)) <= 80
    assert shown(BrokenRepr()).startswith("<BrokenRepr instance")


def test_numpy_integers_are_integers_and_bools_are_not():
    assert positive_int(np.int64(3), "n") == 3 and type(positive_int(np.int64(3), "n")) is int
    with pytest.raises(ArgumentError, match="n must be a positive integer; received True"):
        positive_int(True, "n")
