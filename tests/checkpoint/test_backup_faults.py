"""Backups that lose nothing: a failed restore changes no variable, a damaged latest backup falls back to the
previous one (saying so), a failed save keeps the last good backup, and the end deletes only kdist's files."""

import os
import shutil

import keras
import numpy as np
import pytest

import kdist
from kdist.checkpoint import sharded as checkpoints
from kdist.checkpoint.backup import INCOMING, LATEST, PREVIOUS, restore_backup, save_backup
from tests.checkpoint.state_helpers import assert_unchanged, flip_byte, largest_file, model, snapshot, truncate
from tests.launch_scripts import common

pytest.importorskip("orbax.checkpoint")


@pytest.fixture(scope="module")
def backups(tmp_path_factory):
    """A backup directory holding a latest (epoch 2) and a previous (epoch 1) backup, and their weights."""
    root = tmp_path_factory.mktemp("backups") / "backup"
    first = model(4, seed=0)
    save_backup(first, root, epoch=1, batches_done=0, keep_previous=True)
    second = model(4, seed=3)
    save_backup(second, root, epoch=2, batches_done=5, keep_previous=True)
    kernels = {name: np.asarray(m.layers[0].kernel.value) for name, m in (("previous", first), ("latest", second))}
    keras.distribution.set_distribution(None)
    return root, kernels


def _copy(backups, tmp_path):
    return shutil.copytree(backups[0], tmp_path / "backup")


def _refused(target, directory, words):
    before = snapshot(target)
    with pytest.raises(kdist.CheckpointError) as caught:
        restore_backup(target, directory)
    assert_unchanged(target, before)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_the_latest_backup_is_restored(backups):
    target = model(4, seed=1)
    meta = restore_backup(target, backups[0])
    assert (meta["epoch"], meta["batches_done"]) == (2, 5) and meta["path"].endswith(LATEST)
    np.testing.assert_array_equal(np.asarray(target.layers[0].kernel.value), backups[1]["latest"])


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: flip_byte(largest_file(p / "pytree")), "differ from their checksums"),
        (lambda p: truncate(largest_file(p / "pytree")), "is unreadable"),
        (lambda p: (p / "kdist_checkpoint.json").write_text("garbage"), "kdist_checkpoint.json is not valid JSON"),
        (lambda p: shutil.rmtree(p / "pytree"), "directory is missing"),
    ],
    ids=["corrupted-array", "truncated", "garbage-marker", "missing-arrays"],
)
def test_a_damaged_latest_backup_falls_back_to_the_previous_one_and_says_so(backups, tmp_path, capsys, damage, problem):
    directory = _copy(backups, tmp_path)
    damage(directory / LATEST)
    target = model(4, seed=1)
    meta = restore_backup(target, directory)
    assert (meta["epoch"], meta["batches_done"]) == (1, 0) and meta["path"].endswith(PREVIOUS)
    np.testing.assert_array_equal(np.asarray(target.layers[0].kernel.value), backups[1]["previous"])
    said = capsys.readouterr().out
    assert f"the backup {directory / LATEST} is unreadable" in said and problem in said
    assert f"restored {directory / PREVIOUS} instead" in said


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: flip_byte(largest_file(p / "pytree")), "differ from their checksums"),
        (lambda p: truncate(largest_file(p / "pytree")), "is unreadable"),
    ],
    ids=["corrupted-array", "truncated"],
)
def test_a_damaged_backup_without_a_previous_one_changes_nothing(backups, tmp_path, damage, problem):
    directory = _copy(backups, tmp_path)
    shutil.rmtree(directory / PREVIOUS)
    damage(directory / LATEST)
    _refused(model(4, seed=1), directory, ["No readable backup in", str(directory / LATEST), problem])


def test_another_models_backup_changes_nothing_and_is_not_skipped(backups):
    _refused(model(5, seed=1), backups[0], ["does not fit the model", "'mlp/d2/kernel': (256, 4) float32"])
    renamed = keras.Sequential([keras.Input((64,)), keras.layers.Dense(4, name="other")], name="mlp")
    renamed.compile(optimizer="adam", loss="mse")
    _refused(renamed, backups[0], ["has no value for", "mlp/other/kernel"])


def test_a_failed_save_keeps_the_last_backup(backups, tmp_path, monkeypatch):
    directory = _copy(backups, tmp_path)

    class Broken:
        def save_checkpointables(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "orbax", lambda: Broken())
    with pytest.raises(kdist.CheckpointError, match="No space left on device"):
        save_backup(model(4, seed=7), directory, epoch=3)
    monkeypatch.undo()
    assert sorted(os.listdir(directory)) == sorted([".kdist_backup_dir", LATEST, PREVIOUS])  # no INCOMING left
    assert restore_backup(model(4, seed=1), directory)["epoch"] == 2


def test_without_double_checkpoint_only_the_latest_is_kept(tmp_path):
    save_backup(model(4), tmp_path / "b", epoch=1)
    save_backup(model(4), tmp_path / "b", epoch=2)
    assert sorted(os.listdir(tmp_path / "b")) == [".kdist_backup_dir", LATEST]
    assert INCOMING not in os.listdir(tmp_path / "b")


def test_the_end_of_training_deletes_only_what_the_callback_wrote(tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    (directory / "notes.txt").write_text("keep me")
    callback = kdist.BackupAndRestore(str(directory), save_freq=2, double_checkpoint=True)
    common.train("dp", epochs=1, callbacks=[callback])
    assert sorted(os.listdir(directory)) == ["notes.txt"]
    created = tmp_path / "created"
    common.train("dp", epochs=1, callbacks=[kdist.BackupAndRestore(str(created), save_freq=2)])
    assert not created.exists()  # kdist made it, and nothing else is in it
