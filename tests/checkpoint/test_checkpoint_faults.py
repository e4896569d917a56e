"""Nothing lost: a refused save deletes nothing, a failed load changes no variable, damage is named.

Every failed load below leaves every variable of the target model bitwise as
it was (same bytes, dtype, shape and sharding), and raises
`kdist.CheckpointError` naming the file and the problem.
"""

import os
import shutil

import keras
import numpy as np
import pytest

import kdist
from kdist.checkpoint import sharded as checkpoints
from tests.checkpoint.state_helpers import assert_unchanged, flip_byte, largest_file, model, snapshot, truncate

pytest.importorskip("orbax.checkpoint")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint, a .weights.h5 and a .keras file of the 4-output model."""
    root = tmp_path_factory.mktemp("saved")
    source = model(4, seed=0)
    kdist.save_sharded(source, root / "ckpt")
    source.save_weights(root / "m.weights.h5")
    source.save(root / "m.keras")
    keras.distribution.set_distribution(None)
    return root


def _copy(saved, tmp_path, name="ckpt"):
    target = tmp_path / name
    (shutil.copytree if (saved / name).is_dir() else shutil.copy)(saved / name, target)
    return target


def _refused(target, path, words):
    before = snapshot(target)
    with pytest.raises(kdist.CheckpointError) as caught:
        kdist.load_sharded(target, path)
    assert_unchanged(target, before)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
    return caught.value


@pytest.mark.parametrize("name", ["m.weights.h5", "m.keras"])
def test_a_keras_file_of_a_model_with_another_last_layer_changes_nothing(saved, name):
    _refused(model(5, seed=1), saved / name, [name, "mlp"])


@pytest.mark.parametrize("name", ["m.weights.h5", "m.keras"])
def test_a_truncated_keras_file_changes_nothing(saved, tmp_path, name):
    path = _copy(saved, tmp_path, name)
    truncate(path, 0.6)
    _refused(model(4, seed=1), path, [name])


def test_a_keras_file_loads_through_load_sharded(saved):
    target = model(4, seed=1)
    report = kdist.load_sharded(target, saved / "m.weights.h5")
    assert "mlp/d1/kernel" in report["loaded"]
    reference = model(4, seed=0)
    np.testing.assert_array_equal(
        np.asarray(target.layers[0].kernel.value), np.asarray(reference.layers[0].kernel.value)
    )


def test_a_checkpoint_with_another_shape_changes_nothing(saved):
    _refused(model(5, seed=1), saved / "ckpt", ["'mlp/d2/kernel': (256, 4) float32 in the checkpoint, (256, 5)"])


def test_a_checkpoint_with_another_dtype_changes_nothing(saved):
    _refused(
        model(4, seed=1, dtype="bfloat16"), saved / "ckpt", ["'mlp/d1/kernel'", "float32 in the checkpoint", "bfloat16"]
    )


def test_corrupted_array_data_is_caught_by_the_checksums(saved, tmp_path):
    path = _copy(saved, tmp_path)
    flip_byte(largest_file(path / "pytree"))
    _refused(model(4, seed=1), path, ["is corrupted", "differ from their checksums", "mlp/d1/kernel"])


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda p: truncate(largest_file(p / "pytree")), ["is unreadable"]),
        (lambda p: truncate(p / "pytree" / "_METADATA"), ["_METADATA is not valid JSON"]),
        (lambda p: os.remove(p / "pytree" / "_METADATA"), ["_METADATA is missing"]),
        (lambda p: truncate(p / "pytree" / "manifest.ocdbt"), ["is unreadable"]),
        (lambda p: truncate(p / "pytree" / "_sharding"), ["is unreadable"]),
        (lambda p: truncate(p / "kdist_checkpoint.json"), ["kdist_checkpoint.json is not valid JSON"]),
        (lambda p: (p / "kdist_checkpoint.json").write_text("[]"), ["is not a kdist checkpoint description"]),
        (lambda p: shutil.rmtree(p / "pytree"), ["pytree/ directory is missing"]),
    ],
    ids=["data", "metadata", "no-metadata", "manifest", "sharding", "marker", "marker-kind", "no-pytree"],
)
def test_truncated_or_missing_parts_are_named_and_change_nothing(saved, tmp_path, damage, words):
    path = _copy(saved, tmp_path)
    damage(path)
    error = _refused(model(4, seed=1), path, [str(path), *words])
    assert not isinstance(error, (AttributeError, KeyError))


def test_paths_that_are_not_checkpoints_are_named(saved, tmp_path):
    target = model(4, seed=1)
    _refused(target, tmp_path / "missing", ["does not exist"])
    (tmp_path / "plain.txt").write_text("notes")
    _refused(target, tmp_path / "plain.txt", ["is a file, not a checkpoint directory"])
    (tmp_path / "empty").mkdir()
    _refused(target, tmp_path / "empty", ["is not a kdist/Keras Orbax checkpoint"])


def test_overwrite_refuses_a_users_file_and_directory_and_keeps_them(tmp_path):
    source = model(4)
    plain = tmp_path / "notes.txt"
    plain.write_text("precious")
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "table.csv").write_text("a,b\n")
    for path, words in (
        (plain, "is a file, not a checkpoint directory"),
        (folder, "is a directory that is not a checkpoint"),
    ):
        with pytest.raises(kdist.CheckpointError, match=words):
            kdist.save_sharded(source, path, overwrite=True)
    assert plain.read_text() == "precious"
    assert (folder / "table.csv").read_text() == "a,b\n" and sorted(os.listdir(folder)) == ["table.csv"]
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "results"]  # no staging directory left behind


def test_overwrite_replaces_a_checkpoint_atomically(tmp_path):
    path = tmp_path / "ckpt"
    kdist.save_sharded(model(4, seed=0), path)
    (tmp_path / "empty").mkdir()
    kdist.save_sharded(model(4, seed=0), tmp_path / "empty")  # an empty directory holds nothing to lose
    newer = model(4, seed=2)
    kdist.save_sharded(newer, path, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "empty"]
    target = model(4, seed=1)
    kdist.load_sharded(target, path)
    np.testing.assert_array_equal(np.asarray(target.layers[1].kernel.value), np.asarray(newer.layers[1].kernel.value))


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    first = model(4, seed=0)
    kdist.save_sharded(first, path)

    class Broken:
        def save_checkpointables(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "orbax", lambda: Broken())
    with pytest.raises(kdist.CheckpointError, match="No space left on device"):
        kdist.save_sharded(model(4, seed=2), path, overwrite=True)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    target = model(4, seed=1)
    kdist.load_sharded(target, path)
    np.testing.assert_array_equal(np.asarray(target.layers[1].kernel.value), np.asarray(first.layers[1].kernel.value))


_SAVE_MANY = """
import sys, numpy as np, keras, kdist
seed, path = int(sys.argv[1]), sys.argv[2]
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(64)], name="m")
for v in model.weights:
    v.assign(np.full(v.shape, seed, v.dtype))
