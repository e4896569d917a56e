"""The `>>>` examples in kdist's docstrings run and print what they say (doctest), on the suite's 8 fake devices."""

import doctest
import importlib
import pathlib

import pytest

import kdist

PACKAGE = pathlib.Path(kdist.__file__).parent
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if ">>> " in path.read_text()
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, globs={"kdist": kdist, **vars(module)}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (see the output above)"
