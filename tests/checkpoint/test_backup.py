"""kdist.BackupAndRestore in one process: a run killed mid-epoch resumes where it stopped, on the same or another mesh.

The multi-process case (2 processes x 4 devices, one SIGKILLed) is in test_launcher.py.
"""

import shutil

import keras
import numpy as np
import pytest

import kdist
from kdist.checkpoint.backup import restore_backup, save_backup
from tests.launch_scripts import common
from tests.launch_scripts.common import build, train


class Crash(Exception):
    pass


class CrashAt(keras.callbacks.Callback):
    """Raise when a given batch of a given epoch begins, like a process dying there."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Crash(f"crashed at {self.at}")


def _assert_same(model, reference):
    weights = common.state(model)
    assert list(weights) == list(reference)
    for path, want in reference.items():
        np.testing.assert_allclose(weights[path], want, rtol=1e-5, atol=1e-6, err_msg=path)


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted "2x4" run: (losses, {path: array})."""
    ref = common.reference()
    return ref["2x4"], ref["state"]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A "2x4" run saving every 3 batches, crashed when epoch 1 batch 3 began (last save: epoch 1 batch 1)."""
    backup = tmp_path_factory.mktemp("crashed") / "backup"
    with pytest.raises(Crash):
        train("2x4", epochs=2, callbacks=[kdist.BackupAndRestore(str(backup), save_freq=3), CrashAt(1, 3)])
    return backup


def test_restart_on_the_same_mesh_ends_with_the_uninterrupted_weights(crashed, reference, tmp_path):
    backup = shutil.copytree(crashed, tmp_path / "backup")
    callback = kdist.BackupAndRestore(str(backup), save_freq=3)
    losses, model = train("2x4", epochs=2, callbacks=[callback])
    assert (callback.restored["epoch"], callback.restored["batches_done"]) == (1, 2)
    np.testing.assert_allclose(losses, reference[0][6:], rtol=1e-5)  # only the 2 remaining steps ran
    _assert_same(model, reference[1])
    assert not backup.exists()  # delete_checkpoint=True: removed once training finished


def test_restart_on_another_mesh_ends_with_the_uninterrupted_weights(crashed, reference, tmp_path):
    backup = shutil.copytree(crashed, tmp_path / "backup")
    losses, model = train("tp", epochs=2, callbacks=[kdist.BackupAndRestore(str(backup), save_freq=3)])
    sharding = model.layers[0].kernel.value.sharding  # really another layout: 8-way tensor parallel
    assert dict(sharding.mesh.shape) == {"model": 8} and tuple(sharding.spec) == (None, "model")
    np.testing.assert_allclose(losses, reference[0][6:], rtol=1e-5)
    _assert_same(model, reference[1])


def test_epoch_checkpoints_resume_at_the_next_epoch(reference, tmp_path):
    backup = tmp_path / "backup"
    with pytest.raises(Crash):
        train("2x4", epochs=2, callbacks=[kdist.BackupAndRestore(str(backup)), CrashAt(1, 2)])
    callback = kdist.BackupAndRestore(str(backup))
    losses, model = train("dp", epochs=2, callbacks=[callback])
    assert (callback.restored["epoch"], callback.restored["batches_done"]) == (1, 0)
    np.testing.assert_allclose(losses, reference[0][4:], rtol=1e-5)
    _assert_same(model, reference[1])


def test_keras_callback_restarts_the_interrupted_epoch_from_its_first_batch(reference, tmp_path):
    """What kdist.BackupAndRestore fixes: Keras saves the batch but resumes at the epoch's start."""
    backup = str(tmp_path / "backup")
    with pytest.raises(Crash):
        train("2x4", epochs=2, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3), CrashAt(1, 3)])
    losses, model = train("2x4", epochs=2, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3)])
    assert len(losses) == 4  # epoch 1 ran again in full, on top of the weights saved after its batch 1
    weights = common.state(model)
    assert not all(np.allclose(weights[p], want, rtol=1e-5, atol=1e-6) for p, want in reference[1].items())


def test_restoring_into_another_model_names_the_missing_variable(crashed):
    with kdist.preset("dp").scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4, name="other")], name="tiny")
        model.compile(optimizer="adam", loss="mse")
    with pytest.raises(
        kdist.CheckpointError, match=r"no value for 2 variable\(s\) of the model, first: \['tiny/other/k"
    ):
        restore_backup(model, crashed)


def test_save_and_restore_round_trip_between_meshes(tmp_path):
    with kdist.preset("2x4").scope():
        source = build()
        source.optimizer.build(source.trainable_variables)
    save_backup(source, tmp_path / "backup", epoch=3, batches_done=1)
    with kdist.preset("fsdp").scope():
        target = build()
        target.layers[0].kernel.assign(np.zeros((16, 32), "float32"))
    meta = restore_backup(target, tmp_path / "backup")
    assert (meta["epoch"], meta["batches_done"]) == (3, 1)
    _assert_same(target, common.state(source))


def test_resuming_with_a_shorter_dataset_is_refused(crashed, tmp_path):
    backup = shutil.copytree(crashed, tmp_path / "backup")  # taken after 2 batches of epoch 1
    x, y = common.data()
    with kdist.preset("2x4").scope():
        model = build()
        short = kdist.make_dataset(x[:16], y[:16], global_batch_size=common.GLOBAL_BATCH)  # 1 batch per epoch
        with pytest.raises(
            kdist.CheckpointError, match="taken after 2 batches of epoch 1, but the dataset now yields only 1"
        ):
            model.fit(short, epochs=2, verbose=0, callbacks=[kdist.BackupAndRestore(str(backup), save_freq=3)])
