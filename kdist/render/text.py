"""Plain text from rich renderables, markup escaping and the shared table style."""

import io

import numpy as np
from rich import box
from rich.console import Console
from rich.markup import escape  # noqa: F401  (re-exported: every user string goes through it)
from rich.table import Table
from rich.text import Text

WIDTH = 80  # the width of `str(report)`: a terminal's default


def to_text(renderable, width=WIDTH):
    """Plain text of a rich renderable at `width` columns."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()


def plain(text, style=None):
    """A rich `Text` of a user string: shown as it is, never read as markup."""
    return Text(str(text), style=style)


def table(title=None, caption=None, **kwargs):
    """A table in kdist's style: a simple heading rule, no padding, title and caption at the left."""
    kwargs.setdefault("box", box.SIMPLE_HEAD)
    kwargs.setdefault("padding", (0, 1, 0, 0))
    return Table(title=title, caption=caption, title_justify="left", caption_justify="left", **kwargs)


def device_runs(devices, columns, collapse):
    """(label, values) per device; with `collapse`, consecutive equal devices share a row ("cpu:0…7 (8)")."""
    if not collapse:
        return [(d, columns[i]) for i, d in enumerate(devices)]
    runs, start = [], 0
    for i in range(1, len(devices) + 1):
        if i == len(devices) or not np.array_equal(columns[i], columns[start]):
            label = (
                devices[start]
                if i - start == 1
                else f"{devices[start]}…{devices[i - 1].rpartition(':')[2]} ({i - start})"
            )
            runs.append((label, columns[start]))
            start = i
    return runs
