"""Keras LayoutMaps: the one LayoutMap lookup kdist uses, and exporting kdist rules as a LayoutMap.

A `keras.distribution.LayoutMap` means what Keras says it means: for a path,
an exact key wins; otherwise every key is tried as a regex with
`re.fullmatch`; several matches are an error; no match replicates; the layout
is used as given (no fallback by shape). `LayoutMapRules` applies exactly that
to variables *and* to layer outputs ("<layer path>/output" keys lay out
activations), and the linter, the inspector and the presets all use it.

A layout's axis names are read on the mesh in force by
`ParallelDims.bind_spec`: Keras's and keras-hub's data axis "batch" is the
data role, so a map written for a ("batch", "model") mesh places the same on
kdist's ("data", "model") "2x4"; a role the mesh lacks ("model" on "dp")
replicates that dimension, and the placement's reason says so.
"""

import re

from keras.distribution import LayoutMap

from kdist.checks import shown
from kdist.errors import RuleError
from kdist.meshes.layout import ELLIPSIS, check_layout, dim_axes, full_spec
from kdist.meshes.spec import ParallelDims
from kdist.rules.placement import Placement


class LayoutMapRules:
    """A user's LayoutMap (or a dict of Keras layout keys) with Keras's lookup, for kdist's placement engine.

    Example:

    ```python
    layout_map = keras.distribution.LayoutMap(kdist.mesh("2x4"))
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/output"] = ("data", None)      # an activation layout
    dist = kdist.preset("2x4", rules=layout_map)  # the same placements as keras's ModelParallel
    ```
    """

    def __init__(self, layout_map, name="layout-map"):
        if not isinstance(layout_map, (LayoutMap, dict)):
            raise RuleError(
                "Expected a keras.distribution.LayoutMap or a dict of layout keys; received "
                f"{type(layout_map).__name__}."
            )
        self.name = name
        self.keys = {}  # key -> layout axes, in insertion order
        self.invalid = {}  # key -> the regex error (Keras would fail on them at lookup)
        self._regexes = {}
        for key in layout_map:
            if not isinstance(key, str):
                raise RuleError(f"LayoutMap keys must be strings; received {shown(key)}.")
            layout = layout_map[key]  # exact key: Keras returns that key's layout
            self.keys[key] = _axes(key, layout)
            try:
                self._regexes[key] = re.compile(key)
            except re.error as e:
                self.invalid[key] = str(e)

    def __len__(self):
        return len(self.keys)

    def __repr__(self):
        return f"LayoutMapRules(name={self.name!r}, keys={len(self.keys)})"

    def check_regexes(self):
        """Raise RuleError for the first key that is not a valid regex (Keras would raise re.error at lookup)."""
        for key, error in self.invalid.items():
            raise RuleError(
                f"LayoutMap key {key!r} is not a valid regex ({error}). Keras tries every key as a regex for a path "
                "without an exact key; escape it with re.escape or fix it."
            )

    def matching_keys(self, path):
        """The keys Keras would consider for `path`: `[path]` for an exact key, else every key that fullmatches."""
        if path in self.keys:
            return [path]
        return [key for key, regex in self._regexes.items() if regex.fullmatch(path)]

    def lookup(self, path):
        """`(key, axes)` of the key that lays out `path`, or None. Several matching keys raise, as in Keras."""
        keys = self.matching_keys(path)
        if len(keys) > 1:
            raise RuleError(
                f"Path {path!r} matches multiple layout specification keys: {keys}. Keras raises ValueError here; "
                "make the keys exclusive (anchor or narrow them) or add the exact path as a key."
            )
        return (keys[0], self.keys[keys[0]]) if keys else None

    def place(self, path, shape, dims):
        """The `Placement` of a variable: its key's layout as given, checked against the shape."""
        shape = tuple(shape)
        found = self.lookup(path)
        if found is None:
            return Placement(
                path, shape, (None,) * len(shape), "default", reason="no LayoutMap key matched: replicated"
            )
        key, axes = found
        if len(axes) > len(shape):
            raise RuleError(
                f"LayoutMap key {key!r} gives {path!r} of shape {shape} the layout {axes} of {len(axes)} axes; the "
                f"variable has {len(shape)} dimensions. Use a layout of at most {len(shape)} axes or narrow the key."
            )
        written = full_spec(axes, len(shape), path)
        spec = full_spec(dims.bind_spec(written), len(shape), path)
        check_layout(path, shape, spec, dims.axis_sizes)
        return Placement(path, shape, spec, "layout_map", rule=key, reason=_dropped_reason(written, spec, dims))

    def bound(self, key, dims):
        """The layout of `key` with its axis names read on mesh `dims` (see `ParallelDims.bind_spec`)."""
        return dims.bind_spec(self.keys[key])

    def activation(self, path, dims=None):
        """The layout of the activation at `path` ("<layer>/output"), its names read on `dims` if given, or None."""
        found = self.lookup(path)
        if found is None:
            return None
        return found[1] if dims is None else dims.bind_spec(found[1])


def to_layout_map(rule_set, device_mesh, variables=None):
    """A plain `keras.distribution.LayoutMap` equivalent to `rule_set` on `device_mesh`.

    With `variables` (e.g. `model.variables`, built abstractly or not), the
    map has one exact key per variable with its resolved layout, shape
    fallbacks included: this always works. Without, it has one anchored
    regex key per rule that excludes the paths of earlier rules, so that
    first-match-wins order survives Keras's "several matches is an error"
    lookup; each rule contributes its first layout only (Keras cannot fall
    back by shape), and a rule whose layout uses "..." raises RuleError,
    since a LayoutMap key cannot depend on the variable's rank.
    """
    dims = ParallelDims.from_device_mesh(device_mesh)
    layout_map = LayoutMap(device_mesh)
    if variables is not None:
        placed = {}
        for v in variables:
            placement = rule_set.place(v.path, v.shape, dims, placed)
            placed[v.path] = placement.axes
            if placement.source != "default":
                layout_map[v.path] = placement.axes
        return layout_map
    earlier = []
    for rule in rule_set:
        exclude = "".join(f"(?!(?:{p})$)" for p in earlier)
        layout = rule.layouts[0]
        if ELLIPSIS in layout or rule.follows:
            raise RuleError(
                f"Rule {rule.pattern!r} has layout {layout}"
                + (f" and follows {rule.follows}" if rule.follows else "")
                + ", which depends on each variable's rank or on another variable, which a LayoutMap key cannot "
                "express. Pass variables=model.variables to export one exact key per variable."
            )
        layout_map[f"^{exclude}(?:{rule.pattern})$"] = rule.bind(layout, dims)
        earlier.append(rule.pattern)
    return layout_map


def _dropped_reason(written, spec, dims):
    """Why a LayoutMap layout lost axes on this mesh ("" when it kept them all)."""
    kept = {a for entry in spec for a in dim_axes(entry)}
    dropped = [a for entry in written for a in dim_axes(entry) if dims.bind(a) is None and a not in kept]
    if not dropped:
        return ""
    names = " or ".join(repr(a) for a in dict.fromkeys(dropped))
    return f"the mesh ({dims.describe()}) has no axis for {names}: the map's layout drops it"


def _axes(key, layout):
    axes = getattr(layout, "axes", layout)
    if not isinstance(axes, (tuple, list)):
        raise RuleError(f"LayoutMap key {key!r} has layout {layout!r}; expected a TensorLayout or a tuple of axes.")
    return tuple(tuple(a) if isinstance(a, list) else a for a in axes)
