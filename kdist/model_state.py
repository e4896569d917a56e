"""A model's state: every variable a training step reads or writes, each once, with its kind.

The listing that the inspector, `reshard` and sweeps use, so they agree on
what "the state" is. Checkpoints and backups key the state by the groups of
Keras's `get_state_tree` instead (`checkpoint.reading.flat_variables`).
"""

import keras

from kdist.errors import ModelError

KINDS = ("trainable", "non_trainable", "optimizer", "metric")


def check_model(model, caller, *, built=True):
    """Raise ModelError unless `model` is a Keras layer or model (built, when `built`)."""
    if not isinstance(model, keras.layers.Layer):
        raise ModelError(f"{caller} needs a Keras model or layer; received {type(model).__name__}.")
    if built and (not model.built or not model.variables):
        raise ModelError(
            f"{caller} needs a built model; {model.name!r} is not built (it has no variables yet). Give it a "
            "keras.Input, call it on a batch or call model.build(input_shape) first."
        )
    return model


def state_variables(model, kinds=KINDS):
    """`(variable, kind)` for the model's state, each variable once, in a stable order.

    Kinds are "trainable", "non_trainable", "optimizer" (its iteration and
    learning rate even before it is built, its slots after) and "metric". A list of variables is taken as it is: each is
    "trainable" or "non_trainable".
    """
    if isinstance(model, (list, tuple)):
        return [(v, "trainable" if getattr(v, "trainable", True) else "non_trainable") for v in model]
    optimizer = getattr(model, "optimizer", None)
    groups = {
        "trainable": model.trainable_variables,
        "non_trainable": model.non_trainable_variables,
        "optimizer": optimizer.variables if optimizer is not None else [],  # unbuilt: iteration, learning rate
        "metric": getattr(model, "metrics_variables", []),
    }
    seen, out = set(), []
    for kind in kinds:
        for v in groups[kind]:
            if id(v) not in seen:
                seen.add(id(v))
                out.append((v, kind))
    if "non_trainable" in kinds:  # variables of layers outside the groups above (e.g. seed generators)
        out += [(v, "non_trainable") for v in model.variables if id(v) not in seen and not seen.add(id(v))]
    return out
