"""Sharding inspector: where each variable lives and how full each device is.

Two sources give the same numbers. A live model is read from its arrays'
addressable shards (which device holds which slice). A model built abstractly
(`kdist.abstract_model`, no weights allocated) is computed from the layouts a
distribution gives. Optimizer state is included once the optimizer is built,
or planned from an optimizer's kind (`optimizer="adam"`) without allocating.
"""

import csv
import dataclasses
import functools
import io
import math
import re

import numpy as np

from kdist.export import JSONExport
from kdist.memory import itemsize

KINDS = ("trainable", "non_trainable", "optimizer", "metric")


@dataclasses.dataclass
class VariableReport:
    """Placement and memory of one variable.

    `device_bytes[i]` is what device `i` of the report's `devices` holds.
    `source` says where the layout came from: "rule", "fallback" (a rule's
    later candidate, or indivisible dimensions replicated; `reason` says why),
    "fsdp" (sharded by shape on the fsdp axis), "explicit", "layout_map" (a
    plain Keras LayoutMap key) or "default" (replicated). An optimizer slot
    has its reference variable's layout: `slot_of` names that variable and
    `source`, `rule` and `reason` are the reference's.
    """

    path: str
    kind: str
    shape: tuple
    dtype: str
    spec: tuple
    shard_shape: tuple
    replication: int
    device_bytes: np.ndarray
    source: str = ""
    rule: str = ""
    reason: str = ""
    slot_of: str = ""
    itemsize: int = 0

    def __post_init__(self):
        if not self.itemsize:
            self.itemsize = itemsize(self.dtype)

    @property
    def nbytes(self):
        """Bytes of one copy of the variable."""
        return math.prod(self.shape) * self.itemsize

    @property
    def sharded(self):
        return any(a is not None for a in self.spec)

    @property
    def provenance(self):
        """Where the layout came from, in words: e.g. "slot of d1/kernel: rule (.*/)?kernel"."""
        text = self.source
        if self.rule:
            text += f" {self.rule}"
        if self.reason:
            text += f" ({self.reason})"
        return f"slot of {self.slot_of}: {text}" if self.slot_of else text

    def to_dict(self, devices):
        return {
            "path": self.path,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "spec": [list(a) if isinstance(a, tuple) else a for a in self.spec],
            "shard_shape": list(self.shard_shape),
            "replication": self.replication,
            "nbytes": int(self.nbytes),
            "bytes_per_device": {d: int(b) for d, b in zip(devices, self.device_bytes) if b},
            "source": self.source,
            "rule": self.rule,
            "reason": self.reason,
            "slot_of": self.slot_of,
            "provenance": self.provenance,
        }


