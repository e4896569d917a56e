import math

import jax
import keras
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import kdist
from kdist.model_state import KINDS
from kdist.models import mnist_mlp, tiny_transformer

PRESETS = ("dp", "fsdp", "2x4", "tp")
MODELS = {
    "mlp": mnist_mlp,
    "transformer": lambda: tiny_transformer(vocabulary_size=64, sequence_length=8, hidden_dim=32, num_layers=1),
}


def _compile(model, optimizer="adam"):
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def _live(build, spec, optimizer="adam"):
    """A live model under `spec` with its optimizer built (no training needed for placement)."""
    distribution = kdist.preset(spec)
    with distribution.scope():
        model = _compile(build(), optimizer)
        model.optimizer.build(model.trainable_variables)
    return model, distribution


def _name(device):
    return f"{device.platform}:{device.id}"


def _shard_bytes(variables):
    """Bytes per device name: the sum of shard.data.nbytes over every addressable shard."""
    out = {}
    for v in variables:
        for shard in v.value.addressable_shards:
            out[_name(shard.device)] = out.get(_name(shard.device), 0) + shard.data.nbytes
    return out


def _by_kind(model):
    return {
        "trainable": model.trainable_variables,
        "non_trainable": model.non_trainable_variables,
        "optimizer": model.optimizer.variables,
        "metric": model.metrics_variables,
    }


@pytest.fixture(scope="module")
def cases():
    """(model name, preset) -> (live model, distribution, live report, abstract report)."""
    out = {}
    for name, build in MODELS.items():
        for spec in PRESETS:
            keras.backend.clear_session()  # same layer names in the live and the abstract model
            model, distribution = _live(build, spec)
            live = kdist.inspect(model, distribution)
            keras.backend.clear_session()
            abstract_model = _compile(kdist.abstract_model(build))
            abstract = kdist.inspect(abstract_model, distribution)
            out[name, spec] = (model, distribution, live, abstract)
    return out


@pytest.mark.parametrize("spec", PRESETS)
@pytest.mark.parametrize("name", MODELS)
def test_live_bytes_per_device_equal_addressable_shard_bytes(cases, name, spec):
    model, _, report, _ = cases[name, spec]
    assert report.source == "live"
    for kind, variables in _by_kind(model).items():
        expected = _shard_bytes(variables)
        got = report.device_bytes(kind)
        assert {d: int(b) for d, b in zip(report.devices, got) if b} == {d: b for d, b in expected.items() if b}, kind
    everything = [v for vs in _by_kind(model).values() for v in vs]
    assert dict(zip(report.devices, report.device_bytes().tolist())) == _shard_bytes(everything)
    assert len(report.devices) == 8


@pytest.mark.parametrize("spec", PRESETS)
@pytest.mark.parametrize("name", MODELS)
def test_abstract_report_gives_the_live_numbers(cases, name, spec):
    _, _, live, abstract = cases[name, spec]
    assert abstract.source == "abstract"
    assert abstract.devices == live.devices
    for kind in KINDS:
        np.testing.assert_array_equal(abstract.device_bytes(kind), live.device_bytes(kind), err_msg=kind)
    assert abstract.device_bytes("optimizer").sum() > 0

    def fields(r):
        return {
            v.path: (v.kind, v.shape, v.dtype, v.spec, v.shard_shape, v.replication, v.provenance) for v in r.variables
        }

    assert fields(abstract) == fields(live)
    assert abstract.summary == live.summary


def test_abstract_inspection_allocates_nothing():
    from keras.src.backend.common import global_state

    model = kdist.abstract_model(mnist_mlp)
    pending = len(global_state.get_global_attribute("uninitialized_variables", []))
    report = kdist.inspect(model, kdist.preset("2x4"), optimizer="adam")
    assert all(v._value is None for v in model.variables)
    assert len(global_state.get_global_attribute("uninitialized_variables", [])) == pending
    assert report.summary["optimizer_bytes"] == 2 * report.summary["trainable_bytes"] + 8


