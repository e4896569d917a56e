"""Plots (matplotlib, an optional dependency): sweep results."""

import numpy as np

from kdist.errors import MissingDependencyError

PLOTS_INSTALL = "pip install 'kdist[plots]' (or pip install matplotlib)"


def pyplot():
    """`matplotlib.pyplot`, or a MissingDependencyError naming the install command."""
    try:
        import matplotlib.pyplot as plt  # optional: only plots need it
    except ImportError as e:
        raise MissingDependencyError(f"Plots need matplotlib: {PLOTS_INSTALL} ({e}).") from None
    return plt


def sweep_plot(result, path=None, title=None):
    """Step time and memory per mesh shape as a matplotlib figure; saved as PNG when `path` is given."""
    plt = pyplot()
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
