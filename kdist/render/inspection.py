"""Sharding reports (`kdist.inspect`): variables by layer, memory per device, summary, notes and legend.

Every variable path is shown whole: when the paths do not fit beside the
other columns, each variable takes two lines (its path, then its numbers).
"""

import numpy as np
from rich.console import Group
from rich.text import Text

from kdist.meshes.layout import spec_text
from kdist.model_state import KINDS
from kdist.render.grid import shape_text
from kdist.render.html import html_table, paragraph
from kdist.render.text import device_runs, table
from kdist.units import human_bytes

COLUMNS = ("shape", "layout", "shard", "copies", "/device", "from")
_RIGHT = {"copies", "/device"}
LEGEND = (
    "layout: the mesh axis splitting each dimension (· = replicated). shard: the piece one device holds. "
    "copies: how many devices hold each piece. /device: bytes on one device. from: R<n> the rule in the "
    "notes, fb a fallback candidate of it (the rule's first layout did not divide), fsdp sharded by shape "
    "over the fsdp axis, map a LayoutMap key, preset replicated by the preset (no model axis), default no "
    "rule matched, slot an optimizer slot laid out like its weight, N<n> the reason in the notes."
)


def layer_groups(report):
    """[(layer, rows)] with each slot right after its reference variable; largest layers first.

    A variable's layer is the first component of its path (after the model's
    name, for Sequential and subclassed models); a slot's is its reference's.
    Rows are `(label, variable)`: the path, or "↳ <slot name>" for a slot.
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
        path = v.path[len(prefix) :] if prefix and v.path.startswith(prefix) else v.path
        layer = path.partition("/")[0] if "/" in path else "(model)"
        rows = groups.setdefault(layer, [])
        rows.append((v.path, v))
        for slot in slots.get(v.path, []):
            rows.append(("↳ " + slot_name(slot), slot))
    return sorted(groups.items(), key=lambda item: (-sum(v.nbytes for _, v in item[1]), item[0]))


def slot_name(slot):
    """ "momentum" for "adam/mlp_d1_kernel_momentum" (a slot of "mlp/d1/kernel")."""
    rest = slot.path.partition("/")[2]
    key = slot.slot_of.replace("/", "_") + "_"
    return rest[len(key) :] if rest.startswith(key) else slot.path


class Notes:
    """Numbered notes for long texts (rule patterns, fallback reasons) referenced from table cells."""

    def __init__(self):
        self.rules, self.reasons = {}, {}

    def source(self, v):
        if v.slot_of:
            return "slot"
        parts = []
        if v.rule:
            parts.append("R" + str(self.rules.setdefault(v.rule, len(self.rules) + 1)))
        if v.source in ("fallback", "fsdp", "explicit", "layout_map", "unknown", "preset") or (
            v.source == "default" and not v.rule
        ):
            parts.append({"fallback": "fb", "layout_map": "map"}.get(v.source, v.source))
        # The legend explains these sources' own reason; a note is what the fsdp axis added after it.
        reason = v.reason.partition("; ")[2] if v.source in ("default", "preset", "layout_map") else v.reason
        if reason:
            parts.append("N" + str(self.reasons.setdefault(reason, len(self.reasons) + 1)))
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


def variables_block(report, limit=40, notes=None, width=80):
    """Variables grouped by layer, largest first, at most `limit` rows (None: all), within `width` columns."""
    notes = notes or Notes()
    shown, hidden_rows, hidden_groups = 0, 0, 0
    lines = []  # ("layer", name, bytes) or ("row", label, cells)
    for layer, rows in layer_groups(report):
        if limit is not None and shown >= limit:
            hidden_rows, hidden_groups = hidden_rows + len(rows), hidden_groups + 1
            continue
        lines.append(("layer", layer, human_bytes(np.sum([v.device_bytes for _, v in rows], axis=0).max(initial=0))))
        for label, v in rows:
            if limit is not None and shown >= limit:
                hidden_rows += 1
                continue
            shown += 1
            cells = [
                shape_text(v.shape),
                spec_text(v.spec),
                shape_text(v.shard_shape),
                str(v.replication),
                human_bytes(v.device_bytes.max(initial=0)),
                notes.source(v),
            ]
            lines.append(("row", label, cells))
    opt = f", {report.optimizer} state" if report.optimizer else ""
    text = Text(f"{len(report.variables)} variables{opt} by layer, largest first ({report.source})", style="italic")
    text.append("\n")
    text.append_text(_columns(lines, width))
    if hidden_rows:
        more = f"{hidden_rows} more variables" + (f" in {hidden_groups} more layers" if hidden_groups else "")
        text.append(f"\n… {more} (show all with limit=None / --all, or filter with --var REGEX)", style="italic")
    return text


def _columns(lines, width):
    """Rows of cells under a header. A row whose label does not fit beside the cells gets a line of its own."""
    rows = [cells for kind, _, cells in lines if kind == "row"]
    widths = [max([len(c[i]) for c in rows] + [len(h)]) for i, h in enumerate(COLUMNS)]
    cells_width = sum(widths) + len(widths) - 1
    longest = max([len("  " + label) for kind, label, _ in lines if kind == "row"] + [len("variable")])
    label_width = max(min(longest, width - 1 - cells_width), len("variable"))
    text = Text()
    header = "variable".ljust(label_width) + " " + _cells(COLUMNS, widths)
    text.append(header.rstrip(), style="bold")
    text.append("\n" + "─" * min(width, len(header.rstrip())))
    for kind, label, cells in lines:
        text.append("\n")
        if kind == "layer":  # its bytes right-aligned under /device
            end = label_width + 1 + sum(widths[:5]) + 4
            text.append(label + " " + cells.rjust(max(1, end - len(label) - 1)), style="bold")
            continue
        label = "  " + label
        if len(label) > label_width:
            text.append(label + "\n")
            label = ""
        text.append((label.ljust(label_width) + " " + _cells(cells, widths)).rstrip())
    return text


def _cells(cells, widths):
    return " ".join(c.rjust(w) if name in _RIGHT else c.ljust(w) for c, w, name in zip(cells, widths, COLUMNS))


def devices_table(report, max_rows=16):
    """Bytes per device by kind. Consecutive devices with equal bytes share a row past `max_rows` devices."""
    mesh = ", ".join(f"{k}={v}" for k, v in report.mesh.items())
    t = table(title=f"Memory per device (mesh {mesh})")
    t.add_column("device", no_wrap=True)
    for kind in KINDS:
        t.add_column({"non_trainable": "non-train", "metric": "metrics"}.get(kind, kind), justify="right", no_wrap=True)
    t.add_column("total", justify="right", no_wrap=True, style="bold")
    columns = (
        np.stack([report.device_bytes(k) for k in KINDS] + [report.device_bytes()], axis=1)
        if report.devices
        else np.zeros((0, len(KINDS) + 1))
    )
    for label, values in device_runs(report.devices, columns, collapse=len(report.devices) > max_rows):
        t.add_row(Text(label), *(human_bytes(b) for b in values))
    return t


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
        f"split over some mesh axis: {s['sharded_share']:.1%} of bytes; over all {s['num_devices']} devices "
        f"(no copies): {s['fully_sharded_share']:.1%}; all devices together hold {human_bytes(s['bytes_on_devices'])}",
    ]


def report_renderables(report, limit=40, width=80):
    """The variables, the devices table, the summary, the notes and the legend, fitted to `width` columns."""
    notes = Notes()
    yield variables_block(report, limit, notes, width)
    yield devices_table(report)
    yield Text("Summary", style="bold")
    yield Text("\n".join(summary_lines(report)))
    rendered = notes.renderable()
    if rendered is not None:
        yield rendered
    yield Text(LEGEND, style="dim")


def report_html(report, limit=200):
    """The report as HTML: variables by layer, devices, summary (provenance in full, no notes needed)."""
    rows, shown = [], 0
    for layer, group in layer_groups(report):
        if shown >= limit:
            break
        per_device = np.sum([v.device_bytes for _, v in group], axis=0).max(initial=0)
        rows.append(
            [(layer, "font-weight:bold"), "", "", "", "", "", (human_bytes(per_device), "font-weight:bold"), ""]
        )
        for label, v in group[: max(0, limit - shown)]:
            shown += 1
            rows.append(
                [
                    (label, "padding-left:" + ("32px" if v.slot_of else "20px")),
                    v.kind,
                    shape_text(v.shape),
                    spec_text(v.spec),
                    shape_text(v.shard_shape),
                    v.replication,
                    human_bytes(v.device_bytes.max(initial=0)),
                    v.provenance,
                ]
            )
    opt = f", {report.optimizer} state" if report.optimizer else ""
    caption = f"{len(report.variables)} variables{opt} by layer, largest first ({report.source}; {shown} shown)"
    parts = [
        html_table(
            ["variable", "kind", "shape", "layout", "shard", "copies", "bytes/device", "layout from"], rows, caption
        )
    ]
    per_kind = [report.device_bytes(k) for k in KINDS]
    totals = report.device_bytes()
    mesh = ", ".join(f"{k}={v}" for k, v in report.mesh.items())
    parts.append(
        html_table(
            ["device", *KINDS, "total"],
            [[d, *(human_bytes(p[i]) for p in per_kind), human_bytes(totals[i])] for i, d in enumerate(report.devices)],
            f"Memory per device (mesh {mesh})",
        )
    )
    parts.append(paragraph(summary_lines(report)))
    return "<div>" + "".join(parts) + "</div>"
