"""Move a live model's state from one distribution to another.

`reshard(model, target)` re-lays out every variable a training step touches
(trainable and non-trainable weights, optimizer state, metric state) on the
layouts `target` would give them if the model were built under it, copies
only the variables whose sharding really changes, and makes `target` the
current Keras distribution so that `fit` continues on the new mesh.
`plan_reshape(model, target)` says what would move, and how many bytes each
device would receive, without moving anything.
"""

import dataclasses
import math
import sys
import time

import jax
import keras
import numpy as np
from keras.distribution import TensorLayout

from kdist.checks import shown
from kdist.devices import device_name
from kdist.errors import ArgumentTypeError, ModelError, ReshardError, RuleError
from kdist.keras_internals import array_of, forget_compiled_functions, set_array
from kdist.keras_internals.optimizers import slot_references
from kdist.meshes.layout import spec_json
from kdist.model_state import check_model, state_variables
from kdist.presets import build_preset
from kdist.render.reshard import pieces_text, reshard_renderables
from kdist.reporting import Report


@dataclasses.dataclass
class VariableMove:
    """How one variable is re-laid out.

    Attributes:
        path: the variable's path.
        kind: "trainable", "non_trainable", "optimizer" or "metric".
        shape, dtype: of the variable.
        source, target: the partition specs before and after (one entry per
            dimension; None is replicated).
        source_pieces, target_pieces: into how many pieces each dimension is
            split before and after (a spec entry names an axis, whose size
            depends on the mesh).
        moves: False when the target sharding puts the same piece of the
            variable on every device as now: the arrays are re-labelled with
            the target mesh without copying.
        device_bytes: bytes each device of the plan's `devices` must receive
            that it does not hold now (zero everywhere when `moves` is False).
        reference: for an optimizer slot, the path of the variable whose
            layout it follows; "" otherwise.
    """

    path: str
    kind: str
    shape: tuple
    dtype: str
    source: tuple
    target: tuple
    moves: bool
    device_bytes: np.ndarray
    reference: str = ""
    source_pieces: tuple = ()
    target_pieces: tuple = ()

    @property
    def nbytes(self):
        """Bytes of one full copy of the variable."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass
class ReshardResult(Report):
    """What `kdist.reshard` moved (or, from a dry run, would move). Print it with rich.

    Attributes:
        variables: one `VariableMove` per variable of the model's state.
        devices: device names, in the order of every `device_bytes`.
        distribution: the target `keras.distribution.Distribution`.
        dry_run: True when nothing was moved.
        seconds: wall time of the move (0.0 for a dry run).
    """

    variables: list
    devices: list
    distribution: object
    dry_run: bool
    seconds: float = 0.0

    @property
    def moved(self):
        """The `VariableMove`s whose data is copied."""
        return [v for v in self.variables if v.moves]

    @property
    def count(self):
        """Number of variables whose data is copied."""
        return len(self.moved)

    @property
    def bytes(self):
        """Bytes received by all devices together."""
        return int(self.device_bytes.sum())

    @property
    def device_bytes(self):
        """Bytes each device receives (numpy array, in the order of `devices`)."""
        rows = [v.device_bytes for v in self.variables]
        return np.sum(rows, axis=0) if rows else np.zeros(len(self.devices), dtype=np.int64)

    def to_dict(self):
        return {
            "dry_run": self.dry_run,
            "count": self.count,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "devices": {d: int(b) for d, b in zip(self.devices, self.device_bytes)},
            "variables": [
                {
                    "path": v.path,
                    "kind": v.kind,
                    "shape": list(v.shape),
                    "dtype": v.dtype,
                    "source": spec_json(v.source),
                    "target": spec_json(v.target),
                    "source_pieces": list(v.source_pieces),
                    "target_pieces": list(v.target_pieces),
                    "moves": v.moves,
                    "bytes_received": int(v.device_bytes.sum()),
                    "reference": v.reference,
                }
                for v in self.variables
            ],
        }

    def csv_rows(self):
        return [
            {
                "path": v.path,
                "kind": v.kind,
                "shape": "x".join(map(str, v.shape)),
                "dtype": v.dtype,
                "source": pieces_text(v.source, v.source_pieces),
                "target": pieces_text(v.target, v.target_pieces),
                "moves": v.moves,
                "bytes_received": int(v.device_bytes.sum()),
                "reference": v.reference,
            }
            for v in self.variables
        ]

    def renderables(self, width=80):
        return reshard_renderables(self, width)

    def describe_target(self):
        """ "2x4 (data=2,model=4)": the target distribution in words."""
        mesh = self.distribution.device_mesh
        shape = ",".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.shape))
        spec = getattr(self.distribution, "spec", None)
        return f"{spec} ({shape})" if spec else f"{type(self.distribution).__name__}({shape})"


def plan_reshape(model, target):
    """List what `kdist.reshard(model, target)` would move, moving nothing.

    Same as `kdist.reshard(model, target, dry_run=True)`.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = kdist.models.mnist_mlp()
    plan = kdist.plan_reshape(model, "2x4")
    plan.count, plan.bytes, plan.device_bytes   # variables, bytes, bytes per device
    rich.print(plan)
    ```
    """
    return reshard(model, target, dry_run=True)


def reshard(model, target, *, dry_run=False):
    """Move a built model's state onto the layouts of another distribution.

    Every variable of the training state (trainable and non-trainable
    weights, optimizer state, metric state) gets the layout `target` would
    give it if the model were built under `target`: weights from
    `target.get_variable_layout` (ignoring the layout they carry now),
    optimizer slots (Adam's momentum, ...) the layout of their reference
    weight, and everything else (iteration, learning rate, metrics) its own
    layout from `target`, which is replicated for scalars. Variables whose
    sharding changes are copied with one `jax.device_put`; the others are
    re-labelled with the target mesh without copying. Values are preserved
    bit for bit.

    Afterwards `target` is the current Keras distribution
    (`keras.distribution.set_distribution(target)`), and the model's jitted
    train/test/predict functions are dropped so that `fit`, `evaluate` and
    `predict` retrace with the new shardings. Inside a
    `with old.scope():` block, the scope restores the old distribution when
    it exits: continue under `with result.distribution.scope():`.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = kdist.models.mnist_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64)
    result = kdist.reshard(model, "2x4")   # or kdist.preset(...), any keras Distribution
    print(result.count, result.bytes)
    model.fit(x, y, batch_size=64)         # continues on the 2x4 mesh
    ```

    Args:
        model: a built `keras.Model` (on any distribution, or on one device).
        target: a kdist spec string ("1x8", "fsdp", ...; the default rules
            of `kdist.preset`), a `kdist.ShardedDistribution`, or any
            `keras.distribution.Distribution`.
        dry_run: only plan: nothing moves and the current distribution is
            left as it is.

    Returns:
        A `ReshardResult`: `count`, `bytes`, `device_bytes` and one
        `VariableMove` per variable.
    """
    distribution = _as_distribution(target)
    _check_model(model)
    entries = state_variables(model)
    values = _values(entries)
    targets = _target_layouts(entries, distribution)
    moves, devices = _plan(entries, values, targets)
    result = ReshardResult(moves, devices, distribution, dry_run)
    if dry_run:
        return result
    start = time.perf_counter()
    _apply(entries, values, targets)
    result.seconds = time.perf_counter() - start
    forget_compiled_functions(model)
    keras.distribution.set_distribution(distribution)
    return result


def _as_distribution(target):
    if isinstance(target, str):
        return build_preset(target)
    # keras does not export its Distribution base class: accept what behaves like one.
    if hasattr(target, "get_variable_layout") and hasattr(target, "device_mesh"):
        return target
    raise ArgumentTypeError(
        'reshard target must be a kdist spec string (e.g. "2x4"), a kdist preset or a '
        f"keras.distribution.Distribution; received {type(target).__name__}: {shown(target)}."
    )


def _check_model(model):
    check_model(model, "reshard")
    running = _running_call(model)
    if running:
        raise ReshardError(
            f"Model {model.name!r} is in the middle of {running}(): its compiled step and data pipeline are "
            "bound to the current mesh. Call reshard between fit/evaluate/predict calls, not from a callback."
        )


def _running_call(model):
    """ "fit", "evaluate" or "predict" when called from inside one of them on `model` (e.g. from a callback)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("fit", "evaluate", "predict") and frame.f_locals.get("self") is model:
            return frame.f_code.co_name
        frame = frame.f_back
    return None