for _ in range(5):
    kdist.save_sharded(model, path, overwrite=True)
"""


def test_concurrent_saves_to_one_path_take_turns(tmp_path):
    """Two runs saving to the same path at once: each save is whole, the checkpoint is one of them, nothing is left."""
    import subprocess
    import sys

    script = tmp_path / "save.py"
    script.write_text(_SAVE_MANY)
    env = {**os.environ, "KDIST_FAKE_DEVICES": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    runs = [
        subprocess.Popen([sys.executable, script, str(seed), tmp_path / "ckpt"], env=env, stderr=subprocess.PIPE)
        for seed in (1, 2)
    ]
    for run in runs:
        assert run.wait(timeout=300) == 0, run.stderr.read().decode()[-2000:]
    target = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(64)], name="m")
    kdist.load_sharded(target, tmp_path / "ckpt")
    values = {float(np.asarray(v.value).ravel()[0]) for v in target.weights}
    assert values in ({1.0}, {2.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "save.py"]


@pytest.fixture
def full_disk(tmp_path):
    """A 200 KiB tmpfs (root only): a disk that fills up during a save."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mount]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    yield mount
    subprocess.run(["umount", mount], check=True)


def test_a_full_disk_is_named_and_leaves_nothing(full_disk):
    (full_disk / "ckpt").mkdir()
    (full_disk / "ckpt" / "mine.txt").write_text("kept")
    with pytest.raises(kdist.CheckpointError, match="the disk is full"):
        kdist.save_sharded(model(4, width=1024), full_disk / "new")
    assert sorted(p.name for p in full_disk.iterdir()) == ["ckpt"]
    assert (full_disk / "ckpt" / "mine.txt").read_text() == "kept"