@dataclasses.dataclass
class ShardingReport(JSONExport):
    """What `kdist.inspect` returns: print it, show it in a notebook, or export it.

    Example:

    ```python
    report = kdist.inspect(model)
    rich.print(report)              # tables grouped by layer, devices, summary
    report.device_bytes("optimizer")
    report.to_json("report.json"); report.to_csv("report.csv")
    print(report.grid("mlp/d1/kernel", rows="data", cols="model"))
    ```

    Attributes:
        variables: one `VariableReport` per variable, largest first.
        devices: device names ("cpu:0", ...) in the order of every `device_bytes`.
        mesh: mesh axis name -> size.
        source: "live" (read from arrays) or "abstract" (computed from layouts).
        optimizer: name of the optimizer whose state is included, or "".
    """

    variables: list
    devices: list
    mesh: dict
    source: str = "live"
    optimizer: str = ""
    mesh_grid: object = dataclasses.field(default=None, repr=False)  # device indices in mesh shape
    model_name: str = dataclasses.field(default="", repr=False)

    def device_bytes(self, kind=None):
        """Bytes each device holds, of one kind of variable (see `KINDS`) or of all."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"Unknown kind {kind!r}; kinds are {', '.join(KINDS)} (or None for all).")
        rows = [v.device_bytes for v in self.variables if kind is None or v.kind == kind]
        return np.sum(rows, axis=0, dtype=np.int64) if rows else np.zeros(len(self.devices), dtype=np.int64)

    @property
    def total_bytes(self):
        """Bytes of one copy of every variable."""
        return sum(v.nbytes for v in self.variables)

    @property
    def summary(self):
        """Whole-model numbers. Every `*_device_bytes` and `bytes_if_*` figure is per device."""
        per_device = self.device_bytes()
        n = len(self.devices)
        total = int(self.total_bytes)
        mean = float(per_device.mean()) if n else 0.0
        return {
            "num_variables": len(self.variables),
            "num_devices": n,
            "total_bytes": total,
            "bytes_on_devices": int(per_device.sum()),
            "max_device_bytes": int(per_device.max()) if n else 0,
            "mean_device_bytes": mean,
            "imbalance": float(per_device.max() / mean) if mean else 1.0,
            "bytes_if_replicated": total,
            "bytes_if_perfectly_sharded": -(-total // n) if n else 0,
            "sharded_share": _share(self.variables, lambda v: v.sharded),
            "fully_sharded_share": _share(self.variables, lambda v: v.replication == 1 and n > 1),
            **{f"{kind}_bytes": int(sum(v.nbytes for v in self.variables if v.kind == kind)) for kind in KINDS},
        }

    def select(self, pattern):
        """A report of the variables whose path matches regex `pattern` (re.search), with their optimizer slots."""
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"Invalid variable regex {pattern!r}: {e}.") from None
        keep = [v for v in self.variables if regex.search(v.path) or (v.slot_of and regex.search(v.slot_of))]
        return dataclasses.replace(self, variables=keep)

    def variable(self, path):
        """The `VariableReport` of `path`."""
        for v in self.variables:
            if v.path == path:
                return v
        close = [v.path for v in self.variables if path.split("/")[-1] in v.path][:5]
        raise KeyError(f"No variable {path!r} in the report." + (f" Similar paths: {close}." if close else ""))

    def to_dict(self):
        per_kind = {kind: self.device_bytes(kind) for kind in KINDS}
        totals = self.device_bytes()
        return {
            "source": self.source,
            "optimizer": self.optimizer,
            "mesh": self.mesh,
            "devices": [
                {"device": d, **{k: int(per_kind[k][i]) for k in KINDS}, "total": int(totals[i])}
                for i, d in enumerate(self.devices)
            ],
            "variables": [v.to_dict(self.devices) for v in self.variables],
            "summary": self.summary,
        }

    def to_csv(self, path=None):
        """One row per variable, with one bytes column per device; also written to `path` when given."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            ["path", "kind", "shape", "dtype", "spec", "shard_shape", "replication", "nbytes", "source", "rule", "reason", "slot_of"]
            + [f"bytes:{d}" for d in self.devices]
        )
        for v in self.variables:
            writer.writerow(
                [v.path, v.kind, "x".join(map(str, v.shape)), v.dtype, _spec_text(v.spec), "x".join(map(str, v.shard_shape)),
                 v.replication, v.nbytes, v.source, v.rule, v.reason, v.slot_of, *(int(b) for b in v.device_bytes)]
            )
        text = out.getvalue()
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def grid(self, path, rows=None, cols=None):
        """A `GridView` of which slice of variable `path` each device holds (any rank)."""
        if self.mesh_grid is None:
            raise ValueError("This report has no device mesh (single device or no NamedSharding): there is no grid to draw.")
        v = self.variable(path)
        mesh = _Mesh(tuple(self.mesh), tuple(self.mesh.values()), list(self.devices), self.mesh_grid)
        return _grid_from_layout(v.path, v.shape, v.spec, mesh, rows, cols)

    def __rich_console__(self, console, options):
        from kdist.render import report_renderables

        yield from report_renderables(self, width=options.max_width)

    def _repr_html_(self):
        from kdist.render import report_html

        return report_html(self)

    def __str__(self):
        from kdist.render import report_text

        return report_text(self)

    def __repr__(self):
        s = self.summary
        mesh = ", ".join(f"{k}={v}" for k, v in self.mesh.items())
        return (
            f"<ShardingReport {self.source}: {s['num_variables']} variables on {s['num_devices']} devices "
            f"(mesh {mesh}), max {s['max_device_bytes']} bytes per device>"
        )


