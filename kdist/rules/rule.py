"""Layout rules as plain data: ordered (regex, axes) pairs written in terms of mesh roles.

A rule's axes name roles ("model", "data", "fsdp", "expert"), mesh axis names
or None, one entry per variable dimension. "..." stands for as many None as
the variable's rank needs, so `("...", "model")` shards the last dimension of
a kernel of any rank. A rule may list several candidate layouts: the first
whose sharded dimensions all divide by their mesh axes is used. When none
does, the first candidate is used with its indivisible dimensions replicated,
and the placement records why. Candidates naming a role the mesh lacks (say
"expert" on a data x model mesh) are passed over while another candidate
uses only the mesh's roles. Rules match whole paths (`re.fullmatch`) and the
first matching rule wins. A rule whose pattern ends in "output" also lays out
the activation of the layers it matches (Keras asks for "<layer path>/output").
"""

import dataclasses
import re

from kdist.checks import shown
from kdist.errors import RuleError
from kdist.meshes.layout import ELLIPSIS, expand_layout, fits_rank, indivisible
from kdist.meshes.roles import ROLES
from kdist.meshes.spec import as_dims
from kdist.rules.layout_map import to_layout_map
from kdist.rules.placement import Placement

_TOP_KEYS = {"name", "rules"}
_RULE_KEYS = {"pattern", "layouts", "note", "family", "follows", "fsdp_dim"}
# How a variable's axes derive from the sibling it follows (e.g. "kernel" in the same layer):
FOLLOW_MODES = {
    "trailing": "its dimensions are the sibling's last ones (a bias of a kernel): the sibling's last axes",
    "leading": "its dimensions are the sibling's first ones, then a rank (lora_kernel_a): those axes, then None",
    "last": "a rank, then the sibling's last dimension (lora_kernel_b): None, then the sibling's last axis",
}


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
        follows: `(sibling, mode)`: lay the variable out like the variable
            `sibling` of the same layer (e.g. "kernel"), as `mode` says
            ("trailing": a bias takes its kernel's last axes; "leading" and
            "last": LoRA's `lora_kernel_a` and `lora_kernel_b`). The layouts
            apply when the sibling has not been placed.
        fsdp_dim: the dimension an fsdp axis takes (negative counts from the
            end) when the layout leaves it free and it divides; otherwise, and
            when None, the placer takes the largest free dimension that divides.
    """

    pattern: str
    layouts: tuple
    note: str = ""
    family: str = ""
    follows: tuple = ()
    fsdp_dim: int = None

    def __post_init__(self):
        if not isinstance(self.pattern, str):
            raise RuleError(
                "A rule's pattern must be a regex string; "
                f"received {type(self.pattern).__name__} {shown(self.pattern)}."
            )
        for name in ("note", "family"):
            if not isinstance(getattr(self, name), str):
                raise RuleError(
                    f"Rule {shown(self.pattern)}: {name} must be a string; received {getattr(self, name)!r}."
                )
        try:
            compiled = re.compile(self.pattern)
        except re.error as e:
            raise RuleError(f"Rule {self.pattern!r} is not a valid regex: {e}.") from None
        follows = tuple(self.follows) if isinstance(self.follows, (tuple, list)) else self.follows
        if follows is not None and not (isinstance(follows, tuple) and (follows == () or _is_follow_pair(follows))):
            raise RuleError(
                f"Rule {self.pattern!r}: follows must be (sibling name, mode) with a mode in {sorted(FOLLOW_MODES)}, "
                f"e.g. ('kernel', 'trailing'); received {shown(self.follows)}."
            )
        if self.fsdp_dim is not None and (isinstance(self.fsdp_dim, bool) or not isinstance(self.fsdp_dim, int)):
            raise RuleError(
                f"Rule {self.pattern!r}: fsdp_dim must be a dimension index (an int, negative from the end) or "
                f"None; received {shown(self.fsdp_dim)}."
            )
        object.__setattr__(self, "follows", follows)
        object.__setattr__(self, "layouts", _candidates(self.pattern, self.layouts))
        object.__setattr__(self, "_regex", compiled)

    @property
    def replicates(self):
        """True when the rule replicates on purpose (every layout shards nothing)."""
        return all(all(a in (None, ELLIPSIS) for a in layout) for layout in self.layouts)

    @property
    def families(self):
        """The family names in `family`, as a tuple."""
        return tuple(f for f in self.family.split(",") if f)

    @property
    def for_activations(self):
        """Whether the rule is written for layer outputs (its pattern ends in "output")."""
        return self.pattern.endswith("output")

    def matches(self, path):
        return self._regex.fullmatch(path) is not None

    def bind(self, layout, dims):
        """`layout`'s axes as mesh axis names of `dims`; roles the mesh lacks bind to None (replicated)."""
        bound = dims.bind_spec(layout)  # a role the mesh lacks binds to None: nothing to shard over
        for axis in bound:
            if axis is not None and axis != ELLIPSIS and axis not in dims.axis_sizes:
                raise RuleError(
                    f"Rule {self.pattern!r} uses axis {axis!r}, which is neither a role "
                    f"({', '.join(ROLES)}) nor an axis of the mesh ({', '.join(dims.names)})."
                )
        return bound

    def place(self, path, shape, dims, placed=None):
        """The `Placement` this rule gives a variable of `shape` at `path` on mesh `dims`.

        A rule that follows a sibling takes its axes from `placed` (path -> the
        axes variables were given so far) when the sibling is there; otherwise,
        and for every other rule, the first candidate layout that divides.
        """
        if self.follows and placed is not None:
            sibling = path.rpartition("/")[0] + "/" + self.follows[0]
            if sibling in placed:
                return self._follow(path, shape, dims, sibling, placed[sibling])
        fitting = [layout for layout in self.layouts if fits_rank(layout, len(shape))]
        if not fitting:
            raise RuleError(
                f"Rule {self.pattern!r} matches variable {path!r} of shape {shape}, but "
                f"its layouts {list(self.layouts)} have more axes than the variable's "
                f"rank {len(shape)}. Give the rule a layout of rank {len(shape)} or "
                "narrow its pattern."
            )
        tried = []
        usable = [layout for layout in fitting if not self._missing_roles(layout, dims)]
        if usable and len(usable) < len(fitting):
            for layout in fitting:
                if layout not in usable:
                    missing = ", ".join(repr(r) for r in self._missing_roles(layout, dims))
                    tried.append(f"layout {layout}: the mesh has no {missing} axis")
            fitting = usable
        skipped = len(tried)  # candidates passed over for a role the mesh lacks
        first = None  # (axes, indivisible dimensions) of the first candidate tried
        sizes = dims.axis_sizes
        for layout in fitting:
            axes = self.bind(expand_layout(layout, len(shape)), dims)
            bad = indivisible(shape, axes, sizes)
            if not bad:
                source = "rule" if layout is self.layouts[0] else "fallback"
                return Placement(path, shape, axes, source, self, "; ".join(tried))
            parts = [f"dim {i} ({shape[i]}) not divisible by {axes[i]}={sizes[axes[i]]}" for i in bad]
            tried.append(f"layout {axes}: " + ", ".join(parts))
            first = first or (axes, bad)
        # No candidate divides: the first one, with its indivisible dimensions replicated.
        axes, bad = first
        axes = tuple(None if i in bad else a for i, a in enumerate(axes))
        reason = "; ".join([*tried[:skipped], tried[skipped] + ": replicated those dimensions"])
        return Placement(path, shape, axes, "fallback", self, reason, tuple(bad))

    def _follow(self, path, shape, dims, sibling, sibling_axes):
        mode, rank = self.follows[1], len(shape)
        if mode == "trailing":
            axes = tuple(sibling_axes[-rank:]) if rank else ()
        elif mode == "leading":
            axes = tuple(sibling_axes[: rank - 1]) + (None,)
        else:
            axes = (None,) * (rank - 1) + tuple(sibling_axes[-1:])
        axes = (None,) * (rank - len(axes)) + axes
        bad = indivisible(shape, axes, dims.axis_sizes)
        reason = f"follows {sibling} {tuple(sibling_axes)}"
        if bad:
            axes = tuple(None if i in bad else a for i, a in enumerate(axes))
            return Placement(
                path,
                shape,
                axes,
                "fallback",
                self,
                reason + ": replicated the dimensions that do not divide",
                tuple(bad),
            )
        return Placement(path, shape, axes, "rule", self, reason)

    @staticmethod
    def _missing_roles(layout, dims):
        return [a for a in layout if a in ROLES and dims.bind(a) is None]

    def to_dict(self):
        data = {"pattern": self.pattern, "layouts": [list(layout) for layout in self.layouts]}
        if self.note:
            data["note"] = self.note
        if self.family:
            data["family"] = self.family
        if self.follows:
            data["follows"] = list(self.follows)
        if self.fsdp_dim is not None:
            data["fsdp_dim"] = self.fsdp_dim
        return data


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
        if isinstance(rules, (str, bytes, dict)) or not hasattr(rules, "__iter__"):
            raise RuleError(
                "RuleSet takes a list of Rules or (pattern, layouts) pairs; "
                f"received {type(rules).__name__} {shown(rules)}."
            )
        if not isinstance(name, str):
            raise RuleError(f"A rule set's name must be a string; received {shown(name)}.")
        self.name = name
        self.rules = tuple(_rule(r) for r in rules)

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)

    def __add__(self, other):
        """This set's rules, then `other`'s (a `RuleSet`, or rules as `RuleSet` accepts them)."""
        if not isinstance(other, RuleSet):
            other = RuleSet(other, name="added")
        return RuleSet((*self.rules, *other.rules), name=f"{self.name}+{other.name}")

    def __repr__(self):
        return f"RuleSet(name={self.name!r}, rules={len(self.rules)})"

    def match(self, path):
        """The first rule whose pattern matches the whole `path`, or None."""
        return next((rule for rule in self.rules if rule.matches(path)), None)

    def place(self, path, shape, mesh, placed=None):
        """The `Placement` of a variable of `shape` at `path` on `mesh` (a `ParallelDims`, spec or DeviceMesh).

        The rules alone: first match, candidates and fallbacks, and `placed`
        (path -> axes of the variables placed so far) for rules that follow a
        sibling. What a preset adds (fsdp sharding) is `kdist.rules.Placer`'s.
        """
        shape = tuple(shape)
        rule = self.match(path)
        if rule is None:
            return Placement(path, shape, (None,) * len(shape), "default", reason="no rule matched")
        return rule.place(path, shape, as_dims(mesh), placed)

    def to_layout_map(self, device_mesh, variables=None):
        """Export as a plain `keras.distribution.LayoutMap` (see `kdist.rules.layout_map.to_layout_map`)."""
        return to_layout_map(self, device_mesh, variables)

    def to_dict(self):
        return {"name": self.name, "rules": [r.to_dict() for r in self.rules]}

    @classmethod
    def from_dict(cls, data, source="rule set", default_name="custom"):
        """Build a rule set from plain data: `{"name": ..., "rules": [{"pattern", "layouts", "note"?, "family"?}]}`.

        `source` names the input in errors (e.g. a file path).
        """
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise RuleError(
                f"The {source} must be a mapping with a 'rules' list (and optionally a 'name'); received {_kind(data)}."
            )
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise RuleError(f"The {source} has unknown top-level keys {unknown}; expected {sorted(_TOP_KEYS)}.")
        name = data.get("name", default_name)
        if not isinstance(name, str):
            raise RuleError(f"The {source} has name {name!r}; a name must be a string.")
        rules = []
        for i, entry in enumerate(data["rules"]):
            where = f"rules[{i}] of the {source}"
            if not isinstance(entry, dict):
                raise RuleError(f"{where} must be a mapping with 'pattern' and 'layouts'; received {_kind(entry)}.")
            missing = sorted({"pattern", "layouts"} - set(entry))
            unknown = sorted(set(entry) - _RULE_KEYS)
            if missing or unknown:
                problem = f"lacks {missing}" if missing else f"has unknown keys {unknown}"
                raise RuleError(
                    f"{where} {problem}; a rule has keys {sorted(_RULE_KEYS)} ('pattern' and 'layouts' required)."
                )
            for key in ("pattern", "note", "family"):
                if key in entry and not isinstance(entry[key], str):
                    raise RuleError(f"{where}: {shown(key)} must be a string; received {entry[key]!r}.")
            try:
                rules.append(
                    Rule(
                        entry["pattern"],
                        _data_layouts(entry["layouts"], where),
                        entry.get("note", ""),
                        entry.get("family", ""),
                        entry.get("follows", ()),
                        entry.get("fsdp_dim"),
                    )
                )
            except RuleError as e:
                raise RuleError(f"{where}: {e}") from None
        return cls(rules, name=name)


