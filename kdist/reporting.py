"""The report protocol of `ShardingReport`, `LintReport`, `Plan`, `SweepResult` and `ReshardResult`.

A report implements `to_dict()`, `csv_rows()` (a list of flat dicts) and
`renderables(width)` (rich renderables fitted to `width` columns); this base
class gives it the rest, the same everywhere: `to_json(path=None)`,
`to_csv(path=None)`, `str(report)` (80 columns of plain text),
`__rich_console__` (the terminal's width) and `_repr_html_` (notebooks).
"""

import csv
import io
import json

import numpy as np
from rich.console import Group

from kdist.atomic import write_text
from kdist.render.html import renderables_html
from kdist.render.text import WIDTH, to_text


class Report:
    """Base class of kdist's reports (see the module docstring)."""

    def to_dict(self):
        raise NotImplementedError

    def csv_rows(self):
        """Flat dicts, one per row of the report's CSV."""
        raise NotImplementedError

    def renderables(self, width=WIDTH):
        """Rich renderables of the report, fitted to `width` columns."""
        raise NotImplementedError

    def to_json(self, path=None, indent=1):
        """The report as JSON text; also written to `path` (atomically) when given."""
        text = json.dumps(self.to_dict(), indent=indent, default=_plain)
        if path is not None:
            write_text(path, text + "\n")
        return text

    def to_csv(self, path=None):
        """The report as CSV text, one row per `csv_rows()` entry; also written to `path` when given."""
        rows = self.csv_rows()
        columns = list(dict.fromkeys(key for row in rows for key in row))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = out.getvalue()
        if path is not None:
            write_text(path, text)
        return text

    def __str__(self):
        return to_text(Group(*self.renderables(WIDTH)), WIDTH)

    def __rich_console__(self, console, options):
        yield from self.renderables(options.max_width)

    def _repr_html_(self):
        return renderables_html(list(self.renderables(120)))


def _plain(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
