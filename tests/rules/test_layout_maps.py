"""A Keras LayoutMap given to kdist keeps Keras's meaning: exact key first, re.fullmatch, several matches raise,
"<layer>/output" keys lay out activations; presets, the linter and the inspector share that one lookup."""

import random

import keras
import numpy as np
import pytest
from keras.distribution import LayoutMap, ModelParallel

import kdist
from kdist.errors import RuleError
from kdist.models import mnist_mlp, tiny_transformer


def _map(pairs, mesh):
    layout_map = LayoutMap(mesh)
    for key, axes in pairs:
        layout_map[key] = axes
    return layout_map


def _specs(model):
    return {
        v.path: tuple(v.value.sharding.spec) + (None,) * (len(v.shape) - len(v.value.sharding.spec))
        for v in model.variables
    }


def test_an_exact_key_wins_over_a_regex_key_inserted_before_it():
    mesh = kdist.mesh("2x4")
    layout_map = _map([(r"mlp/d1/k.*", (None, "model")), ("mlp/d1/kernel", ("model", None))], mesh)
    keras_dist = ModelParallel(layout_map=layout_map, batch_dim_name="data")
    with keras_dist.scope():
        expected = _specs(mnist_mlp())
    keras.backend.clear_session()
    dist = kdist.preset("2x4", rules=layout_map)
    with dist.scope():
        got = _specs(mnist_mlp())
    assert expected["mlp/d1/kernel"] == ("model", None)  # Keras: the exact key wins
    assert got == expected
    assert (
        dist.placements["mlp/d1/kernel"].source == "layout_map"
        and dist.placements["mlp/d1/kernel"].rule == "mlp/d1/kernel"
    )


def test_a_path_matching_two_keys_is_an_error_naming_both():
    layout_map = _map([(r"mlp/d1/.*", (None, "model")), (r".*/kernel", (None, "model"))], kdist.mesh("2x4"))
    with pytest.raises(ValueError, match="matches multiple layout"), ModelParallel(layout_map=layout_map).scope():
        mnist_mlp()
    keras.backend.clear_session()
    with pytest.raises(
        RuleError, match=r"'mlp/d1/kernel' matches multiple layout specification keys.*mlp/d1/\.\*.*\.\*/kernel"
    ):
        with kdist.preset("2x4", rules=layout_map).scope():
            mnist_mlp()


