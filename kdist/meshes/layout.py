"""Pure layout algebra: which mesh axes split each dimension, divisibility, shard shapes and bytes, spec text.

A *spec* is one entry per dimension of a variable: None (replicated), a
mesh axis name, or a tuple of names (split over several axes, major first),
as in `jax.sharding.PartitionSpec` and `keras.distribution.TensorLayout`.
A rule *layout* may also hold "..." (as many None as the rank needs).
Sizes are `{mesh axis name: size}`. Nothing here touches devices or Keras.
"""

import math

from kdist.errors import RuleError

ELLIPSIS = "..."


def dim_axes(entry):
    """The mesh axis names one dimension is split over: () for None, ("model",) for "model"."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def normalize_entry(entry):
    """One dimension's axes in canonical form: None, a name, or a tuple of two or more names."""
    if isinstance(entry, (tuple, list)):
        return None if not entry else (entry[0] if len(entry) == 1 else tuple(entry))
    return entry


def full_spec(spec, rank, path=None):
    """`spec` normalised and padded with None to `rank` entries. Raises RuleError when it is longer."""
    spec = tuple(normalize_entry(a) for a in spec)
    if len(spec) > rank:
        what = f"Variable {path!r} of rank {rank}" if path else f"A variable of rank {rank}"
        raise RuleError(f"{what} has layout {spec} with {len(spec)} axes; give at most {rank}.")
    return spec + (None,) * (rank - len(spec))


def expand_layout(layout, rank):
    """A rule layout with its "..." expanded (or padded with None) to `rank` entries."""
    if ELLIPSIS not in layout:
        return tuple(layout) + (None,) * (rank - len(layout))
    i = layout.index(ELLIPSIS)
    return tuple(layout[:i]) + (None,) * (rank - (len(layout) - 1)) + tuple(layout[i + 1 :])


def fits_rank(layout, rank):
    """Whether a rule layout can apply to a variable of `rank` dimensions."""
    return len(layout) - (ELLIPSIS in layout) <= rank


def splits(spec, sizes):
    """Into how many pieces each dimension is split."""
    return tuple(math.prod(sizes[a] for a in dim_axes(entry)) for entry in spec)


def split_by(spec, axis):
    """For each dimension: whether mesh axis `axis` splits it."""
    return [axis in dim_axes(entry) for entry in spec]


def unknown_axes(spec, sizes):
    """Axis names in `spec` that are not mesh axes, in order of appearance."""
    return list(dict.fromkeys(a for entry in spec for a in dim_axes(entry) if a not in sizes))


def indivisible(shape, spec, sizes):
    """The dimensions whose size does not divide by the mesh axes splitting them."""
    return [i for i, k in enumerate(splits(spec, sizes)) if shape[i] % k]


def check_layout(path, shape, spec, sizes):
    """Raise RuleError when `spec` names an axis the mesh lacks or splits a dimension unevenly."""
    unknown = unknown_axes(spec, sizes)
    if unknown:
        raise RuleError(
            f"Variable {path!r} has layout {spec} naming mesh axis {unknown[0]!r}, which is not in the mesh {sizes}."
        )
    for i in indivisible(shape, spec, sizes):
        names = dim_axes(spec[i])
        k = math.prod(sizes[a] for a in names)
        raise RuleError(
            f"Variable {path!r} of shape {tuple(shape)} has layout {spec}: dimension {i} ({shape[i]}) does not "
            "divide by "
            f"{'x'.join(names)}={k}, so jax cannot place it. Replicate that dimension (None) or shard one that divides."
        )


def shard_shape(shape, spec, sizes):
    """The shape of the piece each device holds (dimensions must divide)."""
    return tuple(d // k for d, k in zip(shape, splits(spec, sizes)))


def shard_bytes(shape, spec, sizes, itemsize):
    """Bytes each device holds of a variable laid out as `spec` (every device holds one shard)."""
    return math.prod(shard_shape(shape, spec, sizes)) * itemsize


def replication(spec, sizes):
    """How many devices hold each piece: the mesh size over the number of pieces."""
    return math.prod(sizes.values()) // math.prod(splits(spec, sizes))


def is_sharded(spec):
    return any(entry is not None for entry in spec)


def spec_text(spec, replicated="·"):
    """ "(·, model)" for terminals; `replicated="None"` gives "(None, model)" for files."""
    return "(" + ", ".join(replicated if a is None else "+".join(dim_axes(a)) for a in spec) + ")"


def spec_json(spec):
    """A spec as JSON-ready lists: [None, "model", ["data", "fsdp"]]."""
    return [list(a) if isinstance(a, tuple) else a for a in spec]
