"""Fault tolerance: resume a killed run where it stopped, on any mesh and process count.

`keras.callbacks.BackupAndRestore` restarts an interrupted epoch from its
first batch (it saves the batch number but does not use it), and in a
multi-process run every process writes the same weights file while
`save_weights` cannot read variables sharded over other processes.
`kdist.BackupAndRestore` keeps Keras's interface and fixes both:

- each backup is a sharded checkpoint (the format of `kdist.save_sharded`):
  every process writes the shards it holds, nothing is gathered on one host,
  and it restores onto any mesh and process count;
- a backup is written next to the last one and renamed into place once
  complete; the last one is kept until then (and after, with
  `double_checkpoint=True`), and a restore that finds the latest backup
  unreadable falls back to the previous one, saying so;
- a restore reads and checks everything before it assigns anything: a
  failed restore leaves every variable as it was;
- on restart it restores the epoch *and* the batch: the batches already
  trained in the interrupted epoch are read from the dataset and skipped
  without a train step, so the run ends with the same weights as an
  uninterrupted one (given a dataset that yields the same batches each run).
"""

import os

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils

from kdist.atomic import remove, sync_directory, write_text
from kdist.checkpoint.reading import flat_variables, flatten, match_checkpoint, open_checkpoint, read_arrays
from kdist.checkpoint.restore import assign_all
from kdist.checkpoint.sharded import (
    barrier,
    build_optimizer,
    check_parent,
    check_path,
    move_into_place,
    one_writer,
    require_model,
    write_checkpoint,
)
from kdist.checks import is_int, shown
from kdist.errors import ArgumentError, ArgumentTypeError, CheckpointError, ModelError
from kdist.keras_internals import print_msg

