"""ShardedDistribution at the edges of the batch: any batch size gives one device's results (split over the batch
axes that divide it, replicated over the rest); in a multi-process run, a size that does not divide is a kdist error."""

import contextlib

import jax
import keras
import numpy as np
import pytest

import kdist
from kdist.distribution import BatchShardedOutputs, ShardedDistribution
from kdist.models import mnist_mlp


def _compiled(spec):
    dist = kdist.preset(spec)
    with dist.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return dist, model


SPECS = ["2x4", "fsdp", "dp", "2x2x2"]
RNG = np.random.default_rng(0)
X, Y = RNG.random((13, 28, 28, 1), np.float32), RNG.integers(0, 10, 13)


def _compiled_like_one_device(spec, **compile_args):
    """mnist_mlp with seed 0 under `spec` (None: one device), compiled; its distribution."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    dist = kdist.preset(spec) if spec else None
    with dist.scope() if dist else contextlib.nullcontext():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", **compile_args)
    return dist, model


def _under(dist):
    return dist.scope() if dist else contextlib.nullcontext()


@pytest.mark.parametrize(
    "examples, split",
    [
        (1, {"2x4": None, "fsdp": None, "dp": None, "2x2x2": None}),
        (2, {"2x4": "data", "fsdp": None, "dp": None, "2x2x2": "data"}),
        (6, {"2x4": "data", "fsdp": None, "dp": None, "2x2x2": "data"}),
        (12, {"2x4": "data", "fsdp": None, "dp": None, "2x2x2": ("data", "fsdp")}),
        (16, {"2x4": "data", "fsdp": "fsdp", "dp": "data", "2x2x2": ("data", "fsdp")}),
    ],
)
def test_a_batch_is_split_over_the_batch_axes_that_divide_it(examples, split):
    for spec, axis in split.items():
        assert kdist.preset(spec).get_data_layout((examples, 784)).axes == (axis, None), (spec, examples)


@pytest.mark.parametrize("examples", [1, 2, 3, 13])
def test_predict_with_any_number_of_examples_equals_one_device(examples):
    _, reference = _compiled_like_one_device(None)
    expected = reference.predict(X[:examples], verbose=0)
    for spec in SPECS:
        dist, model = _compiled_like_one_device(spec)
        with dist.scope():
            got = model.predict(X[:examples], batch_size=8, verbose=0)  # 13: a batch of 8, then one of 5
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=spec)


def test_evaluate_with_a_short_last_batch_equals_one_device():
    weights = RNG.random(13).astype(np.float32)
    args = dict(metrics=["accuracy"], weighted_metrics=["sparse_categorical_accuracy"])
    _, reference = _compiled_like_one_device(None, **args)
    expected = [reference.evaluate(X, Y, batch_size=8, verbose=0, sample_weight=w) for w in (None, weights)]
    for spec in SPECS:
        dist, model = _compiled_like_one_device(spec, **args)
        with dist.scope():
            got = [model.evaluate(X, Y, batch_size=8, verbose=0, sample_weight=w) for w in (None, weights)]
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=spec)  # the loss: a mean over 13, not 16


@pytest.mark.parametrize("batch_size", [6])  # 6, 6, 1: split over data on "2x4" and "2x2x2", whole on "fsdp"
def test_fit_on_a_dataset_size_the_batch_shards_do_not_divide_equals_one_device(batch_size):
    _, reference = _compiled_like_one_device(None)
    expected = reference.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0).history["loss"]
    for spec in ("2x4", "fsdp", "2x2x2"):
        dist, model = _compiled_like_one_device(spec)
        with dist.scope():
            losses = model.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0).history["loss"]
        np.testing.assert_allclose(losses, expected, rtol=1e-5, err_msg=spec)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=spec)  # Adam: float noise


def test_an_activation_layout_over_the_data_axis_takes_a_short_batch():
    rules = {"mlp/d1/kernel": (None, "model"), "mlp/d2/output": ("data", None)}
    _, reference = _compiled_like_one_device(None)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    with kdist.preset("2x4", rules=rules).scope():
        model = mnist_mlp()
        got = model.predict(X[:3], verbose=0)
    np.testing.assert_allclose(got, reference.predict(X[:3], verbose=0), rtol=1e-5, atol=1e-6)


def test_a_multi_process_batch_that_does_not_divide_names_the_fix(monkeypatch):
    dist = kdist.preset("2x4")
    monkeypatch.setattr(jax, "process_count", lambda: 2)  # each process holds only its share: no replication
    with pytest.raises(kdist.BatchSizeError) as error:
        dist.get_data_layout((3, 784))
    message = str(error.value)
    assert "A batch of 3 example(s) does not divide over the 2 batch shards of kdist.preset('2x4')" in message
    assert "multiples of 2" in message


def test_a_model_parallel_mesh_takes_any_batch():
    dist, model = _compiled("tp")
    with dist.scope():
        assert model.predict(np.zeros((1, 28, 28, 1), np.float32), verbose=0).shape == (1, 10)


def test_keras_shards_no_inputs_of_a_kdist_distribution_and_the_users_choice_stays_visible():
    pytest.importorskip("tensorflow")
    from keras.src.trainers.data_adapters import get_data_adapter  # what fit() calls first

    dist = kdist.preset("2x4")
    assert (dist.shard_inputs, dist.auto_shard_dataset) == (True, False)  # kdist gives each process its rows
    dist._num_processes, dist._process_id, dist._is_multi_process = 2, 1, True  # as process 1 of 2 sees it
    dataset = kdist.make_dataset(
        np.zeros((96, 3), np.float32), np.zeros(96, np.int32), global_batch_size=32, distribution=dist
    )
    assert dist.distribute_dataset(dataset) is dataset  # global batches, a known number of them
    with dist.scope():  # Keras's own distributions refuse arrays here ("must be a tf.data.Dataset")
        assert get_data_adapter(np.zeros((96, 3)), np.zeros(96), batch_size=32).num_batches == 3
    dist.auto_shard_dataset = False  # Keras's spelling of "each process passes its own rows"
    assert (dist.shard_inputs, dist.auto_shard_dataset) == (False, False)
    assert "auto_shard_dataset=False" in repr(dist)
    with pytest.raises(kdist.ArgumentTypeError, match="auto_shard_dataset must be True or False; received 'no'"):
        dist.auto_shard_dataset = "no"
    with pytest.raises(kdist.ArgumentTypeError, match="auto_shard_dataset must be True or False; received 1"):
        kdist.ShardedDistribution(kdist.mesh("2x4"), auto_shard_dataset=1)


def test_the_data_helpers_without_tensorflow_name_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    with pytest.raises(kdist.MissingDependencyError, match=r"pip install 'kdist\[data\]'"):
        kdist.make_dataset(np.zeros((8, 3)), global_batch_size=8, distribution=kdist.preset("dp"))


def test_under_fsdp_a_layer_output_no_rule_lays_out_is_split_over_the_batch_axes():
    dist = kdist.preset("fsdp=4,model=2")
    layout = dist.get_tensor_layout("transformer/mlp_up/output")
    assert isinstance(layout, BatchShardedOutputs) and layout.axes == (("fsdp",),)
    assert dist.get_tensor_layout("transformer/mlp_up/kernel") is None  # only layer outputs
    assert kdist.preset("2x4").get_tensor_layout("transformer/mlp_up/output") is None  # no fsdp: XLA's choice
    ruled = kdist.preset("fsdp=4,model=2", rules=[("transformer/mlp_up/output", (None, None, "model"))])
    assert ruled.get_tensor_layout("transformer/mlp_up/output").axes == (None, None, "model")  # a rule wins


def test_batch_split_outputs_keep_xla_from_gathering_activations_over_fsdp(monkeypatch):
    """Without them XLA meets `('fsdp', 'model')` MLP kernels by running the MLP on the whole batch (issue 21)."""

    def temporaries():
        plan = kdist.plan(kdist.models.tiny_transformer, 8, batch_size=64, verify=["fsdp=4,model=2"])
        (candidate,) = [c for c in plan.candidates if c.compiled]
        return candidate.compiled["temp"]

    split = temporaries()
    monkeypatch.setattr(ShardedDistribution, "get_tensor_layout", lambda self, path: None)
    assert split < 0.5 * temporaries()


def test_an_eager_call_under_fsdp_takes_a_batch_the_shards_do_not_divide():
    """The batch split of layer outputs guides XLA under jit only: an eager call keeps its output as it is."""
    dist, model = _compiled_like_one_device("fsdp")
    _, reference = _compiled_like_one_device(None)
    with dist.scope():
        out = model(X[:2])
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(X[:2])), rtol=1e-5, atol=1e-6)


def test_adafactors_own_state_under_rules_for_its_weights_trains_like_one_device():
    """Adafactor makes a scalar named 'bias' for each bias, outside its name scope: a bias rule must not refuse it."""
    rules = kdist.RuleSet([("(.*/)?bias", ("model",)), ("(.*/)?kernel", (None, "model"))])

    def fit(dist):
        keras.utils.set_random_seed(0)
        with _under(dist):
            model = mnist_mlp()
            optimizer = keras.optimizers.Adafactor(learning_rate=0.01)
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
            return model.fit(X[:8], Y[:8], batch_size=8, epochs=2, verbose=0).history["loss"]

    expected = fit(None)
    dist = kdist.preset("2x4", rules=rules)
    np.testing.assert_allclose(fit(dist), expected, rtol=1e-5)
    placeholder = dist.placements["bias"]  # rank 0, matched by the bias rule
    assert placeholder.axes == () and "optimizer state of rank 0" in placeholder.reason
    assert dist.placements["mlp/d1/bias"].axes == ("model",)
