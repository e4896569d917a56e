"""Bad inputs to `kdist.save_sharded` and `kdist.load_sharded`: refused with a kdist error that names the argument,
the value and what is accepted, before anything is read or written."""

import os

import keras
import numpy as np
import pytest

import kdist
from tests.checkpoint.state_helpers import model

pytest.importorskip("orbax.checkpoint")


def _unbuilt():
    return keras.Sequential([keras.layers.Dense(2)], name="unbuilt")


def _abstract():
    return kdist.abstract_model(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))


MODELS = [
    # (model, error class, words)
    (lambda: None, kdist.ArgumentTypeError, ["needs a keras.Model", "None"]),
    (lambda: "model.keras", kdist.ArgumentTypeError, ["needs a keras.Model", "'model.keras'", "str"]),
    (lambda: 3, kdist.ArgumentTypeError, ["needs a keras.Model", "int"]),
    (lambda: keras.layers.Dense(2), kdist.ArgumentTypeError, ["needs a keras.Model", "Dense"]),
    (_unbuilt, kdist.ModelError, ["'unbuilt' is not built", "keras.Input"]),
    (_abstract, kdist.ModelError, ["deferred", "kdist.abstract_model"]),
]

PATHS = [
    (None, kdist.ArgumentTypeError, ["path", "str or os.PathLike", "None"]),
    (42, kdist.ArgumentTypeError, ["path", "42"]),
    (b"/tmp/ckpt", kdist.ArgumentTypeError, ["path", "bytes"]),
    (["/tmp/ckpt"], kdist.ArgumentTypeError, ["path", "list"]),
    ("", kdist.ArgumentError, ["path", "non-empty", "''"]),
    ("   ", kdist.ArgumentError, ["path", "non-empty"]),
    ("/tmp/a\x00b", kdist.ArgumentError, ["path", "NUL"]),
]


def _check(call, error, words):
    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, kdist.KdistError)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@pytest.mark.parametrize("make, error, words", MODELS, ids=[str(i) for i in range(len(MODELS))])
@pytest.mark.parametrize("function", ["save_sharded", "load_sharded"])
def test_bad_models_are_refused(function, make, error, words, tmp_path):
    _check(lambda: getattr(kdist, function)(make(), tmp_path / "ckpt"), error, [function, *words])
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def built():
    return model(4)


@pytest.mark.parametrize("path, error, words", PATHS, ids=[repr(p[0]) for p in PATHS])
@pytest.mark.parametrize("function", ["save_sharded", "load_sharded"])
def test_bad_paths_are_refused(function, path, error, words, built):
    _check(lambda: getattr(kdist, function)(built, path), error, [f"{function}(path)", *words])


@pytest.mark.parametrize("overwrite", ["yes", 1, None, [True]])
def test_overwrite_must_be_a_bool(overwrite, built, tmp_path):
    _check(
        lambda: kdist.save_sharded(built, tmp_path / "c", overwrite=overwrite), kdist.ArgumentTypeError, ["overwrite"]
    )
    assert list(tmp_path.iterdir()) == []


def test_an_existing_checkpoint_needs_overwrite(built, tmp_path):
    kdist.save_sharded(built, tmp_path / "c")
    _check(
        lambda: kdist.save_sharded(built, tmp_path / "c"), kdist.CheckpointError, ["already exists", "overwrite=True"]
    )


def test_a_path_under_a_file_is_refused(built, tmp_path):
    (tmp_path / "file").write_text("mine")
    _check(
        lambda: kdist.save_sharded(built, tmp_path / "file" / "ckpt"),
        kdist.CheckpointError,
        ["save_sharded", "is a file, not a directory"],
    )
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_refused(built, tmp_path):
    tmp_path.chmod(0o500)
    try:
        _check(lambda: kdist.save_sharded(built, tmp_path / "ckpt"), kdist.CheckpointError, ["not writable"])
    finally:
        tmp_path.chmod(0o700)


def test_a_checkpoint_with_orbax_newer_item_name_state_is_read(tmp_path):
    """Orbax after 0.12.8 names Keras's item "state"; kdist writes "pytree" and reads both."""
    saved, loaded = model(4, seed=1), model(4, seed=2)
    kdist.save_sharded(saved, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "pytree").rename(tmp_path / "ckpt" / "state")
    kdist.load_sharded(loaded, tmp_path / "ckpt")
    for a, b in zip(saved.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))
