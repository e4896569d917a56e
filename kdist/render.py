"""Renderings of kdist reports: rich tables for terminals (80 columns), HTML for notebooks, text."""

import html
import io

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kdist.inspector import KINDS

_SLICE_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def human_bytes(n):
    """Three significant digits: "800 B", "1.95 KiB", "153 KiB", "1002 MiB"."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            digits = 0 if unit == "B" or abs(n) >= 100 else (1 if abs(n) >= 10 else 2)
            return f"{n:.{digits}f} {unit}"
        n /= 1024


def to_text(renderable, width=80):
    """Plain text of a rich renderable at `width` columns."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()


def spec_text(spec):
    return "(" + ", ".join("·" if a is None else ("+".join(a) if isinstance(a, tuple) else a) for a in spec) + ")"


def shape_text(shape):
    return "×".join(map(str, shape)) if shape else "()"


# --- Grouping ----------------------------------------------------------------------------------------


def layer_groups(report):
    """[(layer, rows)] with each slot right after its reference variable; largest layers first.

    A variable's layer is the first component of its path (after the model's
    name, for Sequential and subclassed models); a slot's is its reference's.
    """
    prefix = report.model_name + "/" if report.model_name else ""
    slots = {}
    for v in report.variables:
        if v.slot_of:
            slots.setdefault(v.slot_of, []).append(v)
    groups, paths = {}, {v.path for v in report.variables}
    for v in report.variables:
        if v.slot_of and v.slot_of in paths:
            continue
        path = v.path[len(prefix):] if prefix and v.path.startswith(prefix) else v.path
        layer, _, name = path.partition("/")
        rows = groups.setdefault(layer or "(model)", [])
        rows.append((name or layer, v))
        for slot in slots.get(v.path, []):
            rows.append(("↳ " + slot_name(slot), slot))
    return sorted(groups.items(), key=lambda item: (-sum(v.nbytes for _, v in item[1]), item[0]))


def slot_name(slot):
    """"momentum" for "adam/mlp_d1_kernel_momentum" (a slot of "mlp/d1/kernel")."""
    rest = slot.path.partition("/")[2]
    key = slot.slot_of.replace("/", "_") + "_"
    return rest[len(key):] if rest.startswith(key) else slot.path


class _Notes:
    """Numbered notes for long texts (rule patterns, fallback reasons) referenced from table cells."""

    def __init__(self):
        self.rules, self.reasons = {}, {}

    def source(self, v):
        if v.slot_of:
            return "slot"
        parts = []
        if v.rule:
            parts.append("R" + str(self.rules.setdefault(v.rule, len(self.rules) + 1)))
        if v.source in ("fallback", "fsdp", "explicit", "layout_map", "unknown") or (v.source == "default" and not v.rule):
            parts.append({"fallback": "fb", "layout_map": "map"}.get(v.source, v.source))
        if v.reason and v.source != "default":
            parts.append("N" + str(self.reasons.setdefault(v.reason, len(self.reasons) + 1)))
        return " ".join(parts)

    def renderable(self):
        if not self.rules and not self.reasons:
            return None
        text = Text()
        for pattern, i in self.rules.items():
            text.append(f"R{i}", style="bold")
            text.append(f" rule {pattern}\n")
        for reason, i in self.reasons.items():
            text.append(f"N{i}", style="bold")
            text.append(f" {reason}\n")
        text.rstrip()
        return Group(Text("Notes", style="italic"), text)


# --- Report tables -----------------------------------------------------------------------------------


def variables_table(report, limit=40, notes=None, width=None):
    """Variables grouped by layer, largest first, at most `limit` rows (None: all).

    With `width`, the table fits in `width` columns: full paths when they fit,
    else names within their layer, shortened where needed ("fee_int_den/kernel");
    exports and HTML keep full paths.
    """
    notes = notes or _Notes()
    groups = layer_groups(report)
    cells = []  # (layer, per-device bytes, rows of cells)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0), title_justify="left")
    table.add_column("variable", overflow="fold")
    table.add_column("shape", overflow="fold")
    table.add_column("layout", overflow="fold")
    table.add_column("shard", overflow="fold")
    table.add_column("×", justify="right", no_wrap=True)
    table.add_column("/device", justify="right", no_wrap=True)
    table.add_column("from", no_wrap=True)
    shown = 0
    hidden_rows, hidden_groups = 0, 0
    for layer, rows in groups:
        if limit is not None and shown >= limit:
            hidden_rows += len(rows)
            hidden_groups += 1
            continue
        per_device = np.sum([v.device_bytes for _, v in rows], axis=0).max(initial=0)
        body = []
        for name, v in rows:
            if limit is not None and shown >= limit:
                hidden_rows += 1
                continue
            shown += 1
            body.append([
                name if v.slot_of else (name, v.path), shape_text(v.shape), spec_text(v.spec), shape_text(v.shard_shape),
                str(v.replication), human_bytes(v.device_bytes.max(initial=0)), notes.source(v),
            ])
        cells.append((layer, per_device, body))
    budget = None
    if width is not None:
        others = [max([len(r[i]) for _, _, body in cells for r in body] + [len(c.header)]) for i, c in enumerate(table.columns) if i]
        budget = max(14, width - sum(others) - len(others) - 4)  # a space between columns, edges, indent
    # Full paths (ready for --var and report.grid) when they all fit, else names within their layer.
    full = budget is None or all(len(r[0][1]) <= budget for _, _, body in cells for r in body if isinstance(r[0], tuple))
    for layer, per_device, body in cells:
        table.add_row(Text(_abbreviate(layer, budget + 2 if budget else None), style="bold"), "", "", "", "", Text(human_bytes(per_device), style="bold"), "")
        for row in body:
            name = row[0] if isinstance(row[0], str) else row[0][1 if full else 0]
            table.add_row("  " + _abbreviate(name, budget), *row[1:])
    opt = f", {report.optimizer} state" if report.optimizer else ""
    table.title = f"{len(report.variables)} variables{opt} by layer, largest first ({report.source})"
    if hidden_rows:
        more = f"{hidden_rows} more variables" + (f" in {hidden_groups} more layers" if hidden_groups else "")
        table.caption = f"… {more} (show all with limit=None / --all, or filter with --var REGEX)"
        table.caption_justify = "left"
    return table


