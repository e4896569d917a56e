"""kdist.reshard / kdist.plan_reshape on 8 fake devices, with a tiny MLP."""

import io

import keras
import numpy as np
import pytest
import rich.console

import kdist
from kdist.errors import RuleError

BATCH = 16


def build():
    # d1/kernel has 8192 elements, so the fsdp preset shards it too.
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu", name="d1"), keras.layers.Dense(16, name="d2")],
        name="mlp",
    )


def compile_(model):
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    return model


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8 * BATCH, 64)).astype("float32"), rng.integers(0, 16, size=(8 * BATCH,))


@pytest.fixture(scope="module")
def initial_weights():
    keras.utils.set_random_seed(0)
    weights = build().get_weights()
    keras.backend.clear_session()
    return weights


def trained(spec, data, steps=2):
    """A model built under `spec`, trained `steps` steps so optimizer state is not zero."""
    keras.distribution.set_distribution(kdist.preset(spec))
    keras.utils.set_random_seed(0)
    model = compile_(build())
    x, y = data
    model.fit(x[: steps * BATCH], y[: steps * BATCH], batch_size=BATCH, shuffle=False, verbose=0)
    return model


def state(model):
    variables = (
        model.trainable_variables + model.non_trainable_variables + model.optimizer.variables + model.metrics_variables
    )
    return {id(v): v for v in variables}


def snapshot(model):
    return {key: np.asarray(v.value) for key, v in state(model).items()}


def mesh_shape(variable):
    mesh = variable.value.sharding.mesh
    return dict(zip(mesh.axis_names, mesh.devices.shape))


def step_losses(history_means):
    # Keras logs the running mean of the epoch's losses after each batch.
    means = np.asarray(history_means, dtype=np.float64)
    steps = np.arange(1, len(means) + 1)
    return means * steps - np.concatenate([[0.0], means[:-1] * steps[:-1]])


class BatchLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.means = []
        self.meshes = []

    def on_train_batch_end(self, batch, logs=None):
        self.means.append(float(logs["loss"]))
        # The live training state (not yet synced back to the variables).
        state = self.model._jax_state["trainable_variables"] + self.model._jax_state["optimizer_variables"]
        self.meshes.append({tuple(a.sharding.mesh.devices.shape) for a in state})


def test_cycle_of_meshes_is_bitwise_lossless(data):
    model = trained("8x1", data)
    before = snapshot(model)
    counts = {}
    for spec in ("2x4", "1x8", "fsdp", "8x1"):
        result = kdist.reshard(model, spec)
        counts[spec] = result.count
        target = keras.distribution.distribution()
        assert target is result.distribution and target.spec == spec
        for key, v in state(model).items():
            assert mesh_shape(v) == dict(zip(target.device_mesh.axis_names, target.device_mesh.shape)), v.path
            np.testing.assert_array_equal(np.asarray(v.value), before[key], err_msg=f"{v.path} after {spec}")
        kernel = model.get_layer("d1").kernel
        assert tuple(kernel.value.sharding.spec) == target.place(kernel.path, kernel.shape).axes
    # Every hop but the last changes a layout: the test would pass vacuously otherwise.
    assert counts["2x4"] > 0 and counts["1x8"] > 0 and counts["fsdp"] > 0


def test_adafactors_own_state_reshards_bitwise_under_rules_for_its_weights(data):
    """Adafactor's factored moments ('adafactor/kernel', one dimension short) match the weights' rules."""
    rules = kdist.RuleSet([("(.*/)?bias", ("model",)), ("(.*/)?kernel", (None, "model"))])
    keras.distribution.set_distribution(kdist.preset("2x4", rules=rules))
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.Adafactor(), loss=keras.losses.SparseCategoricalCrossentropy(True))
    x, y = data
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)
    before = snapshot(model)
    result = kdist.reshard(model, kdist.preset("4x2", rules=rules))
    assert result.count > 0
    for key, v in state(model).items():
        np.testing.assert_array_equal(np.asarray(v.value), before[key], err_msg=v.path)
    factored = [v for v in result.variables if v.path == f"{model.optimizer.name}/kernel"]
    assert factored and all(v.target == (None,) for v in factored)