def test_activation_layouts_of_the_keras_guide_are_honoured():
    mesh = kdist.mesh("2x4")
    layout_map = _map(
        [("mlp/d1/kernel", (None, "model")), ("mlp/d1/bias", ("model",)), ("mlp/d2/output", ("data", None))], mesh
    )
    dist = kdist.preset("2x4", rules=layout_map)
    keras_dist = ModelParallel(layout_map=layout_map, batch_dim_name="data")
    for d in (dist, keras_dist):
        assert tuple(d.get_tensor_layout("mlp/d2/output").axes) == ("data", None)
        assert d.get_tensor_layout("mlp/d1/output") is None
    rules = kdist.RuleSet([(r".*/kernel", ("...", "model")), (r"mlp/d2/output", ("data", None))])
    assert tuple(kdist.preset("2x4", rules=rules).get_tensor_layout("mlp/d2/output").axes) == ("data", None)
    with dist.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        history = model.fit(np.random.rand(64, 28, 28, 1), np.random.randint(0, 10, 64), batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def test_a_dict_of_layout_keys_is_a_layout_map():
    dist = kdist.preset("2x4", rules={"mlp/d1/kernel": ("model", None)})
    assert dist.place("mlp/d1/kernel", (784, 200)).axes == ("model", None)
    assert dist.place("mlp/d2/kernel", (200, 10)).source == "default"


def test_an_invalid_regex_key_is_refused_up_front():
    with pytest.raises(RuleError, match=r"LayoutMap key '\[unclosed' is not a valid regex"):
        kdist.preset("2x4", rules={"[unclosed": (None, "model")})


# --- Generated maps: the preset, the linter and the inspector agree on every path -------------------

KEYS = [
    r".*kernel",
    r".*/kernel",
    r"block_0.*",
    r"block_\d+_mlp_up/kernel",
    r".*(query|key|value)/kernel",
    r"lm_head/.*",
    r"token_embedding/embeddings",
    r"block_1_attention/query/kernel",
    r".*_norm/gamma",
    r"block_0_mlp_up/kernel",
    r".*bias",
]


def _layout(path, shape):
    """A divisible layout of the variable's rank (tiny transformer dims all divide by 4)."""
    return tuple("model" if i == len(shape) - 1 else None for i in range(len(shape)))


@pytest.fixture(scope="module")
def transformer():
    return kdist.abstract_model(tiny_transformer)


@pytest.mark.parametrize("seed", range(12))
def test_generated_maps_place_alike_everywhere(transformer, seed):
    rng = random.Random(seed)
    mesh = kdist.mesh("2x4")
    variables = {v.path: tuple(v.shape) for v in transformer.variables}
    keys = rng.sample(KEYS, rng.randint(2, 6)) + rng.sample(sorted(variables), rng.randint(0, 3))
    rng.shuffle(keys)
    layout_map = LayoutMap(mesh)
    for key in keys:
        rank = next((len(s) for p, s in variables.items() if p == key), rng.choice([1, 2, 3]))
        layout_map[key] = _layout(key, (8,) * rank)
    dist = kdist.preset("2x4", rules=layout_map)
    report = kdist.lint(layout_map, transformer)
    multiple = {f.path for f in report.findings if f.code == "KD101"}
    rank_errors = {f.path for f in report.findings if f.code == "KD102"}
    for path, shape in variables.items():
        try:
            layout = layout_map[path]  # Keras's own lookup: the reference
        except ValueError:
            assert path in multiple, path
            with pytest.raises(RuleError, match="matches multiple"):
                dist.place(path, shape)
            continue
        assert path not in multiple, path
        expected = (
            tuple(layout.axes) + (None,) * (len(shape) - len(layout.axes))
            if layout is not None
            else (None,) * len(shape)
        )
        if layout is not None and len(layout.axes) > len(shape):
            assert path in rank_errors
            with pytest.raises(RuleError, match="dimensions"):
                dist.place(path, shape)
            continue
        assert dist.place(path, shape).axes == expected, path
        assert report.placements[path] == expected, path
    if not multiple and not rank_errors:
        inspected = {v.path: v.spec for v in kdist.inspect(transformer, dist).variables}
        keras_inspected = {
            v.path: v.spec for v in kdist.inspect(transformer, ModelParallel(layout_map=layout_map)).variables
        }
        assert inspected == keras_inspected
        assert inspected == {p: dist.place(p, s).axes for p, s in variables.items()}


# --- Keras's data axis "batch": keras-hub's maps as they are ------------------------------------------

HUB_BACKBONES = {  # tiny, with every sharded dimension dividing its axis (Keras's ModelParallel cannot fall back)
    "gemma": ("GemmaBackbone", dict(num_query_heads=4, num_key_value_heads=4, head_dim=8)),
    "llama": ("LlamaBackbone", dict(num_query_heads=4, num_key_value_heads=2)),
}


@pytest.mark.parametrize("family", list(HUB_BACKBONES))
def test_keras_hub_maps_place_on_2x4_as_keras_model_parallel(family):
    keras_hub = pytest.importorskip("keras_hub")
    name, heads = HUB_BACKBONES[family]
    backbone_class = getattr(keras_hub.models, name)

    def build():
        return backbone_class(vocabulary_size=64, num_layers=1, hidden_dim=64, intermediate_dim=128, **heads)

    keras_mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    layout_map = backbone_class.get_layout_map(keras_mesh)  # names "batch" and "model", as keras-hub documents
    keras.backend.clear_session()
    with ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
        expected = _specs(build())
    keras.backend.clear_session()
    dist = kdist.preset("2x4", rules=layout_map)  # axes ("data", "model"): "batch" is read as "data"
    with dist.scope():
        got = _specs(build())
    as_kdist = {path: tuple("data" if a == "batch" else a for a in spec) for path, spec in expected.items()}
    assert got == as_kdist
    assert any("data" in spec for spec in got.values()) and any("model" in spec for spec in got.values())
    report = kdist.lint(layout_map, kdist.abstract_model(build), "2x4")  # the linter reads the map the same way
    assert report.ok, report
    assert {p: a for p, a in report.placements.items() if p in got} == got


def test_a_batch_axis_in_a_map_is_the_data_axis_and_missing_roles_replicate():
    layout_map = _map(
        [("mlp/d1/kernel", ("batch", "model"))],
        keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices()),
    )
    assert kdist.preset("2x4", rules=layout_map).place("mlp/d1/kernel", (784, 200)).axes == ("data", "model")
    # A mesh named the Keras way reads kdist's role names too.
    named = kdist.preset("2x4", axis_names=("batch", "model"), rules={"mlp/d1/kernel": ("data", "model")})
    assert named.place("mlp/d1/kernel", (784, 200)).axes == ("batch", "model")
    placement = kdist.preset("dp", rules=layout_map).place("mlp/d1/kernel", (784, 200))
    assert placement.axes == ("data", None) and "has no axis for 'model'" in placement.reason
    with pytest.raises(RuleError, match="'tensor', which is not in the mesh"):
        kdist.preset("2x4", rules={"mlp/d1/kernel": (None, "tensor")}).place("mlp/d1/kernel", (784, 200))
