import jax
import keras
import numpy as np
import pytest

import kdist
from kdist import SpecError
from kdist.models import mnist_mlp, small_cnn
from tests.helpers import random_images, train_losses

PRESETS = ["8x1", "2x4", "4x2", "1x8", "dp", "tp", "fsdp", "data=-1,model=2", "2x2x2"]


def test_mesh_shape_and_names():
    m = kdist.mesh("2x4")
    assert isinstance(m, keras.distribution.DeviceMesh)
    assert m.shape == (2, 4) and list(m.axis_names) == ["data", "model"]
    assert kdist.mesh("data=-1,model=2").shape == (4, 2)
    assert list(kdist.mesh("2x4", axis_names=("batch", "model")).axis_names) == ["batch", "model"]
    assert kdist.mesh("dp").shape == (8,)


def test_mesh_uses_jax_device_order():
    from jax.experimental import mesh_utils

    expected = mesh_utils.create_device_mesh((2, 4), jax.devices(), allow_split_physical_axes=True)
    assert (kdist.mesh("2x4").devices == expected).all()


def test_mesh_on_a_subset_of_devices():
    m = kdist.mesh("2x2", devices=jax.devices()[:4])
    assert sorted(d.id for d in m.devices.ravel()) == [0, 1, 2, 3]
    assert kdist.mesh("1x2", devices=["cpu:6", "cpu:7"]).shape == (1, 2)
    with pytest.raises(SpecError, match="Unknown device 'gpu:0'"):
        kdist.mesh("1x1", devices=["gpu:0"])


def test_axis_names_must_match_axes():
    with pytest.raises(SpecError, match="axis_names needs 2 distinct names"):
        kdist.mesh("2x4", axis_names=("batch",))


def test_preset_is_a_keras_distribution():
    dist = kdist.preset("2x4")
    assert isinstance(dist, keras.distribution.ModelParallel)
    assert dist.batch_dim_name == "data"
    keras.distribution.set_distribution(dist)
    assert keras.distribution.distribution() is dist


def test_auto_preset_without_a_model_says_what_to_pass():
    with pytest.raises(SpecError, match=r'preset\("auto", model=model, batch_size=64\)'):
        kdist.preset("auto")
    with pytest.raises(SpecError, match="batch size"):
        kdist.preset("auto", model=kdist.abstract_model(mnist_mlp))


def test_bad_preset_spec_names_it():
    with pytest.raises(SpecError, match="'2x3'"):
        kdist.preset("2x3")


def _spec_of(variable):
    return tuple(variable.value.sharding.spec)


def test_2x4_shards_dense_kernels_on_model():
    dist = kdist.preset("2x4")
    with dist.scope():
        model = mnist_mlp()
    variables = {v.path: v for v in model.variables}
    assert _spec_of(variables["mlp/d1/kernel"]) == (None, "model")
    assert variables["mlp/d1/kernel"].value.sharding.shard_shape((784, 200)) == (784, 50)
    # 10 outputs do not divide by 4: the rule's second candidate shards the inputs instead.
    assert _spec_of(variables["mlp/d2/kernel"]) == ("model", None)
    assert dist.placements["mlp/d2/kernel"].source == "fallback"
    assert "not divisible by model=4" in dist.placements["mlp/d2/kernel"].reason
    # A column-parallel kernel's bias follows its output split (the keras-io guide's map shards it too).
    assert _spec_of(variables["mlp/d1/bias"]) == ("model",)
    assert dist.placements["mlp/d1/bias"].reason == "follows mlp/d1/kernel (None, 'model')"
    # d2's kernel fell back to its input features: its bias stays whole.
    assert _spec_of(variables["mlp/d2/bias"]) in ((), (None,))


def test_indivisible_dimension_is_replicated_and_recorded():
    dist = kdist.preset("1x8")
    with dist.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="odd")])
    kernel = model.get_layer("odd").kernel
    assert _spec_of(kernel) in ((None, None), (None,), ())
    placement = dist.placements[kernel.path]
    assert placement.source == "fallback" and "replicated" in placement.reason


