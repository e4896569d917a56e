"""Sharding inspector: where each variable lives and how full each device is.

Two sources give the same numbers. A live model is read from its arrays'
addressable shards (which device holds which slice). A model built abstractly
(`kdist.abstract_model`, no weights allocated) is computed from the layouts a
distribution gives, through the same placement engine Keras's layouts come
from. Optimizer state is included once the optimizer is built, or planned
from an optimizer's kind (`optimizer="adam"`) without allocating.
"""

import dataclasses
import math

import jax
import keras
import numpy as np
from keras.distribution import DataParallel, ModelParallel

from kdist.checks import shown
from kdist.devices import device_name, device_sort_key
from kdist.distribution import ShardedDistribution, layout_axes
from kdist.errors import ArgumentError, ArgumentTypeError, ModelError
from kdist.inspection.device_grid import DeviceGrid
from kdist.inspection.report import ShardingReport, VariableReport
from kdist.keras_internals import array_of, layout_map_of, own_layout
from kdist.keras_internals.optimizers import new_optimizer, plan_optimizer, slot_references
from kdist.meshes.layout import check_layout, full_spec, replication, shard_shape
from kdist.meshes.spec import ParallelDims
from kdist.model_state import check_model, state_variables
from kdist.presets import build_preset
from kdist.rules.layout_map import LayoutMapRules
from kdist.rules.placer import Placer
from kdist.units import dtype_name, itemsize


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
        model_or_variables: a built Keras model (or layer), or a list of variables.
        distribution: a `keras.distribution.Distribution` or a kdist spec
            string ("2x4"); defaults to the current one. Needed for abstract models.
        optimizer: optimizer whose state to plan, when the model has no built one.

    Returns:
        A `ShardingReport`.
    """
    model_vars = _model_variables(model_or_variables)
    distribution = _distribution(distribution)
    trainable = [v for v, kind in model_vars if kind == "trainable"]
    live = all(array_of(v) is not None for v, _ in model_vars)
    opt_vars, slots, opt_name, planned = _optimizer_variables(model_or_variables, optimizer, trainable, plan=not live)
    own = {id(v) for v, _ in model_vars}
    variables = model_vars + [(v, "optimizer") for v in opt_vars if id(v) not in own]
    layouts = _Layouts(distribution)
    if live:
        report = _live_report(variables, slots, layouts, {id(v) for v in opt_vars} if planned else set())
    else:
        if distribution is None:
            raise ArgumentError(
                "inspect() received variables without values and no distribution: pass "
                "distribution=kdist.preset(...) or set one with keras.distribution.set_distribution."
            )
        report = _abstract_report(variables, slots, layouts)
    report.optimizer = opt_name
    report.model_name = getattr(model_or_variables, "name", "") or ""
    report.variables.sort(key=lambda r: (-r.nbytes, r.path))
    return report


def _model_variables(obj):
    if isinstance(obj, (list, tuple)):
        if not obj or not all(hasattr(v, "path") and hasattr(v, "shape") for v in obj):
            raise ModelError("inspect() takes a Keras model or a non-empty list of Keras variables.")
        return state_variables(list(obj))
    check_model(obj, "inspect()")
    return state_variables(obj, ("trainable", "non_trainable", "metric"))


def _distribution(distribution):
    if distribution is None:
        return keras.distribution.distribution()
    if isinstance(distribution, str):
        return build_preset(distribution)
    if not (hasattr(distribution, "get_variable_layout") and hasattr(distribution, "device_mesh")):
        raise ArgumentTypeError(
            "distribution must be a keras.distribution.Distribution or a kdist spec such as '2x4'; received "
            f"{type(distribution).__name__}."
        )
    return distribution


class _Layouts:
    """The layouts a distribution gives, with where each came from, through kdist's placement engine."""

    def __init__(self, distribution):
        self.distribution = distribution
        self.placer = None
        if isinstance(distribution, ShardedDistribution):
            self.placer = distribution.placer
        elif isinstance(distribution, ModelParallel):
            rules = LayoutMapRules(layout_map_of(distribution))
            self.placer = Placer(rules, ParallelDims.from_device_mesh(distribution.device_mesh))

    def planned(self, variable, optimizer_state=False):
        """(spec, (source, rule, reason)) Keras would give `variable` (an optimizer's own: `optimizer_state`)."""
        shape = tuple(variable.shape)
        layout = own_layout(variable)
        if layout is not None and getattr(layout, "device_mesh", None) is self.distribution.device_mesh:
            spec = full_spec(layout_axes(layout), len(shape), variable.path)
            return spec, self.provenance(variable.path, shape, spec, optimizer_state)
        if self.placer is not None:
            placement = self.placer.place(variable.path, shape, optimizer_state)
            return full_spec(placement.axes, len(shape), variable.path), _provenance(placement)
        layout = self.distribution.get_variable_layout(variable)
        spec = full_spec(layout_axes(layout), len(shape), variable.path)
        return spec, self.provenance(variable.path, shape, spec, optimizer_state)

    def provenance(self, path, shape, spec, optimizer_state=False):
        """(source, rule, reason) of a variable found laid out as `spec`."""
        if self.distribution is None:
            if any(a is not None for a in spec):
                return (
                    "unknown",
                    "",
                    "no distribution given: pass the one the model was built under to see which rule",
                )
            return ("default", "", "no distribution: replicated or on one device")
        if self.placer is not None:
            placement = self.placer.place(path, shape, optimizer_state)
            if full_spec(placement.axes, len(shape)) != spec:
                recorded = getattr(self.distribution, "placements", {}).get(path)
                if recorded is None or full_spec(recorded.axes, len(shape)) != spec:
                    return ("explicit", "", f"its layout differs from the {placement.axes} the distribution gives")
                placement = recorded
            return _provenance(placement)
        if isinstance(self.distribution, DataParallel):
            return ("default", "", "DataParallel replicates variables")
        return ("default", "", "")


