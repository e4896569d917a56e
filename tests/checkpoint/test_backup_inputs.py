"""Bad inputs to `kdist.BackupAndRestore` and the backup functions: refused with a kdist error that names the
argument, the value and what is accepted (Keras's own errors do not pass through)."""

import numpy as np
import pytest

import kdist
from kdist.checkpoint.backup import restore_backup, save_backup
from tests.checkpoint.state_helpers import model

pytest.importorskip("orbax.checkpoint")

CASES = [
    # (keyword arguments, error class, words)
    ({"backup_dir": None}, kdist.ArgumentTypeError, ["backup_dir", "str or os.PathLike", "None"]),
    ({"backup_dir": ""}, kdist.ArgumentError, ["backup_dir", "non-empty"]),
    ({"backup_dir": 7}, kdist.ArgumentTypeError, ["backup_dir", "7"]),
    ({"backup_dir": b"/tmp/b"}, kdist.ArgumentTypeError, ["backup_dir", "bytes"]),
    ({"save_freq": 0}, kdist.ArgumentError, ["save_freq", "'epoch' or a positive number of batches", "0"]),
    ({"save_freq": -3}, kdist.ArgumentError, ["save_freq=-3"]),
    ({"save_freq": "batch"}, kdist.ArgumentError, ["save_freq='batch'", "'epoch'"]),
    ({"save_freq": "Epoch"}, kdist.ArgumentError, ["save_freq='Epoch'"]),
    ({"save_freq": 2.5}, kdist.ArgumentTypeError, ["save_freq=2.5"]),
    ({"save_freq": True}, kdist.ArgumentTypeError, ["save_freq=True"]),
    ({"save_freq": False}, kdist.ArgumentTypeError, ["save_freq=False"]),
    ({"save_freq": None}, kdist.ArgumentTypeError, ["save_freq=None"]),
    ({"double_checkpoint": "yes"}, kdist.ArgumentTypeError, ["double_checkpoint", "True or False", "'yes'"]),
    ({"double_checkpoint": 1}, kdist.ArgumentTypeError, ["double_checkpoint=1"]),
    ({"delete_checkpoint": None}, kdist.ArgumentTypeError, ["delete_checkpoint", "None"]),
    ({"delete_checkpoint": "false"}, kdist.ArgumentTypeError, ["delete_checkpoint='false'"]),
]


@pytest.mark.parametrize("arguments, error, words", CASES, ids=[repr(c[0]) for c in CASES])
def test_bad_arguments_are_refused(arguments, error, words, tmp_path):
    arguments = {"backup_dir": str(tmp_path / "b"), **arguments}
    with pytest.raises(error) as caught:
        kdist.BackupAndRestore(**arguments)
    assert isinstance(caught.value, kdist.KdistError)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
    assert not (tmp_path / "b").exists()


def test_a_file_is_not_a_backup_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(kdist.ArgumentError, match="is a file; give a directory"):
        kdist.BackupAndRestore(str(tmp_path / "file"))


def test_good_arguments_are_kept(tmp_path):
    callback = kdist.BackupAndRestore(tmp_path / "b", save_freq=np.int64(3), double_checkpoint=np.bool_(True))
    assert callback.save_freq == 3 and type(callback.save_freq) is int and callback.double_checkpoint is True
    assert callback.backup_dir == str(tmp_path / "b")
    assert kdist.BackupAndRestore(str(tmp_path / "b")).save_freq == "epoch"


@pytest.mark.parametrize("function", [save_backup, restore_backup])
def test_the_backup_functions_check_their_model_and_directory(function, tmp_path):
    with pytest.raises(kdist.ArgumentTypeError, match="needs a keras.Model"):
        function("model", tmp_path)
    with pytest.raises(kdist.ArgumentTypeError, match=r"backup_dir\) must be a str or os.PathLike"):
        function(model(4), None)


def test_restoring_from_an_empty_directory_finds_nothing(tmp_path):
    assert restore_backup(model(4), tmp_path) is None
