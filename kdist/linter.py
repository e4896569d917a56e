"""Layout linter: find layout rules that would crash, do nothing, or leave big variables replicated.

`lint` checks a kdist `RuleSet`, a plain `keras.distribution.LayoutMap` or a
`ShardedDistribution` against a model's variables and a mesh, without
creating any weight: an abstract model (`kdist.abstract_model`) is enough.
Each finding has a stable code (see `CODES` and docs/lint.md).

A `RuleSet` is linted as `kdist.preset(mesh, rules=...)` applies it: ordered,
first match wins, candidate layouts fall back by shape, and on a mesh with an
fsdp axis weights are also sharded by shape. A `LayoutMap` is linted with
Keras's own semantics: an exact key first, then every key as a regex with
`re.fullmatch`; several matches raise in Keras, and layouts are used as given.
"""

import dataclasses
import itertools
import math
import re

from kdist.export import JSONExport
from kdist.inspector import dim_axis_names
from kdist.memory import itemsize
from kdist.parallel_dims import ROLES
from kdist.rules.binding import bind_mesh
from kdist.rules.rule import ELLIPSIS, Placement, Rule, RuleSet, bind_layout, expand_layout, fits_rank, place_with_rule

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)

# code -> (name, what triggers it). The severity is decided per finding.
CODES = {
    "KD101": ("multiple-matches", "a path matches several LayoutMap keys (Keras raises ValueError)"),
    "KD102": ("rank-mismatch", "a layout has more axes than the variable has dimensions"),
    "KD103": ("unknown-axis", "a layout names an axis that is neither in the mesh nor a role"),
    "KD104": ("indivisible", "a LayoutMap shards a dimension its mesh axis does not divide (jax raises)"),
    "KD105": ("invalid-regex", "a pattern is not a valid regular expression"),
    "KD201": ("unused-rule", "a rule matches no variable"),
    "KD202": ("partial-match-only", "a rule matches only under the pre-3.14 partial-match (re.search) semantics"),
    "KD203": ("replicated-large", "a variable above the size threshold is left replicated"),
    "KD204": ("insufficiently-sharded", "too large a share of parameter bytes is left replicated"),
    "KD205": ("lora-sharded", "a LoRA weight (lora_kernel_a/b) is sharded"),
    "KD206": ("fallback-replicated", "no candidate layout divides: the indivisible dimensions are replicated"),
    "KD301": ("shadowed-rule", "every variable a rule matches is taken by an earlier rule"),
    "KD302": ("fallback-layout", "a later candidate layout of the rule was used"),
    "KD303": ("missing-role", "a rule shards over a role the mesh does not have"),
    "KD304": ("unmatched-variable", "no rule matches a variable: it is replicated"),
}

