"""Sharding inspector: where each variable lives and how full each device is."""

import dataclasses
import math

import numpy as np

KINDS = ("trainable", "non_trainable", "optimizer", "metric")


@dataclasses.dataclass
class VariableReport:
    """Placement and memory of one variable.

    `device_bytes[i]` is what device `i` of the report's `devices` holds.
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

    @property
    def nbytes(self):
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def sharded(self):
        return any(a is not None for a in self.spec)


@dataclasses.dataclass
class ShardingReport:
    """What `kdist.inspect` returns. Print it, or use `to_dict()`.

    Attributes:
        variables: one `VariableReport` per variable, largest first.
        devices: the device names, in the order of every `device_bytes`.
        mesh: mesh axis name -> size.
    """

    variables: list
    devices: list
    mesh: dict

    def device_bytes(self, kind=None):
        """Bytes each device holds, of one kind of variable or of all."""
        rows = [v.device_bytes for v in self.variables if kind is None or v.kind == kind]
        return np.sum(rows, axis=0) if rows else np.zeros(len(self.devices), dtype=np.int64)

    @property
    def total_bytes(self):
        """Bytes of one copy of every variable."""
        return sum(v.nbytes for v in self.variables)

    @property
    def summary(self):
        per_device = self.device_bytes()
        n = len(self.devices)
        mean = per_device.mean() if n else 0
        return {
            "total_bytes": int(self.total_bytes),
            "bytes_if_replicated": int(self.total_bytes * n),
            "bytes_if_perfectly_sharded": int(math.ceil(self.total_bytes / n)) if n else 0,
            "bytes_on_devices": int(per_device.sum()),
            "max_device_bytes": int(per_device.max()) if n else 0,
            "imbalance": float(per_device.max() / mean) if mean else 1.0,
            "sharded_share": _share(self.variables),
        }

    def to_dict(self):
        return {
            "mesh": self.mesh,
            "devices": [
                {"device": d, **{k: int(self.device_bytes(k)[i]) for k in KINDS}, "total": int(self.device_bytes()[i])}
                for i, d in enumerate(self.devices)
            ],
            "variables": [
                {
                    "path": v.path,
                    "kind": v.kind,
                    "shape": list(v.shape),
                    "dtype": v.dtype,
                    "spec": list(v.spec),
                    "shard_shape": list(v.shard_shape),
                    "replication": v.replication,
                    "bytes_per_device": {d: int(b) for d, b in zip(self.devices, v.device_bytes) if b},
                    "source": v.source,
                    "rule": v.rule,
                    "reason": v.reason,
                }
                for v in self.variables
            ],
            "summary": self.summary,
        }

    def __rich_console__(self, console, options):
        from kdist.render import report_renderables

        yield from report_renderables(self)


def inspect(model_or_variables, distribution=None):
    """Report where each variable lives and how many bytes each device holds.

    A live model is read from its arrays' addressable shards. A model built
    abstractly (`kdist.abstract_model`, no values allocated) is computed from
    the layouts `distribution` gives (default: the current distribution).

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = make_model()
    report = kdist.inspect(model)
    rich.print(report)
    report.device_bytes()      # numpy array, bytes per device
    ```
    """
    import keras

    distribution = distribution or keras.distribution.distribution()
    variables = _classified_variables(model_or_variables)
    if all(_is_live(v) for v, _ in variables) and variables:
        devices = _live_devices(variables)
        rows = [_live_row(v, kind, devices, distribution) for v, kind in variables]
        mesh = _mesh_of(distribution, variables)
    else:
        if distribution is None:
            raise ValueError(
                "inspect() received variables without values and no distribution: pass "
                "distribution=kdist.preset(...) or set one with keras.distribution.set_distribution."
            )
        devices = [_device_name(d) for d in distribution.device_mesh.devices.ravel()]
        rows = [_abstract_row(v, kind, distribution) for v, kind in variables]
        mesh = dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))
    rows.sort(key=lambda r: (-r.nbytes, r.path))
    return ShardingReport(rows, devices, mesh)


def _classified_variables(obj):
    if isinstance(obj, (list, tuple)):
        return [(v, "trainable" if getattr(v, "trainable", True) else "non_trainable") for v in obj]
    seen, out = set(), []

    def add(variables, kind):
        for v in variables:
            if id(v) not in seen:
                seen.add(id(v))
                out.append((v, kind))

    add(getattr(obj, "metrics_variables", []), "metric")
    optimizer = getattr(obj, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        add(optimizer.variables, "optimizer")
    add(obj.trainable_variables, "trainable")
    add(obj.non_trainable_variables, "non_trainable")
    return out


def _is_live(variable):
    try:
        return hasattr(variable.value, "addressable_shards")
    except Exception:
        return False


def _device_name(device):
    return f"{device.platform}:{device.id}"


def _live_devices(variables):
    devices = {}
    for v, _ in variables:
        for d in v.value.sharding.device_set:
            devices[_device_name(d)] = d.id
    return sorted(devices, key=devices.get)


def _live_row(variable, kind, devices, distribution):
    value = variable.value
    index = {d: i for i, d in enumerate(devices)}
    device_bytes = np.zeros(len(devices), dtype=np.int64)
    for shard in value.addressable_shards:
        device_bytes[index[_device_name(shard.device)]] += shard.data.nbytes
    sharding = value.sharding
    spec = tuple(getattr(sharding, "spec", ())) + (None,) * (len(value.shape) - len(getattr(sharding, "spec", ())))
    shard_shape = tuple(sharding.shard_shape(value.shape))
    replication = len(sharding.device_set) // max(1, _num_shards(value.shape, shard_shape))
    return VariableReport(
        variable.path, kind, tuple(value.shape), str(value.dtype), _plain(spec), shard_shape, replication, device_bytes,
        *_provenance(variable, distribution),
    )


def _abstract_row(variable, kind, distribution):
    mesh = distribution.device_mesh
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    layout = distribution.get_variable_layout(variable)
    spec = tuple(layout.axes) if hasattr(layout, "axes") else tuple(layout.spec)
    shape = tuple(variable.shape)
    spec = spec + (None,) * (len(shape) - len(spec))
    split = [_split(a, sizes) for a in spec]
    shard_shape = tuple(math.ceil(d / s) for d, s in zip(shape, split))
    n = math.prod(mesh.shape)
    replication = n // math.prod(split)
    itemsize = np.dtype(_dtype(variable)).itemsize
    device_bytes = np.full(n, math.prod(shard_shape) * itemsize, dtype=np.int64)
    return VariableReport(
        variable.path, kind, shape, _dtype(variable), _plain(spec), shard_shape, replication, device_bytes,
        *_provenance(variable, distribution),
    )


def _provenance(variable, distribution):
    placement = getattr(distribution, "placements", {}).get(variable.path)
    if placement is None:
        return ("", "", "")
    return (placement.source, placement.rule.pattern if placement.rule else "", placement.reason)


def _split(axis, sizes):
    names = axis if isinstance(axis, tuple) else (axis,)
    return math.prod(sizes[a] for a in names if a is not None)


def _num_shards(shape, shard_shape):
    return math.prod(math.ceil(d / s) if s else 1 for d, s in zip(shape, shard_shape))


def _dtype(variable):
    return str(np.dtype(variable.dtype))


def _plain(spec):
    return tuple(tuple(a) if isinstance(a, (tuple, list)) else a for a in spec)


def _mesh_of(distribution, variables):
    if distribution is not None:
        return dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))
    return {"devices": len(_live_devices(variables))}


def _share(variables):
    total = sum(v.nbytes for v in variables)
    return sum(v.nbytes for v in variables if v.sharded) / total if total else 0.0
