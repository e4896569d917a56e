"""Lint reports: a status line, the summary, then each finding with its path and rule in full."""

import itertools

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from kdist.units import human_bytes

_STYLES = {"error": "bold red", "warning": "yellow", "info": "dim"}


def lint_renderables(report, width=80, per_group=3):
    """The status, summary and findings; findings of one code and rule beyond `per_group` are counted, not listed."""
    s, c = report.summary, report.counts()
    head = Text(f"kdist lint: {c['error']} error(s), {c['warning']} warning(s), {c['info']} info: ")
    head.append("OK" if report.ok else "FAILED", style="bold green" if report.ok else "bold red")
    yield head
    mesh = ", ".join(f"{k}={v}" for k, v in s["mesh"].items())
    yield Text(
        f"rules {s['rules']!r} on mesh {mesh}: {s['variables']} variables, {human_bytes(s['total_bytes'])}; "
        f"sharded {s['sharded_share']:.1%} of bytes, replicated above {human_bytes(s['size_threshold'])}: "
        f"{s['replicated_share']:.1%}",
        style="dim",
    )
    for (code, rule), group in itertools.groupby(report.findings, key=lambda f: (f.code, f.rule)):
        group = list(group)
        for f in group[:per_group]:
            yield _finding(f)
        if len(group) > per_group:
            more = len(group) - per_group
            yield Text(
                f"  ... and {more} more {code} finding(s) for rule {rule!r} (see to_json() or --json)", style="dim"
            )


def _finding(f):
    text = Text()
    text.append(f"{f.severity} ", style=_STYLES[f.severity])
    text.append(f"{f.code} {f.name}", style="bold")
    if f.path:
        text.append(f"\n  path: {f.path}")
    if f.rule:
        text.append(f"\n  rule: {f.rule}")
    return Group(text, Padding(Text(f.message), (0, 0, 0, 2)))