def test_slots_show_their_reference_provenance(cases):
    _, _, live, abstract = cases["mlp", "2x4"]
    for report in (live, abstract):
        kernel = report.variable("mlp/d1/kernel")
        momentum = report.variable("adam/mlp_d1_kernel_momentum")
        assert kernel.source == "rule" and "kernel" in kernel.rule
        assert momentum.slot_of == "mlp/d1/kernel"
        assert (momentum.source, momentum.rule, momentum.spec) == (kernel.source, kernel.rule, kernel.spec)
        assert momentum.provenance == f"slot of mlp/d1/kernel: rule {kernel.rule}"
        fallback = report.variable("mlp/d2/kernel")
        assert fallback.source == "fallback" and "not divisible by model=4" in fallback.reason
        assert report.variable("adam/iteration").slot_of == ""


def test_fsdp_provenance_and_small_variables_stay_replicated(cases):
    _, _, live, _ = cases["mlp", "fsdp"]
    kernel = live.variable("mlp/d1/kernel")
    assert kernel.spec == ("fsdp", None) and kernel.replication == 1
    assert kernel.provenance.startswith("fsdp")
    small = live.variable("mlp/d2/kernel")  # 2,000 elements: below FSDP_MIN_SIZE, replicated
    assert small.replication == 8 and not small.sharded


@pytest.mark.parametrize(
    "optimizer, slots_per_variable",
    [
        ("sgd", 0),
        (keras.optimizers.SGD(momentum=0.9), 1),
        ("adam", 2),
        ("adamw", 2),
        ({"class_name": "adam", "config": {"amsgrad": True}}, 3),
        ("rmsprop", 1),
    ],
)
def test_planned_optimizer_state_by_kind(optimizer, slots_per_variable):
    model = kdist.abstract_model(mnist_mlp)
    report = kdist.inspect(model, kdist.preset("2x4"), optimizer=optimizer)
    slots = [v for v in report.variables if v.slot_of]
    trainable = [v for v in report.variables if v.kind == "trainable"]
    assert len(slots) == slots_per_variable * len(trainable)
    assert (
        report.device_bytes("optimizer").tolist()
        == (
            slots_per_variable * report.device_bytes("trainable") + 8  # iteration and learning_rate
        ).tolist()
    )


def test_planned_optimizer_state_of_a_live_model_matches_a_built_one():
    keras.backend.clear_session()
    built, distribution = _live(mnist_mlp, "2x4")
    keras.backend.clear_session()
    with distribution.scope():
        fresh = mnist_mlp()
    planned = kdist.inspect(fresh, distribution, optimizer="adam")
    actual = kdist.inspect(built, distribution)
    np.testing.assert_array_equal(planned.device_bytes("optimizer"), actual.device_bytes("optimizer"))
    assert getattr(fresh, "optimizer", None) is None  # nothing built on the caller's model


def test_unknown_optimizer_and_missing_distribution_fail_clearly():
    model = kdist.abstract_model(mnist_mlp)
    with pytest.raises(ValueError, match="Unknown optimizer 'adamz'"):
        kdist.inspect(model, kdist.preset("2x4"), optimizer="adamz")
    with pytest.raises(TypeError, match="optimizer must be a name"):
        kdist.inspect(model, kdist.preset("2x4"), optimizer=3)
    with pytest.raises(ValueError, match="no distribution"):
        kdist.inspect(model)


def test_planned_adafactor_matches_a_built_one():
    """Adafactor's factored accumulators are not slots: the distribution lays them out by their own path."""
    keras.backend.clear_session()
    model, distribution = _live(mnist_mlp, "2x4", optimizer="adafactor")
    live = kdist.inspect(model, distribution)
    keras.backend.clear_session()
    planned = kdist.inspect(kdist.abstract_model(mnist_mlp), distribution, optimizer="adafactor")
    np.testing.assert_array_equal(planned.device_bytes("optimizer"), live.device_bytes("optimizer"))

    def key(r):
        return sorted((v.path, v.shape, v.spec, v.provenance) for v in r.variables if v.kind == "optimizer")

    assert key(planned) == key(live)
    assert ("adafactor/kernel", (784,), ("model",)) in {(v.path, v.shape, v.spec) for v in planned.variables}


