"""What `kdist.inspect` returns: a row per variable, bytes per device, and whole-model numbers."""

import dataclasses
import math
import re

import numpy as np

from kdist.errors import ArgumentError
from kdist.inspection.device_grid import DeviceGrid
from kdist.inspection.grid import grid_from_layout
from kdist.meshes.layout import is_sharded, spec_json, spec_text
from kdist.meshes.spec import ParallelDims
from kdist.model_state import KINDS
from kdist.render.inspection import report_html, report_renderables
from kdist.reporting import Report
from kdist.units import itemsize


@dataclasses.dataclass
class VariableReport:
    """Placement and memory of one variable.

    `device_bytes[i]` is what device `i` of the report's `devices` holds.
    `source` says where the layout came from: "rule", "fallback" (a rule's
    later candidate, or indivisible dimensions replicated; `reason` says why),
    "fsdp" (sharded by shape on the fsdp axis), "explicit", "layout_map" (a
    plain Keras LayoutMap key), "preset" (replicated by the preset: no model
    axis) or "default" (no rule matched: replicated). An optimizer slot
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
        return is_sharded(self.spec)

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
            "spec": spec_json(self.spec),
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
class ShardingReport(Report):
    """What `kdist.inspect` returns: print it, show it in a notebook, or export it.

    Example:

    ```python
    report = kdist.inspect(model)
    rich.print(report)              # variables grouped by layer, devices, summary, legend
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
            raise ArgumentError(f"Unknown kind {kind!r}; kinds are {', '.join(KINDS)} (or None for all).")
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
        except (re.error, TypeError) as e:
            raise ArgumentError(f"Invalid variable regex {pattern!r}: {e}.") from None
        keep = [v for v in self.variables if regex.search(v.path) or (v.slot_of and regex.search(v.slot_of))]
        return dataclasses.replace(self, variables=keep)

    def variable(self, path):
        """The `VariableReport` of `path`."""
        for v in self.variables:
            if v.path == path:
                return v
        close = [v.path for v in self.variables if str(path).split("/")[-1] in v.path][:5]
        raise KeyError(f"No variable {path!r} in the report." + (f" Similar paths: {close}." if close else ""))

    def grid(self, path, rows=None, cols=None):
        """A `GridView` of which slice of variable `path` each device holds (any rank)."""
        if self.mesh_grid is None:
            raise ArgumentError(
                "This report has no device mesh (single device or no NamedSharding): there is no grid to draw."
            )
        v = self.variable(path)
        mesh = DeviceGrid(
            ParallelDims.from_device_mesh(_Axes(tuple(self.mesh), tuple(self.mesh.values()))),
            list(self.devices),
            self.mesh_grid,
        )
        return grid_from_layout(v.path, v.shape, v.spec, mesh, rows, cols)

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

    def csv_rows(self):
        """One row per variable, with one bytes column per device."""
        return [
            {
                "path": v.path,
                "kind": v.kind,
                "shape": "x".join(map(str, v.shape)),
                "dtype": v.dtype,
                "spec": spec_text(v.spec, replicated="None"),
                "shard_shape": "x".join(map(str, v.shard_shape)),
                "replication": v.replication,
                "nbytes": v.nbytes,
                "source": v.source,
                "rule": v.rule,
                "reason": v.reason,
                "slot_of": v.slot_of,
                **{f"bytes:{d}": int(b) for d, b in zip(self.devices, v.device_bytes)},
            }
            for v in self.variables
        ]

    def renderables(self, width=80, limit=40):
        """The variables by layer, the devices, the summary, the notes and a legend, fitted to `width` columns."""
        return report_renderables(self, limit=limit, width=width)

    def _repr_html_(self):
        return report_html(self)

    def __repr__(self):
        s = self.summary
        mesh = ", ".join(f"{k}={v}" for k, v in self.mesh.items())
        return (
            f"<ShardingReport {self.source}: {s['num_variables']} variables on {s['num_devices']} devices "
            f"(mesh {mesh}), max {s['max_device_bytes']} bytes per device>"
        )


@dataclasses.dataclass(frozen=True)
class _Axes:
    axis_names: tuple
    shape: tuple


def _share(variables, predicate):
    total = sum(v.nbytes for v in variables)
    return sum(v.nbytes for v in variables if predicate(v)) / total if total else 0.0
