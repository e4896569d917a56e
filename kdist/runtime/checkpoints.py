"""Sharded checkpoints that restore onto any mesh, through Orbax.

`save_sharded(model, path)` writes the model's whole state (weights,
optimizer state, metric state) with orbax-checkpoint: every process writes
the shards it holds (one copy of each replicated shard), nothing is gathered
on one host. `load_sharded(model, path)` reads it into a model built under
any distribution: each device reads only the slices its variables' current
shardings ask for.

The checkpoint holds the tree of `model.get_state_tree()` under the
checkpointable name "pytree", the format of `keras.callbacks.OrbaxCheckpoint`,
so `model.load_weights(path)` (with a distribution set) reads it too.

Needs the `orbax-checkpoint` package (`pip install orbax-checkpoint`).
"""

import os

import jax

from kdist.errors import MissingDependencyError

KINDS = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")
REQUIRED = ("trainable_variables", "non_trainable_variables")
CHECKPOINTABLE = "pytree"


def save_sharded(model, path, *, overwrite=False):
    """Save `model`'s state as a sharded Orbax checkpoint in directory `path`.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = make_model(); model.compile(...); model.fit(...)
    kdist.save_sharded(model, "/tmp/ckpt")
    ```

    Args:
        model: a built `keras.Model` (optimizer and metric state are saved
            when they exist).
        path: a directory; it must not exist unless `overwrite=True`.
        overwrite: replace an existing checkpoint at `path`.
    """
    ocp = _orbax()
    _require_values(model, "save_sharded")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(
            f"Checkpoint directory {path!r} already exists: pass overwrite=True to replace it, or choose another path."
        )
    ocp.save_checkpointables(path, {CHECKPOINTABLE: _state_tree(model)}, overwrite=overwrite)


def load_sharded(model, path):
    """Load a checkpoint written by `save_sharded` into `model`, on its current layouts.

    Build the model under the distribution you want (any mesh), compile it
    if you want the optimizer state back, then load: each variable is read
    straight into its own sharding. Weights (trainable and non-trainable)
    must all be in the checkpoint with the same shapes. Optimizer and metric
    variables are loaded when both sides have them: an uncompiled model
    loads only the weights, and a compiled model's optimizer is built first
    so its state can be restored.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = make_model(); model.compile(...)
    kdist.load_sharded(model, "/tmp/ckpt")   # saved on 8x1, loaded on 2x4
    ```

    Returns:
        A dict with "loaded" (variable paths restored), "skipped" (in the
        checkpoint, not in the model) and "not_in_checkpoint" (optimizer or
        metric variables of the model the checkpoint lacks; they keep their
        values).
    """
    ocp = _orbax()
    path = _checkpoint_dir(os.path.abspath(os.fspath(path)))
    _require_values(model, "load_sharded")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    tree = ocp.metadata(path, checkpointable_name=CHECKPOINTABLE).metadata
    saved = _flatten(tree)
    current = _flat_variables(model)
    _check_weights(saved, current, path)

    def abstract(key):
        if key not in current:
            return ocp.PLACEHOLDER
        value = current[key].value
        return jax.ShapeDtypeStruct(tuple(value.shape), value.dtype, sharding=value.sharding)

    # The abstract tree must keep the saved structure, empty groups included.
    request = _map_leaves(tree, abstract)
    loaded = _flatten(ocp.load_checkpointables(path, {CHECKPOINTABLE: request})[CHECKPOINTABLE])
    for key, value in loaded.items():
        if key in current:
            current[key].assign(value)
    return {
        "loaded": sorted(k.split("/", 1)[1] for k in saved if k in current),
        "skipped": sorted(k.split("/", 1)[1] for k in saved if k not in current),
        "not_in_checkpoint": sorted(k.split("/", 1)[1] for k in current if k not in saved),
    }


def _orbax():
    try:
        import orbax.checkpoint as ocp  # an optional dependency: imported when a checkpoint is used
    except ImportError as e:
        raise MissingDependencyError(
            "kdist.save_sharded/load_sharded need orbax-checkpoint: pip install orbax-checkpoint (or kdist[checkpoint])"
        ) from e
    return ocp.v1


def _require_values(model, caller):
    # A deferred variable (kdist.abstract_model) has no `_value`; reading `.value` would run its initializer.
    deferred = [v.path for v in model.variables if getattr(v, "_value", True) is None]
    if deferred:
        raise ValueError(
            f"{caller} needs a model whose variables exist; {len(deferred)} are deferred (first: {deferred[0]!r}), "
            "as in a model from kdist.abstract_model. Build the model for real under the distribution you want."
        )


def _state_tree(model):
    tree = {kind: {} for kind in KINDS}  # the four groups of `model.get_state_tree()`, even when empty
    tree.update(_nest({key: v.value for key, v in _flat_variables(model).items()}))
    return tree


def _flat_variables(model):
    """ "<kind>/<variable path>" -> variable, the keys of `model.get_state_tree()` joined by "/"."""
    optimizer = getattr(model, "optimizer", None)
    groups = {
        "trainable_variables": model.trainable_variables,
        "non_trainable_variables": model.non_trainable_variables,
        "optimizer_variables": optimizer.variables if optimizer is not None and optimizer.built else [],
        "metrics_variables": getattr(model, "metrics_variables", []),
    }
    out = {}
    for kind, variables in groups.items():
        for v in variables:
            key = f"{kind}/{v.path}"
            if key in out:
                raise ValueError(
                    f"Variable path {v.path!r} appears twice in model {model.name!r}; give its layers unique "
                    "names so that a checkpoint can tell them apart."
                )
            out[key] = v
    return out


def _check_weights(saved, current, path):
    missing = [k for k in current if k.split("/", 1)[0] in REQUIRED and k not in saved]
    if missing:
        raise ValueError(
            f"Checkpoint {path!r} has no value for {len(missing)} weight(s) of the model, first: "
            f"{missing[:3]}. Was it saved from the same model (same layer names)?"
        )
    differ = [
        f"{key.split('/', 1)[1]!r}: {tuple(meta.shape)} in the checkpoint, {tuple(current[key].shape)} in the model"
        for key, meta in saved.items()
        if key in current and tuple(meta.shape) != tuple(current[key].shape)
    ]
    if differ:
        raise ValueError(f"Checkpoint {path!r} does not fit the model; shapes differ: " + "; ".join(differ) + ".")


def _checkpoint_dir(path):
    """`path` itself, or its latest numbered step (a `keras.callbacks.OrbaxCheckpoint` directory)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No checkpoint directory at {path!r}.")
    if os.path.isdir(os.path.join(path, CHECKPOINTABLE)):
        return path
    steps = [int(n) for n in os.listdir(path) if n.isdigit() and os.path.isdir(os.path.join(path, n))]
    if steps:
        return os.path.join(path, str(max(steps)))
    raise FileNotFoundError(
        f"{path!r} is not a kdist/Keras Orbax checkpoint: it has no {CHECKPOINTABLE!r} directory and no numbered steps."
    )


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _map_leaves(tree, fn, prefix=""):
    return {
        key: _map_leaves(value, fn, f"{prefix}{key}/") if isinstance(value, dict) else fn(f"{prefix}{key}")
        for key, value in tree.items()
    }


def _nest(flat):
    tree = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
