"""Sweep results (`kdist.sweep`): the table of mesh shapes, failures, loss agreement and what times mean."""

from rich.text import Text

from kdist.render.text import table
from kdist.units import human_bytes

_COMPACT = ("mesh", "step ms", "samples/s", "XLA mem", "weights+opt", "loss", "vs bare")


def sweep_renderables(result, width=None):
    """A sweep's table, failures, loss agreement, the sweep's overhead and, on CPU, what times mean."""
    yield sweep_table(result, width)
    for r in result.failed_rows:
        yield Text.assemble((f"{r.mesh} failed ({r.failure_stage}): ", "bold red"), str(r.failure))
    if len(result.ok_rows) > 1:
        yield Text(
            f"Losses of all {len(result.ok_rows)} shapes agree to {result.loss_spread:.1e} (relative, every step)."
        )
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
    t = table(
        title=f"kdist sweep: {result.machine['device_count']} {result.machine['platform']} devices, "
        f"batch {settings['batch_size']}, {settings['steps']} timed steps after {settings['warmup']} warm-up",
    )
    has_step_estimate = any(r.estimate_step_time is not None for r in result.rows)
    on_cpu = result.machine["platform"] == "cpu"  # the measured times are proxies: no ratio with the estimate
    columns = ["mesh", "axes", "step ms"] + (["est. ms"] if has_step_estimate else [])
    columns += ["meas/est"] if has_step_estimate and not on_cpu else []
    columns += ["IQR", "samples/s"] + (["tokens/s"] if has_tokens else [])
    columns += ["compile s", "XLA mem", "weights+opt", "estimate", "loss", "vs bare", "notes"]
    if width is not None and width < 140:
        compact = (
            _COMPACT
            if not has_step_estimate
            else ("mesh", "step ms", "est. ms", "meas/est", "XLA mem", "loss", "vs bare")
        )
        columns = [c for c in columns if c in compact]
    for name in columns:
        t.add_column(name, justify="left" if name in ("mesh", "axes", "notes") else "right", no_wrap=name != "notes")
    for r in result.rows:
        if not r.ok:
            failed = f"[red]failed ({r.failure_stage})[/]"
            cells = (
                {"mesh": r.mesh, "notes": failed}
                if "notes" in columns
                else {"mesh": r.mesh, "step ms": "[red]failed[/]"}
            )
            t.add_row(*(cells.get(c, "-") for c in columns))
            continue
        memory = r.memory.get("total")
        cells = {
            "mesh": Text(r.mesh + (" ★" if r.fastest else "")),
            "axes": " ".join(f"{k}:{v}" for k, v in r.axes.items()),
            "step ms": f"{r.step_time * 1e3:.2f}",
            "est. ms": f"{r.estimate_step_time * 1e3:.3g}" if r.estimate_step_time is not None else "-",
            "meas/est": f"{r.measured_over_estimate:.2f}" if r.measured_over_estimate is not None else "-",
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
        t.add_row(*(cells[c] for c in columns), style="bold green" if r.fastest else None)
    t.caption = (
        "★ fastest median step time. Memory per device: XLA's compiled train step (argument + output "
        "- alias + temp) and weights + optimizer state (kdist.inspect). loss: the last step's. vs bare: "
        "median step time against the same compiled step timed in a bare loop."
        + ("" if has_estimate or "estimate" not in columns else " estimate: not requested.")
        + (f" {result.estimate_caption}" if "estimate" in columns and has_estimate and result.estimate_caption else "")
        + (f" {result.step_estimate_caption}" if has_step_estimate else "")
    )
    return t
