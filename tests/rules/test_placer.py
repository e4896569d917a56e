"""The placer's fsdp axis: the largest free dimension that divides, or the dimension a rule names (`fsdp_dim`);
none on a depthwise convolution's kernel."""

import pytest

from kdist import RuleError
from kdist.meshes import ParallelDims
from kdist.rules import Placer, Rule, RuleSet, placer_for

FSDP_MODEL = ParallelDims.parse("fsdp=2,model=4", 8)
EXPERTS = (8, 64, 128)  # (experts, hidden, inner)


def _place(rule, shape=EXPERTS, dims=FSDP_MODEL):
    return Placer(RuleSet([rule]), dims).place("experts/kernel", shape)


def test_fsdp_takes_the_largest_free_dimension_by_default():
    assert _place(Rule(r".*kernel", ("model", None, None))).axes == ("model", None, "fsdp")


def test_fsdp_takes_the_dimension_the_rule_names():
    assert _place(Rule(r".*kernel", ("model", None, None), fsdp_dim=1)).axes == ("model", "fsdp", None)
    assert _place(Rule(r".*kernel", ("model", None, None), fsdp_dim=-2)).axes == ("model", "fsdp", None)


def test_fsdp_dim_taken_or_indivisible_falls_back_to_the_largest_free_dimension():
    taken = Rule(r".*kernel", ("model", None, None), fsdp_dim=0)  # the model axis has dimension 0
    assert _place(taken).axes == ("model", None, "fsdp")
    indivisible = Rule(r".*kernel", ("model", None, None), fsdp_dim=1)
    assert _place(indivisible, shape=(8, 63, 128)).axes == ("model", None, "fsdp")


def test_fsdp_dim_out_of_range_names_the_rule_and_the_variable():
    with pytest.raises(RuleError, match=r"fsdp_dim 3, out of range for variable 'experts/kernel' of shape"):
        _place(Rule(r".*kernel", ("...", "model"), fsdp_dim=3))


@pytest.mark.parametrize("bad", ["1", 1.0, True])
def test_fsdp_dim_must_be_an_int(bad):
    with pytest.raises(RuleError, match=r"fsdp_dim must be a dimension index .* received"):
        Rule(r".*kernel", ("...", "model"), fsdp_dim=bad)


@pytest.mark.parametrize(
    "path, shape, axes",
    [
        ("layer/mixtral_sparse_moe_block/experts/expert_feedforward_gate_dense", (4, 64, 128), (None, "fsdp", None)),
        ("layer/mixtral_sparse_moe_block/experts/expert_feedforward_output_dense", (4, 128, 64), (None, None, "fsdp")),
        ("layer/sparse_moe_block/experts/gate_up_proj", (4, 64, 256), (None, "fsdp", None)),
        ("layer/self_attention/query/kernel", (64, 8, 16), ("fsdp", None, None)),  # no fsdp_dim: the largest
    ],
)
def test_expert_kernels_take_fsdp_on_their_hidden_size_on_an_fsdp_mesh(path, shape, axes):
    # A preset without a model axis applies no rules; the family rules still say where fsdp goes on experts.
    placement = placer_for(None, ParallelDims.parse("fsdp=8", 8)).place(path, shape)
    assert placement.axes == axes and placement.source == "fsdp"


def test_a_hint_that_does_not_fit_the_variable_is_passed_over():
    # A rank-1 variable whose path an expert rule matches (fsdp_dim 2): the largest dimension, no error.
    placement = placer_for(None, ParallelDims.parse("fsdp=8", 8)).place("m/sparse_moe_block/experts/down_proj", (8192,))
    assert placement.axes == ("fsdp",)


def test_expert_kernels_take_fsdp_on_their_hidden_size_beside_a_model_axis():
    placer = placer_for(None, FSDP_MODEL)
    up = placer.place("mixtral_sparse_moe_block/experts/expert_feedforward_gate_dense", (4, 64, 128))
    down = placer.place("mixtral_sparse_moe_block/experts/expert_feedforward_output_dense", (4, 128, 64))
    assert up.axes == ("model", "fsdp", None) and down.axes == ("model", None, "fsdp")


@pytest.mark.parametrize(
    "path, shape",
    [
        ("block_12_depthwise/kernel", (3, 3, 576, 1)),  # DepthwiseConv2D
        ("stage_0_block_0_depthwise_conv/kernel", (7, 7, 1, 96)),  # Conv2D(groups=96), ConvNeXt's
        ("sep/depthwise_kernel", (5, 5, 512, 1)),  # SeparableConv2D
    ],
)
def test_a_depthwise_kernel_stays_whole_over_fsdp_and_says_why(path, shape):
    # Split on its channels, XLA:GPU reshards the activations instead (docs/plan.md, "Depthwise kernels under fsdp").
    placement = placer_for(None, ParallelDims.parse("data=2,fsdp=4", 8)).place(path, shape)
    assert placement.axes == (None,) * 4
    assert "depthwise convolution's kernel" in placement.reason and "replicated over fsdp" in placement.reason


def test_an_ordinary_convolution_kernel_still_takes_fsdp():
    placer = placer_for(None, ParallelDims.parse("fsdp=8", 8))
    assert placer.place("conv/kernel", (3, 3, 64, 128)).axes == (None, None, None, "fsdp")
    assert placer.place("einsum/kernel", (512, 1, 64)).axes == ("fsdp", None, None)  # rank 3: one key/value head


def test_a_depthwise_kernel_keeps_its_model_split_and_a_named_fsdp_dim():
    placer = placer_for(None, ParallelDims.parse("fsdp=2,model=4", 8))
    assert placer.place("dw/kernel", (3, 3, 576, 1)).axes == (None, None, "model", None)
    named = Rule(r".*kernel", (), fsdp_dim=2)  # a rule that names the dimension is obeyed
    assert _place(named, shape=(3, 3, 576, 1), dims=ParallelDims.parse("fsdp=8", 8)).axes == (None, None, "fsdp", None)
