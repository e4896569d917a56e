"""Reading a checkpoint and checking it against a model, before anything is assigned.

`open_checkpoint` reads kdist's marker and the Orbax metadata (shapes and
dtypes of the saved arrays), `match_checkpoint` compares them with the
model, `read_arrays` reads the arrays onto the model's current shardings and
checks them against the checksums the marker holds. Each raises
`CheckpointError` naming the directory and the problem; none changes the model.
"""

import os
import re

import jax
import numpy as np

from kdist.checkpoint.checksums import checksums
from kdist.checkpoint.restore import first_line
from kdist.errors import CheckpointError, MissingDependencyError
from kdist.keras_internals import array_of, own_layout
from kdist.textdata import read_json

KINDS = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")
REQUIRED = ("trainable_variables", "non_trainable_variables")
CHECKPOINTABLE = "pytree"  # the item kdist writes, as keras.callbacks.OrbaxCheckpoint does with Keras 3.15
# Orbax after 0.12.8 names Keras's default item "state": both are read.
READABLE_ITEMS = (CHECKPOINTABLE, "state")
MARKER = "kdist_checkpoint.json"
FORMAT = "kdist.sharded_checkpoint"
KERAS_FILES = (".weights.h5", ".keras", ".h5")


def is_checkpoint(path):
    """Whether directory `path` is a checkpoint kdist may replace: kdist's marker, or the Orbax layout it writes."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, MARKER)):
        return True
    return os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")) and saved_item(path) is not None


def saved_item(directory):
    """The name of the item holding the arrays in checkpoint `directory` ("pytree" or "state"), or None."""
    return next((name for name in READABLE_ITEMS if os.path.isdir(os.path.join(directory, name))), None)


# --- Reading --------------------------------------------------------------------------------------


def checkpoint_dir(path):
    """`path` itself, or its latest numbered step (a `keras.callbacks.OrbaxCheckpoint` directory)."""
    if not os.path.exists(path):
        raise CheckpointError(f"No checkpoint at {path!r}: it does not exist.")
    if not os.path.isdir(path):
        raise CheckpointError(
            f"{path!r} is a file, not a checkpoint directory; load_sharded reads directories written by "
            f"save_sharded, and Keras files ending in {', '.join(KERAS_FILES)}."
        )
    if saved_item(path) is not None or os.path.isfile(os.path.join(path, MARKER)):
        return path
    steps = [int(n) for n in os.listdir(path) if n.isdigit() and os.path.isdir(os.path.join(path, n))]
    if steps:
        return os.path.join(path, str(max(steps)))
    raise CheckpointError(
        f"{path!r} is not a kdist/Keras Orbax checkpoint: it has no {' or '.join(READABLE_ITEMS)} directory, "
        f"no {MARKER} "
        "and no numbered steps."
    )


def open_checkpoint(directory):
    """(kdist's marker or None, the saved tree of array metadata); CheckpointError if either cannot be read."""
    ocp = orbax()
    marker = _read_marker(directory)
    item = saved_item(directory)
    if item is None:
        raise CheckpointError(f"Checkpoint {directory!r} is incomplete: its {CHECKPOINTABLE}/ directory is missing.")
    where = os.path.join(directory, item)
    _check_json(os.path.join(where, "_METADATA"), directory)
    try:
        tree = ocp.metadata(directory, checkpointable_name=item).metadata
    except Exception as e:
        raise CheckpointError(f"Checkpoint {directory!r} is unreadable: {first_line(e)}") from e
    if not isinstance(tree, dict):
        raise CheckpointError(
            f"Checkpoint {directory!r} is unreadable: Orbax could not read the metadata of its arrays "
            f"(a file under {where} is missing, truncated or corrupted)."
        )
    if marker is not None:
        saved = {k: (tuple(m.shape), str(m.dtype)) for k, m in flatten(tree).items()}
        listed = {k: (tuple(m["shape"]), m["dtype"]) for k, m in marker["variables"].items()}
        if saved != listed:
            differ = sorted(set(saved.items()) ^ set(listed.items()))[:3]
            raise CheckpointError(
                f"Checkpoint {directory!r} is corrupted: {MARKER} and the Orbax metadata disagree (e.g. {differ})."
            )
    return marker, tree


_UNNUMBERED = re.compile(r"_\d+(?=/|$)")  # "seed_generator_1/x" -> "seed_generator/x"


def match_checkpoint(saved, current, directory, required):
    """Raise CheckpointError unless every model variable of the `required` kinds is saved with its shape and dtype."""
    missing = [k for k in current if k.split("/", 1)[0] in required and k not in saved]
    if missing:
        unnumbered = {_UNNUMBERED.sub("", k) for k in saved}
        renumbered = all(_UNNUMBERED.sub("", k) in unnumbered for k in missing)
        hint = (
            " The names differ only in Keras's automatic numbering (e.g. 'dense_1' for 'dense'): the model was "
            "built again in the same process, where Keras counts on from the first one. Call "
            "keras.backend.clear_session() before building it again, or give its layers names."
            if renumbered
            else " Was it saved from the same model (same layer names)?"
        )
        raise CheckpointError(
            f"Checkpoint {directory!r} has no value for {len(missing)} variable(s) of the model, first: "
            f"{[k.split('/', 1)[1] for k in missing[:3]]}.{hint}"
        )
    differ = [
        f"{key.split('/', 1)[1]!r}: {tuple(meta.shape)} {meta.dtype} in the checkpoint, "
        f"{tuple(current[key].shape)} {current[key].dtype} in the model"
        for key, meta in saved.items()
        if key in current
        and (tuple(meta.shape) != tuple(current[key].shape) or str(meta.dtype) != str(current[key].dtype))
    ]
    if differ:
        raise CheckpointError(
            f"Checkpoint {directory!r} does not fit the model; shapes or dtypes differ: " + "; ".join(differ) + "."
        )


def read_arrays(directory, tree, current, marker, shardings=None):
    """{key: array} for every saved variable the model has, read onto its sharding and checked against the checksums.

    A variable without an array (deferred, `kdist.abstract_model`) is read onto `shardings[key]`; None or no
    entry: to one device, uncommitted.
    """
    ocp = orbax()

    def abstract(key):
        if key not in current:
            return ocp.PLACEHOLDER
        value = array_of(current[key])
        if value is None:
            sharding, dtype = (shardings or {}).get(key), jax.numpy.dtype(current[key].dtype)
            if sharding is None:
                return np.broadcast_to(np.zeros((), dtype), tuple(current[key].shape))
            return jax.ShapeDtypeStruct(tuple(current[key].shape), dtype, sharding=sharding)
        if own_layout(current[key]) is None and not value.committed:
            # No distribution: Keras keeps the array uncommitted. Read it to host and put it back uncommitted
            # (below): a committed array beside uncommitted ones makes jit compile the train/test steps again.
            return np.broadcast_to(np.zeros((), value.dtype), tuple(value.shape))
        return jax.ShapeDtypeStruct(tuple(value.shape), value.dtype, sharding=value.sharding)

    # The abstract tree must keep the saved structure, empty groups included.
    request = _map_leaves(tree, abstract)
    item = saved_item(directory)
    try:
        loaded = ocp.load_checkpointables(directory, {item: request})[item]
    except Exception as e:
        raise CheckpointError(f"Checkpoint {directory!r} is unreadable: {first_line(e)}") from e
    loaded = {k: v for k, v in flatten(loaded).items() if k in current}
    loaded = {k: v if isinstance(v, jax.Array) else jax.numpy.asarray(v) for k, v in loaded.items()}  # uncommitted
    if marker is not None:
        sums = checksums(loaded)
        bad = [k for k, s in sums.items() if list(s) != list(marker["variables"][k]["checksum"])]
        if bad:
            raise CheckpointError(
                f"Checkpoint {directory!r} is corrupted: the data of {len(bad)} array(s) differ from their "
                f"checksums, first: {[k.split('/', 1)[1] for k in bad[:3]]}."
            )
    return loaded


def _read_marker(directory):
    path = os.path.join(directory, MARKER)
    if not os.path.lexists(path):
        return None
    marker = read_json(path, f"Checkpoint {directory!r} is corrupted: {MARKER}", CheckpointError)
    variables = marker.get("variables") if isinstance(marker, dict) else None
    if (
        not isinstance(marker, dict)
        or marker.get("format") != FORMAT
        or not isinstance(variables, dict)
        or not all(isinstance(m, dict) and {"shape", "dtype", "checksum"} <= set(m) for m in variables.values())
    ):
        raise CheckpointError(f"Checkpoint {directory!r} is corrupted: {MARKER} is not a kdist checkpoint description.")
    return marker


def _check_json(path, directory):
    if not os.path.lexists(path):
        raise CheckpointError(f"Checkpoint {directory!r} is incomplete: {path} is missing.")
    read_json(path, f"Checkpoint {directory!r} is corrupted: {path}", CheckpointError)


def flat_variables(model):
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
                raise CheckpointError(
                    f"Variable path {v.path!r} appears twice in model {model.name!r}; give its layers unique "
                    "names so that a checkpoint can tell them apart."
                )
            out[key] = v
    return out


def flatten(tree, prefix=""):
    """A nested dict as {"a/b/c": leaf}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _map_leaves(tree, fn, prefix=""):
    return {
        key: _map_leaves(value, fn, f"{prefix}{key}/") if isinstance(value, dict) else fn(f"{prefix}{key}")
        for key, value in tree.items()
    }


def orbax():
    """orbax.checkpoint's v1 API, or MissingDependencyError saying how to install it."""
    try:
        import orbax.checkpoint as ocp  # an optional dependency: imported when a checkpoint is used
    except ImportError as e:
        raise MissingDependencyError(
            "kdist.save_sharded/load_sharded need orbax-checkpoint: pip install orbax-checkpoint (or kdist[checkpoint])"
        ) from e
    return ocp.v1
