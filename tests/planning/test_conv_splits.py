"""The convolution rules of the model-axis propagation: the input a convolution gathers, its partial sums, and the
split of its output."""

from kdist.planning.conv_splits import gathered_inputs, output_split, partial_sum

NUMBERS = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))  # NHWC images, HWIO kernels, NHWC outputs


def test_a_convolution_gathers_and_sums_as_its_operands_splits_say():
    images, kernel, depthwise = (4, 8, 8, 16), (3, 3, 16, 32), (3, 3, 1, 16)
    assert gathered_inputs(NUMBERS, [{"model": 3}, {"model": 3}], [images, kernel]) == [{"model"}, set()]
    assert gathered_inputs(NUMBERS, [{"model": 3}, {"model": 2}], [images, kernel]) == [set(), set()]
    assert partial_sum(NUMBERS, [{"model": 3}, {"model": 2}], [images, kernel])  # row-parallel: a partial sum
    assert partial_sum(NUMBERS, [{}, {"model": 2}], [images, kernel])  # each device reads its slice
    assert not partial_sum(NUMBERS, [{}, {"model": 3}], [images, kernel])
    assert gathered_inputs(NUMBERS, [{"model": 3}, {"model": 3}], [images, depthwise]) == [set(), set()]
    assert not partial_sum(NUMBERS, [{"model": 3}, {"model": 3}], [images, depthwise])


def test_a_kernels_split_output_features_split_the_output_and_the_inputs_batch_split_stays():
    assert output_split(NUMBERS, [{"fsdp": 0}, {"model": 3}]) == {"model": 3, "fsdp": 0}
    assert output_split(NUMBERS, [{"model": 3}, {"model": 2}]) == {}  # contracted channels: a partial sum, whole
