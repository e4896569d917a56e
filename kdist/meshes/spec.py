"""Mesh specs: the one parser of spec strings, and `ParallelDims`, the one mesh value type.

Parsing needs no devices: `parse_spec` checks the syntax ("2x4", "2x2x2",
"dp", "tp", "fsdp", "data=-1,model=2"), the axis names and the sizes, and
keeps a -1 size unresolved. `MeshSpec.resolve(num_devices)` then fits it to
a device count and returns a `ParallelDims`: axis names, sizes and roles, no
devices. The linter, the inspector's abstract path, the planner and the
placement engine all work on `ParallelDims`; a Keras `DeviceMesh` converts
to it with `ParallelDims.from_device_mesh`.
"""

import collections.abc
import dataclasses
import functools
import math
import re

from kdist.checks import MAX_DEVICES, is_int, shown
from kdist.errors import ArgumentTypeError, SpecError
from kdist.meshes.roles import BATCH_ROLES, ROLES, Role, role_of_name

SPEC_FORMS = (
    '"NxM" (data x model, e.g. "2x4"), "NxFxM" (data x fsdp x model), '
    '"dp", "tp", "fsdp", named axes such as "data=2,model=4" (one size may be '
    "-1 to absorb the remaining devices; names: data, fsdp, model, expert), "
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
_SHORTHANDS = {"dp": (("data", -1),), "tp": (("model", -1),), "fsdp": (("fsdp", -1),)}


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """A parsed spec: roles and sizes in mesh-axis order, one size possibly -1 (absorb the rest).

    Example:

    >>> parse_spec("data=-1,model=2").resolve(8).sizes
    {'data': 4, 'model': 2}
    """

    text: str
    axes: tuple

    @property
    def absorbing(self):
        """The role whose size is -1, or None."""
        return next((role for role, size in self.axes if size == -1), None)

    @property
    def fixed_devices(self):
        """The product of the sizes that are given (not -1)."""
        return math.prod(size for _, size in self.axes if size != -1)

    def devices_needed(self, absorb=8):
        """Devices this spec needs: its size, or the first multiple of its fixed part >= `absorb` with a -1 axis."""
        fixed = self.fixed_devices
        return fixed if self.absorbing is None else fixed * max(1, -(-absorb // fixed))

    def resolve(self, num_devices):
        """The `ParallelDims` of this spec on `num_devices` devices. Raises SpecError when it cannot fit."""
        spec, fixed = self.text, self.fixed_devices
        axes = list(self.axes)
        if self.absorbing is not None:
            if num_devices % fixed:
                raise SpecError(
                    f"Mesh spec {spec!r}: the fixed axes multiply to {fixed}, which does "
                    f"not divide the {_devices(num_devices)}, so -1 cannot absorb the rest."
                )
            axes = [(role, num_devices // fixed if size == -1 else size) for role, size in axes]
        elif fixed != num_devices:
            hint = (
                f" Only {_devices(num_devices)} exist{'s' if num_devices == 1 else ''}: on CPU, call "
                f"kdist.fake_devices({fixed}) before importing jax or keras (or pass --fake-devices {fixed})."
                if fixed > num_devices
                else ""
            )
            raise SpecError(
                f"Mesh spec {spec!r} asks for {_devices(fixed)}, but the mesh has "
                f"{num_devices}. Use sizes that multiply to {num_devices} (e.g. "
                f'"{_example(num_devices)}") or pass devices= with {fixed} devices.{hint}'
            )
        return ParallelDims(spec, tuple(axes))


def parse_spec(spec):
    """Parse a mesh spec string without devices. Raises SpecError naming the spec and the accepted forms."""
    if not isinstance(spec, str):
        raise SpecError(f"A mesh spec must be a string; received {shown(spec)}. Use {SPEC_FORMS}.")
    text = spec.strip().lower().replace(" ", "")
    if text == "auto":
        raise SpecError(AUTO_NEEDS)
    if text in _SHORTHANDS:
        axes = _SHORTHANDS[text]
    elif _GRID.fullmatch(text):
        sizes = [int(s) for s in text.split("x")]
        roles = ("data", "model") if len(sizes) == 2 else ("data", "fsdp", "model")
        axes = tuple(zip(roles, sizes))
    elif _NAMED.fullmatch(text):
        axes = tuple((name, int(size)) for name, size in (p.split("=") for p in text.split(",")))
    else:
        raise SpecError(f"Malformed mesh spec {spec!r}. Use {SPEC_FORMS}.")
    _check_axes(spec, axes)
    return MeshSpec(spec, axes)


@dataclasses.dataclass(frozen=True)
class ParallelDims:
    """Validated parallelism degrees of a mesh, one per axis, in mesh-axis order.

    `axes` holds `(role, size)` pairs; a role is "data", "fsdp", "model",
    "expert", or None for an axis that plays none (a user's mesh axis
    named "tensor"). `axis_names` are the mesh's axis names (by default the
    roles). Build one from a spec with `ParallelDims.parse` or
    `kdist.meshes.parse_spec`, from role sizes with `from_sizes`, or from a
    Keras mesh with `from_device_mesh`.

    Example:

    >>> dims = ParallelDims.parse("2x4", 8)
    >>> dims.sizes, dims.model_enabled, dims.fsdp_enabled
    ({'data': 2, 'model': 4}, True, False)
    >>> ParallelDims.parse("data=-1,model=2", 8).shape
    (4, 2)
    """

    spec: str
    axes: tuple
    axis_names: tuple = None

    def __post_init__(self):
        axes = self._pairs(self.axes)
        for role, size in axes:
            if role is not None and role not in ROLES:
                raise SpecError(f"Mesh axis role {role!r} is not one of {', '.join(ROLES)} (or None).")
            if not is_int(size) or size < 1:
                raise SpecError(f"Mesh axis sizes must be positive integers; received {shown(size)} for {shown(role)}.")
        roles = [r for r, _ in axes if r is not None]
        if len(set(roles)) != len(roles):
            raise SpecError(f"Mesh axes {axes} give a role to more than one axis.")
        names = self.axis_names
        if names is not None:
            names = tuple(names)
            if (
                len(names) != len(axes)
                or len(set(names)) != len(names)
                or not all(isinstance(n, str) and n for n in names)
            ):
                raise SpecError(
                    f"Mesh spec {self.spec!r} has axes {list(self.roles_of(axes))}, so axis_names needs "
                    f"{len(axes)} distinct names (non-empty strings); received axis_names={shown(self.axis_names)}."
                )
            if names == tuple(r for r, _ in axes):
                names = None
        object.__setattr__(self, "axes", tuple((r, int(s)) for r, s in axes))
        object.__setattr__(self, "axis_names", names)

    @staticmethod
    def _pairs(axes):
        try:
            pairs = tuple(tuple(a) for a in axes)
        except TypeError:
            pairs = None
        if isinstance(axes, str) or pairs is None or not all(len(p) == 2 for p in pairs):
            raise SpecError(
                f"ParallelDims axes must be (role, size) pairs such as (('data', 2), ('model', 4)); "
                f"received axes={shown(axes)}."
            )
        return pairs

    @staticmethod
    def roles_of(axes):
        return tuple(r for r, _ in axes)

    @classmethod
    def parse(cls, spec, num_devices):
        """Parse `spec` for `num_devices` devices. Raises SpecError when it cannot fit."""
        return parse_spec(spec).resolve(num_devices)

    @classmethod
    def from_sizes(cls, sizes):
        """From role -> size in mesh-axis order, e.g. {"data": 2, "model": 4}; its spec is "data=2,model=4"."""
        if not isinstance(sizes, collections.abc.Mapping):
            raise ArgumentTypeError(
                "sizes must be a mapping of mesh role to size, e.g. {'data': 2, 'model': 4}; "
                f"received {shown(sizes)}."
            )
        if not sizes:
            raise SpecError("sizes names no mesh axis; give at least one, e.g. {'data': 8}. Received: {}.")
        return cls(",".join(f"{r}={s}" for r, s in sizes.items()), tuple(sizes.items()))

    @classmethod
    def from_device_mesh(cls, device_mesh, roles=None):
        """From a `keras.distribution.DeviceMesh` (or anything with `axis_names` and `shape`).

        Roles default to the axis names where they name a role ("batch" counts as "data").
        """
        names, shape = tuple(device_mesh.axis_names), tuple(int(s) for s in device_mesh.shape)
        roles = tuple(roles) if roles is not None else tuple(role_of_name(n) for n in names)
        seen = set()
        roles = tuple(r if r not in seen and not seen.add(r) else None for r in roles)  # first axis keeps a role
        return cls(",".join(f"{n}={s}" for n, s in zip(names, shape)), tuple(zip(roles, shape)), names)

    # --- Axes -------------------------------------------------------------------------------------

    # The axes' derived views are cached: Keras asks for the batch axes on every step's input.
    @functools.cached_property
    def roles(self):
        return self.roles_of(self.axes)

    @property
    def shape(self):
        return tuple(size for _, size in self.axes)

    @functools.cached_property
    def names(self):
        """Mesh axis names, in order: `axis_names`, or the roles."""
        return self.axis_names or tuple(r or f"axis{i}" for i, r in enumerate(self.roles))

    @property
    def sizes(self):
        """Role -> degree, for the axes that have a role."""
        return {role: size for role, size in self.axes if role is not None}

    @property
    def axis_sizes(self):
        """Mesh axis name -> size."""
        return dict(zip(self.names, self.shape))

    @property
    def num_devices(self):
        return math.prod(self.shape)

    def size_of(self, role):
        """The size of the axis playing `role`; 1 when the mesh has none."""
        return self.sizes.get(role, 1)

    def name_of(self, role):
        """The mesh axis name playing `role`, or None."""
        return next((n for n, r in zip(self.names, self.roles) if r == role), None)

    def bind(self, axis):
        """The mesh axis name a rule's axis (a role or a mesh axis name) refers to, or None."""
        if axis in self.axis_sizes:
            return axis
        return self.name_of(role_of_name(axis) or axis)

    def bind_spec(self, spec):
        """A layout's axis names as this mesh's axes: the one place a layout's names are resolved.

        Each name that is a mesh axis stays; a role name or Keras's "batch"
        (the data role: Keras's `DataParallel`, `ModelParallel` examples and
        keras-hub's `get_layout_map` call the data axis "batch") becomes the
        axis playing that role, or None when no axis plays it (nothing to
        split over); any other name is kept, for the caller to report.

        >>> ParallelDims.parse("2x4", 8).bind_spec(("model", "batch"))
        ('model', 'data')
        >>> ParallelDims.parse("fsdp", 8).bind_spec(("model", None))
        (None, None)
        """
        return tuple(self._bind_entry(entry) for entry in spec)

    def _bind_entry(self, entry):
        if entry is None:
            return None
        if isinstance(entry, (tuple, list)):
            bound = [b for b in (self._bind_entry(a) for a in entry) if b is not None]
            return None if not bound else bound[0] if len(bound) == 1 else tuple(bound)
        if entry in self.axis_sizes or role_of_name(entry) is None:
            return entry
        return self.name_of(role_of_name(entry))

    # --- What is enabled --------------------------------------------------------------------------

    @property
    def data_enabled(self):
        return self.size_of(Role.DATA) > 1

    @property
    def fsdp_enabled(self):
        return self.size_of(Role.FSDP) > 1

    @property
    def model_enabled(self):
        return self.size_of(Role.MODEL) > 1

    @property
    def expert_enabled(self):
        return self.size_of(Role.EXPERT) > 1

    @functools.cached_property
    def batch_axes(self):
        """Names of the axes the batch is split over (data, then fsdp, in mesh order)."""
        return tuple(n for n, r in zip(self.names, self.roles) if r in BATCH_ROLES)

    @functools.cached_property
    def num_batch_shards(self):
        """Into how many pieces the batch is split."""
        return math.prod(self.axis_sizes[n] for n in self.batch_axes)

    @property
    def weight_axes(self):
        """Axes of size > 1 over which weights are meant to be split: every axis but the data axis."""
        return tuple(n for n, s, r in zip(self.names, self.shape, self.roles) if s > 1 and r != Role.DATA)

    def describe(self):
        """ "data=2, model=4"."""
        return ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))


def _check_axes(spec, axes):
    names = [name for name, _ in axes]
    unknown = [name for name in names if name not in ROLES]
    if unknown:
        raise SpecError(f"Mesh spec {spec!r} names unknown axis {unknown[0]!r}. Axis names are {', '.join(ROLES)}.")
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
        raise SpecError(f"Mesh spec {spec!r} has -1 on axes {absorbing}; at most one axis may be -1.")
    fixed = math.prod(size for _, size in axes if size != -1)
    if fixed > MAX_DEVICES:
        raise SpecError(
            f"Mesh spec {spec!r} asks for {fixed} devices, more than the {MAX_DEVICES} kdist accepts; check for a typo."
        )


def _devices(n):
    return f"{n} device" if n == 1 else f"{n} devices"


def _example(num_devices):
    model = 2 if num_devices % 2 == 0 and num_devices > 1 else 1
    return f"{num_devices // model}x{model}"


def as_dims(mesh, num_devices=None):
    """The `ParallelDims` of `mesh`: a ParallelDims, a spec string, role sizes or a Keras `DeviceMesh`.

    A spec with a -1 axis ("dp", "data=-1,model=2") resolves against
    `num_devices`; fixed sizes ("2x4") need no device count.
    """
    if isinstance(mesh, ParallelDims):
        return mesh
    if isinstance(mesh, str):
        parsed = parse_spec(mesh)
        if num_devices is None and parsed.absorbing is not None:
            raise SpecError(f"Mesh spec {mesh!r} has an axis that absorbs the devices (-1): give the device count too.")
        return parsed.resolve(parsed.fixed_devices if num_devices is None else num_devices)
    if isinstance(mesh, dict):
        return ParallelDims.from_sizes(mesh)
    if hasattr(mesh, "axis_names") and hasattr(mesh, "shape"):
        return ParallelDims.from_device_mesh(mesh)
    raise SpecError(
        "A mesh must be a spec string such as '2x4', a kdist.ParallelDims or a keras.distribution.DeviceMesh; "
        f"received {type(mesh).__name__} {shown(mesh)}."
    )
