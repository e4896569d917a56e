"""The keras-io guide "Distributed training with Keras 3": its DataParallel and ModelParallel MLPs, hand-written
maps against kdist's presets (same losses, placements compared)."""

import contextlib

import keras
import numpy as np
import pytest
from keras.distribution import DataParallel, DeviceMesh, LayoutMap, ModelParallel

import kdist
from kdist.demo import fit_steps

X = np.random.default_rng(0).random((64, 28, 28, 1), dtype=np.float32)
Y = np.random.default_rng(1).integers(0, 10, 64)


def guide_model():
    """The guide's model, functional: its layer names are the variable paths ("d1/kernel")."""
    inputs = keras.Input((28, 28, 1))
    y = keras.layers.Flatten()(inputs)
    y = keras.layers.Dense(200, use_bias=True, activation="relu", name="d1")(y)
    y = keras.layers.Dropout(0.4)(y)
    y = keras.layers.Dense(10, activation="softmax", name="d2")(y)
    return keras.Model(inputs, y)


def train(distribution):
    """Per-step losses of the guide's model trained under `distribution` (None: one device), and its layouts."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        model = guide_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        losses = fit_steps(model, X, Y, 16)
    specs = {v.path: tuple(getattr(v.value.sharding, "spec", ())) for v in model.weights}
    return losses, specs


@pytest.fixture(scope="module")
def single():
    return train(None)[0]


def test_data_parallel_matches_the_guides_data_parallel(single):
    keras_losses, keras_specs = train(DataParallel(devices=keras.distribution.list_devices()))
    kdist_losses, kdist_specs = train(kdist.preset("dp"))
    np.testing.assert_allclose(kdist_losses, keras_losses, rtol=1e-5)
    np.testing.assert_allclose(kdist_losses, single, rtol=1e-5)
    replicated = lambda specs: {p: all(a is None for a in s) for p, s in specs.items()}  # noqa: E731
    assert replicated(kdist_specs) == replicated(keras_specs) and all(replicated(kdist_specs).values())


def _guide_map():
    mesh = DeviceMesh((2, 4), ["data", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, "model")
    layout_map["d1/bias"] = ("model",)
    layout_map["d2/output"] = ("data", None)
    return layout_map


def test_model_parallel_matches_the_guides_hand_written_map(single):
    keras_losses, keras_specs = train(ModelParallel(layout_map=_guide_map(), batch_dim_name="data"))
    same_map_losses, same_map_specs = train(kdist.preset("2x4", rules=_guide_map()))
    auto_losses, auto_specs = train(kdist.preset("2x4"))
    for losses in (keras_losses, same_map_losses, auto_losses):
        np.testing.assert_allclose(losses, single, rtol=1e-5)
    assert same_map_specs == keras_specs  # the map means what Keras says
    # kdist's own rules shard what the guide shards, d1 and its bias, and d2's inputs besides.
    for path in ("d1/kernel", "d1/bias"):
        assert auto_specs[path] == keras_specs[path], path
    assert auto_specs["d2/kernel"] == ("model", None) and keras_specs["d2/kernel"] in ((), (None, None), (None,))
