"""What `kdist.plan` returns: every candidate mesh with its estimates, ranked, and a recommendation."""

import dataclasses

from kdist.checks import shown
from kdist.errors import PlanError
from kdist.presets import build_preset
from kdist.render.plan import plan_renderables
from kdist.reporting import Report

MEMORY_TERMS = ("weights", "optimizer", "activations", "transient", "other")  # what `Candidate.peak` sums
TRANSIENT_TERMS = ("live_gradients", "loss", "backward", "gathered", "workspace")  # what `Candidate.transient` holds


@dataclasses.dataclass
class Candidate:
    """One mesh of the plan, with its per-device estimates.

    Bytes are per device (the fullest device). `peak` = weights + optimizer
    + activations + transient + other, at the step's memory peak (`phase`):
    `activations` are the forward's buffers kept for the backward pass,
    `transient` the gradients made so far (`live_gradients`), the loss's
    buffers (`loss`), backward temporaries (`backward`), all-gathered
    copies (`gathered`: FSDP's weights, an FFT's operand and output,
    activations a model axis gathers again) and,
    on a GPU where the peak is at a matrix product, its cuBLAS workspace
    (`workspace`);
    `other` the batch shard. `gradients` is the whole gradient state (the
    inspector's bytes), of which only `live_gradients`
    exist at the peak. `band` is (low, high) bytes: the peak times the spread
    of truth / estimate on configs like this one (`band_class`, e.g.
    "fsdp transformers": `kdist.planning.calibration.BANDS`), the top plus
    XLA:GPU's cuBLAS workspace (`memory_model.GEMM_WORKSPACE`: XLA's order may
    peak at a GEMM where the estimate's does not), widened where
    the estimate is unsure, or None; `band_why` says why it is wider or
    absent. `comm` maps each
    mesh axis to `{"size", "collectives": [{"kind", "of", "bytes", "count",
    "seconds"}, ...], "bytes": payload bytes per step, "seconds": alpha-beta
    time}`. `compiled` holds XLA's memory analysis when the plan was
    verified, with the "backend" it was compiled for.

    Step time, an estimate (docs/plan.md, "Step time"): `compute_seconds`
    (every kernel of the traced step at the target's roofline: `flops` and
    `hbm_bytes` per device), `exposed_comm_seconds` (the communication not
    hidden behind compute) and `step_seconds`, their sum; None where the
    step was not traced or the target's peaks are unknown (the CPU).
    """

    spec: str
    axes: dict
    valid: bool = True
    reason: str = ""
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    transient: int = 0
    other: int = 0
    comm: dict = dataclasses.field(default_factory=dict)
    fits: bool = None
    rank: int = None
    compiled: dict = None
    live_gradients: int = 0
    loss: int = 0
    backward: int = 0
    gathered: int = 0
    workspace: int = 0
    phase: str = None
    band: tuple = None
    band_class: str = ""
    band_why: str = ""
    compute_seconds: float = None
    exposed_comm_seconds: float = None
    flops: float = None
    hbm_bytes: float = None

    @property
    def peak(self):
        """Estimated peak bytes on one device: weights + optimizer + activations + transient + other."""
        return sum(getattr(self, term) for term in MEMORY_TERMS)

    @property
    def comm_seconds(self):
        return sum(c["seconds"] for c in self.comm.values())

    @property
    def step_seconds(self):
        """Estimated seconds per training step: compute + exposed communication (None without the target's peaks)."""
        if self.compute_seconds is None:
            return None
        return self.compute_seconds + self.exposed_comm_seconds

    @property
    def comm_bytes(self):
        return sum(c["bytes"] for c in self.comm.values())

    @property
    def shape(self):
        """ "data x fsdp x model [x expert]" sizes, e.g. "2x1x4"."""
        roles = ("data", "fsdp", "model", "expert") if "expert" in self.axes else ("data", "fsdp", "model")
        return "x".join(str(self.axes.get(r, 1)) for r in roles)

    @property
    def ratio(self):
        """Estimated / compiled peak, when verified (against XLA:CPU, which has no cuBLAS, less the workspace)."""
        if not self.compiled or not self.compiled.get("peak"):
            return None
        return (self.peak - self.workspace * (self.compiled.get("backend") == "cpu")) / self.compiled["peak"]

    def to_dict(self):
        return {
            "spec": self.spec,
            "axes": dict(self.axes),
            "valid": self.valid,
            "reason": self.reason,
            "rank": self.rank,
            "fits": self.fits,
            "bytes": {
                **{term: getattr(self, term) for term in ("weights", "gradients", *MEMORY_TERMS[1:])},
                **{term: getattr(self, term) for term in TRANSIENT_TERMS},
                "peak": self.peak,
            },
            "band": list(self.band) if self.band else None,
            "band_class": self.band_class,
            "band_why": self.band_why,
            "phase": self.phase,
            "comm": self.comm,
            "comm_seconds": self.comm_seconds,
            "step_estimate": {
                "compute_seconds": self.compute_seconds,
                "exposed_comm_seconds": self.exposed_comm_seconds,
                "step_seconds": self.step_seconds,
                "flops": self.flops,
                "hbm_bytes": self.hbm_bytes,
            },
            "compiled": self.compiled,
            "estimate_over_compiled": self.ratio,
        }


