"""Bad input to meshes and presets: a kdist error naming the argument and value, and what would be accepted."""

import pytest

import kdist
from kdist.errors import ArgumentError, ArgumentTypeError, RuleError, SpecError
from kdist.meshes import ParallelDims, parse_spec
from tests.helpers import raises_clearly

CASES = [
    # call, error, words the message must contain
    (lambda: kdist.mesh(8), SpecError, "must be a string", "8", '"2x4"'),
    (lambda: kdist.mesh(""), SpecError, "Malformed mesh spec ''"),
    (lambda: kdist.mesh("2x4", axis_names="bm"), SpecError, "axis_names needs 2 distinct names", "'bm'"),
    (lambda: kdist.mesh("2x4", axis_names=(1, 2)), SpecError, "axis_names", "(1, 2)"),
    (lambda: kdist.mesh("2x4", axis_names=(None, "model")), SpecError, "axis_names"),
    (lambda: kdist.mesh("2x4", axis_names=("a", "a")), SpecError, "distinct"),
    (lambda: kdist.mesh("2x4", devices=[]), SpecError, "devices is empty"),
    (lambda: kdist.mesh("1x2", devices=["cpu:0", "cpu:0"]), SpecError, "'cpu:0' more than once"),
    (lambda: kdist.mesh("1x2", devices=[0, 1]), SpecError, "jax devices or names", "0"),
    (lambda: kdist.mesh("1x2", devices="cpu:0"), SpecError, "a list of jax devices"),
    (lambda: kdist.mesh("1x1", devices=["tpu:0"]), SpecError, "Unknown device 'tpu:0'", "cpu:7"),
    (lambda: kdist.mesh("200x200"), SpecError, "asks for 40000 devices", "Only 8 devices exist"),
    (lambda: kdist.mesh("2000000x1"), SpecError, "more than the", "typo"),
    (lambda: kdist.mesh("data=2,model=2,data=2"), SpecError, "names axis 'data' twice"),
    (lambda: kdist.mesh("data=-2,model=4"), SpecError, "sizes must be positive"),
    (lambda: kdist.mesh("2x4x1x1"), SpecError, "Malformed"),
    (lambda: kdist.preset("2x4", rules=42), ArgumentTypeError, "rules must be", "int"),
    (lambda: kdist.preset("2x4", rules="nonexistent"), RuleError, "Unknown rule set 'nonexistent'"),
    (lambda: kdist.preset("2x4", rules={"[bad": (None, "model")}), RuleError, "'[bad' is not a valid regex"),
    (lambda: kdist.preset("2x4", rules=[("ok", "model")]), RuleError, "layouts must be one layout", "'model'"),
    (lambda: kdist.preset("2x4", model=object()), ArgumentError, 'kdist.preset("auto"'),
    (lambda: kdist.preset("auto"), SpecError, 'preset("auto", model=model, batch_size=64)'),
    (lambda: kdist.fake_devices(0), ArgumentError, "positive integer", "0"),
    (lambda: kdist.fake_devices(40000), ArgumentError, "40000", "4096"),
    (lambda: kdist.ShardedDistribution("2x4"), ArgumentTypeError, "keras.distribution.DeviceMesh", "str"),
    (lambda: ParallelDims("x", (("data", 0),)), SpecError, "positive integers"),
    (lambda: ParallelDims("x", (("tensor", 2),)), SpecError, "'tensor'", "data, fsdp, model, expert"),
    (lambda: ParallelDims("x", ("data",)), SpecError, "(role, size) pairs", "axes=('data',)"),
    (lambda: ParallelDims("x", None), SpecError, "(role, size) pairs", "axes=None"),
    (lambda: parse_spec(None), SpecError, "must be a string"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case):
    call, error, *words = case
    raises_clearly(call, error, *words)
