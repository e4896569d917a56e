"""A gather's splits: its output's, and its indices' where XLA partitions the gather along a dimension.

XLA's SPMD partitioner splits a gather along an operand dimension whose
start index is an iota over a dimension of the indices (a parallel
dimension, `hlo_sharding_util::GetGatherParallelBatchDims`): indexing
`maps[b, y, x, arange(channels)]` (keras-hub's SAM 3 ROI align) reads each
device's own channels, so the indices are split over the channels as the
maps are. `iota_dim` follows an index back through what keeps it an iota
(broadcasts, reshapes that add or drop ones, an offset, a type conversion,
jax's wrap of negative indices: `select_n(i < 0, i, i + n)`) to an `iota`.
"""

_KEEPS = frozenset(("convert_element_type", "add", "sub", "select_n"))
_VIEWS = frozenset(("reshape", "squeeze", "expand_dims"))  # those adding or dropping dimensions of one: `_moved`


def gather_output_split(dimension_numbers, operand, shape, rank):
    """A gather's output split (of `rank` dimensions) from its `operand`'s (of `shape`): a table's split survives
    a lookup on its other dimensions (a position table's hidden size), and a batching dimension's (jax's
    `take_along_axis`: each device reads its own heads) splits the output's dimension of the indices' batching
    dimension it pairs with (XLA partitions the gather along it)."""
    batching = list(getattr(dimension_numbers, "operand_batching_dims", ()))
    kept = [d for d in range(len(shape)) if d not in dimension_numbers.collapsed_slice_dims and d not in batching]
    out = {a: dimension_numbers.offset_dims[kept.index(d)] for a, d in operand.items() if d in kept}
    of_indices = [p for p in range(rank) if p not in dimension_numbers.offset_dims]  # the indices' dimensions
    for a, d in operand.items():
        if d in batching:
            out[a] = of_indices[dimension_numbers.start_indices_batching_dims[batching.index(d)]]
    return out


def gather_index_splits(f, dimension_numbers, operand, operand_split, indices):
    """{axis: dimension} of gather `indices` (a value of flat program `f`) where `operand`'s split dimension has an
    iota over one of theirs, of its length, for its start index."""
    producers = {o: i for i, (_, _, outs) in enumerate(f.eqns) for o in outs}
    starts = list(dimension_numbers.start_index_map)
    batching = list(getattr(dimension_numbers, "operand_batching_dims", ()))
    out = {}
    for axis, d in operand_split.items():
        if d in batching:  # an explicit batching dimension: the indices' paired one, split alike
            out[axis] = dimension_numbers.start_indices_batching_dims[batching.index(d)]
            continue
        if d not in starts:
            continue
        component = _component(f, producers, indices, starts.index(d))
        j = None if component is None else iota_dim(f, producers, component)
        if j is not None and j < len(f.shape[indices]) - 1 and f.shape[indices][j] == f.shape[operand][d]:
            out[axis] = j
    return out


def index_views(f, i, indices, split):
    """[(value, split)]: what gather `i`'s `indices` (of flat program `f`, split as `split` says) are a view of,
    back to a value another operation made (jax's `take_along_axis` adds a dimension of one to its index)."""
    producers = {o: k for k, (_, _, outs) in enumerate(f.eqns[:i]) for o in outs}
    out, x = [], indices
    while (k := producers.get(x)) is not None and f.eqns[k][0] in _VIEWS and len(f.eqns[k][1]) == 1:
        source = f.eqns[k][1][0]
        split = {a: _moved(f.shape[x], f.shape[source], d) for a, d in split.items()}
        if None in split.values():
            break
        out.append((source, split))
        x = source
    return out


def _component(f, producers, indices, k):
    """The value holding start index `k` of `indices` (the last dimension), where it is one of a concatenation."""
    i = producers.get(indices)
    if i is None or f.eqns[i][0] != "concatenate":
        return indices if f.shape[indices][-1] == 1 and k == 0 else None
    at = 0
    for x in f.eqns[i][1]:
        if at == k and f.shape[x][-1] == 1:
            return x
        at += f.shape[x][-1]
    return None


def iota_dim(f, producers, x, depth=0):
    """The dimension along which value `x` of flat program `f` is an iota (the same along the others), or None."""
    i = producers.get(x)
    if i is None or depth > 32:
        return None
    name, ins, _ = f.eqns[i]
    if name == "iota":
        return f.params[i]
    if name in _KEEPS:  # its operands of the output's shape but a select's predicate (a literal: not in `ins`)
        cases = ins[1:] if name == "select_n" and f.dtype[ins[0]] == "bool" else ins
        dims = {iota_dim(f, producers, y, depth + 1) for y in cases if f.shape[y] == f.shape[x]}
        return dims.pop() if len(dims) == 1 else None
    if len(ins) != 1:  # an operand given as a literal, or sizes given as values
        return None
    d = iota_dim(f, producers, ins[0], depth + 1)
    if d is None or d >= len(f.shape[ins[0]]):
        return None
    if name == "broadcast_in_dim":
        return f.params[i][d]
    if name in ("reshape", "squeeze"):
        return _moved(f.shape[ins[0]], f.shape[x], d)
    return None


def _moved(shape, new_shape, d):
    """Dimension `d` of `shape` in `new_shape`, where the two differ only by dimensions of one."""
    kept = [k for k, n in enumerate(shape) if n != 1]
    new_kept = [k for k, n in enumerate(new_shape) if n != 1]
    if [shape[k] for k in kept] != [new_shape[k] for k in new_kept] or d not in kept:
        return None
    return new_kept[kept.index(d)]