def _values(entries):
    """The variables' arrays, in the order of `entries`; a clear error for variables without one."""
    values = []
    for v, _ in entries:
        value = array_of(v)
        if value is None:
            raise ModelError(
                f"reshard needs variables with values; {v.path!r} has none. "
                "A model built with kdist.abstract_model cannot be resharded: build it for real."
            )
        values.append(value)
    return values


def _target_layouts(entries, distribution):
    """variable id -> (layout, jax sharding, reference path) under `distribution`."""
    layouts = {}
    by_id = {id(v): v for v, _ in entries}
    references = _slot_references(entries)
    for v, kind in entries:
        if id(v) not in references:
            layout = distribution.get_variable_layout(_Unplaced(v, kind == "optimizer"))
            if layout is None:
                raise ReshardError(
                    f"{type(distribution).__name__}.get_variable_layout gave no layout for variable {v.path!r}; "
                    "reshard needs one for every variable (a TensorLayout or a jax Sharding)."
                )
            layouts[id(v)] = (layout, _sharding(layout), "")
    for slot_id, ref_id in references.items():
        layouts[slot_id] = layouts[ref_id][:2] + (by_id[ref_id].path,)
    return layouts


def _slot_references(entries):
    """Optimizer variable id -> id of the weight it was made from (Keras's slot naming)."""
    weights = [v for v, kind in entries if kind in ("trainable", "non_trainable")]
    slots = slot_references([v for v, kind in entries if kind == "optimizer"], weights)
    return {slot: id(reference) for slot, reference in slots.items()}


