"""Plans (`kdist.plan`): the ranking, the recommendation and why, its memory term by term, and the notes."""

from rich.text import Text

from kdist.render.text import table
from kdist.units import human_bytes, human_seconds, short_bytes

WIDE = 130  # from this width the table shows every memory term


def plan_renderables(p, width=80):
    """The candidates table (fitted to `width`), then the recommendation and its memory, or the advice."""
    memory = f", {human_bytes(p.memory_per_device)} per device" if p.memory_per_device else ""
    seq = f", sequence {p.sequence_length}" if p.sequence_length else ""
    yield Text(
        f"Plan for {p.model!r} on {p.devices} devices: batch {p.batch_size}{seq}, {p.optimizer}{memory}", style="bold"
    )
    yield candidates_table(p, width)
    best = p.recommendation
    if best is not None:
        yield Text.assemble(("Recommended: ", "bold"), (best.spec, "bold green"), f" ({best.shape}): {p.reason}.")
        yield Text(
            f"Memory of {best.spec} per device: "
            + ", ".join(
                f"{term} {human_bytes(getattr(best, term))}"
                for term in ("weights", "gradients", "optimizer", "activations", "transient", "other")
            )
            + f"; peak {human_bytes(best.peak)}."
        )
    else:
        yield Text(p.advice, style="bold red")
    for note in p.notes:
        yield Text(f"note: {note}", style="dim")


def candidates_table(p, width=80):
    verified = any(c.compiled for c in p.candidates)
    wide = width >= WIDE
    t = table(caption="★ recommended; peak, compiled: bytes per device; comm/step: estimated collective time per step")
    columns = ["#", "mesh"]
    columns += ["weights", "grads", "optim.", "activ.", "transient"] if wide else []
    columns += ["peak"] + (["compiled", "est/comp"] if verified else []) + ["fits", "comm/step"]
    columns += ["traffic"] if wide or not verified else []
    for name in columns:
        t.add_column(name, justify="left" if name in ("mesh", "traffic", "fits") else "right", no_wrap=True)
    t.add_column("note", overflow="fold", ratio=1)
    for c in p.candidates:
        cells = {
            "#": str(c.rank),
            "mesh": ("★ " if c is p.recommendation else "") + c.spec,
            "weights": human_bytes(c.weights),
            "grads": human_bytes(c.gradients),
            "optim.": human_bytes(c.optimizer),
            "activ.": human_bytes(c.activations),
            "transient": human_bytes(c.transient),
            "peak": human_bytes(c.peak),
            "compiled": human_bytes(c.compiled["peak"]) if c.compiled else "",
            "est/comp": f"{c.ratio:.2f}" if c.ratio else "",
            "fits": {True: "yes", False: "no", None: "-"}[c.fits],
            "comm/step": human_seconds(c.comm_seconds),
            "traffic": " ".join(f"{axis}:{short_bytes(x['bytes'])}" for axis, x in c.comm.items()),
        }
        note = c.reason if not c.valid else ("does not fit" if c.fits is False else "")
        style = "bold green" if c is p.recommendation else ("dim" if not c.valid or c.fits is False else None)
        t.add_row(*(Text(cells[name]) for name in columns), Text(note), style=style)
    return t
