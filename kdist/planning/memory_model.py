"""The memory of one training step on one device, term by term (docs/plan.md, "Memory per device").

Weights, gradients and optimizer state come from each variable's placement
(the placement engine's layouts, the inspector's numbers exactly);
activations from the residuals autodiff keeps; transient buffers and inputs
from the step's structure.
"""

import dataclasses
import math

import keras

from kdist.meshes.layout import shard_bytes, split_by
from kdist.planning.activations import TRACE_BATCH
from kdist.units import is_float, itemsize


@dataclasses.dataclass(frozen=True)
class PlacedVariable:
    """A representative variable laid out on one candidate mesh; `count` variables are laid out alike."""

    kind: str
    shape: tuple
    dtype: str
    spec: tuple
    shard_bytes: int
    count: int

    def bytes(self, itemsize_override=None):
        """Bytes on one device of one of these variables, in `itemsize_override` bytes per element for floats."""
        if itemsize_override is None or not is_float(self.dtype):
            return self.shard_bytes
        return self.shard_bytes // itemsize(self.dtype) * itemsize_override

    def split_over(self, axis):
        return any(split_by(self.spec, axis))


def placed_variables(facts, dims):
    """Every representative variable (weights, then optimizer state) laid out on mesh `dims`."""
    placer, sizes = facts.placer(dims), dims.axis_sizes
    rows, by_path = [], {}
    for v in facts.variables:
        spec = placer.place(v.path, v.shape).axes
        kind = "trainable" if getattr(v, "trainable", True) else "non_trainable"
        row = _row(kind, v, spec, sizes, facts.counts.get(v.path, 1))
        rows.append(row)
        by_path[v.path] = row
    for v in facts.optimizer_variables:
        reference = facts.slots.get(id(v))
        if reference is not None:
            spec, count = by_path[reference.path].spec, by_path[reference.path].count
        else:
            spec, count = placer.place(v.path, v.shape).axes, 1
        rows.append(_row("optimizer", v, spec, sizes, count))
    return rows


def _row(kind, variable, spec, sizes, count):
    shape = tuple(variable.shape)
    dtype = str(variable.dtype)
    return PlacedVariable(kind, shape, dtype, tuple(spec), shard_bytes(shape, spec, sizes, itemsize(dtype)), count)


def total_bytes(rows, itemsize_override=None):
    return int(sum(r.bytes(itemsize_override) * r.count for r in rows))


def memory_terms(facts, rows, axes, batch_size):
    """Per-device bytes of each term of the step's peak on mesh `axes` (role -> size)."""
    scale = itemsize(facts.dtype) if facts.dtype is not None else None
    trainable = [r for r in rows if r.kind == "trainable"]
    split = axes.get("data", 1) * axes.get("fsdp", 1)
    local_batch = -(-batch_size // split)
    return {
        "weights": total_bytes([r for r in rows if r.kind in ("trainable", "non_trainable")], scale),
        "gradients": total_bytes(trainable, scale),
        "optimizer": total_bytes([r for r in rows if r.kind == "optimizer"], scale),
        "activations": activation_bytes(facts, local_batch, sharded_dim_sizes(trainable, axes), axes),
        "transient": transient_bytes(trainable, axes, scale),
        "other": input_bytes(facts, local_batch),
    }


def sharded_dim_sizes(rows, axes):
    """For the model and expert axes: sizes of weight dimensions split over them, minus sizes left whole beside them."""
    out = {}
    for axis in ("model", "expert"):
        if axes.get(axis, 1) == 1:
            continue
        split, whole = set(), set()
        for r in rows:
            dims = split_by(r.spec, axis)
            if any(dims):
                for d, on in zip(r.shape, dims):
                    (split if on else whole).add(d)
        out[axis] = split - whole
    return out


def activation_bytes(facts, local_batch, sharded_sizes, axes):
    """Saved activations on one device (see docs/plan.md, "Activations")."""
    total = 0
    for shape, element_bytes, count in facts.residuals:
        size = math.prod(shape) * element_bytes
        if any(d % TRACE_BATCH == 0 for d in shape):
            size = size * local_batch / TRACE_BATCH
        for axis, sizes in sharded_sizes.items():
            if any(d in sizes for d in shape):
                size /= axes[axis]
        total += size * count
    return int(total)


def transient_bytes(rows, axes, scale):
    """Buffers that live during the step besides the state (see docs/plan.md, "Transient buffers").

    With the batch split (data or fsdp > 1), each device's gradients exist once
    before their all-reduce / reduce-scatter and once after: the unreduced
    copy is fsdp times a sharded weight's shard. Weights all-gathered over
    fsdp are kept whole from the forward to the backward pass (Keras does not
    rematerialise), beyond their shards.
    """
    f = axes.get("fsdp", 1)
    total = 0
    for r in rows:
        shard = r.bytes(scale) * r.count
        on_fsdp = f > 1 and r.split_over("fsdp")
        if axes.get("data", 1) * f > 1:
            total += shard * (f if on_fsdp else 1)
        if on_fsdp:
            total += shard * (f - 1)
    return total


def input_bytes(facts, local_batch):
    """One batch shard of inputs and integer labels (one per output position)."""
    if facts.inputs is None:
        return 0
    total = 0
    for s in keras.tree.flatten(facts.inputs):
        total += local_batch * math.prod(s.shape[1:]) * itemsize(s.dtype)
    for shape in facts.label_shapes:
        total += local_batch * math.prod(shape) * 4
    return int(total)
