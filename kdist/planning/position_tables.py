"""Learned position tables: which a model has, and what to say when a traced sequence does not fit them."""

from kdist.checks import is_int, shown
from kdist.keras_internals import layers


def _position_layers(model):
    """(layer, length) for each learned position table of the model.

    A position layer is one named so, or one whose `sequence_length` is the
    length of a table it holds (SigLIP's text embedding sums a token and a
    position table in one layer).
    """
    for layer in layers(model):
        length = getattr(layer, "sequence_length", None)
        if not isinstance(length, int):
            continue
        if "Position" in type(layer).__name__ or any(v.shape[:1] == (length,) for v in layer.weights):
            yield layer, length


def shorter_tables(model, sequence_length):
    """(layer, length) of each learned position table shorter than one `sequence_length` (by name: not checked)."""
    if not is_int(sequence_length):
        return []
    return [(layer, length) for layer, length in _position_layers(model) if length < sequence_length]


def overrun(model, sequence_length, shorter, fix=True):
    """What a sequence longer than learned position tables meets (a step that could not run), and what to pass."""
    tables = "; ".join(
        f"layer {layer.name!r} ({type(layer).__name__}) holds positions for {n} tokens" for layer, n in shorter
    )
    shortest = min(length for _, length in shorter)
    advice = f" Pass sequence_length <= {shortest}, or build the model with longer position tables." if fix else ""
    return f"sequence_length={sequence_length} is longer than model {model.name!r} takes: {tables}.{advice}"


def position_table_hint(model, sequence_length, failed):
    """For a trace that failed at the layers `failed` (one, its sublayers, those it reads): the learned position
    tables among them that the traced lengths may not fit (a layer may add its whole table, or take no more
    positions than it holds)."""
    tables = [(layer, length) for layer, length in _position_layers(model) if any(layer is f for f in failed)]
    if sequence_length is None:
        return ""
    if isinstance(sequence_length, dict):
        held = ", ".join(f"{layer.name!r} ({type(layer).__name__}) {length}" for layer, length in tables)
        return (
            f" The model's learned position tables hold these many positions: {held}. An input longer than the table "
            "it reaches cannot be traced, and a layer that adds its whole table needs exactly its length: check "
            f"sequence_length={shown(sequence_length)} against them."
            if tables
            else ""
        )
    return "".join(
        f" Layer {layer.name!r} ({type(layer).__name__}) holds positions for {length} tokens and the step was "
        f"traced with sequence_length={sequence_length}: if it adds its whole table, pass sequence_length={length}."
        for layer, length in tables
        if length > sequence_length
    )