def inspect(model_or_variables, distribution=None, *, optimizer=None):
    """Report where each variable lives and how many bytes each device holds.

    A live model is read from its arrays' addressable shards. A model built
    abstractly (`kdist.abstract_model`, no values allocated) is computed from
    the layouts `distribution` gives (default: the current distribution),
    exactly as Keras would place them.

    Optimizer state: a built `model.optimizer` is included as it is. Otherwise
    pass `optimizer` (a Keras optimizer name such as "adam", "adamw", "sgd",
    a config dict or an `Optimizer`) to plan its state without allocating:
    the real Keras optimizer is built on deferred variables, its slots take
    their reference variable's layout, its scalars the distribution's. An
    abstract model compiled with an (unbuilt) optimizer is planned the same way.

    Example:

    ```python
    dist = kdist.preset("2x4")
    model = kdist.abstract_model(kdist.models.mnist_mlp)
    report = kdist.inspect(model, dist, optimizer="adam")
    report.device_bytes("optimizer")      # numpy array, bytes per device
    report.summary["imbalance"]
    ```

    Args:
        model_or_variables: a Keras model (or layer), or a list of variables.
        distribution: a `keras.distribution.Distribution`; defaults to the
            current one. Needed for abstract models.
        optimizer: optimizer whose state to plan, when the model has no built one.

    Returns:
        A `ShardingReport`.
    """
    import keras

    if distribution is None:
        distribution = keras.distribution.distribution()
    model_vars = model_variables(model_or_variables)
    trainable = [v for v, kind in model_vars if kind == "trainable"]
    live = bool(model_vars) and all(is_live(v) for v, _ in model_vars)
    opt_vars, slots, opt_name, planned = _optimizer_variables(model_or_variables, optimizer, trainable, plan=not live)
    own = {id(v) for v, _ in model_vars}
    variables = model_vars + [(v, "optimizer") for v in opt_vars if id(v) not in own]
    if live:
        report = _live_report(variables, slots, distribution, {id(v) for v in opt_vars} if planned else set())
    else:
        if distribution is None:
            raise ValueError(
                "inspect() received variables without values and no distribution: pass "
                "distribution=kdist.preset(...) or set one with keras.distribution.set_distribution."
            )
        report = _abstract_report(variables, slots, distribution)
    report.optimizer = opt_name
    report.model_name = getattr(model_or_variables, "name", "") or ""
    report.variables.sort(key=lambda r: (-r.nbytes, r.path))
    return report


def grid_view(x, rows=None, cols=None, *, distribution=None, name=None):
    """Show which slice of `x` each device holds, on a 2-D grid of mesh axes, for any rank.

    `jax.debug.visualize_array_sharding` draws only 1-D and 2-D arrays; this
    lays out any mesh's axes as rows and columns and writes, in each device's
    cell, the index range it holds along every dimension (":" = all of it).

    Example:

    ```python
    mesh = kdist.mesh("data=2,fsdp=2,model=2").backend_mesh
    x = jax.device_put(np.zeros((4, 6, 8)), NamedSharding(mesh, PartitionSpec("data", None, "model")))
    print(kdist.grid_view(x, rows=("data", "fsdp"), cols="model"))
    view = kdist.grid_view(x)
    view.slice_text("cpu:1")   # "[0:2, :, 4:8]"
    view.slices["cpu:1"]       # ((0, 2), (0, 6), (4, 8))
    ```

    Args:
        x: a sharded `jax.Array`, a Keras variable with a value, or an abstract
            Keras variable (laid out by `distribution`, default the current one).
        rows: mesh axis name(s) drawn as rows; defaults to every axis but the last.
        cols: mesh axis name(s) drawn as columns; defaults to the remaining axes.
        distribution: for abstract variables.
        name: title; defaults to the variable's path.

    Returns:
        A `GridView` (rich-printable, `str()` gives text, HTML in notebooks).
    """
    import jax
    import keras

    path = name or getattr(x, "path", None) or "array"
    if not isinstance(x, jax.Array) and is_live(x):
        x = _array(x)
    if isinstance(x, jax.Array):
        sharding = x.sharding
        if not isinstance(sharding, jax.sharding.NamedSharding):
            raise ValueError(
                f"grid_view needs an array with a NamedSharding; {path!r} has {type(sharding).__name__}. "
                "Place it with jax.device_put(x, NamedSharding(mesh, spec)) or a Keras distribution."
            )
        mesh = _Mesh.from_jax(sharding.mesh)
        indices = sharding.devices_indices_map(tuple(x.shape))
        slices = {_device_name(d): _ranges(index, x.shape) for d, index in indices.items()}
        spec = _full_spec(tuple(sharding.spec), len(x.shape))
        return _grid(path, tuple(x.shape), spec, mesh, slices, rows, cols)
    distribution = distribution if distribution is not None else keras.distribution.distribution()
    if distribution is None:
        raise ValueError(
            f"grid_view received {path!r} without a value and no distribution: pass distribution=kdist.preset(...)."
        )
    mesh = _Mesh.from_keras(distribution.device_mesh)
    spec, _ = _planned_layout(x, distribution, mesh)
    return _grid_from_layout(path, tuple(x.shape), spec, mesh, rows, cols)