def _abbreviate(name, budget):
    """Shorten `name` to `budget` characters: trim its longest words (never the last one) to no
    fewer than 3 letters ("feedforward_gate_dense/kernel" -> "fee_gat_den/kernel"), then cut from the left."""
    if budget is None or len(name) <= budget:
        return name
    parts = [p.split("_") for p in name.split("/")]
    words = [(i, j) for i, p in enumerate(parts) for j in range(len(p) - (i == len(parts) - 1))]
    excess = len(name) - budget
    while excess > 0:
        i, j = max(words, key=lambda w: len(parts[w[0]][w[1]]), default=(None, None))
        if i is None or len(parts[i][j]) <= 3:
            break
        cut = min(excess, len(parts[i][j]) - 3, max(1, len(parts[i][j]) - 4))
        parts[i][j] = parts[i][j][: len(parts[i][j]) - cut]
        excess -= cut
    short = "/".join("_".join(p) for p in parts)
    return short if len(short) <= budget else "…" + short[len(short) - budget + 1 :]


def devices_table(report, max_rows=16):
    """Bytes per device by kind. Consecutive devices with equal bytes share a row past `max_rows` devices."""
    mesh = ", ".join(f"{k}={v}" for k, v in report.mesh.items())
    table = Table(title=f"Memory per device (mesh {mesh})", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0))
    table.add_column("device", no_wrap=True)
    for kind in KINDS:
        table.add_column({"non_trainable": "non-train", "optimizer": "optimizer", "metric": "metrics"}.get(kind, kind), justify="right", no_wrap=True)
    table.add_column("total", justify="right", no_wrap=True, style="bold")
    columns = np.stack([report.device_bytes(k) for k in KINDS] + [report.device_bytes()], axis=1) if report.devices else np.zeros((0, len(KINDS) + 1))
    for label, values in _device_runs(report.devices, columns, collapse=len(report.devices) > max_rows):
        table.add_row(label, *(human_bytes(b) for b in values))
    return table


def _device_runs(devices, columns, collapse):
    if not collapse:
        return [(d, columns[i]) for i, d in enumerate(devices)]
    runs, start = [], 0
    for i in range(1, len(devices) + 1):
        if i == len(devices) or not np.array_equal(columns[i], columns[start]):
            label = devices[start] if i - start == 1 else f"{devices[start]}…{devices[i - 1].rpartition(':')[2]} ({i - start})"
            runs.append((label, columns[start]))
            start = i
    return runs


def summary_lines(report):
    """The whole-model summary, one short line each."""
    s = report.summary
    kinds = ", ".join(f"{k.replace('_', '-')} {human_bytes(s[f'{k}_bytes'])}" for k in KINDS if s[f"{k}_bytes"])
    return [
        f"total (one copy) {human_bytes(s['total_bytes'])}: {kinds or 'no variables'}",
        f"per device: max {human_bytes(s['max_device_bytes'])}, mean {human_bytes(s['mean_device_bytes'])}, "
        f"imbalance (max/mean) {s['imbalance']:.2f}",
        f"per device if fully replicated {human_bytes(s['bytes_if_replicated'])}, "
        f"if perfectly sharded {human_bytes(s['bytes_if_perfectly_sharded'])}",
        f"sharded: {s['sharded_share']:.1%} of bytes (over every device: {s['fully_sharded_share']:.1%}); "
        f"on all devices {human_bytes(s['bytes_on_devices'])}",
    ]


def summary_text(report):
    return Text("\n".join(summary_lines(report)))