SIZE_THRESHOLD = 2**20  # bytes: smaller variables (norms, biases) may stay replicated
TOLERANCE = 0.02  # MaxText's default share of parameter bytes that may stay replicated
_LORA = re.compile(r"(.*/)?lora_kernel_[ab]")
_WEIGHT_ROLES = ("model", "fsdp", "expert")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One lint finding.

    Attributes:
        code: stable code, e.g. "KD101" (see `kdist.linter.CODES`).
        severity: "error", "warning" or "info".
        message: what is wrong and how to fix it.
        path: the variable path involved, if any.
        rule: the rule pattern (or LayoutMap key) involved, if any.
    """

    code: str
    severity: str
    message: str
    path: str = None
    rule: str = None

    @property
    def name(self):
        return CODES[self.code][0]

    def to_dict(self):
        return {"code": self.code, "name": self.name, "severity": self.severity, "path": self.path, "rule": self.rule, "message": self.message}

    def __str__(self):
        where = " ".join(f"{k}={v!r}" for k, v in (("path", self.path), ("rule", self.rule)) if v is not None)
        return f"{self.severity}: {self.code} {self.name}: {self.message}" + (f" [{where}]" if where else "")


@dataclasses.dataclass
class LintReport(JSONExport):
    """What `kdist.lint` returns: findings, most severe first, and a summary.

    Print it with rich (`rich.print(report)`), or use `to_dict()` / `to_json()`.

    Attributes:
        findings: list of `Finding`.
        summary: numbers about the model and mesh: variables, parameter bytes,
            the share of bytes left replicated and the top replicated variables.
        placements: variable path -> mesh axes (None: replicated) chosen per
            dimension, as the linted rules would lay the variables out.
    """

    findings: list
    summary: dict
    placements: dict = dataclasses.field(default_factory=dict, repr=False)

    def _of(self, severity):
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self):
        return self._of(ERROR)

    @property
    def warnings(self):
        return self._of(WARNING)

    @property
    def infos(self):
        return self._of(INFO)

    @property
    def ok(self):
        """True when there is no error (warnings and info allowed)."""
        return not self.errors

    def codes(self, severity=None):
        """The set of codes found, optionally of one severity."""
        return {f.code for f in self.findings if severity is None or f.severity == severity}

    def counts(self):
        return {s: len(self._of(s)) for s in SEVERITIES}

    def to_dict(self):
        return {"ok": self.ok, "counts": self.counts(), "summary": self.summary, "findings": [f.to_dict() for f in self.findings]}

    def __repr__(self):
        c = self.counts()
        return f"<LintReport ok={self.ok} errors={c[ERROR]} warnings={c[WARNING]} info={c[INFO]} rules={self.summary.get('rules')!r}>"

    def __str__(self):
        c = self.counts()
        head = f"kdist lint: {c[ERROR]} error(s), {c[WARNING]} warning(s), {c[INFO]} info"
        return "\n".join([head, *(str(f) for f in self.findings)])

    def __rich_console__(self, console, options):
        yield from _renderables(self)


def lint(rules, model_or_variables, mesh=None, *, size_threshold=SIZE_THRESHOLD, tolerance=TOLERANCE, top=5):
    """Check layout rules against a model's variables and a mesh.

    Nothing is allocated: pass a model built with `kdist.abstract_model` (or
    under `keras.StatelessScope(initialize_variables=False)`), a live model,
    or a list of variables or `(path, shape[, dtype])` tuples.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    report = kdist.lint(kdist.rules.KERAS_CORE, model, mesh="2x4")
    rich.print(report)                  # a table of findings
    assert report.ok, report            # no error
    report.to_json()                    # for CI
    ```

    Args:
        rules: a `kdist.RuleSet`, a list of `(pattern, axes)` pairs, "auto"
            (the rules `kdist.preset(spec)` uses by default), a rule set name
            ("keras-core", "llama", ...) or the path of a rules file, a
            `keras.distribution.LayoutMap`, a `kdist.ShardedDistribution` or a
            `keras.distribution.ModelParallel`.
        model_or_variables: a Keras model or layer, or its variables.
        mesh: a spec string ("2x4"; no devices are needed) or a
            `keras.distribution.DeviceMesh`. Defaults to the mesh of the
            distribution or of the LayoutMap.
        size_threshold: bytes from which a replicated variable is reported.
        tolerance: the share of parameter bytes (in replicated variables
            above `size_threshold`) beyond which the model is reported as
            insufficiently sharded.
        top: how many of the largest replicated variables the summary lists.

    Returns:
        A `LintReport`.
    """
    variables = _variables(model_or_variables)
    checker = _checker(rules, mesh)
    findings, placements = checker.check(variables, _output_paths(model_or_variables))
    summary, offenders = _summary(checker, variables, placements, size_threshold, top)
    findings += _sharding_findings(checker, summary, offenders, size_threshold, tolerance)
    findings.sort(key=lambda f: (SEVERITIES.index(f.severity), f.code, f.rule or "", _natural(f.path or "")))
    return LintReport(findings, summary, placements)


def _natural(path):
    """Sort key that puts layer_2 before layer_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


# ---------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass(frozen=True)
class _Var:
    path: str
    shape: tuple
    nbytes: int


@dataclasses.dataclass(frozen=True)
class _Mesh:
    """Axis names, sizes and roles: all the linter needs of a mesh (no devices)."""

    axis_names: tuple
    shape: tuple
    roles: tuple

    @property
    def sizes(self):
        return dict(zip(self.axis_names, self.shape))

    @property
    def weight_axes(self):
        """Axes of size > 1 over which weights are meant to be split (all but the data axes)."""
        return tuple(n for n, s, r in zip(self.axis_names, self.shape, self.roles) if s > 1 and r != "data")


def _variables(obj):
    items = obj.variables if hasattr(obj, "variables") and not isinstance(obj, (list, tuple, dict)) else obj
    items = items.items() if isinstance(items, dict) else items
    out = []
    for item in items:
        if isinstance(item, tuple):
            path, shape, dtype = (*item, "float32") if len(item) == 2 else item
        else:
            path, shape, dtype = item.path, item.shape, item.dtype
        shape = tuple(int(d) for d in shape)
        out.append(_Var(path, shape, math.prod(shape) * itemsize(dtype)))
    if not out:
        name = f" {obj.name!r}" if hasattr(obj, "name") else ""
        raise ValueError(
            f"lint() found no variables in {type(obj).__name__}{name}: build the model "
            "(give it an Input or call build()) before linting it, or pass its variables."
        )
    return out


def _output_paths(obj):
    """"<layer path>/output" for each layer: the paths Keras asks activation layouts for."""
    layers = getattr(obj, "_flatten_layers", None)
    if layers is None:
        return []
    return [f"{layer.path}/output" for layer in layers(include_self=False) if getattr(layer, "path", None)]


def _mesh(mesh, default=None, roles=None):
    if mesh is None:
        mesh = default
    if mesh is None:
        raise ValueError(
            "lint() needs a mesh for a RuleSet: pass mesh='2x4' (a kdist spec) or a keras.distribution.DeviceMesh."
        )
    if isinstance(mesh, _Mesh):
        return mesh
    if isinstance(mesh, str):
        return _mesh_of_spec(mesh)
    if hasattr(mesh, "axis_names") and hasattr(mesh, "shape"):
        names, shape = tuple(mesh.axis_names), tuple(mesh.shape)
        if roles is None:
            binding = bind_mesh(mesh)
            roles = tuple(next((r for r in ("data", *_WEIGHT_ROLES) if binding.get(r, (None,))[0] == n), None) for n in names)
        return _Mesh(names, shape, tuple(roles))
    raise TypeError(f"mesh must be a spec string such as '2x4' or a keras.distribution.DeviceMesh; received {mesh!r}.")


def _mesh_of_spec(spec):
    """A mesh from a kdist spec. Fixed sizes need no devices; -1, "dp", "tp", "fsdp" use the device count."""
    from kdist.parallel_dims import ParallelDims

    sizes = [int(s) for s in re.findall(r"-?\d+", spec)]
    if sizes and all(s > 0 for s in sizes):
        num_devices = math.prod(sizes)
    else:
        import jax

        num_devices = jax.device_count()
    dims = ParallelDims.parse(spec, num_devices)
    return _Mesh(dims.roles, dims.shape, dims.roles)


def _checker(rules, mesh):
    from keras.distribution import LayoutMap, ModelParallel

    from kdist.distribution import ShardedDistribution

    if isinstance(rules, ShardedDistribution):
        if mesh is None:
            lint_mesh = _mesh(rules.device_mesh, roles=rules.roles)
        else:
            lint_mesh = _mesh(mesh)
        return _RuleSetChecker(rules.rules, lint_mesh, fsdp_min_size=rules.fsdp_min_size)
    if isinstance(rules, ModelParallel):
        return _LayoutMapChecker(rules._layout_map, _mesh(mesh, rules.device_mesh))
    if isinstance(rules, LayoutMap):
        return _LayoutMapChecker(rules, _mesh(mesh, rules.device_mesh))
    if isinstance(rules, str) or hasattr(rules, "__fspath__"):
        lint_mesh = _mesh(mesh)
        return _RuleSetChecker(_named_rules(rules, lint_mesh), lint_mesh)
    if isinstance(rules, (RuleSet, list, tuple)):
        return _RuleSetChecker(rules, _mesh(mesh))
    raise TypeError(
        "lint() checks a kdist.RuleSet, a list of (pattern, axes) pairs, a keras.distribution.LayoutMap, "
        f"a kdist.ShardedDistribution or a keras ModelParallel; received {type(rules).__name__}."
    )


def _named_rules(name, mesh):
    """The rules `kdist.preset(spec, rules=name)` uses on a mesh with these roles: "auto", a rule set name or a file."""
    from kdist.presets import resolve_rules

    return resolve_rules(name, mesh)


# ---------------------------------------------------------------------------
# RuleSet: ordered, first match wins, candidate layouts fall back by shape


class _RuleSetChecker:
    def __init__(self, rules, mesh, fsdp_min_size=None):
        from kdist.distribution import FSDP_MIN_SIZE

        self.mesh = mesh
        self.findings = []
        self.rules = self._valid_rules(rules)
        self.name = rules.name if isinstance(rules, RuleSet) else "custom"
        self.axis_sizes = bind_mesh(mesh, mesh.roles)
        self.fsdp_min_size = FSDP_MIN_SIZE if fsdp_min_size is None else fsdp_min_size
        self.library = _library_rules()
        self.winners = {}  # variable path -> the pattern of the rule that laid it out

    def _valid_rules(self, rules):
        """Rules as `Rule`s; a (pattern, axes) pair whose pattern is not a regex becomes a KD105 finding."""
        valid = []
        for rule in rules:
            if not isinstance(rule, Rule):
                try:
                    re.compile(rule[0])
                except re.error as e:
                    self.findings.append(Finding(
                        "KD105", ERROR, f"Rule {rule[0]!r} is not a valid regex ({e}). Fix or re.escape it; the rule was skipped.",
                        rule=rule[0],
                    ))
                    continue
                rule = Rule(*rule)
            valid.append(rule)
        return valid

    def check(self, variables, output_paths=()):
        findings = self.findings
        broken = {rule for rule in self.rules if self._axis_findings(rule, findings)}
        matched = {rule: [] for rule in self.rules}
        won = {rule: [] for rule in self.rules}
        placements = {}
        for v in variables:
            matches = [rule for rule in self.rules if rule.matches(v.path)]
            for rule in matches:
                matched[rule].append(v)
            winner = matches[0] if matches else None
            if winner is not None:
                won[winner].append(v)
                self.winners[v.path] = winner.pattern
            if winner in broken:
                continue
            axes = self._place(v, winner, findings)
            if axes is not None:
                placements[v.path] = axes
        unused_library = []
        for rule in self.rules:
            if not matched[rule] and self._is_library(rule):
                unused_library.append(rule)
            else:
                findings += self._rule_findings(rule, matched[rule], won[rule], variables)
        if unused_library:
            findings.append(_unused_library_finding(unused_library))
        return findings, placements

    def _is_library(self, rule):
        return bool(rule.family) or rule in self.library

    def _axis_findings(self, rule, findings):
        names = set(self.mesh.axis_names)
        unknown = sorted({a for layout in rule.layouts for a in layout if a not in (None, ELLIPSIS) and a not in names and a not in ROLES})
        for axis in unknown:
            findings.append(Finding(
                "KD103", ERROR,
                f"Rule {rule.pattern!r} uses axis {axis!r}, which is neither a mesh axis ({', '.join(self.mesh.axis_names)}) "
                f"nor a role ({', '.join(ROLES)}). Use a role such as 'model' so the rule binds to any mesh, or one of the mesh's axis names.",
                rule=rule.pattern,
            ))
        return bool(unknown)

    def _place(self, v, rule, findings):
        if rule is None:
            axes = (None,) * len(v.shape)
            findings.append(Finding(
                "KD304", INFO, f"No rule matches {v.path!r} {v.shape}: it is replicated. Add a rule (e.g. (pattern, ()) to replicate it on purpose).", path=v.path
            ))
            return self._fsdp(v, axes)
        if not any(fits_rank(layout, len(v.shape)) for layout in rule.layouts):
            findings.append(Finding(
                "KD102", ERROR,
                f"Rule {rule.pattern!r} matches {v.path!r} of shape {v.shape} (rank {len(v.shape)}), but its layouts "
                f"{[list(layout) for layout in rule.layouts]} have more axes. Add a candidate of rank {len(v.shape)} "
                "(or use '...') or narrow the pattern.",
                path=v.path, rule=rule.pattern,
            ))
            return None
        placement = place_with_rule(rule, v.path, v.shape, self.axis_sizes)
        if placement.source == "fallback":
            findings.append(self._fallback_finding(v, rule, placement))
        if _LORA.fullmatch(v.path) and placement.sharded:
            findings.append(self._lora_finding(v, rule, placement.axes))
        return self._fsdp(v, placement.axes)

    def _lora_finding(self, v, rule, axes):
        if self._is_library(rule):  # kdist.rules.with_lora: sharded on request
            return Finding(
                "KD205", INFO, f"LoRA weight {v.path!r} {v.shape} is sharded {axes} on request (kdist.rules.with_lora).",
                path=v.path, rule=rule.pattern,
            )
        return Finding(
            "KD205", WARNING,
            f"LoRA weight {v.path!r} {v.shape} is sharded {axes} by rule {rule.pattern!r}. LoRA adapters are small and "
            "low-rank; sharding them adds collectives for no memory gain. Put r'(.*/)?lora_kernel_[ab]' -> () before "
            "this rule.",
            path=v.path, rule=rule.pattern,
        )

    def _fallback_finding(self, v, rule, placement):
        candidates = [bind_layout(rule, expand_layout(layout, len(v.shape)), self.axis_sizes) for layout in rule.layouts if fits_rank(layout, len(v.shape))]
        if placement.axes in candidates:
            return Finding(
                "KD302", INFO,
                f"{v.path!r} {v.shape}: rule {rule.pattern!r} fell back to candidate {placement.axes} ({placement.reason}).",
                path=v.path, rule=rule.pattern,
            )
        return Finding(
            "KD206", WARNING,
            f"{v.path!r} {v.shape}: no candidate layout of rule {rule.pattern!r} divides ({placement.reason}); laid out "
            f"{placement.axes}. Add a candidate whose sharded dimensions divide, or pick a mesh axis size that divides them.",
            path=v.path, rule=rule.pattern,
        )

    def _fsdp(self, v, axes):
        from kdist.distribution import shard_fsdp

        fsdp = self.axis_sizes.get("fsdp")
        if fsdp is None or fsdp[1] == 1:
            return axes
        return shard_fsdp(Placement(v.path, v.shape, axes, "rule"), *fsdp, self.fsdp_min_size).axes

    def _rule_findings(self, rule, matched, won, variables):
        if not matched:
            partial = [v.path for v in variables if _partial_match(rule._regex, v.path)]
            if partial:
                return [_partial_finding(rule.pattern, partial)]
            return [Finding(
                "KD201", WARNING,
                f"Rule {rule.pattern!r} matches no variable of this model, so it does nothing. Check the pattern against "
                "the variable paths (`[v.path for v in model.variables]`; rules match whole paths) or remove it.",
                rule=rule.pattern,
            )]
        out = []
        if not won and not self._is_library(rule):
            earlier = sorted({r.pattern for v in matched for r in self.rules if r.matches(v.path)} - {rule.pattern})
            out.append(Finding(
                "KD301", INFO,
                f"Rule {rule.pattern!r} matches {len(matched)} variable(s) (e.g. {matched[0].path!r}) but earlier rules "
                f"{earlier} take them all (first match wins), so it never applies. Move it before them or narrow them.",
                path=matched[0].path, rule=rule.pattern,
            ))
        missing = [sorted(a for a in layout if a in _WEIGHT_ROLES and a not in self.axis_sizes) for layout in rule.layouts]
        missing = sorted({a for m in missing for a in m}) if all(missing) else []
        if won and missing:
            out.append(Finding(
                "KD303", INFO,
                f"Rule {rule.pattern!r} shards over role(s) {missing}, which the mesh ({', '.join(self.mesh.axis_names)}) "
                f"does not have: those dimensions are replicated for {len(won)} variable(s). Add the axis to the mesh "
                "(e.g. 'data=2,expert=4') if you meant to shard them.",
                path=won[0].path, rule=rule.pattern,
            ))
        return out


def _unused_library_finding(rules):
    return Finding(
        "KD201", INFO,
        f"{len(rules)} rule(s) of kdist's rule libraries match no variable of this model: they are for layers it "
        "does not have. Nothing to fix.",
    )


def _library_rules():
    """Rules of the rule sets `kdist.rules` exports (library rules also carry a `family`).

    A library rule that matches nothing is expected (the model lacks that
    layer), not suspicious.
    """
    import kdist.rules

    rules = set()
    for value in vars(kdist.rules).values():
        if isinstance(value, RuleSet):
            rules.update(value.rules)
    return rules


# ---------------------------------------------------------------------------
# LayoutMap: exact key, else every key as a regex (re.fullmatch); several matches raise


class _LayoutMapChecker:
    def __init__(self, layout_map, mesh):
        self.mesh = mesh
        self.name = "layout-map"
        self.findings = []
        self.winners = {}
        self.keys = {}  # key -> (compiled regex, axes); keys that are no regex are KD105 findings
        for key, layout in layout_map._layout_map.items():
            axes = tuple(getattr(layout, "axes", layout))
            try:
                regex = re.compile(key)
            except re.error as e:
                self.findings.append(Finding(
                    "KD105", ERROR,
                    f"LayoutMap key {key!r} is not a valid regex ({e}). Keras tries every key as a regex for each variable "
                    "without an exact key, so this crashes model creation. Escape it (re.escape) or fix it.",
                    rule=key,
                ))
                continue
            self.keys[key] = (regex, axes)
            self._axis_findings(key, axes)

    def _axis_findings(self, key, axes):
        names = set(self.mesh.axis_names)
        unknown = sorted({n for a in axes for n in dim_axis_names(a) if n not in names})
        for name in unknown:
            self.findings.append(Finding(
                "KD103", ERROR,
                f"LayoutMap key {key!r} has layout {axes} with axis {name!r}, which is not a mesh axis "
                f"({', '.join(self.mesh.axis_names)}). Rename it to a mesh axis or build the mesh with that axis name.",
                rule=key,
            ))

    def check(self, variables, output_paths=()):
        findings = self.findings
        bad = {f.rule for f in findings}
        used = {key: 0 for key in self.keys}
        placements = {}
        for v in variables:
            keys = self._lookup(v.path)
            for key in keys:
                used[key] += 1
            if len(keys) > 1:
                findings.append(_multiple(v.path, keys, "variable"))
                continue
            if not keys:  # no key: replicated
                placements[v.path] = (None,) * len(v.shape)
                continue
            key = keys[0]
            axes = self.keys[key][1]
            if key in bad or not self._layout_findings(v, key, axes, findings):
                continue
            placements[v.path] = axes + (None,) * (len(v.shape) - len(axes))
            self.winners[v.path] = key
            if _LORA.fullmatch(v.path) and any(a is not None for a in axes):
                findings.append(Finding(
                    "KD205", WARNING,
                    f"LoRA weight {v.path!r} {v.shape} is sharded {axes} by key {key!r}. LoRA adapters are small "
                    "and low-rank; sharding them adds collectives for no memory gain. Narrow the key so it does not match "
                    "lora_kernel_a/b (e.g. end it with '/kernel').",
                    path=v.path, rule=key,
                ))
        activation = {key: 0 for key in self.keys}
        for path in output_paths:
            keys = self._lookup(path)
            for key in keys:
                activation[key] += 1
            if len(keys) > 1:
                findings.append(_multiple(path, keys, "layer output"))
        for key, (regex, _) in self.keys.items():
            if used[key] or activation[key]:
                continue
            partial = [v.path for v in variables if _partial_match(regex, v.path)]
            if partial:
                findings.append(_partial_finding(key, partial))
            else:
                findings.append(Finding(
                    "KD201", WARNING,
                    f"LayoutMap key {key!r} matches no variable (nor layer output) of this model, so it does nothing. "
                    "Keras matches whole paths (re.fullmatch): check it against `[v.path for v in model.variables]`.",
                    rule=key,
                ))
        return findings, placements

    def _lookup(self, path):
        if path in self.keys:
            return [path]
        return [key for key, (regex, _) in self.keys.items() if regex.fullmatch(path)]

    def _layout_findings(self, v, key, axes, findings):
        if len(axes) > len(v.shape):
            findings.append(Finding(
                "KD102", ERROR,
                f"LayoutMap key {key!r} gives {v.path!r} of shape {v.shape} the layout {axes} of {len(axes)} axes; "
                f"the variable has {len(v.shape)} dimensions, so jax.device_put fails. Use a layout of at most "
                f"{len(v.shape)} axes or narrow the key.",
                path=v.path, rule=key,
            ))
            return False
        sizes = self.mesh.sizes
        ok = True
        for dim, axis in enumerate(axes):
            size = math.prod(sizes[n] for n in dim_axis_names(axis))
            if v.shape[dim] % size:
                ok = False
                findings.append(Finding(
                    "KD104", ERROR,
                    f"LayoutMap key {key!r} shards dim {dim} ({v.shape[dim]}) of {v.path!r} {v.shape} over {axis}={size}, "
                    "which does not divide it; Keras passes the layout to jax, which raises. Shard a dimension that "
                    f"divides by {size}, replicate this one (None), or use kdist rules with candidate layouts.",
                    path=v.path, rule=key,
                ))
        return ok


def _multiple(path, keys, what):
    return Finding(
        "KD101", ERROR,
        f"The {what} path {path!r} matches {len(keys)} LayoutMap keys {keys}; Keras raises ValueError when it "
        "looks it up. Make the keys exclusive (anchor or narrow them) or add the exact path as a key.",
        path=path, rule=keys[0],
    )


def _partial_match(regex, path):
    return regex.fullmatch(path) is None and regex.search(path) is not None


def _partial_finding(pattern, paths):
    example = paths[0]
    return Finding(
        "KD202", WARNING,
        f"Rule {pattern!r} matches {len(paths)} variable(s) such as {example!r} only as a partial match "
        "(re.search/re.match, Keras < 3.14); Keras >= 3.14 and kdist match whole paths (re.fullmatch), so it now "
        f"matches nothing. Write it for the whole path, e.g. '.*{pattern}' or '(.*/)?{pattern}'.",
        path=example, rule=pattern,
    )


# ---------------------------------------------------------------------------
# Replication: MaxText's "sufficiently sharded" check


def _summary(checker, variables, placements, size_threshold, top):
    """The report's summary, and the replicated variables above `size_threshold`, largest first."""
    mesh = checker.mesh
    weight_axes = mesh.weight_axes
    total = sum(v.nbytes for v in variables)
    sharded, replicated = [], []  # of the variables laid out
    for v in variables:
        if v.path in placements:
            (sharded if set(_flat(placements[v.path])) & set(weight_axes) else replicated).append(v)
    # Without weight axes (a data-parallel mesh) replicating weights is the point: nothing to report.
    offenders = sorted((v for v in replicated if v.nbytes >= size_threshold), key=lambda v: (-v.nbytes, v.path)) if weight_axes else []
    summary = {
        "rules": checker.name,
        "mesh": mesh.sizes,
        "weight_axes": list(weight_axes),
        "variables": len(variables),
        "parameters": sum(math.prod(v.shape) for v in variables),
        "total_bytes": total,
        "sharded_share": sum(v.nbytes for v in sharded) / total if total else 0.0,
        "replicated_share": sum(v.nbytes for v in offenders) / total if total else 0.0,
        "size_threshold": size_threshold,
        "top_replicated": [{"path": v.path, "shape": list(v.shape), "bytes": v.nbytes} for v in offenders[:top]],
    }
    return summary, offenders


def _sharding_findings(checker, summary, offenders, size_threshold, tolerance):
    axes = ", ".join(summary["weight_axes"])
    findings = [
        Finding(
            "KD203", WARNING,
            f"{v.path!r} {v.shape} ({_bytes(v.nbytes)}) is replicated on every weight axis ({axes}), above the "
            f"{_bytes(size_threshold)} threshold: each device holds all of it. "
            + (f"Rule {checker.winners[v.path]!r} replicates it: shard one of its dimensions instead."
               if checker.winners.get(v.path) else "No rule matches it: add one that shards one of its dimensions."),
            path=v.path, rule=checker.winners.get(v.path),
        )
        for v in offenders
    ]
    share = summary["replicated_share"]
    if share > tolerance:
        worst = ", ".join(f"{t['path']} ({_bytes(t['bytes'])})" for t in summary["top_replicated"])
        findings.append(Finding(
            "KD204", WARNING,
            f"{share:.1%} of parameter bytes are in variables of at least {_bytes(size_threshold)} replicated on every "
            f"weight axis ({axes}), above the {tolerance:.0%} tolerance. Largest: {worst}. Add rules for them.",
        ))
    return findings


def _flat(axes):
    return [n for a in axes for n in dim_axis_names(a)]


def _bytes(n):
    from kdist.render import human_bytes

    return human_bytes(n)


# ---------------------------------------------------------------------------
# Rendering

_STYLES = {ERROR: "bold red", WARNING: "yellow", INFO: "dim"}


def _renderables(report, per_group=3):
    """A summary line and a table; findings of one code and rule beyond `per_group` are counted, not listed."""
    from rich.table import Table
    from rich.text import Text

    from kdist.render import human_bytes

    s, c = report.summary, report.counts()
    status = Text("OK" if report.ok else "FAILED", style="bold green" if report.ok else "bold red")
    yield Text.assemble(
        status,
        f"  {c[ERROR]} error(s), {c[WARNING]} warning(s), {c[INFO]} info | rules {s['rules']!r} on mesh {s['mesh']} | "
        f"{s['variables']} variables, {human_bytes(s['total_bytes'])} | sharded {s['sharded_share']:.1%}, "
        f"replicated above {human_bytes(s['size_threshold'])}: {s['replicated_share']:.1%}",
    )
    if not report.findings:
        return
    table = Table(show_lines=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("code", no_wrap=True)
    table.add_column("where", overflow="fold", ratio=2)
    table.add_column("message", ratio=5)
    for (code, rule), group in itertools.groupby(report.findings, key=lambda f: (f.code, f.rule)):
        group = list(group)
        for f in group[:per_group]:
            table.add_row(Text(f.severity, style=_STYLES[f.severity]), Text(f"{f.code}\n{f.name}"), _where(f.path, f.rule), Text(f.message))
        if len(group) > per_group:
            more = len(group) - per_group
            table.add_row("", "", _where(f"... and {more} more", rule), Text("the same finding for more variables (see to_json() or --json)"))
    yield table


def _where(path, rule):
    from rich.text import Text

    return Text("\n".join([*([path] if path else []), *([f"rule: {rule}"] if rule else [])]))
