"""Reshard results (`kdist.reshard`, `kdist.plan_reshape`): what moves where, and bytes per device."""

import numpy as np
from rich.text import Text

from kdist.render.text import device_runs, table
from kdist.units import human_bytes


def reshard_renderables(result, width=80, max_rows=16):
    verb = "would move" if result.dry_run else "moved"
    yield Text(
        f"reshard to {result.describe_target()}: {verb} {result.count} of {len(result.variables)} variables, "
        f"{human_bytes(result.bytes)} received",
        style="bold",
    )
    moved = sorted(result.moved, key=lambda v: (-int(v.device_bytes.sum()), v.path))
    if moved:
        text = Text()
        for i, v in enumerate(moved):
            text.append(("\n" if i else "") + v.path)
            text.append(
                f"\n    {v.kind}, {'×'.join(map(str, v.shape))}: {pieces_text(v.source, v.source_pieces)} → "
                f"{pieces_text(v.target, v.target_pieces)}, {human_bytes(int(v.device_bytes.sum()))} received",
                style="dim",
            )
        yield text
    t = table(title="bytes received per device")
    t.add_column("device", no_wrap=True)
    t.add_column("received", justify="right", no_wrap=True)
    columns = np.asarray(result.device_bytes).reshape(-1, 1)
    for label, values in device_runs(result.devices, columns, collapse=len(result.devices) > max_rows):
        t.add_row(Text(label), human_bytes(int(values[0])))
    yield t


def pieces_text(spec, pieces):
    """E.g. "(None, model/8)": the axis splitting each dimension and into how many pieces."""
    entries = []
    for axis, n in zip(spec, pieces):
        name = "+".join(axis) if isinstance(axis, tuple) else axis
        entries.append("None" if name is None else f"{name}/{n}")
    return "(" + ", ".join(entries) + ")"