LATEST = "kdist_backup_latest"
PREVIOUS = "kdist_backup_previous"
INCOMING = ".kdist_backup_incoming"
CREATED = ".kdist_backup_dir"  # in a backup_dir kdist created: it may delete the directory at the end
REQUIRED = ("trainable_variables", "non_trainable_variables", "optimizer_variables")


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that resumes mid-epoch, across meshes and processes, and loses nothing.

    Use it in place of Keras's callback, in every process of the run; the
    `backup_dir` must be visible to all of them (one machine, or shared storage).

    Example:

    ```python
    dataset = kdist.make_dataset(x, y, global_batch_size=64)
    backup = kdist.BackupAndRestore("/tmp/backup", save_freq=10)
    model.fit(dataset, epochs=3, callbacks=[backup])   # killed? run it again: it resumes
    ```

    Args:
        backup_dir: directory of the backups (`kdist_backup_latest/`, and
            `kdist_backup_previous/`); created if needed.
        save_freq: "epoch" or a positive number of batches between saves.
        double_checkpoint: keep the previous backup after a new one is
            complete, to fall back to if the latest cannot be read.
        delete_checkpoint: delete the backups when training finishes (and
            `backup_dir`, if kdist created it and nothing else is in it).

    Attributes:
        restored: {"epoch", "batches_done", "path"} of the backup restored
            when training began, or None.
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True):
        backup_dir = check_path(backup_dir, "BackupAndRestore(backup_dir)")
        if os.path.lexists(backup_dir) and not os.path.isdir(backup_dir):
            raise ArgumentError(f"BackupAndRestore: backup_dir={backup_dir!r} is a file; give a directory.")
        check_parent(os.path.join(backup_dir, INCOMING), "BackupAndRestore")
        if save_freq != "epoch" and (not is_int(save_freq) or save_freq < 1):
            raise (ArgumentError if is_int(save_freq) or isinstance(save_freq, str) else ArgumentTypeError)(
                "BackupAndRestore: save_freq must be 'epoch' or a positive number of batches; "
                f"received save_freq={shown(save_freq)}."
            )
        for name, value in (("double_checkpoint", double_checkpoint), ("delete_checkpoint", delete_checkpoint)):
            if not isinstance(value, (bool, np.bool_)):
                raise ArgumentTypeError(
                    f"BackupAndRestore: {name} must be True or False; received {name}={shown(value)}."
                )
        save_freq = save_freq if save_freq == "epoch" else int(save_freq)
        super().__init__(
            backup_dir,
            save_freq=save_freq,
            double_checkpoint=bool(double_checkpoint),
            delete_checkpoint=bool(delete_checkpoint),
        )
        self._epoch = 0
        self._batches_done = 0
        self._resume = None  # (epoch, batches already trained in it) after a restore
        self._metric_values = []  # (metric variable, value restored) to give back after fit() resets them
        self._skipping = False
        self._skip_until = 0
        self._train_function = None
        self._saves = 0
        self.restored = None

    def on_train_begin(self, logs=None):
        model = self.model
        if not model.built:
            raise ModelError(
                f"kdist.BackupAndRestore needs a built model before fit(); model {model.name!r} is not built. "
                "Build it with an Input layer or by calling it on a batch."
            )
        restored = _restore(model, self.backup_dir)
        if restored is None:
            return
        meta, self._metric_values = restored
        self.restored = meta
        model._initial_epoch = meta["epoch"]
        self._epoch = meta["epoch"]
        if meta["batches_done"] > 0:
            self._resume = (meta["epoch"], meta["batches_done"])

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batches_done = 0
        if self._resume and self._resume[0] == epoch:
            # fit() reset the metrics just before this call: give the epoch's running means back.
            for variable, value in self._metric_values:
                variable.assign(value)
            self._skip_batches(self._resume[1])
            self._last_batch_seen = self._resume[1] - 1
            self._batches_seen_since_last_saving = 0
        self._resume = None
        self._metric_values = []

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
                f"The backup in {self.backup_dir} was taken after {self._skip_until} batches of epoch {epoch}, "
                f"but the dataset now yields only {self._batches_done}: resume with the dataset the run was started "
                "with."
            )
        self._epoch = epoch + 1
        self._batches_done = 0
        self._last_batch_seen = 0
        if self.save_freq == "epoch":
            self._save_model()

    def on_train_end(self, logs=None):
        if self.delete_checkpoint:
            delete_backups(self.backup_dir)

    def _save_model(self):
        self._saves += 1
        save_backup(
            self.model,
            self.backup_dir,
            epoch=self._epoch,
            batches_done=self._batches_done,
            keep_previous=self.double_checkpoint,
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


def save_backup(model, backup_dir, *, epoch=0, batches_done=0, keep_previous=False):
    """Write a backup of `model` (every variable, sharded) to `backup_dir`, replacing the latest once complete.

    Collective: every process calls it. The new backup is written to a
    hidden directory; then the latest becomes the previous one (deleted
    unless `keep_previous`) and the new one the latest.

    Example:

    ```python
    save_backup(model, "/tmp/backup", epoch=3, batches_done=10)
    restore_backup(other_model, "/tmp/backup")   # {"epoch": 3, "batches_done": 10, "path": ...}
    ```

    Returns:
        The metadata written: {"epoch", "batches_done"}.
    """
    require_model(model, "save_backup")
    backup_dir = check_path(backup_dir, "save_backup(backup_dir)")
    if os.path.lexists(backup_dir) and not os.path.isdir(backup_dir):
        raise CheckpointError(f"save_backup: backup_dir={backup_dir!r} is a file, not a directory; give a directory.")
    check_parent(os.path.join(backup_dir, INCOMING), "save_backup")
    if jax.process_index() == 0 and not os.path.isdir(backup_dir):
        os.makedirs(backup_dir, exist_ok=True)
        write_text(os.path.join(backup_dir, CREATED), "kdist.BackupAndRestore created this directory.\n")
    meta = {"epoch": int(epoch), "batches_done": int(batches_done)}
    with one_writer(backup_dir, "save_backup"):
        write_checkpoint(model, os.path.join(backup_dir, INCOMING), extra={"backup": meta})
        move_into_place(
            lambda: _rotate(backup_dir, keep_previous),
            "kdist_backup_saved",
            f"the new backup into place in {backup_dir}",
        )
    return meta


def _rotate(backup_dir, keep_previous):
    """The complete new backup becomes the latest; the latest becomes the previous one, kept or deleted."""
    latest, previous = os.path.join(backup_dir, LATEST), os.path.join(backup_dir, PREVIOUS)
    if os.path.isdir(latest):
        remove(previous)
        os.replace(latest, previous)
    os.replace(os.path.join(backup_dir, INCOMING), latest)
    sync_directory(backup_dir)
    if not keep_previous:
        remove(previous)


def restore_backup(model, backup_dir):
    """Restore the latest readable backup in `backup_dir` into `model`; nothing changes if it fails.

    Falls back to the previous backup when the latest is unreadable (and
    says so); a backup of another model (other variable names or shapes) is
    refused. Returns {"epoch", "batches_done", "path"}, or None when there is
    no backup. Metric state is assigned too (see `BackupAndRestore`).

    Example:

    ```python
    meta = restore_backup(model, "/tmp/backup")   # None if there is no backup yet
    ```

    Raises:
        CheckpointError: no backup can be read, or the backup does not fit the model.
    """
    require_model(model, "restore_backup")
    restored = _restore(model, check_path(backup_dir, "restore_backup(backup_dir)"))
    return None if restored is None else restored[0]


def delete_backups(backup_dir):
    """Delete the backups kdist wrote in `backup_dir`, and the directory if kdist created it and it is now empty."""
    barrier("kdist_backup_end")
    if jax.process_index() != 0 or not os.path.isdir(backup_dir):
        return
    for name in (LATEST, PREVIOUS, INCOMING):
        remove(os.path.join(backup_dir, name))
    if os.listdir(backup_dir) == [CREATED]:
        remove(os.path.join(backup_dir, CREATED))
        os.rmdir(backup_dir)


def _restore(model, backup_dir):
    """((metadata, [(metric variable, value)]) or None; reads and checks everything before assigning."""
    candidates = [os.path.join(backup_dir, n) for n in (LATEST, PREVIOUS) if os.path.isdir(os.path.join(backup_dir, n))]
    if not candidates:
        return None
    problems = []
    for path in candidates:
        opened = _everyone(lambda path=path: _open_backup(path))
        if isinstance(opened, CheckpointError):
            problems.append((path, opened))
            continue
        marker, tree = opened
        saved = flatten(tree)
        weights = {k: v for k, v in flat_variables(model).items() if k.startswith(REQUIRED[:2])}
        match_checkpoint(saved, weights, path, REQUIRED)  # the weights first, before the optimizer is built
        build_optimizer(model)
        current = flat_variables(model)
        wanted = _without_unmatched_metrics(current, saved)
        match_checkpoint(saved, wanted, path, REQUIRED)  # another model's backup: refused, no fall back
        values = _everyone(lambda path=path: read_arrays(path, tree, wanted, marker))
        if isinstance(values, CheckpointError):
            problems.append((path, values))
            continue
        assign_all(wanted, values)
        for failed, error in problems:
            print_msg(f"kdist.BackupAndRestore: the backup {failed} is unreadable ({error}); restored {path} instead.")
        meta = marker["extra"]["backup"]
        metrics = [(wanted[k], values[k]) for k in values if k.startswith("metrics_variables/")]
        return {"epoch": meta["epoch"], "batches_done": meta["batches_done"], "path": path}, metrics
    raise CheckpointError(
        f"No readable backup in {backup_dir}: " + "; ".join(f"{p}: {e}" for p, e in problems) + ". Delete the "
        "directory to start training from scratch."
    )


def _open_backup(path):
    marker, tree = open_checkpoint(path)
    meta = ((marker or {}).get("extra") or {}).get("backup")
    if not (isinstance(meta, dict) and is_int(meta.get("epoch")) and is_int(meta.get("batches_done"))):
        raise CheckpointError(f"{path} is not a kdist backup: its kdist_checkpoint.json has no epoch and batch.")
    return marker, tree


def _everyone(read):
    """`read()`, or the CheckpointError it raised; in a multi-process run, an error if any process failed."""
    try:
        result = read()
    except CheckpointError as e:
        result = e
    if jax.process_count() > 1:
        failed = multihost_utils.process_allgather(np.array(isinstance(result, CheckpointError), np.int32))
        if np.any(failed) and not isinstance(result, CheckpointError):
            result = CheckpointError(f"another process could not read it (processes {np.flatnonzero(failed)})")
    return result


def _without_unmatched_metrics(current, saved):
    """The model's variables to load: metric state only when the backup has the same metrics."""
    metrics = {k for k in current if k.startswith("metrics_variables/")}
    if not metrics:  # outside fit() the metrics may not be built: nothing to restore
        return current
    same = all(k in saved and tuple(saved[k].shape) == tuple(current[k].shape) for k in metrics) and metrics == {
        k for k in saved if k.startswith("metrics_variables/")
    }
    if same:
        return current
    print_msg(
        f"kdist.BackupAndRestore: the model's metrics {sorted(k.split('/', 1)[1] for k in metrics)} differ from the "
        "backup's; this epoch's metrics cover only the batches trained after the restart."
    )
    return {k: v for k, v in current.items() if k not in metrics}