class _Unplaced:
    """A view of a variable without its layout, so a distribution decides afresh.

    `optimizer_state`: an optimizer's own variable (kdist's distributions
    read it; while resharding, no optimizer method is on the stack to say so).
    """

    _layout = None

    def __init__(self, variable, optimizer_state=False):
        self._variable = variable
        self.optimizer_state = optimizer_state

    def __getattr__(self, name):
        return getattr(self._variable, name)


def _plan(entries, values, targets):
    shardings = [targets[id(v)][1] for v, _ in entries]
    all_devices = set()
    for sharding in {s for value, target in zip(values, shardings) for s in (value.sharding, target)}:
        all_devices |= sharding.device_set
    ordered = sorted(all_devices, key=lambda d: (d.platform, d.id))
    index = {d: i for i, d in enumerate(ordered)}
    received = {}  # optimizer slots share their weight's shape and shardings
    moves = []
    for (v, kind), value, target in zip(entries, values, shardings):
        _check_divisible(v, target)
        moves_data = not value.sharding.is_equivalent_to(target, value.ndim)
        if moves_data and not value.is_fully_addressable:
            raise ReshardError(
                f"Variable {v.path!r} spans several processes: reshard runs in one process (jax's device_put "
                "cannot re-split such arrays). Save with kdist.save_sharded and load under the new mesh instead."
            )
        key = (tuple(value.shape), str(value.dtype), value.sharding, target)
        if not moves_data:
            device_bytes = np.zeros(len(ordered), dtype=np.int64)
        elif key in received:
            device_bytes = received[key].copy()
        else:
            device_bytes = received[key] = _received_bytes(value.shape, value.dtype, value.sharding, target, index)
        moves.append(
            VariableMove(
                v.path,
                kind,
                tuple(value.shape),
                str(value.dtype),
                _spec_of(value.sharding, value.ndim),
                _spec_of(target, value.ndim),
                moves_data,
                device_bytes,
                targets[id(v)][2],
                _pieces(value.sharding, value.shape),
                _pieces(target, value.shape),
            )
        )
    return moves, [device_name(d) for d in ordered]


def _sharding(layout):
    return layout.backend_layout if isinstance(layout, TensorLayout) else layout


def _check_divisible(variable, sharding):
    spec = tuple(getattr(sharding, "spec", ()))
    if len(spec) > len(variable.shape):
        raise RuleError(
            f"Variable {variable.path!r} of shape {tuple(variable.shape)} cannot take layout {spec}: it has "
            f"{len(spec)} axes for {len(variable.shape)} dimensions. Change the target's layout for this variable."
        )
    if all(axes is None for axes in spec):
        return
    sizes = dict(sharding.mesh.shape)
    for dim, axes in zip(variable.shape, spec):
        names = axes if isinstance(axes, tuple) else (axes,)
        split = math.prod(sizes[a] for a in names if a is not None)
        if dim % split:
            raise RuleError(
                f"Variable {variable.path!r} of shape {tuple(variable.shape)} cannot take layout "
                f"{tuple(spec)} on mesh {sizes}: dimension {dim} does not divide by {split}. "
                "Change the target's layout for this variable (its layout map or rules) or the mesh."
            )


def _received_bytes(shape, dtype, source, target, index):
    """Per device: bytes of its target block that its source block does not already cover."""
    itemsize = np.dtype(dtype).itemsize
    have = {d: _box(idx, shape) for d, idx in source.devices_indices_map(tuple(shape)).items()}
    out = np.zeros(len(index), dtype=np.int64)
    for d, idx in target.devices_indices_map(tuple(shape)).items():
        want = _box(idx, shape)
        held = _overlap(want, have[d]) if d in have else 0
        out[index[d]] = (_volume(want) - held) * itemsize
    return out


def _box(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _volume(box):
    return math.prod(hi - lo for lo, hi in box)


def _overlap(a, b):
    return math.prod(max(0, min(ah, bh) - max(al, bl)) for (al, ah), (bl, bh) in zip(a, b))


def _apply(entries, values, targets):
    """One batched `jax.device_put`: jax copies what changes and re-wraps equivalent shardings' buffers."""
    layouts = [targets[id(v)] for v, _ in entries]
    moved = jax.device_put(values, [sharding for _, sharding, _ in layouts], may_alias=True)
    for (v, _), (layout, _, _), value in zip(entries, layouts, moved):
        set_array(v, layout, value)
    jax.block_until_ready(moved)


def _spec_of(sharding, ndim):
    spec = tuple(getattr(sharding, "spec", ()))
    spec = spec + (None,) * (ndim - len(spec))
    return tuple(tuple(a) if isinstance(a, (list, tuple)) else a for a in spec)


def _pieces(sharding, shape):
    return tuple(d // s if s else 1 for d, s in zip(shape, sharding.shard_shape(tuple(shape))))