def _provenance(placement):
    return (placement.source, placement.pattern, placement.reason)


# --- Live reports --------------------------------------------------------------------------------


def _live_report(variables, slots, layouts, planned):
    arrays = {id(v): array_of(v) for v, _ in variables}
    devices = sorted(
        {device_name(d) for a in arrays.values() if a is not None for d in a.sharding.device_set}, key=device_sort_key
    )
    mesh = _live_mesh(arrays.values(), layouts.distribution, devices)
    index = {d: i for i, d in enumerate(devices)}
    rows, by_path, pending = [], {}, []
    for v, kind in variables:
        if arrays[id(v)] is not None and id(v) not in planned:
            row = _live_row(v, arrays[id(v)], kind, index, layouts)
            reference = by_path.get(getattr(slots.get(id(v)), "path", None))
            if reference is not None and reference.spec == row.spec:  # a built slot: its reference's provenance
                row = dataclasses.replace(
                    row, source=reference.source, rule=reference.rule, reason=reference.reason, slot_of=reference.path
                )
            rows.append(row)
            by_path[v.path] = row
        else:
            pending.append((v, kind))
    for v, kind in pending:  # planned optimizer state of a live model
        row = _slot_row(v, kind, slots, by_path)
        if row is None:
            if layouts.distribution is None or mesh is None or not set(mesh.devices) <= set(devices):
                raise ArgumentError(
                    f"Cannot plan optimizer variable {v.path!r} of a live model without a distribution "
                    "whose devices are the model's: pass distribution=..."
                )
            row = _planned_row(v, kind, layouts, mesh, index)
        rows.append(row)
    if mesh is None or set(mesh.devices) != set(devices):
        return ShardingReport(rows, devices, {"devices": len(devices)}, "live")
    return ShardingReport(rows, devices, mesh.sizes, "live", mesh_grid=mesh.grid)


def _live_mesh(arrays, distribution, devices):
    if distribution is not None:
        return DeviceGrid.from_keras(distribution.device_mesh)
    for a in arrays:
        if a is not None and isinstance(a.sharding, jax.sharding.NamedSharding):
            mesh = DeviceGrid.from_jax(a.sharding.mesh)
            if set(mesh.devices) == set(devices):
                return mesh
    return None