@dataclasses.dataclass
class Plan(Report):
    """What `kdist.plan` returns: the candidates, ranked, and a recommendation.

    Print it (the ranking, the recommendation and why), or use `to_dict()` /
    `to_json()` / `to_csv()`. `recommendation` is None when no candidate is
    valid or none fits `memory_per_device`; `advice` then says what would
    make one fit, and `suggestions` holds the numbers ("batch_size",
    "devices") it found.

    `target` names the accelerator the estimate is for ("H100", "gpu", ...),
    `memory_source` where `memory_per_device` came from, `margin` the
    fraction of it kept free (a candidate fits when its peak is at most
    `budget` = (1 - margin) x memory_per_device), `attention` what the
    layers were traced with and `remat` whether each layer is rematerialised.
    """

    model: str
    devices: int
    batch_size: int
    sequence_length: object  # an int, or {input name: length} (`kdist.plan`)
    optimizer: str
    memory_per_device: int
    bandwidth: float
    latency: float
    candidates: list
    recommendation: Candidate = None
    reason: str = ""
    advice: str = ""
    suggestions: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    rules: object = None
    target: str = "gpu"
    memory_source: str = ""
    margin: float = 0.0
    attention: str = ""
    remat: bool = False

    @property
    def budget(self):
        """Bytes a candidate's peak may reach and still fit: (1 - margin) x memory_per_device (None without one)."""
        return None if self.memory_per_device is None else int(self.memory_per_device * (1 - self.margin))

    def candidate(self, spec):
        """The candidate whose spec (e.g. "data=2,model=4") or shape (e.g. "2x1x4") is `spec`."""
        for c in self.candidates:
            if spec in (c.spec, c.shape):
                return c
        raise PlanError(
            f"The plan has no candidate {shown(spec)}; give a spec or shape of one of its candidates: "
            f"{[c.spec for c in self.candidates]}."
        )

    def preset(self, **kwargs):
        """`kdist.preset` of the recommendation, with the rules the plan used."""
        if self.recommendation is None:
            raise PlanError(f"The plan has no recommendation. {self.advice}")
        kwargs.setdefault("rules", self.rules)
        return build_preset(self.recommendation.spec, **kwargs)

    def to_dict(self):
        return {
            "model": self.model,
            "devices": self.devices,
            "batch_size": self.batch_size,
            "sequence_length": self.sequence_length,
            "optimizer": self.optimizer,
            "memory_per_device": self.memory_per_device,
            "memory_source": self.memory_source,
            "margin": self.margin,
            "budget": self.budget,
            "target": self.target,
            "attention": self.attention,
            "remat": self.remat,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "recommendation": self.recommendation.spec if self.recommendation else None,
            "reason": self.reason,
            "advice": self.advice,
            "suggestions": dict(self.suggestions),
            "notes": list(self.notes),
            "seconds": self.seconds,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def csv_rows(self):
        return [
            {
                "rank": c.rank,
                "spec": c.spec,
                "valid": c.valid,
                "fits": c.fits,
                **{t: getattr(c, t) for t in ("weights", "gradients", *MEMORY_TERMS[1:])},
                "peak": c.peak,
                "band_low": c.band[0] if c.band else None,
                "band_high": c.band[1] if c.band else None,
                "comm_seconds": c.comm_seconds,
                "comm_bytes": c.comm_bytes,
                "compute_seconds_est": c.compute_seconds,
                "exposed_comm_seconds_est": c.exposed_comm_seconds,
                "step_seconds_est": c.step_seconds,
                "compiled_peak": (c.compiled or {}).get("peak"),
                "reason": c.reason,
            }
            for c in self.candidates
        ]

    def renderables(self, width=80):
        return plan_renderables(self, width)

    def __repr__(self):
        best = self.recommendation.spec if self.recommendation else None
        n = len(self.candidates)
        return f"<Plan model={self.model!r} devices={self.devices} candidates={n} recommendation={best!r}>"