@dataclasses.dataclass
class GridView:
    """Which slice each device holds, laid out on mesh axes as rows and columns.

    Attributes:
        slices: device name -> ((start, stop), ...) per dimension.
        cells: rows of columns of device names.
    """

    path: str
    shape: tuple
    spec: tuple
    row_axes: tuple
    col_axes: tuple
    row_labels: list
    col_labels: list
    cells: list
    slices: dict

    def slice_text(self, device):
        """The slice `device` holds, e.g. "[0:2, :, 4:8]"."""
        return "[" + ", ".join(":" if (a, b) == (0, d) else f"{a}:{b}" for (a, b), d in zip(self.slices[device], self.shape)) + "]"

    def __rich_console__(self, console, options):
        from kdist.render import grid_table

        yield grid_table(self)

    def _repr_html_(self):
        from kdist.render import grid_html

        return grid_html(self)

    def __str__(self):
        from kdist.render import to_text

        return to_text(self)

    def __repr__(self):
        return f"<GridView {self.path} {self.shape} {self.spec}: rows {self.row_axes}, columns {self.col_axes}>"


# --- Meshes -------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Mesh:
    """A mesh in report terms: axis names and sizes, device names sorted by id, and
    `grid`: each mesh position's index into `devices`."""

    axis_names: tuple
    shape: tuple
    devices: list
    grid: np.ndarray

    @classmethod
    def from_keras(cls, device_mesh):
        return cls._of(tuple(device_mesh.axis_names), tuple(device_mesh.shape), np.asarray(device_mesh.devices))

    @classmethod
    def from_jax(cls, mesh):
        return cls._of(tuple(mesh.axis_names), tuple(mesh.devices.shape), np.asarray(mesh.devices))

    @classmethod
    def _of(cls, names, shape, devices):
        flat = [_device_name(d) for d in devices.ravel()]
        order = sorted(flat, key=_device_sort_key)
        index = {d: i for i, d in enumerate(order)}
        return cls(names, shape, order, np.array([index[d] for d in flat]).reshape(shape))

    @property
    def sizes(self):
        return dict(zip(self.axis_names, self.shape))

    @functools.cached_property
    def coords(self):
        """Mesh axis name -> each device's coordinate along it (devices in `devices` order)."""
        out = {name: np.zeros(len(self.devices), dtype=np.int64) for name in self.axis_names}
        for position, device in np.ndenumerate(self.grid):
            for name, c in zip(self.axis_names, position):
                out[name][device] = c
        return out

    def shard_index(self, axes):
        """Each device's shard index along a dimension split over mesh `axes` (major first)."""
        idx = np.zeros(len(self.devices), dtype=np.int64)
        for a in axes:
            idx = idx * self.sizes[a] + self.coords[a]
        return idx


# --- Live reports --------------------------------------------------------------------------------


