"""Layout linter: find layout rules that would crash, do nothing, or leave big variables replicated.

`lint` checks a kdist `RuleSet`, a plain `keras.distribution.LayoutMap` or a
`ShardedDistribution` against a model's variables and a mesh, without
creating any weight: an abstract model (`kdist.abstract_model`) is enough.
Each finding has a stable code (see `CODES` and docs/lint.md).

A `RuleSet` is linted as `kdist.preset(mesh, rules=...)` applies it, through
the same placement engine: ordered, first match wins, candidate layouts fall
back by shape, and on a mesh with an fsdp axis weights are also sharded by
shape. A `LayoutMap` is linted with Keras's own semantics (the lookup
presets share): an exact key first, then every key as a regex with
`re.fullmatch`; several matches raise in Keras, and layouts are used as given.
"""

import pathlib

from keras.distribution import LayoutMap, ModelParallel

from kdist.checks import non_negative_int, positive_number, shown
from kdist.distribution import ShardedDistribution
from kdist.errors import ArgumentTypeError
from kdist.keras_internals import layout_map_of
from kdist.linting.findings import sort_key
from kdist.linting.inputs import lint_mesh, lint_variables, output_paths
from kdist.linting.layout_map_checks import LayoutMapChecker
from kdist.linting.replication import data_axis_finding, replication_findings, summarize
from kdist.linting.report import LintReport
from kdist.linting.rule_checks import RuleSetChecker
from kdist.rules.layout_map import LayoutMapRules
from kdist.rules.registry import resolve_rules
from kdist.rules.rule import RuleSet

SIZE_THRESHOLD = 2**20  # bytes: smaller variables (norms, biases) may stay replicated
TOLERANCE = 0.02  # MaxText's default share of parameter bytes that may stay replicated


def lint(rules, model_or_variables, mesh=None, *, size_threshold=SIZE_THRESHOLD, tolerance=TOLERANCE, top=5):
    """Check layout rules against a model's variables and a mesh.

    Nothing is allocated: pass a model built with `kdist.abstract_model` (or
    under `keras.StatelessScope(initialize_variables=False)`), a live model,
    or a list of variables or `(path, shape[, dtype])` tuples.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    report = kdist.lint(kdist.rules.KERAS_CORE, model, mesh="2x4")
    print(report)                       # findings, each with its path and rule
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
    size_threshold = non_negative_int(size_threshold, "size_threshold")
    tolerance = positive_number(tolerance, "tolerance") if tolerance else 0.0
    top = non_negative_int(top, "top")
    checker = _checker(rules, mesh)
    variables = lint_variables(model_or_variables)
    findings, placements = checker.check(variables, output_paths(model_or_variables))
    summary, offenders = summarize(checker, variables, placements, size_threshold, top)
    findings += replication_findings(checker, summary, offenders, size_threshold, tolerance)
    findings += data_axis_finding(checker, variables, size_threshold)
    findings.sort(key=sort_key)
    return LintReport(findings, summary, placements)


def _checker(rules, mesh):
    if isinstance(rules, ShardedDistribution):
        dims = rules.dims if mesh is None else lint_mesh(mesh)
        if isinstance(rules.rules, LayoutMapRules):
            return LayoutMapChecker(rules.rules, dims)
        return RuleSetChecker(rules.rules, dims, fsdp_min_size=rules.fsdp_min_size)
    if isinstance(rules, ModelParallel):
        return LayoutMapChecker(layout_map_of(rules), lint_mesh(mesh, rules.device_mesh))
    if isinstance(rules, LayoutMap):
        return LayoutMapChecker(rules, lint_mesh(mesh, rules.device_mesh))
    if isinstance(rules, (str, pathlib.PurePath)):
        dims = lint_mesh(mesh)
        return RuleSetChecker(resolve_rules(rules, dims), dims)
    if isinstance(rules, (RuleSet, list, tuple)):
        return RuleSetChecker(rules, lint_mesh(mesh))
    raise ArgumentTypeError(
        "lint() checks a kdist.RuleSet, a list of (pattern, axes) pairs, a rule set name or file, a "
        "keras.distribution.LayoutMap (wrap a dict of layout keys in one), a kdist.ShardedDistribution or a keras "
        f"ModelParallel as rules; received {type(rules).__name__} {shown(rules)} (the arguments are "
        "lint(rules, model_or_variables, mesh))."
    )
