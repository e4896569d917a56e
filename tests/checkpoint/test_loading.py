"""kdist.load: presets, Keras files and sharded checkpoints read into their shards, bitwise, within the memory bound."""

import os

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import kdist
from kdist.checkpoint.loading import load
from kdist.checkpoint.peak_memory import PeakMemory
from kdist.keras_internals import is_live
from kdist.zoo import BACKBONES, TINY, hub_backbone
from tests.checkpoint.state_helpers import assert_unchanged, snapshot

hub = pytest.importorskip("keras_hub")

SPECS = ("fsdp", "2x4", "dp")


def mlp(width=128):
    return keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(width, name="d1"), keras.layers.Dense(16, name="d2")], name="mlp"
    )


def weights_of(model):
    return {v.path: np.asarray(v.value) for v in model.weights}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A tiny Gemma preset (float32 and bfloat16), an MLP's .weights.h5, .keras and sharded checkpoint; one device."""
    root = tmp_path_factory.mktemp("load")
    keras.distribution.set_distribution(None)
    out = {}
    for name, dtype in (("preset", None), ("preset_bf16", "bfloat16")):
        keras.backend.clear_session()
        keras.utils.set_random_seed(1)
        backbone = hub_backbone(BACKBONES["gemma"], **dict(TINY["gemma"], dtype=dtype))
        backbone.save_to_preset(str(root / name))
        out[name] = str(root / name)
        out[name + "_weights"] = weights_of(backbone)
    backbone.save_to_preset(str(root / "preset_sharded"), max_shard_size=40e3 / 2**30)  # keras-hub's sharded files
    out["preset_sharded"] = str(root / "preset_sharded")
    keras.backend.clear_session()
    keras.utils.set_random_seed(2)
    model = mlp()
    model.save_weights(str(root / "mlp.weights.h5"))
    model.save(str(root / "mlp.keras"))
    kdist.save_sharded(model, str(root / "ckpt"))
    out.update(weights=str(root / "mlp.weights.h5"), keras=str(root / "mlp.keras"), ckpt=str(root / "ckpt"))
    out["mlp_weights"] = weights_of(model)
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    mlp(width=96).save_weights(str(root / "narrow.weights.h5"))
    out["narrow"] = str(root / "narrow.weights.h5")
    return out


def assert_loaded(model, expected, distribution):
    """Every weight bitwise as saved, on the layout the distribution gives it (or one device without one)."""
    assert {v.path for v in model.weights} == set(expected)
    for v in model.weights:
        np.testing.assert_array_equal(np.asarray(v.value), expected[v.path], err_msg=v.path)
        assert str(v.value.dtype) == str(expected[v.path].dtype), v.path
        if distribution is None:
            assert len(v.value.sharding.device_set) == 1, v.path
        else:
            layout = distribution.get_variable_layout(v)
            assert v.value.sharding.is_equivalent_to(layout.backend_layout, v.value.ndim), v.path


def sharded_bytes(model):
    """{device: bytes} the model's variables hold, and the largest variable's unsharded bytes."""
    per_device = {}
    for v in model.variables:
        value = v.value
        for shard in value.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return per_device, max(v.value.nbytes for v in model.variables)


@pytest.mark.parametrize("spec", SPECS)
def test_a_preset_loads_bitwise_on_the_layouts_of_plain_from_preset(sources, spec):
    distribution = kdist.preset(spec)
    model = load(sources["preset"], distribution=distribution)
    assert_loaded(model, sources["preset_weights"], distribution)
    keras.backend.clear_session()
    with distribution.scope():
        plain = hub.models.Backbone.from_preset(sources["preset"])
    assert [str(v.value.sharding.spec) for v in plain.weights] == [str(v.value.sharding.spec) for v in model.weights]


def test_a_preset_with_sharded_weight_files_loads_too(sources):
    assert len([n for n in os.listdir(sources["preset_sharded"]) if n.endswith(".weights.h5")]) > 1
    distribution = kdist.preset("2x4")
    model = load(sources["preset_sharded"], distribution=distribution, dtype="bfloat16")
    assert_loaded(model, sources["preset_bf16_weights"], distribution)


def test_without_a_distribution_a_preset_loads_on_one_device(sources):
    assert_loaded(load(sources["preset"]), sources["preset_weights"], None)