def test_summary_definitions(cases):
    _, _, report, _ = cases["transformer", "2x4"]
    s = report.summary
    per_device = report.device_bytes()
    total = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in report.variables)
    assert s["total_bytes"] == total
    assert s["bytes_if_replicated"] == total and s["bytes_if_perfectly_sharded"] == math.ceil(total / 8)
    assert s["imbalance"] == pytest.approx(per_device.max() / per_device.mean())
    assert s["bytes_on_devices"] == per_device.sum()
    sharded = sum(v.nbytes for v in report.variables if any(a is not None for a in v.spec))
    assert s["sharded_share"] == pytest.approx(sharded / total)
    assert sum(s[f"{k}_bytes"] for k in KINDS) == total


def test_select_and_unknown_variable(cases):
    _, _, report, _ = cases["mlp", "2x4"]
    d1 = report.select(r"d1")
    assert {v.path for v in d1.variables} >= {"mlp/d1/kernel", "adam/mlp_d1_kernel_momentum"}
    assert all("d1" in v.path for v in d1.variables)
    with pytest.raises(KeyError, match="No variable 'mlp/d9/kernel'"):
        report.variable("mlp/d9/kernel")
    with pytest.raises(ValueError, match="Invalid variable regex"):
        report.select("(")


# --- Grid views -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cube():
    """A data=2, fsdp=2, model=2 distribution and its jax mesh."""
    distribution = kdist.preset("data=2,fsdp=2,model=2")
    return distribution, distribution.device_mesh.backend_mesh


def _device_at(mesh, d, f, m):
    return _name(mesh.devices[d, f, m])


def test_grid_of_a_3d_array(cube):
    _, mesh = cube
    x = jax.device_put(np.zeros((4, 6, 8), np.float32), NamedSharding(mesh, PartitionSpec("data", None, "model")))
    view = kdist.grid_view(x, rows=("data", "fsdp"), cols="model", name="cube")
    assert view.slice_text(_device_at(mesh, 0, 0, 0)) == "[0:2, :, 0:4]"
    assert view.slice_text(_device_at(mesh, 1, 0, 1)) == "[2:4, :, 4:8]"
    assert view.slice_text(_device_at(mesh, 1, 1, 1)) == "[2:4, :, 4:8]"
    assert view.row_labels == ["data=0,fsdp=0", "data=0,fsdp=1", "data=1,fsdp=0", "data=1,fsdp=1"]
    assert view.cells[2][1] == _device_at(mesh, 1, 0, 1)  # row data=1,fsdp=0; column model=1
    text = str(view)
    assert "[2:4, :, 4:8]" in text and "[0:2, :, 0:4]" in text


def test_grid_of_a_4d_array_with_a_dimension_over_two_axes(cube):
    _, mesh = cube
    spec = PartitionSpec(("data", "fsdp"), None, None, "model")
    x = jax.device_put(np.zeros((4, 3, 5, 8), np.float32), NamedSharding(mesh, spec))
    view = kdist.grid_view(x, rows="model", cols=("data", "fsdp"))
    assert view.slice_text(_device_at(mesh, 0, 1, 0)) == "[1:2, :, :, 0:4]"
    assert view.slice_text(_device_at(mesh, 1, 1, 1)) == "[3:4, :, :, 4:8]"
    assert view.cells[1][3] == _device_at(mesh, 1, 1, 1)
    assert len(view.cells) == 2 and len(view.cells[0]) == 4
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        assert view.slices[_name(device)] == tuple(s.indices(d)[:2] for s, d in zip(index, x.shape))


