"""Renderings of a `kdist.sweep` result: the rich table and text, and the matplotlib figure."""

import numpy as np
from rich.table import Table
from rich.text import Text

from kdist.render import human_bytes
from kdist.sweeps import NO_ESTIMATE

_COMPACT = ("mesh", "step ms", "samples/s", "XLA mem", "weights+opt", "loss", "vs bare")


def sweep_renderables(result, width=None):
    """Rich renderables of a sweep: the table, failures, loss agreement, the sweep's overhead and, on CPU, what times mean."""
    yield sweep_table(result, width)
    for r in result.failed_rows:
        yield Text.assemble((f"{r.mesh} failed ({r.failure_stage}): ", "bold red"), r.failure)
    if len(result.ok_rows) > 1:
        yield Text(f"Losses of all {len(result.ok_rows)} shapes agree to {result.loss_spread:.1e} (relative, every step).")
    o = result.overhead
    yield Text(
        f"Sweep wall time {o['wall_s']:.1f} s, of which {o['measured_s']:.3f} s in measured steps: "
        f"overhead {o['overhead_s']:.1f} s ({o['overhead_share']:.0%}: build, compile, warm-up, checks).",
    )
    if result.machine["platform"] == "cpu":
        yield Text(result.note, style="bold yellow")


def sweep_table(result, width=None):
    """The rows as a `rich.table.Table`, fastest shape marked; compact below 140 columns."""
    has_tokens = any(r.tokens_per_s for r in result.rows)
    has_estimate = any(r.estimate_bytes is not None for r in result.rows)
    settings = result.settings
    table = Table(
        title=f"kdist sweep: {result.machine['device_count']} {result.machine['platform']} devices, "
        f"batch {settings['batch_size']}, {settings['steps']} timed steps after {settings['warmup']} warm-up",
        title_justify="left",
    )
    columns = ["mesh", "axes", "step ms", "IQR", "samples/s"] + (["tokens/s"] if has_tokens else [])
    columns += ["compile s", "XLA mem", "weights+opt", "estimate", "loss", "vs bare", "notes"]
    if width is not None and width < 140:
        columns = [c for c in columns if c in _COMPACT]
    for name in columns:
        table.add_column(name, justify="left" if name in ("mesh", "axes", "notes") else "right", no_wrap=name != "notes")
    for r in result.rows:
        if not r.ok:
            failed = f"[red]failed ({r.failure_stage})[/]"
            cells = {"mesh": r.mesh, "notes": failed} if "notes" in columns else {"mesh": r.mesh, "step ms": "[red]failed[/]"}
            table.add_row(*(cells.get(c, "-") for c in columns))
            continue
        memory = r.memory.get("total")
        cells = {
            "mesh": r.mesh + (" ★" if r.fastest else ""),
            "axes": " ".join(f"{k}:{v}" for k, v in r.axes.items()),
            "step ms": f"{r.step_time * 1e3:.2f}",
            "IQR": f"{r.step_time_iqr * 1e3:.2f}",
            "samples/s": f"{r.samples_per_s:,.0f}",
            "tokens/s": f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-",
            "compile s": f"{r.compile_s:.2f}",
            "XLA mem": human_bytes(memory) if memory is not None else "n/a",
            "weights+opt": human_bytes(r.state_bytes),
            "estimate": human_bytes(r.estimate_bytes) if r.estimate_bytes is not None else "n/a",
            "loss": f"{r.final_loss:.5f}",
            "vs bare": f"{r.agreement:+.1%}" if r.agreement is not None else "-",
            "notes": "fastest" if r.fastest else "",
        }
        table.add_row(*(cells[c] for c in columns), style="bold green" if r.fastest else None)
    table.caption = (
        "★ fastest median step time. Memory per device: XLA's compiled train step (argument + output "
        "- alias + temp) and weights + optimizer state (kdist.inspect). loss: the last step's. vs bare: "
        "median step time against the same compiled step timed in a bare loop."
        + ("" if has_estimate else f" estimate: {NO_ESTIMATE}.")
    )
    return table


def sweep_plot(result, path=None, title=None):
    """Step time and memory per mesh shape as a matplotlib figure; saved as PNG when `path` is given."""
    import matplotlib.pyplot as plt

    rows = result.rows
    names = [r.mesh for r in rows]
    positions = np.arange(len(rows))
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(max(8, 1.3 * len(rows) + 4), 4.2))
    step = [r.step_time * 1e3 if r.ok else 0 for r in rows]
    quartiles = [np.percentile(r.step_times, [25, 75]) * 1e3 if r.ok else (0, 0) for r in rows]
    spread = np.array([[s - q[0] for s, q in zip(step, quartiles)], [q[1] - s for s, q in zip(step, quartiles)]])
    colors = ["tab:green" if r.fastest else ("tab:blue" if r.ok else "lightgray") for r in rows]
    time_ax.bar(positions, step, yerr=spread, color=colors, capsize=3)
    time_ax.set_ylabel("step time, ms (median; bars: 25th-75th percentile)")
    time_ax.set_title("Step time per mesh shape")
    series = [
        ("XLA compiled step", "tab:orange", [r.memory.get("total", 0) if r.ok else 0 for r in rows]),
        ("weights + optimizer", "tab:purple", [(r.state_bytes or 0) if r.ok else 0 for r in rows]),
    ]
    if any(r.estimate_bytes is not None for r in rows):
        series.append(("planner estimate", "tab:gray", [r.estimate_bytes or 0 for r in rows]))
    width = 0.8 / len(series)
    for i, (label, color, values) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        memory_ax.bar(positions + offset, np.array(values) / 2**20, width, label=label, color=color)
    memory_ax.set_ylabel("MiB per device")
    memory_ax.set_title("Memory per device")
    memory_ax.legend(fontsize="small")
    for ax in (time_ax, memory_ax):
        ax.set_xticks(positions, names, rotation=30, ha="right")
        for i, r in enumerate(rows):
            if not r.ok:
                ax.annotate("failed", (i, 0), ha="center", va="bottom", color="red", fontsize="small", rotation=90)
    heading = title or "kdist sweep"
    if result.machine["platform"] == "cpu":
        kind = "fake CPU devices" if result.machine["fake_devices"] else "CPU device"
        heading += f"\n{result.machine['device_count']} {kind}: times say nothing about accelerators"
    fig.suptitle(heading, fontsize="medium")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
