"""HTML for notebooks: plain tables with escaped cells, and any rich renderable as styled text."""

import html
import io

from rich.console import Console, Group


def html_table(header, rows, caption=""):
    """A `<table>`: `rows` of cells, a cell being text or `(text, extra CSS)`; everything escaped."""
    out = ["<table style='border-collapse:collapse;font-size:90%'>"]
    if caption:
        out.append(f"<caption style='text-align:left;font-weight:bold'>{html.escape(caption)}</caption>")
    out.append(
        "<tr>" + "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header) + "</tr>"
    )
    for row in rows:
        cells = []
        for cell in row:
            style = "padding:2px 8px"
            if isinstance(cell, tuple):
                cell, extra = cell
                style += ";" + extra
            cells.append(f"<td style='{style}'>{html.escape(str(cell))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def paragraph(lines):
    """Lines of text as one escaped `<p>`."""
    return "<p>" + "<br>".join(html.escape(line) for line in lines) + "</p>"


def renderables_html(renderables, width=120):
    """Rich renderables as HTML (`<pre>` with inline styles), for reports without tables of their own."""
    console = Console(file=io.StringIO(), width=width, record=True, force_terminal=True, color_system="truecolor")
    console.print(Group(*renderables))
    return console.export_html(inline_styles=True, code_format="<pre style='font-size:90%'>{code}</pre>")
