"""Grid views: one cell per device with the slice of the array it holds."""

from rich import box
from rich.table import Table
from rich.text import Text

from kdist.meshes.layout import spec_text
from kdist.render.html import html_table

_SLICE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
_HTML_COLOURS = {
    "cyan": "#d0f0f8",
    "magenta": "#f4d8f4",
    "green": "#d8f4d8",
    "yellow": "#f8f4c8",
    "blue": "#d8e0f8",
    "red": "#f8d8d8",
    "bright_cyan": "#c0f8f8",
    "bright_magenta": "#f8c8f8",
}


def shape_text(shape):
    return "×".join(map(str, shape)) if shape else "()"


def title(view):
    return f"{view.path} {shape_text(view.shape)} {spec_text(view.spec)}"


def grid_table(view):
    """A GridView as a rich table: one cell per device with the slice it holds."""
    styles = _slice_styles(view)
    corner = ",".join(view.row_axes) + " \\ " + ",".join(view.col_axes)
    table = Table(title=Text(title(view)), title_justify="left", box=box.SQUARE, show_lines=True, collapse_padding=True)
    table.add_column(Text(corner), style="bold", no_wrap=True)
    for label in view.col_labels:
        table.add_column(Text(_coords(label)), overflow="fold")
    for label, row in zip(view.row_labels, view.cells):
        table.add_row(Text(label), *(Text(f"{d}\n{view.slice_text(d)}", style=styles[d]) for d in row))
    return table


def grid_html(view):
    styles = _slice_styles(view)
    corner = ",".join(view.row_axes) + " \\ " + ",".join(view.col_axes)
    rows = [
        [
            (label, "font-weight:bold"),
            *((f"{d} {view.slice_text(d)}", f"background:{_HTML_COLOURS[styles[d]]}") for d in row),
        ]
        for label, row in zip(view.row_labels, view.cells)
    ]
    return html_table([corner, *view.col_labels], rows, title(view))


def _coords(label):
    """ "model=3" -> "3", "fsdp=0,model=1" -> "0,1" (the corner cell names the axes)."""
    return ",".join(part.partition("=")[2] for part in label.split(",")) if label else label


def _slice_styles(view):
    """Devices holding the same slice share a colour."""
    distinct = {}
    for d, s in view.slices.items():
        distinct.setdefault(s, _SLICE_STYLES[len(distinct) % len(_SLICE_STYLES)])
    return {d: distinct[s] for d, s in view.slices.items()}