def _live_report(variables, slots, distribution, planned):
    devices = sorted({_device_name(d) for v, _ in variables if is_live(v) for d in _array(v).sharding.device_set}, key=_device_sort_key)
    mesh = _live_mesh(variables, distribution, devices)
    index = {d: i for i, d in enumerate(devices)}
    rows, by_path = [], {}
    pending = []
    for v, kind in variables:
        if is_live(v) and id(v) not in planned:
            row = _live_row(v, kind, index, distribution)
            reference = by_path.get(getattr(slots.get(id(v)), "path", None))
            if reference is not None and reference.spec == row.spec:  # a built slot: its reference's provenance
                row = dataclasses.replace(row, source=reference.source, rule=reference.rule, reason=reference.reason, slot_of=reference.path)
            rows.append(row)
            by_path[v.path] = row
        else:
            pending.append((v, kind))
    for v, kind in pending:  # planned optimizer state of a live model
        row = _slot_row(v, kind, slots, by_path)
        if row is not None:
            rows.append(row)
        elif distribution is not None and mesh is not None and set(mesh.devices) <= set(devices):
            rows.append(_planned_row(v, kind, distribution, mesh, index))
        else:
            raise ValueError(
                f"Cannot plan optimizer variable {v.path!r} of a live model without a distribution "
                "whose devices are the model's: pass distribution=..."
            )
    if mesh is None or set(mesh.devices) != set(devices):
        return ShardingReport(rows, devices, {"devices": len(devices)}, "live")
    return ShardingReport(rows, devices, mesh.sizes, "live", mesh_grid=mesh.grid)


def _live_mesh(variables, distribution, devices):
    if distribution is not None:
        return _Mesh.from_keras(distribution.device_mesh)
    import jax

    for v, _ in variables:
        if is_live(v) and isinstance(_array(v).sharding, jax.sharding.NamedSharding):
            mesh = _Mesh.from_jax(_array(v).sharding.mesh)
            if set(mesh.devices) == set(devices):
                return mesh
    return None