def _live_row(variable, value, kind, index, layouts):
    shape = tuple(value.shape)
    element_bytes = value.dtype.itemsize
    device_bytes = np.zeros(len(index), dtype=np.int64)
    for shard in value.addressable_shards:
        piece = math.prod(b - a for a, b in (s.indices(n)[:2] for s, n in zip(shard.index, shape)))
        device_bytes[index[device_name(shard.device)]] += element_bytes * piece
    sharding = value.sharding
    spec = full_spec(tuple(getattr(sharding, "spec", ())), len(shape))
    piece_shape = tuple(sharding.shard_shape(shape))
    num_shards = math.prod(-(-d // s) if s else 1 for d, s in zip(shape, piece_shape))
    return VariableReport(
        variable.path,
        kind,
        shape,
        dtype_name(value.dtype),
        spec,
        piece_shape,
        len(sharding.device_set) // max(1, num_shards),
        device_bytes,
        *layouts.provenance(variable.path, shape, spec, kind == "optimizer"),
        itemsize=element_bytes,
    )


# --- Abstract reports ----------------------------------------------------------------------------


def _abstract_report(variables, slots, layouts):
    mesh = DeviceGrid.from_keras(layouts.distribution.device_mesh)
    index = {d: i for i, d in enumerate(mesh.devices)}
    cache, rows, by_path = {}, [], {}
    for v, kind in variables:
        row = _slot_row(v, kind, slots, by_path) or _planned_row(v, kind, layouts, mesh, index, cache)
        rows.append(row)
        by_path[v.path] = row
    return ShardingReport(rows, list(mesh.devices), mesh.sizes, "abstract", mesh_grid=mesh.grid)


def _planned_row(variable, kind, layouts, mesh, index, cache=None):
    shape = tuple(variable.shape)
    spec, provenance = layouts.planned(variable, kind == "optimizer")
    dtype = dtype_name(variable.dtype)
    element_bytes = itemsize(dtype)
    key = (shape, spec, element_bytes)
    placed = cache.get(key) if cache is not None else None
    if placed is None:
        check_layout(variable.path, shape, spec, mesh.sizes)
        device_bytes = np.full(
            len(index), math.prod(shard_shape(shape, spec, mesh.sizes)) * element_bytes, dtype=np.int64
        )
        device_bytes.flags.writeable = False  # shared between rows of the same shape and layout
        placed = (shard_shape(shape, spec, mesh.sizes), replication(spec, mesh.sizes), device_bytes)
        if cache is not None:
            cache[key] = placed
    piece, copies, device_bytes = placed
    return VariableReport(
        variable.path, kind, shape, dtype, spec, piece, copies, device_bytes, *provenance, itemsize=element_bytes
    )


def _slot_row(variable, kind, slots, by_path):
    """An optimizer slot's row: its reference variable's layout (Keras copies it), or None if not a slot."""
    reference = slots.get(id(variable))
    row = by_path.get(reference.path) if reference is not None else None
    if row is None or tuple(variable.shape) != row.shape or dtype_name(variable.dtype) != row.dtype:
        return None
    return dataclasses.replace(row, path=variable.path, kind=kind, slot_of=row.path)


# --- Optimizer state -----------------------------------------------------------------------------


def _optimizer_variables(obj, optimizer, trainable, plan):
    """(optimizer variables, {id(slot): reference variable}, optimizer name, whether planned)."""
    own = getattr(obj, "optimizer", None) if not isinstance(obj, (list, tuple)) else None
    if optimizer is None:
        if own is None:
            return [], {}, "", False
        if own.built:
            return list(own.variables), slot_references(own.variables, trainable), own.name, False
        if not plan:
            return [], {}, "", False  # a live model before its optimizer is built: no state yet
        optimizer = own
    if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
        return list(optimizer.variables), slot_references(optimizer.variables, trainable), optimizer.name, False
    built = planned_optimizer(optimizer)
    variables, slots = plan_optimizer(built, trainable)
    return variables, slots, built.name, True


def planned_optimizer(optimizer):
    """A fresh, unbuilt Keras optimizer from a name, config dict or instance; clear errors for anything else."""
    if not isinstance(optimizer, (str, dict, keras.optimizers.Optimizer)):
        raise ArgumentTypeError(
            "optimizer must be a name, a config dict or a keras.optimizers.Optimizer; received "
            f"{type(optimizer).__name__}."
        )
    try:
        return new_optimizer(optimizer)
    except KeyError as e:  # a config dict without Keras's keys
        raise ArgumentError(
            f"optimizer config {shown(optimizer)} has no {e}: a config dict is what keras.optimizers.serialize "
            "returns, {'class_name': 'Adam', 'config': {...}}."
        ) from None
    except (ValueError, TypeError) as e:
        raise ArgumentError(
            f"Unknown optimizer {optimizer!r}: name a Keras optimizer (adam, adamw, sgd, rmsprop, "
            f"adagrad, adamax, nadam, lion, ...) or pass a keras.optimizers.Optimizer. Keras said: {e}"
        ) from None
