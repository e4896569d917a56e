"""Plans (`kdist.plan`): the ranking, the recommendation and why, its memory term by term, and the notes."""

from rich.console import Group
from rich.text import Text

from kdist.render.text import table
from kdist.units import human_bytes, human_seconds, short_bytes

WIDE = 130  # from this width the table shows every memory term
# Columns in the order they are given up when the width is short (the note column folds, the mesh never shrinks).
OPTIONAL = ("traffic", "transient", "activ.", "optim.", "weights", "comm/step", "band", "fits", "compute", "exposed")


def plan_renderables(p, width=80):
    """The header, the candidates table (fitted to `width`), then the recommendation and its memory, or the advice."""
    yield Text(_header(p), style="bold")
    yield candidates_table(p, width)
    best = p.recommendation
    if best is not None:
        yield Text.assemble(("Recommended: ", "bold"), (best.spec, "bold green"), f" ({best.shape}): {p.reason}.")
        yield Text(memory_line(best))
    else:
        yield Text(p.advice, style="bold red")
    for note in p.notes:
        yield Text(f"note: {note}", style="dim")


def _header(p):
    seq = f", sequence {p.sequence_length}" if p.sequence_length else ""
    if isinstance(p.sequence_length, dict):
        seq = ", sequences " + ", ".join(f"{name} {length}" for name, length in p.sequence_length.items())
    memory = ""
    if p.memory_per_device:
        source = f" ({p.memory_source})" if p.memory_source and p.memory_source != "memory_per_device" else ""
        memory = f", {human_bytes(p.memory_per_device)} per device{source}, {p.margin:.0%} kept free"
    remat = ", remat" if p.remat else ""
    return (
        f"Plan for {p.model!r} on {p.devices} devices: batch {p.batch_size}{seq}, {p.optimizer}; "
        f"target {p.target}{memory}{remat}"
    )


def memory_line(c):
    """The recommended candidate's memory, term by term, at its peak."""
    phase = f" at its peak ({c.phase})" if c.phase else ""
    band = f" (likely {human_bytes(c.band[0])}-{human_bytes(c.band[1])})" if c.band else ""
    transient = ", ".join(
        f"{name} {human_bytes(v)}"
        for name, v in (
            ("gradients so far", c.live_gradients),
            ("loss", c.loss),
            ("backward", c.backward),
            ("gathered copies", c.gathered),
            ("a GEMM's workspace", c.workspace),
        )
        if v
    )
    return (
        f"Memory of {c.spec} per device{phase}: weights {human_bytes(c.weights)}, optimizer "
        f"{human_bytes(c.optimizer)}, activations {human_bytes(c.activations)}, transient "
        f"{human_bytes(c.transient)}" + (f" ({transient})" if transient else "") + f", inputs {human_bytes(c.other)}; "
        f"peak {human_bytes(c.peak)}{band}. Gradient state in all: {human_bytes(c.gradients)}."
    )


def _cells(p, c):
    verified = c.compiled or {}
    return {
        "#": str(c.rank),
        "mesh": ("★ " if c is p.recommendation else "") + c.spec,
        "weights": human_bytes(c.weights),
        "optim.": human_bytes(c.optimizer),
        "activ.": human_bytes(c.activations),
        "transient": human_bytes(c.transient),
        "peak": human_bytes(c.peak),
        "band": f"{short_bytes(c.band[0])}-{short_bytes(c.band[1])}" if c.band else "",
        "compiled": human_bytes(verified["peak"]) if verified else "",
        "est/comp": f"{c.ratio:.2f}" if c.ratio else "",
        "fits": {True: "yes", False: "no", None: "-"}[c.fits],
        "comm/step": human_seconds(c.comm_seconds),
        "compute": short_seconds(c.compute_seconds),
        "exposed": short_seconds(c.exposed_comm_seconds),
        "step": short_seconds(c.step_seconds),
        "traffic": " ".join(f"{axis}:{short_bytes(x['bytes'])}" for axis, x in c.comm.items()),
    }


def short_seconds(seconds):
    """ "1.23s", "4.56ms", "7.89us": a time in at most 6 characters; "" for None."""
    if seconds is None:
        return ""
    if seconds >= 1:
        return f"{seconds:.3g}s"
    return f"{seconds * 1e3:.3g}ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g}us"


def _note(c):
    if not c.valid:
        return c.reason
    return "over the budget" if c.fits is False else ""


def candidates_table(p, width=80):
    """The ranking: one row per candidate; columns are given up from the right until the table fits `width`."""
    backends = sorted({c.compiled.get("backend", "?") for c in p.candidates if c.compiled})
    columns = ["#", "mesh"]
    columns += ["weights", "optim.", "activ.", "transient"] if width >= WIDE else []
    timed = any(c.step_seconds is not None for c in p.candidates)
    columns += ["peak", "band"] + (["compiled", "est/comp"] if backends else []) + ["fits"]
    columns += ["compute", "exposed", "step", "traffic"] if timed else ["comm/step", "traffic"]
    columns += ["comm/step"] if timed and width >= WIDE else []
    rows = [(_cells(p, c), _note(c), c) for c in p.candidates]
    heads = {name: name for name in columns}
    if backends:
        heads["compiled"] = f"compiled ({'/'.join(backends)})"
    noted = any(note for _, note, _ in rows)

    def needed(names):
        widths = [max([len(heads[n])] + [len(cells[n]) for cells, _, _ in rows]) + 1 for n in names]
        edges = len(names) + (2 if noted else 1)  # the box's column separators and edges
        return sum(widths) + edges + (12 if noted else 0)  # the note column keeps at least 12 columns when used

    for name in OPTIONAL:
        if needed(columns) <= width:
            break
        if name in columns:
            columns.remove(name)
    if needed(columns) > width:
        return _candidate_list(p, rows, width)
    caption = "★ recommended; bytes per device"
    if "band" in columns:
        caption += "; band: where the truth fell on the calibration"
    if backends:
        caption += f"; compiled: XLA's figure on {'/'.join(backends)}"
    if timed:
        caption += (
            "; step = compute + exposed (communication not hidden behind compute): estimated time per training "
            "step, not measured"
        )
    if "comm/step" in columns:
        caption += "; comm/step: estimated collective time per step"
    t = table(caption=caption)
    for name in columns:
        justify = "left" if name in ("mesh", "traffic", "fits", "band") else "right"
        t.add_column(heads[name], justify=justify, no_wrap=True)
    if noted:
        t.add_column("note", overflow="fold", ratio=1)
    for cells, note, c in rows:
        t.add_row(*(Text(cells[n]) for n in columns), *([Text(note)] if noted else []), style=_style(p, c))
    return t


def _candidate_list(p, rows, width):
    """For widths too narrow for the table: each mesh on a line of its own, its figures on the next."""
    lines = []
    for cells, note, c in rows:
        lines.append(Text(f"{cells['#']}. {cells['mesh']}", style=_style(p, c)))
        timing = f"step {cells['step']} (est.)" if c.step_seconds is not None else f"comm {cells['comm/step']}"
        figures = f"peak {cells['peak']}, fits {cells['fits']}, {timing}" + (f"; {note}" if note else "")
        lines.append(Text("   " + figures, style=_style(p, c)))
    return Group(*lines)


def _style(p, c):
    if c is p.recommendation:
        return "bold green"
    return "dim" if not c.valid or c.fits is False else None