def report_renderables(report, limit=40, width=None):
    """The variables table, the devices table, the summary and the notes, fitted to `width` columns."""
    notes = _Notes()
    yield variables_table(report, limit, notes, width)
    yield devices_table(report)
    yield Text("Summary", style="bold")
    yield summary_text(report)
    rendered = notes.renderable()
    if rendered is not None:
        yield rendered


def report_text(report, limit=40, width=80):
    """The report as plain text of `width` columns."""
    return to_text(Group(*report_renderables(report, limit, width)), width)


# --- HTML --------------------------------------------------------------------------------------------


def _html_table(header, rows, caption=""):
    out = ["<table style='border-collapse:collapse;font-size:90%'>"]
    if caption:
        out.append(f"<caption style='text-align:left;font-weight:bold'>{html.escape(caption)}</caption>")
    out.append("<tr>" + "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header) + "</tr>")
    for row in rows:
        cells = []
        for cell in row:
            style = "padding:2px 8px"
            if isinstance(cell, tuple):  # (text, extra style)
                cell, extra = cell
                style += ";" + extra
            cells.append(f"<td style='{style}'>{html.escape(str(cell))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def report_html(report, limit=200):
    """The report as HTML: variables by layer, devices, summary (provenance in full, no notes needed)."""
    rows, shown = [], 0
    for layer, group in layer_groups(report):
        if shown >= limit:
            break
        per_device = np.sum([v.device_bytes for _, v in group], axis=0).max(initial=0)
        rows.append([(layer, "font-weight:bold"), "", "", "", "", "", (human_bytes(per_device), "font-weight:bold"), ""])
        for name, v in group[: max(0, limit - shown)]:
            shown += 1
            rows.append([(name if v.slot_of else v.path, "padding-left:" + ("32px" if v.slot_of else "20px")), v.kind, shape_text(v.shape), spec_text(v.spec), shape_text(v.shard_shape),
                         v.replication, human_bytes(v.device_bytes.max(initial=0)), v.provenance])
    opt = f", {report.optimizer} state" if report.optimizer else ""
    caption = f"{len(report.variables)} variables{opt} by layer, largest first ({report.source}; {shown} shown)"
    parts = [_html_table(["variable", "kind", "shape", "layout", "shard", "copies", "bytes/device", "layout from"], rows, caption)]
    per_kind = [report.device_bytes(k) for k in KINDS]
    totals = report.device_bytes()
    mesh = ", ".join(f"{k}={v}" for k, v in report.mesh.items())
    parts.append(_html_table(
        ["device", *KINDS, "total"],
        [[d, *(human_bytes(p[i]) for p in per_kind), human_bytes(totals[i])] for i, d in enumerate(report.devices)],
        f"Memory per device (mesh {mesh})",
    ))
    parts.append("<p>" + "<br>".join(html.escape(line) for line in summary_lines(report)) + "</p>")
    return "<div>" + "".join(parts) + "</div>"


# --- Grid views --------------------------------------------------------------------------------------


def grid_table(view):
    """A GridView as a rich table: one cell per device with the slice it holds."""
    styles = _slice_styles(view)
    title = f"{view.path} {shape_text(view.shape)} {spec_text(view.spec)}"
    corner = ",".join(view.row_axes) + " \\ " + ",".join(view.col_axes)
    table = Table(title=title, title_justify="left", box=box.SQUARE, show_lines=True, collapse_padding=True)
    table.add_column(corner, style="bold", no_wrap=True)
    for label in view.col_labels:
        table.add_column(_coords(label), overflow="fold")
    for label, row in zip(view.row_labels, view.cells):
        table.add_row(label, *(Text(f"{d}\n{view.slice_text(d)}", style=styles[d]) for d in row))
    return table


def grid_html(view):
    styles = _slice_styles(view)
    colors = {"cyan": "#d0f0f8", "magenta": "#f4d8f4", "green": "#d8f4d8", "yellow": "#f8f4c8", "blue": "#d8e0f8",
              "red": "#f8d8d8", "bright_cyan": "#c0f8f8", "bright_magenta": "#f8c8f8"}
    corner = ",".join(view.row_axes) + " \\ " + ",".join(view.col_axes)
    rows = [[(label, "font-weight:bold"), *((f"{d} {view.slice_text(d)}", f"background:{colors[styles[d]]}") for d in row)]
            for label, row in zip(view.row_labels, view.cells)]
    title = f"{view.path} {shape_text(view.shape)} {spec_text(view.spec)}"
    return _html_table([corner, *view.col_labels], rows, title)


def _coords(label):
    """"model=3" -> "3", "fsdp=0,model=1" -> "0,1" (the corner cell names the axes)."""
    return ",".join(part.partition("=")[2] for part in label.split(",")) if label else label


def _slice_styles(view):
    """Devices holding the same slice share a colour."""
    distinct = {}
    for d, s in view.slices.items():
        distinct.setdefault(s, _SLICE_STYLES[len(distinct) % len(_SLICE_STYLES)])
    return {d: distinct[s] for d, s in view.slices.items()}