def test_optimizer_slots_follow_their_weight_and_scalars_stay_replicated(data):
    model = trained("8x1", data)
    result = kdist.reshard(model, "1x8")
    by_path = {v.path: v for v in result.variables}
    kernel = model.get_layer("d2").kernel
    for slot in ("momentum", "velocity"):
        move = by_path[f"adam/mlp_d2_kernel_{slot}"]
        assert move.reference == kernel.path
        assert move.target == by_path[kernel.path].target == (None, "model")
    assert by_path["adam/iteration"].target == () and by_path["adam/learning_rate"].target == ()
    assert all(v.target == (None,) * len(v.shape) for v in result.variables if v.kind == "metric")


def test_training_continues_on_the_new_mesh_like_training_there_from_the_start(data, initial_weights):
    x, y = data
    k = 3
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = compile_(build())
    model.set_weights(initial_weights)
    first, second = BatchLosses(), BatchLosses()
    model.fit(x[: k * BATCH], y[: k * BATCH], batch_size=BATCH, shuffle=False, verbose=0, callbacks=[first])
    kdist.reshard(model, "2x4")
    model.fit(
        x[k * BATCH : 2 * k * BATCH],
        y[k * BATCH : 2 * k * BATCH],
        batch_size=BATCH,
        shuffle=False,
        verbose=0,
        callbacks=[second],
    )
    resharded = np.concatenate([step_losses(first.means), step_losses(second.means)])
    assert mesh_shape(model.get_layer("d1").kernel) == {"data": 2, "model": 4}
    # The jitted step was rebuilt for the new mesh: its outputs stay there between steps.
    assert first.meshes == [{(8, 1)}] * k and second.meshes == [{(2, 4)}] * k
    assert int(model.optimizer.iterations.value) == 2 * k

    keras.backend.clear_session()
    keras.distribution.set_distribution(kdist.preset("2x4"))
    reference = compile_(build())
    reference.set_weights(initial_weights)
    log = BatchLosses()
    reference.fit(x[: 2 * k * BATCH], y[: 2 * k * BATCH], batch_size=BATCH, shuffle=False, verbose=0, callbacks=[log])

    np.testing.assert_allclose(resharded, step_losses(log.means), rtol=1e-5, atol=1e-6)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # evaluate and predict retrace under the new mesh too.
    assert np.isfinite(model.evaluate(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)[0])
    assert model.predict(x[:BATCH], batch_size=BATCH, verbose=0).shape == (BATCH, 16)


def test_dry_run_lists_the_moves_and_moves_nothing(data):
    model = trained("1x8", data)
    values = {key: v.value for key, v in state(model).items()}
    current = keras.distribution.distribution()

    plan = kdist.plan_reshape(model, "8x1")
    same = kdist.reshard(model, "8x1", dry_run=True)

    assert keras.distribution.distribution() is current
    assert all(v.value is values[key] for key, v in state(model).items())
    # the kernels are split on their outputs, so their biases follow them (and every slot its weight)
    weights = {f"mlp/{layer}/{kind}" for layer in ("d1", "d2") for kind in ("kernel", "bias")}
    slots = {f"adam/{w.replace('/', '_')}_{s}" for w in weights for s in ("momentum", "velocity")}
    assert {v.path for v in plan.moved} == weights | slots
    assert plan.dry_run and plan.count == 12 and same.count == 12 and same.bytes == plan.bytes
    kernel = next(v for v in plan.variables if v.path == "mlp/d1/kernel")
    assert (kernel.source, kernel.target) == ((None, "model"), (None, "model"))  # same names...
    assert (kernel.source_pieces, kernel.target_pieces) == ((1, 8), (1, 1))  # ...other meshes
    # 1x8 -> 8x1: each device holds 1/8 of each sharded array and must receive the other 7/8.
    per_device = sum(v.nbytes for v in plan.moved) * 7 // 8
    assert plan.devices == [f"cpu:{i}" for i in range(8)]
    assert plan.device_bytes.tolist() == [per_device] * 8
    assert plan.bytes == 8 * per_device