def test_report_grid_of_an_abstract_variable_matches_jax():
    rules = kdist.RuleSet([(r".*/w", ("data", None, "model"))])
    distribution = kdist.preset("data=2,fsdp=2,model=2", rules=rules)
    with keras.StatelessScope(initialize_variables=False), keras.name_scope("block"):
        w = keras.Variable(initializer="zeros", shape=(4, 3, 8), name="w")
    report = kdist.inspect([w], distribution)
    view = report.grid("block/w", rows="data", cols=("fsdp", "model"))
    x = jax.device_put(np.zeros((4, 3, 8), np.float32), distribution.get_variable_layout(w).backend_layout)
    assert view.slices == kdist.grid_view(x).slices
    assert view.slice_text(_name(distribution.device_mesh.backend_mesh.devices[1, 1, 0])) == "[2:4, :, 0:4]"
    assert kdist.grid_view(w, distribution=distribution).slices == view.slices


def test_grid_axes_must_cover_the_mesh_once(cube):
    _, mesh = cube
    x = jax.device_put(np.zeros((4, 6)), NamedSharding(mesh, PartitionSpec("data")))
    with pytest.raises(ValueError, match=r"\['fsdp'\] is in neither"):
        kdist.grid_view(x, rows="data", cols="model")
    with pytest.raises(ValueError, match="'batch' is not in the mesh"):
        kdist.grid_view(x, rows="batch")
    with pytest.raises(ValueError, match="needs an array with a NamedSharding"):
        kdist.grid_view(jax.numpy.zeros(3))


# --- Plain Keras distributions ------------------------------------------------------------------------


def _keras_model_parallel(layout):
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], keras.distribution.list_devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*d1/kernel"] = layout
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def test_keras_model_parallel_layout_map_live_and_abstract():
    distribution = _keras_model_parallel((None, "model"))
    keras.backend.clear_session()
    with distribution.scope():
        live_model = _compile(mnist_mlp())
        live_model.optimizer.build(live_model.trainable_variables)
    live = kdist.inspect(live_model, distribution)
    keras.backend.clear_session()
    abstract = kdist.inspect(_compile(kdist.abstract_model(mnist_mlp)), distribution)
    for kind in KINDS:
        np.testing.assert_array_equal(abstract.device_bytes(kind), live.device_bytes(kind), err_msg=kind)
    expected = _shard_bytes([v for vs in _by_kind(live_model).values() for v in vs])
    assert dict(zip(live.devices, live.device_bytes().tolist())) == expected
    kernel = live.variable("mlp/d1/kernel")
    assert (kernel.source, kernel.rule, kernel.spec) == ("layout_map", ".*d1/kernel", (None, "model"))
    assert live.variable("mlp/d2/kernel").reason == "no LayoutMap key matched: replicated"
    assert (
        abstract.variable("adam/mlp_d1_kernel_velocity").provenance == "slot of mlp/d1/kernel: layout_map .*d1/kernel"
    )


def test_indivisible_layout_fails_with_the_variable_named():
    distribution = _keras_model_parallel(("model", None))
    layout_map = distribution._layout_map
    layout_map[".*d2/kernel"] = (None, "model")  # 10 output features over model=4
    with pytest.raises(
        ValueError, match=r"'mlp/d2/kernel' of shape \(200, 10\).*dimension 1 \(10\) does not divide by model=4"
    ):
        kdist.inspect(kdist.abstract_model(mnist_mlp), distribution)


def test_data_parallel_and_no_distribution_provenance():
    data_parallel = keras.distribution.DataParallel()
    report = kdist.inspect(kdist.abstract_model(mnist_mlp), data_parallel, optimizer="sgd")
    kernel = report.variable("mlp/d1/kernel")
    assert kernel.replication == 8 and kernel.reason == "DataParallel replicates variables"
    assert report.summary["sharded_share"] == 0.0
    distribution = kdist.preset("2x4")
    with distribution.scope():
        model = mnist_mlp()
    unknown = kdist.inspect(model)  # built under a distribution, inspected without one
    assert unknown.variable("mlp/d1/kernel").source == "unknown"
    assert unknown.variable("mlp/d1/kernel").spec == (None, "model")
