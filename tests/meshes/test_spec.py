import pytest

from kdist import ArgumentTypeError, ParallelDims, SpecError


@pytest.mark.parametrize(
    "spec, axes",
    [
        ("8x1", (("data", 8), ("model", 1))),
        ("2x4", (("data", 2), ("model", 4))),
        ("1x8", (("data", 1), ("model", 8))),
        ("dp", (("data", 8),)),
        ("tp", (("model", 8),)),
        ("fsdp", (("fsdp", 8),)),
        ("data=2,model=4", (("data", 2), ("model", 4))),
        ("data=-1,model=2", (("data", 4), ("model", 2))),
        ("model=2,data=-1", (("model", 2), ("data", 4))),
        ("2x2x2", (("data", 2), ("fsdp", 2), ("model", 2))),
        ("data=2,expert=2,model=2", (("data", 2), ("expert", 2), ("model", 2))),
        (" 2X4 ", (("data", 2), ("model", 4))),
    ],
)
def test_parse(spec, axes):
    dims = ParallelDims.parse(spec, 8)
    assert dims.axes == axes
    assert dims.num_devices == 8


@pytest.mark.parametrize(
    "spec, message",
    [
        ("2x", "Malformed mesh spec '2x'"),
        ("axb", "Malformed mesh spec 'axb'"),
        ("2x4x", "Malformed mesh spec '2x4x'"),
        ("", "Malformed mesh spec ''"),
        ("0x8", "sizes must be positive"),
        ("2x3", "asks for 6 devices, but the mesh has 8"),
        ("16x1", "Only 8 devices exist"),
        ("data=-1,model=-1", "at most one axis may be -1"),
        ("data=-1,model=3", "do not divide|does not divide"),
        ("data=2,tensor=4", "unknown axis 'tensor'"),
        ("data=2,data=4", "names axis 'data' twice"),
    ],
)
def test_bad_specs_name_the_spec(spec, message):
    with pytest.raises(SpecError, match=message):
        ParallelDims.parse(spec, 8)


def test_bad_spec_lists_allowed_forms():
    with pytest.raises(SpecError, match='"dp", "tp", "fsdp"'):
        ParallelDims.parse("axb", 8)


def test_auto_needs_the_planner_inputs():
    with pytest.raises(SpecError, match="planner, which needs the model and the batch size"):
        ParallelDims.parse("auto", 8)


def test_non_string_spec():
    with pytest.raises(SpecError, match="must be a string"):
        ParallelDims.parse(8, 8)


def test_from_sizes_keeps_the_order_of_the_roles():
    dims = ParallelDims.from_sizes({"model": 4, "data": 2})
    assert dims.spec == "model=4,data=2" and dims.shape == (4, 2)


@pytest.mark.parametrize(
    "sizes, error, message",
    [
        (None, ArgumentTypeError, "sizes must be a mapping of mesh role to size.*received None"),
        ([("data", 2)], ArgumentTypeError, r"received \[\('data', 2\)\]"),
        ({}, SpecError, "names no mesh axis"),
        ({"data": 0}, SpecError, "received 0 for 'data'"),
        ({"tensor": 2}, SpecError, "role 'tensor' is not one of"),
    ],
)
def test_from_sizes_rejects_what_is_not_role_sizes(sizes, error, message):
    with pytest.raises(error, match=message):
        ParallelDims.from_sizes(sizes)
