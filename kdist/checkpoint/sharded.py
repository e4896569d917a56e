"""Sharded checkpoints that restore onto any mesh, through Orbax; loads that change nothing when they fail.

`save_sharded(model, path)` writes the model's whole state (weights,
optimizer state, metric state) with orbax-checkpoint: every process writes
the shards it holds (one copy of each replicated shard), nothing is gathered
on one host. `load_sharded(model, path)` reads it into a model built under
any distribution: each device reads only the slices its variables' current
shardings ask for.

Both ways are atomic. A save goes to a hidden sibling directory and is
renamed into place once complete; `overwrite=True` replaces only a
checkpoint, never an ordinary file or another directory. A load reads and
checks everything (structure, shapes, dtypes, kdist's checksums) before it
assigns anything, and puts every variable back if an assignment fails.

The checkpoint holds the tree of `model.get_state_tree()` under the
checkpointable name "pytree", the format of `keras.callbacks.OrbaxCheckpoint`,
so `model.load_weights(path)` (with a distribution set) reads it too, plus
`kdist_checkpoint.json`: each variable's shape, dtype and checksum.

Needs the `orbax-checkpoint` package (`pip install orbax-checkpoint`).
"""

import contextlib
import glob
import json
import os

import jax
import keras
from jax.experimental import multihost_utils

from kdist.atomic import exclusive, remove, replace_directory, sibling, write_text
from kdist.checkpoint.checksums import checksums
from kdist.checkpoint.reading import (
    CHECKPOINTABLE,
    FORMAT,
    KERAS_FILES,
    KINDS,
    MARKER,
    REQUIRED,
    checkpoint_dir,
    flat_variables,
    flatten,
    is_checkpoint,
    match_checkpoint,
    open_checkpoint,
    orbax,
    read_arrays,
)
from kdist.checkpoint.restore import assign_all, first_line, load_keras_file
from kdist.checks import shown
from kdist.errors import ArgumentError, ArgumentTypeError, CheckpointError, ModelError
from kdist.keras_internals import is_live


def save_sharded(model, path, *, overwrite=False):
    """Save `model`'s state as a sharded Orbax checkpoint in directory `path`, atomically.

    Every process of a multi-process run must call it. The checkpoint is
    written to a hidden sibling directory and renamed to `path` once it is
    complete, so `path` always holds either the old checkpoint or the new one.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = make_model(); model.compile(...); model.fit(...)
    kdist.save_sharded(model, "/tmp/ckpt")
    ```

    Args:
        model: a built `keras.Model` (optimizer and metric state are saved
            when they exist).
        path: a directory (str or path-like); it must not exist, be empty,
            or, with `overwrite=True`, be a checkpoint.
        overwrite: replace an existing checkpoint at `path`. Anything else at
            `path` (an ordinary file, a directory that is not a checkpoint)
            is never replaced.

    Raises:
        CheckpointError: `path` exists (without `overwrite=True`), is not a
            checkpoint, or cannot be written; nothing at `path` is changed.
        ArgumentTypeError: `model` is not a keras.Model, `path` not a path, `overwrite` not a bool.
        ModelError: the model is not built, or abstract (`kdist.abstract_model`).
    """
    require_model(model, "save_sharded")
    path = check_path(path, "save_sharded(path)")
    if not isinstance(overwrite, bool):
        raise ArgumentTypeError(
            f"save_sharded: overwrite must be True or False; received overwrite={shown(overwrite)}."
        )
    check_parent(path, "save_sharded")
    with one_writer(os.path.dirname(path), "save_sharded"):
        _check_target(path, overwrite)
        staging = sibling(path, "kdist-staging")
        write_checkpoint(model, staging)
        move_into_place(
            lambda: replace_directory(staging, path), "kdist_save_sharded", f"the new checkpoint into place at {path!r}"
        )


def load_sharded(model, path):
    """Load a checkpoint into `model`, on its current layouts; on any failure nothing is changed.

    `path` is a checkpoint written by `save_sharded` (or a
    `keras.callbacks.OrbaxCheckpoint` step directory, or its root: the
    latest step), or a Keras `.weights.h5` / `.keras` file. Build the model
    under the distribution you want (any mesh), compile it if you want the
    optimizer state back, then load: each variable is read straight into its
    own sharding. Weights (trainable and non-trainable) must all be in the
    checkpoint with the same shapes and dtypes. Optimizer and metric
    variables are loaded when both sides have them: an uncompiled model
    loads only the weights, and a compiled model's optimizer is built first
    so its state can be restored. Everything is read and checked before
    anything is assigned (a Keras file is loaded by `model.load_weights`,
    and every variable is put back if it fails).

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

    Raises:
        CheckpointError: the checkpoint is missing, unreadable, corrupted
            (a checksum differs) or does not fit the model; every variable
            keeps its value.
    """
    require_model(model, "load_sharded")
    path = check_path(path, "load_sharded(path)")
    if path.endswith(KERAS_FILES) and not os.path.isdir(path):
        return load_keras_file(model, path)
    directory = checkpoint_dir(path)
    marker, tree = open_checkpoint(directory)
    saved = flatten(tree)
    weights = {k: v for k, v in flat_variables(model).items() if k.startswith(REQUIRED)}
    match_checkpoint(saved, weights, directory, REQUIRED)  # the weights first, before the optimizer is built
    build_optimizer(model)
    current = flat_variables(model)
    match_checkpoint(saved, current, directory, REQUIRED)
    assign_all(current, read_arrays(directory, tree, current, marker))
    return {
        "loaded": sorted(k.split("/", 1)[1] for k in saved if k in current),
        "skipped": sorted(k.split("/", 1)[1] for k in saved if k not in current),
        "not_in_checkpoint": sorted(k.split("/", 1)[1] for k in current if k not in saved),
    }


