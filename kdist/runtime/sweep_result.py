"""The result of `kdist.sweep`: one row per mesh shape, and where it ran."""

import dataclasses

import numpy as np

from kdist.jax_internals import MEMORY_FIELDS
from kdist.planning.targets import CPU_PROXY_RATIO
from kdist.render.plot import sweep_plot
from kdist.render.sweep import sweep_renderables
from kdist.reporting import Report

NO_ESTIMATE = "not requested"


@dataclasses.dataclass
class SweepRow:
    """One mesh shape of a sweep. Times are seconds, memory is bytes per device.

    `memory` is XLA's compiled memory analysis of the train step (argument,
    output, alias, temp, total = argument + output - alias + temp, and peak
    where jax reports it). `state_bytes` is what `kdist.inspect` counts for
    the weights and optimizer state on the fullest device. `losses` has one
    loss per step, warm-up steps first. `direct_step_time` is the median of the
    same compiled step timed in a bare loop, each bare step next to a timed one;
    `agreement` is the median over those pairs of `timed / bare`, minus 1. `loop_overhead_s` is the
    time per step the timing loop spends outside the timed calls. `estimate_step_time` is `kdist.plan`'s
    estimated step time for the mesh on `estimate_target` (an estimate; on fake CPU devices the measured
    time is a proxy and not comparable with it), `measured_over_estimate` their ratio.
    """

    mesh: str
    axes: dict = dataclasses.field(default_factory=dict)
    status: str = "ok"
    failure_stage: str = ""
    failure: str = ""
    step_times: list = dataclasses.field(default_factory=list)
    step_time: float = None
    step_time_iqr: float = None
    samples_per_s: float = None
    tokens_per_s: float = None
    build_s: float = None
    compile_s: float = None
    memory: dict = dataclasses.field(default_factory=dict)
    state_bytes: int = None
    estimate_bytes: int = None
    estimate_note: str = NO_ESTIMATE
    estimate_step_time: float = None
    estimate_target: str = ""
    losses: list = dataclasses.field(default_factory=list)
    direct_step_times: list = dataclasses.field(default_factory=list)
    direct_step_time: float = None
    agreement: float = None
    loop_overhead_s: float = None
    wall_s: float = 0.0
    fastest: bool = False

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def final_loss(self):
        return self.losses[-1] if self.losses else None

    @property
    def measured_over_estimate(self):
        """Measured / estimated step time, or None."""
        if not self.step_time or not self.estimate_step_time:
            return None
        return self.step_time / self.estimate_step_time

    @property
    def measured_s(self):
        """Seconds inside the measured steps."""
        return float(sum(self.step_times))

    @property
    def overhead_s(self):
        """Seconds this shape took outside its measured steps (build, compile, warm-up, checks)."""
        return self.wall_s - self.measured_s

    def to_dict(self):
        data = dataclasses.asdict(self)
        data.update(
            final_loss=self.final_loss,
            measured_s=self.measured_s,
            overhead_s=self.overhead_s,
            measured_over_estimate=self.measured_over_estimate,
        )
        return data