@pytest.mark.parametrize("spec", ("fsdp", "2x4"))
def test_bfloat16_presets_and_the_global_distribution(sources, spec):
    plain = weights_of(hub.models.Backbone.from_preset(sources["preset_bf16"]))  # keras-hub casts to float32
    distribution = kdist.preset(spec)
    keras.backend.clear_session()  # (it also forgets the global distribution)
    keras.distribution.set_distribution(distribution)
    assert_loaded(load(sources["preset_bf16"]), plain, distribution)
    model = load(sources["preset_bf16"], dtype="bfloat16")
    assert_loaded(model, sources["preset_bf16_weights"], distribution)
    assert {str(v.value.dtype) for v in model.weights} == {"bfloat16"}


@pytest.mark.parametrize("spec", ("fsdp", "2x4"))
def test_a_task_preset_loads_its_backbone_into_shards(sources, spec):
    distribution = kdist.preset(spec)
    lm = load(sources["preset"], distribution=distribution, model_class=hub.models.GemmaCausalLM, preprocessor=None)
    assert isinstance(lm, hub.models.GemmaCausalLM)
    assert_loaded(lm.backbone, sources["preset_weights"], distribution)
    tokens = np.arange(16, dtype="int32").reshape(2, 8) % 200
    inputs = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, dtype=bool)}
    keras.distribution.set_distribution(None)
    keras.backend.clear_session()
    reference = hub.models.GemmaCausalLM.from_preset(sources["preset"], preprocessor=None)
    keras.distribution.set_distribution(distribution)
    np.testing.assert_allclose(
        np.asarray(lm(inputs)),
        np.asarray(reference(inputs)),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kind", ("weights", "keras", "ckpt"))
def test_keras_files_and_checkpoints_load_into_an_abstract_model(sources, spec, kind):
    distribution = kdist.preset(spec)
    model = kdist.abstract_model(mlp)
    assert not any(is_live(v) for v in model.variables)
    assert load(sources[kind], model, distribution=distribution) is model
    assert all(is_live(v) for v in model.variables)
    assert_loaded(model, sources["mlp_weights"], distribution)


@pytest.mark.parametrize("spec", ("fsdp", "2x4"))
def test_a_keras_file_builds_its_own_model(sources, spec):
    distribution = kdist.preset(spec)
    model = load(sources["keras"], distribution=distribution)
    # As with keras.models.load_model: a Sequential built from its config has no model name in its paths.
    assert_loaded(model, {k.removeprefix("mlp/"): v for k, v in sources["mlp_weights"].items()}, distribution)


@pytest.mark.parametrize("kind", ("weights", "keras", "ckpt"))
def test_a_live_model_keeps_its_layouts(sources, kind):
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = mlp()
    before = [v.value.sharding for v in model.weights]
    load(sources[kind], model)
    assert_loaded(model, sources["mlp_weights"], kdist.preset("2x4"))
    assert [v.value.sharding for v in model.weights] == before


@pytest.mark.parametrize("spec", ("fsdp", "2x4"))
@pytest.mark.parametrize("kind", ("preset", "weights", "ckpt"))
def test_no_point_of_a_load_holds_more_than_the_sharded_model_and_one_variable(sources, spec, kind):
    distribution = kdist.preset(spec)
    model = None if kind == "preset" else kdist.abstract_model(mlp)
    with PeakMemory() as peak:
        model = load(sources[kind], model, distribution=distribution)
    final, largest = sharded_bytes(model)
    growth = peak.growth()
    assert set(final) == set(jax.devices())
    for device, size in final.items():
        assert size <= growth[device] <= size + largest, (device, growth[device], size, largest)
    assert peak.samples > len(model.variables)


def test_the_tracker_sees_an_unsharded_variable_on_one_device():
    with PeakMemory() as peak:
        full = jnp.zeros((256, 1024), jnp.float32)
        peak.sample()
        del full
    device = jax.devices()[0]
    assert peak.growth()[device] >= 256 * 1024 * 4
    assert peak.rss_peak >= peak.rss_baseline > 0


# --- Failures change nothing -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("narrow", "preset"))
def test_a_failed_load_leaves_a_live_model_as_it_was(sources, kind):
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    before = snapshot(model)
    with pytest.raises(kdist.CheckpointError, match="mlp|d1|shape|variables"):
        load(sources[kind], model)
    assert_unchanged(model, before)


def test_a_failed_load_leaves_an_abstract_model_abstract(sources):
    model = kdist.abstract_model(mlp)
    with pytest.raises(kdist.CheckpointError, match=r"\(64, 96\).*\(64, 128\)|\(96,\)|shape"):
        load(sources["narrow"], model, distribution=kdist.preset("fsdp"))
    assert not any(is_live(v) for v in model.variables)


def test_a_truncated_preset_returns_no_model(sources, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(sources["preset"]):
        data = open(os.path.join(sources["preset"], name), "rb").read()
        (broken / name).write_bytes(data[: len(data) // 2] if name.endswith(".h5") else data)
    with pytest.raises(kdist.CheckpointError, match="broken"):
        load(str(broken), distribution=kdist.preset("fsdp"))


# --- Bad input -------------------------------------------------------------------------------------


def test_bad_sources_get_kdist_errors(sources, tmp_path):
    with pytest.raises(kdist.CheckpointError, match="nothing at .*missing"):
        load(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(kdist.CheckpointError, match="neither a keras-hub preset"):
        load(str(tmp_path / "empty"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(kdist.CheckpointError, match="not a file kdist can load"):
        load(str(tmp_path / "notes.txt"))
    (tmp_path / "fake.weights.h5").write_text("not hdf5")
    with pytest.raises(kdist.CheckpointError, match="not an HDF5"):
        load(str(tmp_path / "fake.weights.h5"), mlp())
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "config.json").write_text("{}")
    with pytest.raises(kdist.CheckpointError, match="has no weights"):
        load(str(tmp_path / "nothing"))


def test_bad_arguments_get_kdist_errors(sources):
    with pytest.raises(kdist.ArgumentTypeError, match="source"):
        load(3)
    with pytest.raises(kdist.ArgumentError, match="model="):
        load(sources["weights"])
    with pytest.raises(kdist.ArgumentError, match="model="):
        load(sources["ckpt"])
    with pytest.raises(kdist.ArgumentTypeError, match="model must be a keras.Model"):
        load(sources["weights"], "model")
    with pytest.raises(kdist.ModelError, match="not built"):
        load(sources["weights"], keras.Sequential([keras.layers.Dense(3)]))
    with pytest.raises(kdist.ArgumentTypeError, match="distribution"):
        load(sources["preset"], distribution="2x4")
    with pytest.raises(kdist.ArgumentError, match="model_class"):
        load(sources["weights"], mlp(), model_class=hub.models.Backbone)
    with pytest.raises(kdist.ArgumentError, match="keyword arguments"):
        load(sources["keras"], dtype="bfloat16")
    with pytest.raises(kdist.ArgumentTypeError, match="model_class"):
        load(sources["preset"], model_class=len)


def test_keras_own_distributions_give_the_layouts(sources):
    data_parallel = keras.distribution.DataParallel()
    assert_loaded(load(sources["preset"], distribution=data_parallel), sources["preset_weights"], data_parallel)
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], keras.distribution.list_devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*d1/kernel"] = (None, "model")
    model_parallel = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    model = load(sources["weights"], kdist.abstract_model(mlp), distribution=model_parallel)
    assert_loaded(model, sources["mlp_weights"], model_parallel)
    assert str(model.get_layer("d1").kernel.value.sharding.spec) == "P(None, 'model')"


def test_a_compiled_keras_file_brings_its_optimizer_state(tmp_path):
    model = mlp()
    model.compile(optimizer="adam", loss="mse")
    x, y = np.random.default_rng(0).normal(size=(2, 16, 64)).astype("float32")[0], np.zeros((16, 16), "float32")
    model.fit(x, y, batch_size=8, verbose=0)
    model.save(str(tmp_path / "trained.keras"))
    keras.backend.clear_session()
    plain = keras.models.load_model(str(tmp_path / "trained.keras"))
    expected = {v.path: np.asarray(v.value) for v in [*plain.weights, *plain.optimizer.variables]}
    keras.backend.clear_session()
    distribution = kdist.preset("fsdp")
    loaded = load(str(tmp_path / "trained.keras"), distribution=distribution)
    got = {v.path: np.asarray(v.value) for v in [*loaded.weights, *loaded.optimizer.variables]}
    assert set(got) == set(expected) and len(got) == 4 + 10  # Adam: iteration, learning rate, 2 slots a weight
    for path, value in expected.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)
    keras.distribution.set_distribution(distribution)
    loaded.fit(x, y, batch_size=8, verbose=0)
