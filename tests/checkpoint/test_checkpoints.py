"""Checkpoints across meshes: Keras weights files and kdist's sharded Orbax checkpoints."""

import keras
import numpy as np
import pytest

import kdist

BATCH = 16


def build(out=16):
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu", name="d1"), keras.layers.Dense(out, name="d2")],
        name="mlp",
    )


def compile_(model):
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(4 * BATCH, 64)).astype("float32"), rng.integers(0, 16, size=(4 * BATCH,))


def trained_on(spec, data):
    keras.distribution.set_distribution(kdist.preset(spec))
    keras.utils.set_random_seed(0)
    model = compile_(build())
    x, y = data
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return model


def values(variables):
    return [(v.path, np.asarray(v.value)) for v in variables]


def fresh_on(spec, seed=1):
    """A compiled model built under `spec`, with other initial weights than the trained one."""
    keras.backend.clear_session()
    keras.distribution.set_distribution(kdist.preset(spec))
    keras.utils.set_random_seed(seed)
    return compile_(build())


def assert_bitwise_on_mesh(expected, variables, shape):
    # By order: a Sequential loaded from a .keras file drops the model name from its paths.
    assert len(variables) == len(expected)
    for (path, value), v in zip(expected, variables):
        assert v.path.replace("mlp/", "").replace("mlp_", "") == path.replace("mlp/", "").replace("mlp_", ""), (
            path,
            v.path,
        )
        np.testing.assert_array_equal(np.asarray(v.value), value, err_msg=v.path)
        assert tuple(v.value.sharding.mesh.devices.shape) == shape, v.path


def test_weights_file_saved_on_8x1_loads_on_2x4_bitwise(tmp_path, data):
    model = trained_on("8x1", data)
    weights = values(model.weights)
    model.save_weights(tmp_path / "m.weights.h5")

    restored = fresh_on("2x4")
    assert not np.array_equal(np.asarray(restored.get_layer("d1").kernel.value), dict(weights)["mlp/d1/kernel"])
    restored.load_weights(tmp_path / "m.weights.h5")
    assert_bitwise_on_mesh(weights, restored.weights, (2, 4))
    assert tuple(restored.get_layer("d1").kernel.value.sharding.spec) == (None, "model")


def test_keras_file_saved_on_8x1_loads_on_1x8_with_optimizer_state(tmp_path, data):
    model = trained_on("8x1", data)
    weights, slots = values(model.weights), values(model.optimizer.variables)
    model.save(tmp_path / "m.keras")

    keras.backend.clear_session()
    keras.distribution.set_distribution(kdist.preset("1x8"))
    restored = keras.models.load_model(tmp_path / "m.keras")
    assert_bitwise_on_mesh(weights, restored.weights, (1, 8))
    assert_bitwise_on_mesh(slots, restored.optimizer.variables, (1, 8))
    x, y = data
    restored.fit(x, y, batch_size=BATCH, verbose=0)  # training goes on from the restored state


def test_sharded_checkpoint_saved_on_8x1_loads_on_2x4_bitwise(tmp_path, data):
    pytest.importorskip("orbax.checkpoint")
    model = trained_on("8x1", data)
    weights, slots = values(model.weights), values(model.optimizer.variables)
    kdist.save_sharded(model, tmp_path / "ckpt")

    restored = fresh_on("2x4")
    report = kdist.load_sharded(restored, tmp_path / "ckpt")
    assert_bitwise_on_mesh(weights, restored.weights, (2, 4))
    assert_bitwise_on_mesh(slots, restored.optimizer.variables, (2, 4))
    assert "mlp/d1/kernel" in report["loaded"] and "adam/mlp_d1_kernel_momentum" in report["loaded"]
    assert report["skipped"] == [] and report["not_in_checkpoint"] == []
    x, y = data
    restored.fit(x, y, batch_size=BATCH, verbose=0)
    assert int(restored.optimizer.iterations.value) == 2 * len(x) // BATCH


def test_sharded_checkpoint_into_an_uncompiled_model_loads_the_weights_only(tmp_path, data):
    pytest.importorskip("orbax.checkpoint")
    model = trained_on("1x8", data)
    weights = values(model.weights)
    kdist.save_sharded(model, tmp_path / "ckpt")

    keras.backend.clear_session()
    keras.distribution.set_distribution(kdist.preset("fsdp"))
    keras.utils.set_random_seed(1)
    restored = build()
    report = kdist.load_sharded(restored, tmp_path / "ckpt")
    assert_bitwise_on_mesh(weights, restored.weights, (8,))
    assert tuple(restored.get_layer("d1").kernel.value.sharding.spec) == (None, "fsdp")
    assert "adam/iteration" in report["skipped"]


def test_keras_load_weights_reads_a_sharded_checkpoint(tmp_path, data):
    pytest.importorskip("orbax.checkpoint")
    model = trained_on("8x1", data)
    weights = values(model.trainable_variables)
    kdist.save_sharded(model, tmp_path / "ckpt")

    restored = fresh_on("2x4")
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(tmp_path / "ckpt")
    assert_bitwise_on_mesh(weights, restored.trainable_variables, (2, 4))


def test_sharded_checkpoint_errors_name_the_problem(tmp_path, data):
    pytest.importorskip("orbax.checkpoint")
    model = trained_on("8x1", data)
    kdist.save_sharded(model, tmp_path / "ckpt")
    with pytest.raises(kdist.CheckpointError, match="overwrite=True"):
        kdist.save_sharded(model, tmp_path / "ckpt")
    kdist.save_sharded(model, tmp_path / "ckpt", overwrite=True)

    keras.backend.clear_session()
    other = build(out=32)
    with pytest.raises(
        kdist.CheckpointError, match=r"'mlp/d2/kernel': \(128, 16\) float32 in the checkpoint, \(128, 32\) float32 in"
    ):
        kdist.load_sharded(other, tmp_path / "ckpt")
    renamed = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, name="e1")], name="mlp")
    with pytest.raises(kdist.CheckpointError, match="mlp/e1/kernel"):
        kdist.load_sharded(renamed, tmp_path / "ckpt")
    with pytest.raises(kdist.ModelError, match="kdist.abstract_model"):
        kdist.load_sharded(kdist.abstract_model(build), tmp_path / "ckpt")
    with pytest.raises(kdist.CheckpointError, match="no pytree or state directory"):
        kdist.load_sharded(other, tmp_path)


def test_load_sharded_reads_keras_orbax_checkpoint_callback_output(tmp_path, data):
    pytest.importorskip("orbax.checkpoint")
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = compile_(build())
    x, y = data
    saver = keras.callbacks.OrbaxCheckpoint(str(tmp_path / "run"), save_freq="epoch", save_on_background=False)
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[saver])
    weights, slots = values(model.weights), values(model.optimizer.variables)

    restored = fresh_on("2x4")
    kdist.load_sharded(restored, tmp_path / "run")  # the root: its latest step is read
    assert_bitwise_on_mesh(weights, restored.weights, (2, 4))
    assert_bitwise_on_mesh(slots, restored.optimizer.variables, (2, 4))