def _live_row(variable, kind, index, distribution):
    value = _array(variable)
    shape = tuple(value.shape)
    dtype = _dtype_name(value.dtype)
    element_bytes = value.dtype.itemsize
    device_bytes = np.zeros(len(index), dtype=np.int64)
    for shard in value.addressable_shards:
        device_bytes[index[_device_name(shard.device)]] += element_bytes * math.prod(b - a for a, b in _ranges(shard.index, shape))
    sharding = value.sharding
    spec = _full_spec(tuple(getattr(sharding, "spec", ())), len(shape))
    shard_shape = tuple(sharding.shard_shape(shape))
    num_shards = math.prod(-(-d // s) if s else 1 for d, s in zip(shape, shard_shape))
    replication = len(sharding.device_set) // max(1, num_shards)
    return VariableReport(
        variable.path, kind, shape, dtype, spec, shard_shape, replication, device_bytes,
        *_provenance(variable.path, shape, spec, distribution), itemsize=element_bytes,
    )


# --- Abstract reports ----------------------------------------------------------------------------


def _abstract_report(variables, slots, distribution):
    mesh = _Mesh.from_keras(distribution.device_mesh)
    index = {d: i for i, d in enumerate(mesh.devices)}
    cache = {}
    rows, by_path = [], {}
    for v, kind in variables:
        row = _slot_row(v, kind, slots, by_path) or _planned_row(v, kind, distribution, mesh, index, cache)
        rows.append(row)
        by_path[v.path] = row
    return ShardingReport(rows, list(mesh.devices), mesh.sizes, "abstract", mesh_grid=mesh.grid)


def _planned_row(variable, kind, distribution, mesh, index, cache=None):
    shape = tuple(variable.shape)
    spec, provenance = _planned_layout(variable, distribution, mesh)
    dtype = _dtype_name(variable.dtype)
    element_bytes = itemsize(dtype)
    key = (shape, spec, element_bytes)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        placed = _place_on_mesh(variable.path, shape, spec, element_bytes, mesh, index)
        if cache is not None:
            cache[key] = placed
    shard_shape, replication, device_bytes = placed
    return VariableReport(variable.path, kind, shape, dtype, spec, shard_shape, replication, device_bytes, *provenance, itemsize=element_bytes)


def _slot_row(variable, kind, slots, by_path):
    """An optimizer slot's row: its reference variable's layout (Keras copies it), or None if not a slot."""
    reference = slots.get(id(variable))
    row = by_path.get(reference.path) if reference is not None else None
    if row is None or tuple(variable.shape) != row.shape or _dtype_name(variable.dtype) != row.dtype:
        return None
    return dataclasses.replace(row, path=variable.path, kind=kind, slot_of=row.path)


def _planned_layout(variable, distribution, mesh):
    """The spec Keras would give `variable` under `distribution`, and its provenance."""
    from kdist.distribution import ShardedDistribution

    shape = tuple(variable.shape)
    layout = getattr(variable, "_layout", None)
    if layout is not None and _same_mesh(layout, distribution):
        spec = _full_spec(_axes_of(layout), len(shape), variable.path)
        return spec, _provenance(variable.path, shape, spec, distribution)
    if isinstance(distribution, ShardedDistribution):
        placement = distribution.place(variable.path, shape)
        return _full_spec(placement.axes, len(shape), variable.path), _placement_provenance(placement)
    spec = _full_spec(_axes_of(distribution.get_variable_layout(variable)), len(shape), variable.path)
    return spec, _provenance(variable.path, shape, spec, distribution)


def _place_on_mesh(path, shape, spec, element_bytes, mesh, index):
    """(shard shape, replication, bytes per device) of a variable laid out as `spec` on `mesh`.

    Every device of the mesh holds one shard of the same shape (jax shards
    evenly), so the bytes are uniform over the mesh's devices.
    """
    _check_layout(path, shape, spec, mesh)
    splits = [math.prod(mesh.sizes[a] for a in dim_axis_names(axes)) for axes in spec]
    shard_shape = tuple(d // k for d, k in zip(shape, splits))
    device_bytes = np.zeros(len(index), dtype=np.int64)
    device_bytes[[index[d] for d in mesh.devices]] = math.prod(shard_shape) * element_bytes
    device_bytes.flags.writeable = False
    return shard_shape, len(mesh.devices) // math.prod(splits), device_bytes


def _check_layout(path, shape, spec, mesh):
    for i, (d, axes) in enumerate(zip(shape, spec)):
        for a in dim_axis_names(axes):
            if a not in mesh.sizes:
                raise ValueError(f"Variable {path!r} has layout {spec} naming mesh axis {a!r}, which is not in the mesh {mesh.sizes}.")
        k = math.prod(mesh.sizes[a] for a in dim_axis_names(axes))
        if d % k:
            raise ValueError(
                f"Variable {path!r} of shape {shape} has layout {spec}: dimension {i} ({d}) does not divide by "
                f"{'x'.join(dim_axis_names(axes))}={k}, so jax cannot place it. Replicate that dimension (None) or shard one that divides."
            )


# --- Provenance ----------------------------------------------------------------------------------


def _provenance(path, shape, spec, distribution):
    """(source, rule, reason) of a variable laid out as `spec`."""
    from keras.distribution import DataParallel, ModelParallel

    from kdist.distribution import ShardedDistribution

    if distribution is None:
        if any(a is not None for a in spec):
            return ("unknown", "", "no distribution given: pass the one the model was built under to see which rule")
        return ("default", "", "no distribution: replicated or on one device")
    if isinstance(distribution, ShardedDistribution):
        placement = distribution.place(path, shape)
        if _full_spec(placement.axes, len(shape)) != spec:
            recorded = distribution.placements.get(path)
            if recorded is not None and _full_spec(recorded.axes, len(shape)) == spec:
                placement = recorded
            else:
                return ("explicit", "", f"its layout differs from the {placement.axes} the distribution gives")
        return _placement_provenance(placement)
    if isinstance(distribution, ModelParallel):
        key = _layout_map_key(distribution._layout_map, path)
        if key is not None:
            return ("layout_map", key, "")
        return ("default", "", "no LayoutMap key matched: replicated")
    if isinstance(distribution, DataParallel):
        return ("default", "", "DataParallel replicates variables")
    return ("default", "", "")


def _placement_provenance(placement):
    return (placement.source, placement.rule.pattern if placement.rule else "", placement.reason)


def _layout_map_key(layout_map, path):
    keys = layout_map._layout_map
    if path in keys:
        return path
    return next((k for k in keys if re.fullmatch(k, path)), None)


# --- Variables and optimizer slots ---------------------------------------------------------------


def model_variables(obj):
    """(variable, kind) for the model's own variables: trainable, non-trainable, metrics."""
    if isinstance(obj, (list, tuple)):
        return [(v, "trainable" if getattr(v, "trainable", True) else "non_trainable") for v in obj]
    seen, out = set(), []

    def add(variables, kind):
        for v in variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append((v, kind))

    add(obj.trainable_variables, "trainable")
    add(obj.non_trainable_variables, "non_trainable")
    add(getattr(obj, "metrics_variables", []), "metric")
    return out


def _optimizer_variables(obj, optimizer, trainable, plan):
    """(optimizer variables, {id(slot): reference variable}, optimizer name, whether planned)."""
    import keras

    own = getattr(obj, "optimizer", None) if not isinstance(obj, (list, tuple)) else None
    if optimizer is None:
        if own is None:
            return [], {}, "", False
        if getattr(own, "built", False):
            return list(own.variables), _slots_by_name(own, trainable), own.name, False
        if not plan:
            return [], {}, "", False  # a live model before its optimizer is built: no state yet
        optimizer = own
    if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
        return list(optimizer.variables), _slots_by_name(optimizer, trainable), optimizer.name, False
    return (*plan_optimizer(new_optimizer(optimizer), trainable), True)


def new_optimizer(optimizer):
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer.__class__.from_config(optimizer.get_config())  # never build the caller's optimizer
    if isinstance(optimizer, (str, dict)):
        try:
            made = keras.optimizers.get(optimizer)
            # Keras names a second "adam" "adam_1"; plan under the name a fresh session would use.
            return made.__class__.from_config({**made.get_config(), "name": re.sub(r"_\d+$", "", made.name)})
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"Unknown optimizer {optimizer!r}: name a Keras optimizer (adam, adamw, sgd, rmsprop, "
                f"adagrad, adamax, nadam, lion, ...) or pass a keras.optimizers.Optimizer. Keras said: {e}"
            ) from None
    raise TypeError(f"optimizer must be a name, a config dict or a keras.optimizers.Optimizer; received {type(optimizer).__name__}.")


def plan_optimizer(optimizer, trainable):
    """Build `optimizer` with its variables deferred (nothing allocated) and record each slot's reference.

    Only `add_variable` runs in a `StatelessScope`: a placeholder an optimizer
    builds from a value (Adafactor's scalars for rank-1 variables) is created as usual.
    """
    import keras
    from keras.src.backend.common import global_state

    slots = {}
    add_variable = optimizer.add_variable
    add_from_reference = optimizer.add_variable_from_reference

    def deferred(*args, **kwargs):
        with keras.StatelessScope(initialize_variables=False):
            return add_variable(*args, **kwargs)

    def recording(reference_variable, *args, **kwargs):
        slot = add_from_reference(reference_variable, *args, **kwargs)
        slots[id(slot)] = reference_variable
        return slot

    optimizer.add_variable = deferred
    optimizer.add_variable_from_reference = recording
    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(pending)
    try:
        optimizer.build(trainable)
    finally:
        del optimizer.add_variable, optimizer.add_variable_from_reference
        del pending[before:]  # so that no later scope exit allocates the planned state
    return list(optimizer.variables), slots, optimizer.name


def _slots_by_name(optimizer, trainable):
    """Slots of a built optimizer, matched by Keras's naming: "<opt>/<reference path with _>_<slot>"."""
    by_key = {v.path.replace("/", "_"): v for v in trainable}
    prefix = optimizer.name + "/"
    slots = {}
    for v in optimizer.variables:
        if not v.path.startswith(prefix):
            continue
        rest = v.path[len(prefix):]
        cut = len(rest)
        while (cut := rest.rfind("_", 0, cut)) > 0:
            reference = by_key.get(rest[:cut])
            if reference is not None and tuple(reference.shape) == tuple(v.shape):
                slots[id(v)] = reference
                break
    return slots


# --- Grids ---------------------------------------------------------------------------------------


def _grid_from_layout(path, shape, spec, mesh, rows, cols):
    _check_layout(path, shape, spec, mesh)
    starts, stops = [], []
    for d, axes in zip(shape, spec):
        names = dim_axis_names(axes)
        k = math.prod(mesh.sizes[a] for a in names)
        chunk = -(-d // k)
        start = np.minimum(mesh.shard_index(names) * chunk, d)
        starts.append(start)
        stops.append(np.minimum(start + chunk, d))
    slices = {device: tuple((int(a[i]), int(b[i])) for a, b in zip(starts, stops)) for i, device in enumerate(mesh.devices)}
    return _grid(path, shape, spec, mesh, slices, rows, cols)


def _grid(path, shape, spec, mesh, slices, rows, cols):
    row_axes, col_axes = _grid_axes(mesh, rows, cols)
    sizes = mesh.sizes
    order = list(row_axes) + list(col_axes)
    grid = np.transpose(mesh.grid, [mesh.axis_names.index(a) for a in order])
    n_rows = math.prod(sizes[a] for a in row_axes)
    n_cols = math.prod(sizes[a] for a in col_axes)
    grid = grid.reshape(n_rows, n_cols)
    cells = [[mesh.devices[i] for i in row] for row in grid]
    return GridView(
        path, tuple(shape), tuple(spec), row_axes, col_axes,
        _labels(row_axes, sizes), _labels(col_axes, sizes), cells, slices,
    )


def _grid_axes(mesh, rows, cols):
    names = mesh.axis_names
    rows = _axis_tuple(rows)
    cols = _axis_tuple(cols)
    for a in (rows or ()) + (cols or ()):
        if a not in names:
            raise ValueError(f"Mesh axis {a!r} is not in the mesh; its axes are {list(names)}.")
    if rows is None and cols is None:
        rows, cols = names[:-1], names[-1:]
    elif rows is None:
        rows = tuple(a for a in names if a not in cols)
    elif cols is None:
        cols = tuple(a for a in names if a not in rows)
    overlap = set(rows) & set(cols)
    missing = [a for a in names if a not in rows and a not in cols]
    if overlap or missing:
        raise ValueError(
            f"rows={rows} and cols={cols} must share no axis and cover every mesh axis {list(names)}"
            + (f"; {sorted(overlap)} is in both" if overlap else "")
            + (f"; {missing} is in neither" if missing else "") + "."
        )
    return rows, cols


def _axis_tuple(axes):
    if axes is None:
        return None
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _labels(axes, sizes):
    if not axes:
        return [""]
    return [",".join(f"{a}={c}" for a, c in zip(axes, coords)) for coords in np.ndindex(*(sizes[a] for a in axes))]


# --- Small helpers -------------------------------------------------------------------------------


def _array(variable):
    """The jax array behind a variable, or None. Never `variable.value`: on an
    abstract variable Keras would run the initializer and allocate it."""
    value = getattr(variable, "_value", variable)
    return value if hasattr(value, "addressable_shards") else None


def is_live(variable):
    return _array(variable) is not None


def _device_name(device):
    if isinstance(device, str):
        return device.lower()
    return f"{device.platform}:{device.id}"


def _device_sort_key(name):
    platform, _, number = name.rpartition(":")
    return (platform, int(number)) if number.isdigit() else (name, 0)


def _ranges(index, shape):
    return tuple(s.indices(d)[:2] for s, d in zip(index, shape))


def dim_axis_names(axes):
    """The mesh axis names one dimension of a layout is split over."""
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _axes_of(layout):
    axes = getattr(layout, "axes", None)
    return tuple(axes) if axes is not None else tuple(layout.spec)


def _same_mesh(layout, distribution):
    mesh = getattr(layout, "device_mesh", None)
    return mesh is not None and mesh is distribution.device_mesh


def _full_spec(spec, rank, path=None):
    spec = tuple(_axis(a) for a in spec)
    if len(spec) > rank:
        raise ValueError(f"Variable {path!r} of rank {rank} has layout {spec} with {len(spec)} axes; give at most {rank}.")
    return spec + (None,) * (rank - len(spec))


def _axis(a):
    """One dimension's mesh axes: None, a name, or a tuple of several names."""
    if isinstance(a, (tuple, list)):
        return None if not a else (a[0] if len(a) == 1 else tuple(a))
    return a


def _dtype_name(dtype):
    import keras

    return keras.backend.standardize_dtype(dtype)


def _spec_text(spec):
    return "(" + ", ".join("None" if a is None else ("+".join(a) if isinstance(a, tuple) else a) for a in spec) + ")"


def _share(variables, predicate):
    total = sum(v.nbytes for v in variables)
    return sum(v.nbytes for v in variables if predicate(v)) / total if total else 0.0
