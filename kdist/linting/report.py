"""What `kdist.lint` returns."""

import dataclasses

from kdist.linting.findings import ERROR, INFO, SEVERITIES, WARNING
from kdist.render.lint import lint_renderables
from kdist.reporting import Report


@dataclasses.dataclass
class LintReport(Report):
    """What `kdist.lint` returns: findings, most severe first, and a summary.

    Print it (`print(report)`, `rich.print(report)`), or use `to_dict()` /
    `to_json()` / `to_csv()`.

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
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
        }

    def csv_rows(self):
        return [f.to_dict() for f in self.findings]

    def renderables(self, width=80):
        return lint_renderables(self, width)

    def __repr__(self):
        c = self.counts()
        rules = self.summary.get("rules")
        return f"<LintReport ok={self.ok} errors={c[ERROR]} warnings={c[WARNING]} info={c[INFO]} rules={rules!r}>"
