"""Fault tolerance: resume a killed run where it stopped, on any mesh and process count.

`keras.callbacks.BackupAndRestore` restarts an interrupted epoch from its
first batch (it saves the batch number but does not use it), and in a
multi-process run every process writes the same weights file while
`save_weights` cannot read variables sharded over other processes.
`kdist.BackupAndRestore` keeps Keras's interface and fixes both:

- the checkpoint holds every model and optimizer variable by path, gathered
  to full arrays, written by process 0 only, atomically; it does not depend
  on the mesh, so a run can resume under another preset or process count;
- on restart it restores the epoch *and* the batch: the batches already
  trained in the interrupted epoch are read from the dataset and skipped
  without a train step, so the run ends with the same weights as an
  uninterrupted one (given a dataset that yields the same batches each run).
"""

import json
import os
import shutil

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils

from kdist.errors import CheckpointError
from kdist.keras_internals import print_msg
from kdist.model_state import check_unique_paths, state_variables

CHECKPOINT_FILE = "kdist_checkpoint.npz"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that resumes mid-epoch, across meshes and processes.

    Use it in place of Keras's callback, in every process of the run; the
    `backup_dir` must be visible to all of them (one machine, or shared storage).

    Example:

    ```python
    dataset = kdist.make_dataset(x, y, global_batch_size=64)
    backup = kdist.BackupAndRestore("/tmp/backup", save_freq=10)
    model.fit(dataset, epochs=3, callbacks=[backup])   # killed? run it again: it resumes
    ```

    Args:
        backup_dir: directory of the checkpoint (`kdist_checkpoint.npz`).
        save_freq: "epoch" or a number of batches between saves.
        double_checkpoint: also keep the previous checkpoint, used if the latest cannot be read.
        delete_checkpoint: delete `backup_dir` when training finishes.
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True):
        super().__init__(
            backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint, delete_checkpoint=delete_checkpoint
        )
        self.checkpoint_path = os.path.join(backup_dir, CHECKPOINT_FILE)
        self._previous_path = os.path.join(backup_dir, "previous_" + CHECKPOINT_FILE)
        self._epoch = 0
        self._batches_done = 0
        self._resume = None  # (epoch, batches already trained in it) after a restore
        self._skipping = False
        self._skip_until = 0
        self._train_function = None
        self._saves = 0
        self._restored_path = None
        self.restored = None  # metadata of the checkpoint restored at train begin, if any

    def on_train_begin(self, logs=None):
        model = self.model
        if not model.built:
            raise ValueError(
                f"kdist.BackupAndRestore needs a built model before fit(); model {model.name!r} is not built. "
                "Build it with an Input layer or by calling it on a batch."
            )
        path = self.checkpoint_path
        if not os.path.exists(path) and self.double_checkpoint and os.path.exists(self._previous_path):
            path = self._previous_path
        if not os.path.exists(path):
            return
        try:
            meta = restore_checkpoint(model, path)
        except (OSError, ValueError) as e:
            if not (self.double_checkpoint and os.path.exists(self._previous_path)) or path == self._previous_path:
                raise
            print_msg(f"kdist.BackupAndRestore: {path} is unreadable ({e}); using the previous checkpoint.")
            path = self._previous_path
            meta = restore_checkpoint(model, path)
        self.restored = meta
        self._restored_path = path
        model._initial_epoch = meta["epoch"]
        self._epoch = meta["epoch"]
        if meta["batches_done"] > 0:
            self._resume = (meta["epoch"], meta["batches_done"])

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches_done = 0
        if self._resume and self._resume[0] == epoch:
            # fit() reset the metrics just before this call: give the epoch's running means back.
            restore_metrics(self.model, self._restored_path)
            self._skip_batches(self._resume[1])
            self._last_batch_seen = self._resume[1] - 1
            self._batches_seen_since_last_saving = 0
        self._resume = None

    def on_train_batch_end(self, batch, logs=None):
        self._batches_done = batch + 1
        if self._skipping:
            self._skipping = self._batches_done < self._skip_until
            return
        if self._should_save_on_batch(batch):
            self._save_model()

    def on_epoch_end(self, epoch, logs=None):
        if self._skipping:
            self.model.train_function = self._train_function
            self._skipping = False
            raise CheckpointError(
                f"The checkpoint in {self.backup_dir} was taken after {self._skip_until} batches of epoch {epoch}, "
                f"but the dataset now yields only {self._batches_done}: resume with the dataset the run was started "
                "with."
            )
        self._epoch = epoch + 1
        self._batches_done = 0
        self._last_batch_seen = 0
        if self.save_freq == "epoch":
            self._save_model()

    def on_train_end(self, logs=None):
        if not self.delete_checkpoint:
            return
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("kdist_backup_end")
        if jax.process_index() == 0 and os.path.exists(self.backup_dir):
            shutil.rmtree(self.backup_dir)

    def _save_model(self):
        if self.double_checkpoint and _is_writer() and os.path.exists(self.checkpoint_path):
            os.replace(self.checkpoint_path, self._previous_path)
        self._saves += 1
        save_checkpoint(
            self.model, self.checkpoint_path, epoch=self._epoch, batches_done=self._batches_done, tag=self._saves
        )

    def _skip_batches(self, count):
        """Make the next `count` train steps read their batch and do nothing else."""
        model = self.model
        train_function = self._train_function = model.train_function
        steps = getattr(model, "steps_per_execution", 1) or 1
        left = [count]
        self._skipping, self._skip_until = True, count

        def skip(state, iterator):
            for i in range(min(steps, left[0])):
                try:
                    next(iterator)
                except StopIteration:
                    if i == 0:
                        raise
                    break
            left[0] -= steps
            if left[0] <= 0:
                model.train_function = train_function
            return {}, state

        model.train_function = skip