# --- Arguments ------------------------------------------------------------------------------------


def require_model(model, caller):
    """`model` if it is a built `keras.Model` whose variables exist, else a kdist error saying what to pass."""
    if not isinstance(model, keras.Model):
        raise ArgumentTypeError(f"{caller} needs a keras.Model; received model={_short(model)}.")
    if not model.built or not model.variables:
        raise ModelError(
            f"{caller} needs a built model; {model.name!r} is not built (it has no variables yet). Give it a "
            "keras.Input, call it on a batch or call model.build(input_shape) first."
        )
    # A deferred variable (kdist.abstract_model) has no array; reading `.value` would run its initializer.
    deferred = [v.path for v in model.variables if not is_live(v)]
    if deferred:
        raise ModelError(
            f"{caller} needs a model whose variables exist; {len(deferred)} are deferred (first: {deferred[0]!r}), "
            "as in a model from kdist.abstract_model. Build the model for real under the distribution you want."
        )
    return model


def check_path(path, name):
    """`path` as an absolute path string; a kdist error for anything that is not a non-empty str or path-like."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise ArgumentTypeError(f"{name} must be a str or os.PathLike; received {_short(path)}.")
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ArgumentError(f"{name} must be a non-empty path; received {shown(path)}.")
    if "\x00" in text:
        raise ArgumentError(f"{name} contains a NUL character; received {shown(path)}.")
    return os.path.abspath(text)


@contextlib.contextmanager
def one_writer(directory, caller):
    """Create `directory` and, in a single-process run, hold its lock: concurrent saves there take turns."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"{caller}: cannot create the directory {directory!r}: {e.strerror or e}.") from None
    if jax.process_count() > 1:
        yield  # the processes of one run write together, in step through barriers
        return
    with exclusive(directory):
        yield


def check_parent(path, caller):
    """A `CheckpointError` unless `path`'s nearest existing ancestor is a directory this process can write into."""
    parent = os.path.dirname(path)
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise CheckpointError(
            f"{caller}: cannot write {path!r}: {parent!r} is a file, not a directory. Choose a path under a directory."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(
            f"{caller}: cannot write {path!r}: the directory {parent!r} is not writable by this process. "
            "Choose a writable directory or change its permissions."
        )


def _check_target(path, overwrite):
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path):
        raise CheckpointError(
            f"save_sharded: {path!r} is a file, not a checkpoint directory; kdist never replaces it "
            "(not even with overwrite=True). Choose another path."
        )
    if not os.listdir(path):
        return  # an empty directory: nothing to lose
    if not overwrite:
        raise CheckpointError(
            f"Checkpoint directory {path!r} already exists: pass overwrite=True to replace it, or choose another path."
        )
    if not is_checkpoint(path):
        raise CheckpointError(
            f"save_sharded: {path!r} is a directory that is not a checkpoint (no {MARKER}, no Orbax "
            f"{CHECKPOINTABLE}/ directory); overwrite=True replaces only checkpoints, so it was left as it is. "
            "Choose another path."
        )


# --- Writing --------------------------------------------------------------------------------------


def write_checkpoint(model, staging, extra=None):
    """Write `model`'s state to directory `staging` (replacing a stale one), with kdist's marker last.

    Collective: every process calls it. The caller moves `staging` into place.
    """
    ocp = orbax()
    variables = flat_variables(model)
    values = {key: v.value for key, v in variables.items()}
    sums = checksums(values)
    if jax.process_index() == 0:
        remove(staging)
        os.makedirs(os.path.dirname(staging), exist_ok=True)
    barrier("kdist_checkpoint_staging")
    tree = {kind: {} for kind in KINDS}  # the four groups of `model.get_state_tree()`, even when empty
    tree.update(_nest(values))
    try:
        ocp.save_checkpointables(staging, {CHECKPOINTABLE: tree})
        if jax.process_index() == 0:
            marker = {
                "format": FORMAT,
                "version": 1,
                "variables": {
                    key: {"shape": list(v.shape), "dtype": str(v.dtype), "checksum": sums[key]}
                    for key, v in values.items()
                },
                "extra": extra or {},
            }
            write_text(os.path.join(staging, MARKER), json.dumps(marker))
    except Exception as e:
        if jax.process_index() == 0:
            for partial in (staging, *glob.glob(glob.escape(staging) + ".orbax-checkpoint-tmp*")):
                remove(partial)  # what this save created, Orbax's temporary directory included
        full = "No space left on device" in str(e)
        raise CheckpointError(
            f"Cannot write a checkpoint to {staging!r}"
            + (": the disk is full; free space or choose another path. " if full else ": ")
            + f"Nothing was replaced. ({first_line(e)})"
        ) from e


def build_optimizer(model):
    """Build a compiled model's optimizer, so that its state can be restored into it."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)


def barrier(name):
    """Wait until every process of a multi-process run gets here (nothing to do in one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def move_into_place(move, barrier_name, what):
    """Run `move` (renames) on process 0, then meet the other processes; raise CheckpointError if it failed.

    Every process passes the barrier before process 0 raises, so no process waits there for ever.
    """
    failed = None
    if jax.process_index() == 0:
        try:
            move()
        except OSError as e:
            failed = e
    barrier(barrier_name)
    if failed is not None:
        raise CheckpointError(f"Cannot move {what}: {failed}.") from failed


def _nest(flat):
    tree = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _short(value):
    return f"{shown(value)} ({type(value).__name__})"
