"""Rich renderings of kdist reports."""

from rich.table import Table
from rich.text import Text

from kdist.inspector import KINDS


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def _spec(spec):
    return "(" + ", ".join("·" if a is None else (a if isinstance(a, str) else "+".join(a)) for a in spec) + ")"


def variables_table(report, limit=None):
    rows = report.variables if limit is None else report.variables[:limit]
    title = f"Variables ({len(rows)} of {len(report.variables)}, largest first)"
    table = Table(title=title, title_justify="left")
    for name in ("path", "kind", "shape", "dtype", "layout", "shard", "copies", "bytes/device", "from"):
        table.add_column(name, justify="right" if name in ("copies", "bytes/device") else "left")
    for v in rows:
        source = v.source + (f": {v.reason}" if v.reason else "")
        table.add_row(
            v.path, v.kind, str(v.shape), v.dtype, _spec(v.spec), str(v.shard_shape),
            str(v.replication), human_bytes(v.device_bytes.max(initial=0)), source,
        )
    return table


def devices_table(report):
    table = Table(title=f"Memory per device (mesh {report.mesh})", title_justify="left")
    table.add_column("device")
    for kind in KINDS:
        table.add_column(kind.replace("_", "-"), justify="right")
    table.add_column("total", justify="right")
    per_kind = {kind: report.device_bytes(kind) for kind in KINDS}
    totals = report.device_bytes()
    for i, device in enumerate(report.devices):
        table.add_row(device, *(human_bytes(per_kind[k][i]) for k in KINDS), human_bytes(totals[i]))
    return table


def summary_text(report):
    s = report.summary
    return Text(
        f"total {human_bytes(s['total_bytes'])} | on devices {human_bytes(s['bytes_on_devices'])} "
        f"(replicated everywhere: {human_bytes(s['bytes_if_replicated'])}, perfectly sharded: "
        f"{human_bytes(s['bytes_if_perfectly_sharded'])} per device) | max per device "
        f"{human_bytes(s['max_device_bytes'])}, imbalance {s['imbalance']:.2f} | "
        f"sharded share {s['sharded_share']:.0%}"
    )


def report_renderables(report, limit=20):
    yield variables_table(report, limit)
    yield devices_table(report)
    yield summary_text(report)
