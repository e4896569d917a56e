"""Parsing and validating mesh specs such as "2x4", "dp" or "data=-1,model=2".

A spec names parallelism degrees by role. The roles are:

- `data`: the batch is split over it; weights are replicated along it.
- `fsdp`: the batch is split over it and weights and optimizer state are
  sharded along it too (ZeRO-3 style).
- `model`: weights are split over it by layout rules (tensor parallelism).
- `expert`: mixture-of-experts weights are split over it by layout rules.
"""

import dataclasses
import math
import re

from kdist.errors import SpecError

ROLES = ("data", "fsdp", "model", "expert")
BATCH_ROLES = ("data", "fsdp")
SPEC_FORMS = (
    '"NxM" (data x model, e.g. "2x4"), "NxFxM" (data x fsdp x model), '
    '"dp", "tp", "fsdp", named axes such as "data=2,model=4" (one size may be '
    '-1 to absorb the remaining devices; names: data, fsdp, model, expert), '
    'or "auto"'
)
AUTO_NEEDS = (
    'The "auto" spec chooses a mesh with the planner, which needs the model and the batch size: '
    'pass them, e.g. kdist.preset("auto", model=model, batch_size=64) (see kdist.plan), '
    'or pick an explicit spec such as "2x4" or "dp".'
)
_SIZE = r"-?\d+"
_GRID = re.compile(rf"{_SIZE}(x{_SIZE}){{1,2}}")
_NAMED = re.compile(rf"[a-z_]+={_SIZE}(,[a-z_]+={_SIZE})*")


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """Validated parallelism degrees of a mesh, one per role, in mesh-axis order.

    Example:

    >>> ParallelDims.parse("2x4", 8)
    ParallelDims(spec='2x4', axes=(('data', 2), ('model', 4)))
    >>> ParallelDims.parse("data=-1,model=2", 8).sizes
    {'data': 4, 'model': 2}
    """

    spec: str
    axes: tuple

    @classmethod
    def parse(cls, spec, num_devices):
        """Parse `spec` for `num_devices` devices. Raises SpecError when it cannot fit."""
        if not isinstance(spec, str):
            raise SpecError(f"A mesh spec must be a string; received {spec!r}. Use {SPEC_FORMS}.")
        text = spec.strip().lower().replace(" ", "")
        if text == "auto":
            raise SpecError(AUTO_NEEDS)
        if text == "dp":
            axes = [("data", -1)]
        elif text == "tp":
            axes = [("model", -1)]
        elif text == "fsdp":
            axes = [("fsdp", -1)]
        elif _GRID.fullmatch(text):
            sizes = [int(s) for s in text.split("x")]
            roles = ("data", "model") if len(sizes) == 2 else ("data", "fsdp", "model")
            axes = list(zip(roles, sizes))
        elif _NAMED.fullmatch(text):
            axes = [(name, int(size)) for name, size in (p.split("=") for p in text.split(","))]
        else:
            raise SpecError(f"Malformed mesh spec {spec!r}. Use {SPEC_FORMS}.")
        return cls(spec, _resolve(spec, axes, num_devices))

    @property
    def sizes(self):
        """Role -> degree."""
        return dict(self.axes)

    @property
    def roles(self):
        return tuple(role for role, _ in self.axes)

    @property
    def shape(self):
        return tuple(size for _, size in self.axes)

    @property
    def num_devices(self):
        return math.prod(self.shape)


def _resolve(spec, axes, num_devices):
    names = [name for name, _ in axes]
    unknown = [name for name in names if name not in ROLES]
    if unknown:
        raise SpecError(
            f"Mesh spec {spec!r} names unknown axis {unknown[0]!r}. "
            f"Axis names are {', '.join(ROLES)}."
        )
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise SpecError(f"Mesh spec {spec!r} names axis {duplicated[0]!r} twice.")
    bad = [size for _, size in axes if size == 0 or size < -1]
    if bad:
        raise SpecError(
            f"Mesh spec {spec!r} has axis size {bad[0]}; sizes must be positive "
            "(or -1 for one axis that absorbs the remaining devices)."
        )
    absorbing = [name for name, size in axes if size == -1]
    if len(absorbing) > 1:
        raise SpecError(
            f"Mesh spec {spec!r} has -1 on axes {absorbing}; at most one axis may be -1."
        )
    fixed = math.prod(size for _, size in axes if size != -1)
    if absorbing:
        if num_devices % fixed:
            raise SpecError(
                f"Mesh spec {spec!r}: the fixed axes multiply to {fixed}, which does "
                f"not divide the {num_devices} devices, so -1 cannot absorb the rest."
            )
        axes = [(name, num_devices // fixed if size == -1 else size) for name, size in axes]
    elif fixed != num_devices:
        hint = (
            f" Only {num_devices} devices exist: on CPU, call kdist.fake_devices({fixed}) "
            "before importing jax or keras."
            if fixed > num_devices
            else ""
        )
        raise SpecError(
            f"Mesh spec {spec!r} asks for {fixed} devices, but the mesh has "
            f"{num_devices}. Use sizes that multiply to {num_devices} (e.g. "
            f'"{_example(num_devices)}") or pass devices= with {fixed} devices.{hint}'
        )
    return tuple(axes)


def _example(num_devices):
    model = 2 if num_devices % 2 == 0 and num_devices > 1 else 1
    return f"{num_devices // model}x{model}"
