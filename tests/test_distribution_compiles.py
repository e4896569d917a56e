"""Under every preset, Keras's step functions compile as often as under plain Keras, on 8 devices and on 1.

Counted, not timed: XLA compilations of Keras's train/test/predict steps
(`jax_internals.count_compiles`) during each call, for an MLP with Dropout (a
seed generator) and a metric. On one device a preset used to compile the
steps again in the second `fit` and in `evaluate` (arrays Keras makes
uncommitted beside the committed ones a step returns; see
`keras_internals.commit_arrays_to`), which on 8 devices never shows.
"""

import json
import pathlib

import keras
import numpy as np
import pytest

import kdist
from kdist.jax_internals import KERAS_STEPS, count_compiles
from kdist.models import mnist_mlp
from tests.subprocess_utils import compilation_cache_env, run_python

BASIC = ("fit", "fit", "evaluate", "predict", "fit")
RESTORED = ("evaluate", "predict", "fit", "fit", "evaluate")


def _data():
    rng = np.random.default_rng(0)
    return rng.random((128, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 128)


def _model(spec):
    """A fresh model (names as in a new process) under kdist.preset(spec), or plain Keras when spec is None."""
    keras.backend.clear_session()
    if spec is not None:
        keras.distribution.set_distribution(kdist.preset(spec))
    keras.utils.set_random_seed(0)
    model = mnist_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class _Crash(Exception):
    pass


class _CrashAt(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 2:
            raise _Crash("a crash in the middle of the epoch")


def step_compiles(spec, ops, directory):
    """The compilations of Keras's steps during each op of `ops` for the MLP under `spec` (None: plain Keras).

    Ops: "fit", "evaluate", "predict", "reshard SPEC"; a first op "load"
    saves a trained model with `kdist.save_sharded` and loads it into a new
    one, "resume" crashes a fit under `kdist.BackupAndRestore` and resumes it
    in a new model.
    """
    directory.mkdir(parents=True, exist_ok=True)
    x, y = _data()
    model = _model(spec)
    if ops[0] == "load":
        model.fit(x, y, batch_size=32, verbose=0)
        kdist.save_sharded(model, str(directory / "checkpoint"))
    elif ops[0] == "resume":
        backup = kdist.BackupAndRestore(str(directory / "backup"), save_freq=1)
        with pytest.raises(_Crash):
            model.fit(x, y, batch_size=32, verbose=0, callbacks=[backup, _CrashAt()])
    counts = []
    for op in ops:
        with count_compiles(KERAS_STEPS) as count:
            if op == "load":
                model = _model(spec)
                kdist.load_sharded(model, str(directory / "checkpoint"))
            elif op == "resume":
                model = _model(spec)
                backup = kdist.BackupAndRestore(str(directory / "backup"), save_freq=1)
                model.fit(x, y, batch_size=32, verbose=0, callbacks=[backup])
            elif op.startswith("reshard "):
                kdist.reshard(model, op.split()[1])
            elif op == "predict":
                model.predict(x, batch_size=32, verbose=0)
            else:
                getattr(model, op)(x, y, batch_size=32, verbose=0)
        counts.append(count[0])
    return counts


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Plain Keras's counts, per sequence."""
    directory = tmp_path_factory.mktemp("plain")
    counts = {ops: step_compiles(None, ops, directory) for ops in (BASIC, ("load", *RESTORED), ("resume", *BASIC[1:]))}
    keras.backend.clear_session()
    assert counts[BASIC][0] >= 1  # the counter sees the first fit compile
    return counts


@pytest.mark.parametrize("spec", ["dp", "2x4", "fsdp", "data=2,fsdp=2,model=2"])
def test_every_preset_compiles_as_often_as_plain_keras_on_8_devices(spec, plain, tmp_path):
    assert step_compiles(spec, BASIC, tmp_path) == plain[BASIC]


@pytest.mark.parametrize("first", ["load", "resume"])
def test_a_restored_model_compiles_as_often_as_plain_keras(first, plain, tmp_path):
    ops = ("load", *RESTORED) if first == "load" else ("resume", *BASIC[1:])
    assert step_compiles("2x4", ops, tmp_path) == plain[ops]


def test_after_a_reshard_each_step_compiles_once_more(tmp_path):
    # The steps are jitted with the mesh's shardings as outputs: a new mesh needs them once each, then never again.
    counts = step_compiles("2x4", ("fit", "reshard fsdp", "fit", "evaluate", "predict", "fit", "evaluate"), tmp_path)
    assert counts == [1, 0, 1, 1, 1, 0, 0]


def test_on_one_device_every_preset_compiles_as_often_as_plain_keras(tmp_path):
    root = pathlib.Path(__file__).parent.parent
    code = f"""
import json, pathlib, sys
sys.path.insert(0, {str(root)!r})
import kdist  # first: it selects the JAX backend before the test module imports keras
from tests.test_distribution_compiles import BASIC, RESTORED, step_compiles
directory = pathlib.Path({str(tmp_path)!r})
runs = {{}}
for spec in (None, "dp", "fsdp", "1x1"):
    runs[str(spec)] = step_compiles(spec, BASIC, directory / f"{{spec}}")
for spec in (None, "dp"):
    runs[f"{{spec}} load"] = step_compiles(spec, ("load", *RESTORED), directory / f"{{spec}}-load")
    runs[f"{{spec}} resume"] = step_compiles(spec, ("resume", *BASIC[1:]), directory / f"{{spec}}-resume")
runs["dp reshard"] = step_compiles("dp", ("fit", "reshard fsdp", "fit", "evaluate", "predict", "fit"), directory / "r")
print("COUNTS", json.dumps(runs))
"""
    cache = compilation_cache_env(tmp_path / "jax-cache")  # each spec compiles the same steps again
    result = run_python(code, env={"KDIST_FAKE_DEVICES": "1", **cache}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads(result.stdout.split("COUNTS ", 1)[1])
    plain = runs["None"]
    assert plain[0] >= 1
    assert runs["dp"] == runs["fsdp"] == runs["1x1"] == plain
    assert runs["dp load"] == runs["None load"] and runs["dp resume"] == runs["None resume"]
    assert runs["dp reshard"] == [1, 0, 1, 1, 1, 0]