def test_narrowing_a_replicated_array_receives_no_bytes(data):
    model = trained("8x1", data)
    plan = kdist.plan_reshape(model, "1x8")
    assert plan.count == 12  # the kernels, biases and their slots are re-sliced...
    assert plan.bytes == 0  # ...but every device already holds its new shard.


def test_equal_layouts_are_relabelled_not_copied(data):
    # On 8x1 the model axis has size 1, so every variable is effectively replicated, as under "dp".
    model = trained("8x1", data)
    kernel = model.get_layer("d1").kernel
    buffers = [s.data.unsafe_buffer_pointer() for s in kernel.value.addressable_shards]
    result = kdist.reshard(model, "dp")
    assert result.count == 0 and result.bytes == 0
    assert mesh_shape(kernel) == {"data": 8}
    assert [s.data.unsafe_buffer_pointer() for s in kernel.value.addressable_shards] == buffers


def test_reshard_from_one_device_to_keras_distributions(data):
    keras.utils.set_random_seed(0)
    model = build()
    before = [w.copy() for w in model.get_weights()]
    result = kdist.reshard(model, keras.distribution.DataParallel())
    assert result.count == len(model.variables)
    # cpu:0 holds everything already; the 7 others receive a full copy.
    assert result.device_bytes[0] == 0 and result.device_bytes[1] == sum(w.nbytes for w in before)
    # What a device that held nothing received is what the inspector finds on it now.
    assert kdist.inspect(model).device_bytes()[1:].tolist() == result.device_bytes[1:].tolist()
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["mlp/d1/kernel"] = (None, "model")
    kdist.reshard(model, keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
    assert tuple(model.get_layer("d1").kernel.value.sharding.spec) == (None, "model")
    assert all(a is None for a in model.get_layer("d2").kernel.value.sharding.spec)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_bad_inputs_get_clear_errors(data):
    with pytest.raises(TypeError, match="spec string"):
        kdist.reshard(build(), 42)
    keras.backend.clear_session()
    unbuilt = keras.Sequential([keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="not built"):
        kdist.reshard(unbuilt, "2x4")
    abstract = kdist.abstract_model(build)
    with pytest.raises(ValueError, match="abstract_model cannot be resharded"):
        kdist.reshard(abstract, "2x4")
    assert abstract.get_layer("d1").kernel._value is None  # nothing was initialised
    odd = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10, name="d2")], name="mlp")
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["mlp/d2/kernel"] = (None, "model")  # 10 output features on 4 devices
    with pytest.raises(RuleError, match=r"'mlp/d2/kernel'.*does not divide by 4"):
        kdist.reshard(odd, keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))


def test_reshard_during_fit_is_refused_and_after_train_on_batch_allowed(data):
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = compile_(build())
    x, y = data

    class ReshardMidEpoch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            kdist.reshard(self.model, "2x4")

    with pytest.raises(ValueError, match=r"in the middle of fit\(\).*between fit/evaluate/predict calls"):
        model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0, callbacks=[ReshardMidEpoch()])
    # train_on_batch leaves its (synced) state behind; resharding after it is fine.
    model.train_on_batch(x[:BATCH], y[:BATCH])
    assert kdist.reshard(model, "2x4").count > 0
    model.train_on_batch(x[:BATCH], y[:BATCH])
    assert mesh_shape(model.get_layer("d1").kernel) == {"data": 2, "model": 4}


def test_result_prints_with_rich(data):
    model = trained("8x1", data)
    console = rich.console.Console(file=io.StringIO(), width=200)
    console.print(kdist.plan_reshape(model, "2x4"))
    text = console.file.getvalue()
    assert "would move 12 of" in text and "mlp/d1/kernel" in text and "cpu:7" in text
    assert kdist.plan_reshape(model, "2x4").to_dict()["count"] == 12
