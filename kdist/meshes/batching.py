"""How a batch of any size is laid out over a mesh's batch axes: split over the axes that divide it, whole on the rest.

jax can only split a dimension evenly. A batch whose size the batch shards do
not divide (one prompt on 8 data-parallel devices, the short last batch of a
dataset) is therefore split over the largest set of batch axes whose sizes
divide it, and replicated over the others: each device of those axes computes
the same examples. The result is exact (the same examples, the same math as
one device: no padding, so losses, metrics and batch statistics are
unchanged); the cost is that the replicated axes repeat that batch's compute
and each of their devices holds its activations. Pure: sizes in, axis names out.
"""

import itertools
import math


def batch_split(size, axis_sizes):
    """The batch axes (mesh order) to split a batch of `size` examples over; () means replicated.

    `axis_sizes` maps the mesh's batch axes to their sizes, in mesh order. Of
    the sets of axes whose sizes multiply to a divisor of `size`, the one
    with the most shards wins (the earlier axes on a tie).

    >>> batch_split(64, {"data": 2, "fsdp": 4})
    ('data', 'fsdp')
    >>> batch_split(6, {"data": 2, "fsdp": 4})
    ('data',)
    >>> batch_split(3, {"fsdp": 8})
    ()
    """
    names = tuple(axis_sizes)
    best = ()
    for count in range(len(names), 0, -1):
        for subset in itertools.combinations(names, count):
            shards = math.prod(axis_sizes[a] for a in subset)
            if size % shards == 0 and shards > math.prod(axis_sizes[a] for a in best):
                best = subset
    return best
