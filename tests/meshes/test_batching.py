"""batch_split: a batch is split over the batch axes whose sizes divide it, the most shards first."""

import pytest

from kdist.meshes.batching import batch_split


@pytest.mark.parametrize(
    "size, axes, expected",
    [
        (64, {"data": 2, "fsdp": 4}, ("data", "fsdp")),
        (6, {"data": 2, "fsdp": 4}, ("data",)),
        (4, {"data": 2, "fsdp": 4}, ("fsdp",)),
        (1, {"data": 2, "fsdp": 4}, ()),
        (3, {"fsdp": 8}, ()),
        (12, {"data": 4, "fsdp": 2}, ("data",)),  # 4 shards beat 2; 8 do not divide 12
        (2, {"data": 2, "fsdp": 2}, ("data",)),  # a tie: the earlier axis
        (5, {}, ()),
    ],
)
def test_the_largest_dividing_set_of_batch_axes_splits_the_batch(size, axes, expected):
    assert batch_split(size, axes) == expected