@dataclasses.dataclass
class SweepResult(Report):
    """What `kdist.sweep` returns: one `SweepRow` per mesh spec, and where it ran.

    Print it (a rich table, fastest shape marked), or save it with
    `to_csv`, `to_json` and `plot`.
    """

    rows: list
    machine: dict
    settings: dict
    wall_s: float

    @property
    def ok_rows(self):
        return [r for r in self.rows if r.ok]

    @property
    def failed_rows(self):
        return [r for r in self.rows if not r.ok]

    @property
    def fastest(self):
        """The successful row with the lowest median step time, or None."""
        return min(self.ok_rows, key=lambda r: r.step_time, default=None)

    def row(self, mesh):
        """The row of the spec `mesh`."""
        for r in self.rows:
            if r.mesh == mesh:
                return r
        raise KeyError(f"No row for mesh {mesh!r}; the sweep ran {[r.mesh for r in self.rows]}.")

    @property
    def measured_s(self):
        return sum(r.measured_s for r in self.rows)

    @property
    def overhead(self):
        """The sweep's own cost: wall time outside the measured steps."""
        return {
            "wall_s": self.wall_s,
            "measured_s": self.measured_s,
            "overhead_s": self.wall_s - self.measured_s,
            "overhead_share": (self.wall_s - self.measured_s) / self.wall_s if self.wall_s else 0.0,
            "loop_overhead_per_step_s": _mean([r.loop_overhead_s for r in self.ok_rows]),
        }

    @property
    def loss_spread(self):
        """Largest relative difference of any step's loss from the first successful shape's."""
        rows = [r for r in self.ok_rows if r.losses]
        if len(rows) < 2:
            return 0.0
        reference = np.array(rows[0].losses)
        scale = np.maximum(np.abs(reference), 1e-12)
        return float(max(np.max(np.abs(np.array(r.losses) - reference) / scale) for r in rows[1:]))

    @property
    def note(self):
        """What the times mean on the machine the sweep ran on."""
        m = self.machine
        if m["platform"] != "cpu":
            return f"{m['device_count']} {m['device_kind']} devices."
        return (
            f"{m['device_count']} CPU devices sharing {m['cpu_count']} CPU cores "
            f"({'fake devices' if m['fake_devices'] else 'host CPU'}): step times say nothing "
            "about accelerators. Compare losses and memory; time a real run on the target hardware."
        )

    @property
    def estimate_caption(self):
        """What the estimate column stands beside on CPU devices ("" elsewhere)."""
        if self.machine["platform"] != "cpu":
            return ""
        low, high = CPU_PROXY_RATIO["transformers"]
        return (
            "estimate: kdist.plan's peak for its default target (a GPU), beside XLA:CPU's compiled figure, a proxy "
            f"that ran {low:.1f}-{high:.1f}x the H100's for transformers."
        )

    @property
    def step_estimate_caption(self):
        """What the estimated step times are for, and on CPU devices what they stand beside ("" without them)."""
        targets = sorted({r.estimate_target for r in self.rows if r.estimate_step_time is not None})
        if not targets:
            return ""
        text = f"est. ms: kdist.plan's estimated step time on {'/'.join(targets)} (an estimate, not measured)"
        if self.machine["platform"] == "cpu":
            return text + "; the measured step ms here are CPU proxies, not comparable with it."
        return text + "; meas/est: measured / estimated."

    def to_dict(self):
        return {
            "note": self.note,
            "machine": self.machine,
            "settings": self.settings,
            "overhead": self.overhead,
            "fastest": self.fastest.mesh if self.fastest else None,
            "loss_spread": self.loss_spread,
            "rows": [r.to_dict() for r in self.rows],
        }

    def csv_rows(self):
        return [csv_record(r) for r in self.rows]

    def plot(self, path=None, title=None):
        """Step time and memory per mesh shape as a matplotlib figure; saved as PNG when `path` is given."""
        return sweep_plot(self, path, title)

    def renderables(self, width=80):
        return sweep_renderables(self, width)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _ms(seconds):
    return None if seconds is None else round(seconds * 1e3, 4)


def csv_record(row):
    return {
        "mesh": row.mesh,
        "axes": " ".join(f"{k}={v}" for k, v in row.axes.items()),
        "status": row.status,
        "fastest": row.fastest,
        "step_time_ms": _ms(row.step_time),
        "step_time_iqr_ms": _ms(row.step_time_iqr),
        "samples_per_s": row.samples_per_s,
        "tokens_per_s": row.tokens_per_s,
        "build_s": row.build_s,
        "compile_s": row.compile_s,
        **{f"memory_{k}_bytes": row.memory.get(k) for k in (*MEMORY_FIELDS, "total", "peak")},
        "state_bytes": row.state_bytes,
        "estimate_bytes": row.estimate_bytes,
        "estimate_note": row.estimate_note,
        "estimate_step_time_ms": _ms(row.estimate_step_time),
        "estimate_target": row.estimate_target,
        "measured_over_estimate": row.measured_over_estimate,
        "final_loss": row.final_loss,
        "losses": " ".join(f"{v:.6g}" for v in row.losses),
        "direct_step_time_ms": _ms(row.direct_step_time),
        "agreement": row.agreement,
        "loop_overhead_ms": _ms(row.loop_overhead_s),
        "wall_s": row.wall_s,
        "overhead_s": row.overhead_s,
        "failure_stage": row.failure_stage,
        "failure": row.failure,
    }
