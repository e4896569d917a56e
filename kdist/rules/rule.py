"""Layout rules: ordered (regex, axes) pairs written in terms of mesh roles.

A rule's axes name roles ("model", "data", "fsdp", "expert"), mesh axis names
or None, one entry per variable dimension. "..." stands for as many None as
the variable's rank needs, so `("...", "model")` shards the last dimension of
a kernel of any rank. A rule may list several candidate layouts: the first
whose sharded dimensions all divide by their mesh axes is used. When none
does, the first candidate is used with its indivisible dimensions replicated,
and the placement records why. Candidates naming a role the mesh lacks (say
"expert" on a data x model mesh) are passed over while another candidate
uses only the mesh's roles. Rules match whole paths (`re.fullmatch`) and
the first matching rule wins.
"""

import dataclasses
import re

from kdist.errors import RuleError
from kdist.parallel_dims import ROLES as _ROLE_NAMES

ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True)
class Rule:
    """One layout rule.

    Example:

    >>> rule = Rule(r".*/(query|key|value)/kernel", [(None, "model", None), (None, None, "model")])
    >>> rule.matches("block_0/attention/query/kernel")
    True

    Args:
        pattern: regex matched against the whole variable path.
        layouts: one layout (a tuple of axes) or a list of candidate layouts.
            An empty tuple replicates on purpose.
        note: why the rule exists, shown by the inspector and linter.
        family: the rule library the rule comes from (e.g. "llama"; several
            families sharing a rule are joined by ","), empty for user rules.
    """

    pattern: str
    layouts: tuple
    note: str = ""
    family: str = ""

    def __post_init__(self):
        layouts = self.layouts
        if isinstance(layouts, tuple) and all(_is_axis(a) for a in layouts):
            layouts = [layouts]
        layouts = tuple(tuple(_axis(a) for a in layout) for layout in layouts)
        if not layouts:
            raise RuleError(f"Rule {self.pattern!r} has no layout; use () to replicate.")
        for layout in layouts:
            if layout.count(ELLIPSIS) > 1:
                raise RuleError(f"Rule {self.pattern!r}: layout {layout} has more than one '...'.")
        try:
            compiled = re.compile(self.pattern)
        except re.error as e:
            raise RuleError(f"Rule {self.pattern!r} is not a valid regex: {e}.") from None
        object.__setattr__(self, "layouts", layouts)
        object.__setattr__(self, "_regex", compiled)

    @property
    def replicates(self):
        """True when the rule replicates on purpose (every layout shards nothing)."""
        return all(all(a in (None, ELLIPSIS) for a in layout) for layout in self.layouts)

    def matches(self, path):
        return self._regex.fullmatch(path) is not None

    def to_dict(self):
        data = {"pattern": self.pattern, "layouts": [list(layout) for layout in self.layouts]}
        if self.note:
            data["note"] = self.note
        if self.family:
            data["family"] = self.family
        return data

    @property
    def families(self):
        """The family names in `family`, as a tuple."""
        return tuple(f for f in self.family.split(",") if f)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one variable goes and why.

    `source` is "rule" (the rule's first layout fit), "fallback" (a later
    candidate, or indivisible dimensions replicated), "fsdp" (sharded on the
    fsdp axis by shape), "explicit" (the variable carried its own layout) or
    "default" (no rule matched: replicated).
    """

    path: str
    shape: tuple
    axes: tuple
    source: str
    rule: Rule = None
    reason: str = ""

    @property
    def sharded(self):
        return any(a is not None for a in self.axes)


class RuleSet:
    """An ordered list of rules; the first rule whose pattern matches a path wins.

    Example:

    ```python
    rules = kdist.RuleSet([
        (r".*/kernel", ("...", "model")),
        (r".*/bias", ()),
    ], name="mine")
    layout_map = rules.to_layout_map(kdist.mesh("2x4"), variables=model.variables)
    ```
    """

    def __init__(self, rules=(), name="custom"):
        self.name = name
        self.rules = tuple(r if isinstance(r, Rule) else Rule(*r) for r in rules)

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)

    def __add__(self, other):
        return RuleSet((*self.rules, *other.rules), name=f"{self.name}+{other.name}")

    def __repr__(self):
        return f"RuleSet(name={self.name!r}, rules={len(self.rules)})"

    def match(self, path):
        """The first rule whose pattern matches the whole `path`, or None."""
        return next((rule for rule in self.rules if rule.matches(path)), None)

    def place(self, path, shape, axis_sizes):
        """Choose axes for a variable of `shape` at `path` on a mesh with `axis_sizes`.

        Args:
            axis_sizes: role or mesh axis name -> (mesh axis name, size).
        """
        shape = tuple(shape)
        rule = self.match(path)
        if rule is None:
            return Placement(path, shape, (None,) * len(shape), "default", reason="no rule matched")
        return place_with_rule(rule, path, shape, axis_sizes)

    def to_layout_map(self, device_mesh, variables=None, axis_sizes=None):
        """Export as a plain `keras.distribution.LayoutMap`.

        With `variables` (e.g. `model.variables`, built abstractly or not), the
        map has one exact key per variable with its resolved layout, shape
        fallbacks included: this always works. Without, it has one anchored
        regex key per rule that excludes the paths of earlier rules, so that
        first-match-wins order survives Keras's "several matches is an error"
        lookup; each rule contributes its first layout only (Keras cannot fall
        back by shape), and a rule whose layout uses "..." raises RuleError,
        since a LayoutMap key cannot depend on the variable's rank.
        """
        from keras.distribution import LayoutMap

        from kdist.rules.binding import bind_mesh

        axis_sizes = axis_sizes or bind_mesh(device_mesh)
        layout_map = LayoutMap(device_mesh)
        if variables is not None:
            for v in variables:
                placement = self.place(v.path, v.shape, axis_sizes)
                if placement.source != "default":
                    layout_map[v.path] = placement.axes
            return layout_map
        earlier = []
        for rule in self.rules:
            exclude = "".join(f"(?!(?:{p})$)" for p in earlier)
            layout = rule.layouts[0]
            if ELLIPSIS in layout:
                raise RuleError(
                    f"Rule {rule.pattern!r} has layout {layout}, whose '...' depends on each variable's rank, "
                    "which a LayoutMap key cannot express. Pass variables=model.variables to export one "
                    "exact key per variable."
                )
            layout_map[f"^{exclude}(?:{rule.pattern})$"] = bind_layout(rule, layout, axis_sizes)
            earlier.append(rule.pattern)
        return layout_map

    def to_dict(self):
        return {"name": self.name, "rules": [r.to_dict() for r in self.rules]}

    def save(self, path):
        """Write the rule set to a `.json` or `.toml` file (see `kdist.rules.load_rules`)."""
        from kdist.rules.files import save_rules

        save_rules(self, path)

    @classmethod
    def from_dict(cls, data, source="rule set"):
        """Build a rule set from plain data: `{"name": ..., "rules": [{"pattern", "layouts", "note"?, "family"?}]}`.

        `source` names the input in errors (e.g. a file path).
        """
        from kdist.rules.files import rules_from_data

        return rules_from_data(data, source)


def place_with_rule(rule, path, shape, axis_sizes):
    fitting = [layout for layout in rule.layouts if fits_rank(layout, len(shape))]
    if not fitting:
        raise RuleError(
            f"Rule {rule.pattern!r} matches variable {path!r} of shape {shape}, but "
            f"its layouts {list(rule.layouts)} have more axes than the variable's "
            f"rank {len(shape)}. Give the rule a layout of rank {len(shape)} or "
            "narrow its pattern."
        )
    tried = []
    usable = [layout for layout in fitting if not _missing_roles(layout, axis_sizes)]
    if usable and len(usable) < len(fitting):
        for layout in fitting:
            if layout not in usable:
                missing = ", ".join(repr(r) for r in _missing_roles(layout, axis_sizes))
                tried.append(f"layout {layout}: the mesh has no {missing} axis")
        fitting = usable
    skipped = len(tried)  # candidates passed over for a role the mesh lacks
    first = None  # (axes, indivisible dimensions) of the first candidate tried
    for layout in fitting:
        axes = bind_layout(rule, expand_layout(layout, len(shape)), axis_sizes)
        bad = _indivisible(shape, axes, axis_sizes)
        if not bad:
            source = "rule" if layout is rule.layouts[0] else "fallback"
            reason = "; ".join(tried)
            return Placement(path, shape, axes, source, rule, reason)
        tried.append(_describe(axes, bad, shape, axis_sizes))
        first = first or (axes, bad)
    # No candidate divides: the first one, with its indivisible dimensions replicated.
    axes, bad = first
    axes = tuple(None if i in bad else a for i, a in enumerate(axes))
    reason = "; ".join([*tried[:skipped], tried[skipped] + ": replicated those dimensions"])
    return Placement(path, shape, axes, "fallback", rule, reason)


def _missing_roles(layout, axis_sizes):
    return [a for a in layout if a in _ROLE_NAMES and a not in axis_sizes]


def bind_layout(rule, layout, axis_sizes):
    bound = []
    for axis in layout:
        if axis is None or axis == ELLIPSIS:
            bound.append(axis)
        elif axis in axis_sizes:
            bound.append(axis_sizes[axis][0])
        elif axis in _ROLE_NAMES:
            bound.append(None)  # the mesh has no such role: nothing to shard over
        else:
            raise RuleError(
                f"Rule {rule.pattern!r} uses axis {axis!r}, which is neither a role "
                f"({', '.join(_ROLE_NAMES)}) nor an axis of the mesh "
                f"({', '.join(sorted({n for n, _ in axis_sizes.values()}))})."
            )
    return tuple(bound)


def _indivisible(shape, axes, axis_sizes):
    sizes = {name: size for name, size in axis_sizes.values()}
    return [i for i, a in enumerate(axes) if a is not None and shape[i] % sizes[a]]


def _describe(axes, bad, shape, axis_sizes):
    sizes = {name: size for name, size in axis_sizes.values()}
    parts = [f"dim {i} ({shape[i]}) not divisible by {axes[i]}={sizes[axes[i]]}" for i in bad]
    return f"layout {axes}: " + ", ".join(parts)


def expand_layout(layout, rank):
    if ELLIPSIS not in layout:
        return layout + (None,) * (rank - len(layout))
    i = layout.index(ELLIPSIS)
    fill = rank - (len(layout) - 1)
    return layout[:i] + (None,) * fill + layout[i + 1 :]


def fits_rank(layout, rank):
    return len(layout) - (ELLIPSIS in layout) <= rank


def _is_axis(a):
    return a is None or isinstance(a, str)


def _axis(a):
    if not _is_axis(a):
        raise RuleError(f"A layout axis must be a string or None; received {a!r}.")
    return a