def test_dp_replicates_everything():
    dist = kdist.preset("dp")
    with dist.scope():
        model = mnist_mlp()
    for v in model.variables:
        assert v.value.sharding.is_fully_replicated, v.path
    assert dist.get_data_layout((64, 784)).axes == ("data", None)


def test_fsdp_shards_weights_over_the_data_axis():
    dist = kdist.preset("fsdp")
    with dist.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    kernel = model.get_layer("d1").kernel
    assert _spec_of(kernel) == ("fsdp", None)  # 784 is the largest dimension dividing by 8
    momentum = [v for v in model.optimizer.variables if v.path == "adam/mlp_d1_kernel_momentum"][0]
    assert _spec_of(momentum) == ("fsdp", None)
    assert dist.placements[kernel.path].source == "fsdp"
    assert model.get_layer("d1").bias.value.sharding.is_fully_replicated  # 200 elements: too small to shard
    assert dist.get_data_layout((64, 784)).axes == ("fsdp", None)


def test_three_axis_preset_shards_batch_over_data_and_fsdp():
    dist = kdist.preset("2x2x2")
    assert dist.get_data_layout((64, 10)).axes == (("data", "fsdp"), None)
    assert dist.num_model_replicas == 4
    with dist.scope():
        model = mnist_mlp()
    assert _spec_of(model.get_layer("d1").kernel) == ("fsdp", "model")


def test_tp_replicates_the_batch():
    dist = kdist.preset("tp")
    assert dist.get_data_layout((64, 10)).axes == (None, None)
    assert dist.num_model_replicas == 1


def test_custom_axis_names_bind_to_roles():
    dist = kdist.preset("2x4", axis_names=("batch", "tensor"))
    with dist.scope():
        model = mnist_mlp()
    assert _spec_of(model.get_layer("d1").kernel) == (None, "tensor")
    assert dist.get_data_layout((4, 3)).axes == ("batch", None)


def test_rules_from_a_layout_map_and_from_pairs():
    layout_map = keras.distribution.LayoutMap(kdist.mesh("2x4"))
    layout_map["mlp/d1/kernel"] = ("model", None)
    dist = kdist.preset("2x4", rules=layout_map)
    with dist.scope():
        model = mnist_mlp()
    assert _spec_of(model.get_layer("d1").kernel) == ("model", None)
    assert dist.placements["mlp/d2/kernel"].source == "default"
    dist = kdist.preset("2x4", rules=[(r".*/d2/kernel", (None, "data"))])
    with dist.scope():
        model = mnist_mlp()
    assert _spec_of(model.get_layer("d2").kernel) == (None, "data")
    with pytest.raises(TypeError, match="rules must be"):
        kdist.preset("2x4", rules=42)


X, Y = random_images(256)
BATCH = 32
STEPS = 4


@pytest.fixture(scope="module")
def single_device_mlp_losses():
    return train_losses(mnist_mlp, None, X, Y, steps=STEPS, batch_size=BATCH)[0]


@pytest.fixture(scope="module")
def single_device_cnn_losses():
    return train_losses(small_cnn, None, X, Y, steps=STEPS, batch_size=BATCH)[0]


@pytest.mark.parametrize("spec", PRESETS)
def test_mlp_losses_match_single_device(spec, single_device_mlp_losses):
    losses, model = train_losses(mnist_mlp, kdist.preset(spec), X, Y, steps=STEPS, batch_size=BATCH)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, single_device_mlp_losses, rtol=2e-5, atol=1e-6)
    assert len(model.get_layer("d1").kernel.value.sharding.device_set) == 8


@pytest.mark.parametrize("spec", ["2x4", "fsdp", "dp"])
def test_cnn_losses_match_single_device(spec, single_device_cnn_losses):
    losses, _ = train_losses(small_cnn, kdist.preset(spec), X, Y, steps=STEPS, batch_size=BATCH)
    np.testing.assert_allclose(losses, single_device_cnn_losses, rtol=2e-5, atol=1e-6)


def test_evaluate_and_predict_under_a_preset():
    dist = kdist.preset("2x4")
    with dist.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        loss = model.evaluate(X[:64], Y[:64], batch_size=32, verbose=0)
        predictions = model.predict(X[:64], batch_size=32, verbose=0)
    assert np.isfinite(loss) and predictions.shape == (64, 10)