def save_checkpoint(model, path, *, epoch=0, batches_done=0, tag=0):
    """Write every model and optimizer variable of `model` to `path` (.npz), mesh-independent.

    Variables sharded over several processes are gathered; every process
    must call this (it is collective), and process 0 writes the file
    atomically. Returns the metadata written.
    """
    variables = _state_variables(model)
    metrics = list(model.metrics_variables)
    paths = [v.path for v in variables]
    values = [v.value for v in variables + metrics]
    remote = [i for i, v in enumerate(values) if isinstance(v, jax.Array) and not v.is_fully_addressable]
    if remote:
        gathered = multihost_utils.process_allgather([values[i] for i in remote], tiled=True)
        for i, g in zip(remote, gathered):
            values[i] = g
    meta = {
        "epoch": int(epoch),
        "batches_done": int(batches_done),
        "paths": paths,
        "metrics_paths": [v.path for v in metrics],
        "format": 1,
    }
    if _is_writer():
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        arrays = {f"v{i}": np.asarray(v) for i, v in enumerate(values[: len(variables)])}
        arrays.update({f"m{i}": np.asarray(v) for i, v in enumerate(values[len(variables) :])})
        tmp = f"{path}.tmp{os.getpid()}.npz"
        np.savez(tmp, __meta__=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"kdist_backup_save_{tag}")
    return meta


def restore_checkpoint(model, path):
    """Load a checkpoint written by `save_checkpoint` into `model` (and its optimizer), under any mesh.

    Metric state is not restored here (fit() resets it each epoch): see `restore_metrics`.
    Returns the checkpoint's metadata: {"epoch", "batches_done", "paths", "metrics_paths"}.

    Raises:
        CheckpointError: a variable of the model is missing from the checkpoint,
            or has another shape there.
    """
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        stored = {p: f"v{i}" for i, p in enumerate(meta["paths"])}
        variables = _state_variables(model)
        missing = [v.path for v in variables if v.path not in stored]
        if missing:
            raise CheckpointError(
                f"Checkpoint {path} has no values for {missing[:5]}{' ...' if len(missing) > 5 else ''}; "
                f"it holds {len(stored)} variables such as {list(stored)[:3]}. Restore into the same model "
                "(same layer names) and optimizer it was saved from."
            )
        for v in variables:
            value = data[stored[v.path]]
            if tuple(value.shape) != tuple(v.shape):
                raise CheckpointError(
                    f"Checkpoint {path} holds {v.path} with shape {tuple(value.shape)}, but the model's variable has "
                    f"shape {tuple(v.shape)}."
                )
            v.assign(value)
    return meta


def restore_metrics(model, path):
    """Load the metric state (running means of the interrupted epoch) of a checkpoint into `model`.

    Returns True if restored; False (with a printed notice) when the model's
    metrics differ from the checkpoint's, in which case the epoch's metrics
    cover only the batches trained after the restart.
    """
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["__meta__"]))
        stored = meta.get("metrics_paths", [])
        variables = list(model.metrics_variables)
        values = [data[f"m{i}"] for i in range(len(stored))]
    if [v.path for v in variables] != stored or any(tuple(v.shape) != a.shape for v, a in zip(variables, values)):
        print_msg(
            f"kdist.BackupAndRestore: the model's metrics {[v.path for v in variables]} differ from the "
            f"checkpoint's {stored}; this epoch's metrics cover only the batches trained after the restart."
        )
        return False
    for v, a in zip(variables, values):
        v.assign(a)
    return True


def _state_variables(model):
    entries = state_variables(model, ("trainable", "non_trainable", "optimizer"))
    check_unique_paths(entries)
    return [v for v, _ in entries]


def _is_writer():
    return jax.process_index() == 0