def _data_layouts(value, where):
    """Layouts from plain data: one list of axes, or a list of such lists."""
    if not isinstance(value, list):
        raise RuleError(
            f"{where}: 'layouts' must be a list (one layout or a list of layouts); received {shown(value)}."
        )
    if all(a is None or isinstance(a, str) for a in value):
        return tuple(value)
    for layout in value:
        if not isinstance(layout, list) or not all(a is None or isinstance(a, str) for a in layout):
            raise RuleError(
                f"{where}: each layout must be a list of axis names (a role, a mesh axis, '...' "
                f"or null for a replicated dimension); received {shown(layout)}."
            )
    return [tuple(layout) for layout in value]


def _rule(item):
    if isinstance(item, Rule):
        return item
    if isinstance(item, (tuple, list)) and 2 <= len(item) <= 6:
        return Rule(*item)
    raise RuleError(f"A rule must be a kdist.Rule or a (pattern, layouts) pair; received {_kind(item)}.")


def _is_follow_pair(follows):
    sibling, mode = follows if len(follows) == 2 else (None, None)
    return isinstance(sibling, str) and sibling != "" and isinstance(mode, str) and mode in FOLLOW_MODES


def _candidates(pattern, layouts):
    """`layouts` as a tuple of candidate layouts, each a tuple of axes (str or None). Refuses anything else."""
    hint = (
        f"Rule {pattern!r}: layouts must be one layout (a tuple of axes such as (None, 'model') or "
        "('...', 'model'); () replicates) or a list of such tuples (candidates, first that divides wins); "
    )
    if isinstance(layouts, tuple) and all(_is_axis(a) for a in layouts):
        layouts = [layouts]
    if not isinstance(layouts, (list, tuple)):
        raise RuleError(hint + f"received {_kind(layouts)}.")
    out = []
    for layout in layouts:
        if not isinstance(layout, (tuple, list)) or not all(_is_axis(a) for a in layout):
            raise RuleError(hint + f"received the layout {_kind(layout)}.")
        if list(layout).count(ELLIPSIS) > 1:
            raise RuleError(
                f"Rule {pattern!r}: layout {tuple(layout)} has more than one '...'. '...' stands for all the "
                "replicated dimensions between the named ones, so it can appear once: e.g. ('...', 'model')."
            )
        out.append(tuple(layout))
    if not out:
        raise RuleError(f"Rule {pattern!r} has no layout; use () to replicate.")
    return tuple(out)


def _is_axis(a):
    return a is None or (isinstance(a, str) and a != "")


def _kind(value):
    return f"{type(value).__name__} {shown(value)}"
