"""The layout linter: `lint` and its findings' codes."""

from kdist.linting.findings import CODES, SEVERITIES, Finding
from kdist.linting.lint import SIZE_THRESHOLD, TOLERANCE, lint
from kdist.linting.report import LintReport

__all__ = ["CODES", "Finding", "LintReport", "SEVERITIES", "SIZE_THRESHOLD", "TOLERANCE", "lint"]
