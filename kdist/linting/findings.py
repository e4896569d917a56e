"""Lint findings: stable codes, severities and the `Finding` record."""

import dataclasses
import re

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
    "KD207": (
        "data-replicated",
        "large weights are replicated over the data axis, where an fsdp axis would split them",
    ),
    "KD301": ("shadowed-rule", "every variable a rule matches is taken by an earlier rule"),
    "KD302": ("fallback-layout", "a later candidate layout of the rule was used"),
    "KD303": ("missing-role", "a rule shards over a role the mesh does not have"),
    "KD304": ("unmatched-variable", "no rule matches a variable: it is replicated"),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One lint finding.

    Attributes:
        code: stable code, e.g. "KD101" (see `kdist.linting.CODES`).
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
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "path": self.path,
            "rule": self.rule,
            "message": self.message,
        }

    def __str__(self):
        where = " ".join(f"{k}={v!r}" for k, v in (("path", self.path), ("rule", self.rule)) if v is not None)
        return f"{self.severity}: {self.code} {self.name}: {self.message}" + (f" [{where}]" if where else "")


def sort_key(finding):
    """Most severe first, then by code, rule and path (layer_2 before layer_10)."""
    natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", finding.path or "")]
    return (SEVERITIES.index(finding.severity), finding.code, finding.rule or "", natural)


def partial_match(regex, path):
    """Whether `regex` matches `path` only partially (re.search, not re.fullmatch)."""
    return regex.fullmatch(path) is None and regex.search(path) is not None


def partial_finding(pattern, paths):
    return Finding(
        "KD202",
        WARNING,
        f"Rule {pattern!r} matches {len(paths)} variable(s) such as {paths[0]!r} only as a partial match "
        "(re.search/re.match, Keras < 3.14); Keras >= 3.14 and kdist match whole paths (re.fullmatch), so it now "
        f"matches nothing. Write it for the whole path, e.g. '.*{pattern}' or '(.*/)?{pattern}'.",
        path=paths[0],
        rule=pattern,
    )
