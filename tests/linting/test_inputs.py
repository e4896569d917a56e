"""Bad input to kdist.lint: a kdist error naming the argument and value."""

import keras
import pytest

import kdist
from kdist.errors import ArgumentError, ArgumentTypeError, ModelError, SpecError
from kdist.models import mnist_mlp
from tests.helpers import raises_clearly

MODEL = kdist.abstract_model(mnist_mlp)
CASES = [
    (lambda: kdist.lint({"a": 1}, MODEL, "2x4"), ArgumentTypeError, "received dict", "LayoutMap"),
    (lambda: kdist.lint(42, MODEL, "2x4"), ArgumentTypeError, "received int"),
    (lambda: kdist.lint("auto", MODEL), ModelError, "needs a mesh"),
    (lambda: kdist.lint("auto", MODEL, "2x3x"), SpecError, "'2x3x'"),
    (lambda: kdist.lint("auto", MODEL, 8), SpecError, "spec string such as '2x4'"),
    (lambda: kdist.lint("auto", 42, "2x4"), ArgumentTypeError, "needs a Keras model", "int"),
    (lambda: kdist.lint("auto", [("only-a-path",)], "2x4"), ArgumentTypeError, "(path, shape)"),
    (lambda: kdist.lint("auto", [], "2x4"), ModelError, "found no variables"),
    (lambda: kdist.lint("auto", keras.Sequential([keras.layers.Dense(2)]), "2x4"), ModelError, "build the model"),
    (lambda: kdist.lint("auto", MODEL, "2x4", size_threshold=-1), ArgumentError, "size_threshold", "-1"),
    (lambda: kdist.lint("auto", MODEL, "2x4", tolerance="lots"), ArgumentError, "tolerance", "lots"),
    (lambda: kdist.lint("auto", MODEL, "2x4", top=1.5), ArgumentError, "top", "1.5"),
    (lambda: kdist.lint("no-such-set", MODEL, "2x4"), kdist.RuleError, "Unknown rule set 'no-such-set'"),
    (lambda: kdist.lint("auto", [("w", (-4, 8))], "2x4"), ArgumentError, "'w'", "sizes from 0", "(-4, 8)"),
    (lambda: kdist.lint("auto", [("w", (4.5, 8))], "2x4"), ArgumentError, "'w'", "integer sizes", "4.5"),
    (lambda: kdist.lint("auto", [("w", (10**30,))], "2x4"), ArgumentError, "'w'", "sizes from 0 to"),
    (lambda: kdist.lint("auto", [("w", "48")], "2x4"), ArgumentTypeError, "'w'", "tuple of sizes", "'48'"),
    (lambda: kdist.lint("auto", [("w", (4,), "float77")], "2x4"), ArgumentError, "'w'", "dtype", "'float77'"),
    (lambda: kdist.lint("auto", [(3, (4,))], "2x4"), ArgumentTypeError, "path must be a non-empty string", "3"),
    (lambda: kdist.lint("auto", [("w", (4,)), 5], "2x4"), ArgumentTypeError, "received int 5"),
    (lambda: kdist.lint(MODEL, "dp"), ArgumentTypeError, "as rules; received", "lint(rules, model_or_variables, mesh)"),
    (lambda: kdist.lint("auto", "dp", "2x4"), ArgumentTypeError, "model_or_variables; received str 'dp'"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case):
    call, error, *words = case
    raises_clearly(call, error, *words)
