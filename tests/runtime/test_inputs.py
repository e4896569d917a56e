"""Bad input to reshard, the data helpers and sweeps: a kdist error naming the argument and value."""

import keras
import numpy as np
import pytest

import kdist
from kdist.errors import ArgumentError, ArgumentTypeError, BatchSizeError, ModelError, RuleError
from kdist.models import mnist_mlp
from tests.helpers import raises_clearly

X = np.zeros((64, 28, 28, 1), np.float32)
Y = np.zeros(64, np.int32)


def built():
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = mnist_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def too_long_layout():
    mesh = kdist.mesh("2x4")
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["mlp/d1/bias"] = (None, "model")  # rank 2 for a rank-1 bias
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")


CASES = [
    (lambda: kdist.reshard(built(), 42), ArgumentTypeError, "spec string", "int"),
    (lambda: kdist.reshard("mlp", "2x4"), ModelError, "needs a Keras model", "str"),
    (lambda: kdist.reshard(keras.Sequential([keras.layers.Dense(2)]), "2x4"), ModelError, "not built"),
    (lambda: kdist.reshard(kdist.abstract_model(mnist_mlp), "2x4"), ModelError, "abstract_model cannot be resharded"),
    (lambda: kdist.reshard(built(), "2x3"), kdist.SpecError, "'2x3'"),
    (lambda: kdist.reshard(built(), too_long_layout()), RuleError, "'mlp/d1/bias'", "2 axes for 1 dimensions"),
    (lambda: kdist.global_batch_size(0), BatchSizeError, "positive integer", "0"),
    (lambda: kdist.global_batch_size(np.int64(-2)), BatchSizeError, "positive integer", "-2"),
    (lambda: kdist.global_batch_size(16.0), BatchSizeError, "positive integer", "16.0"),
    (lambda: kdist.global_batch_size(16, 42), ArgumentTypeError, "distribution must be", "int"),
    (lambda: kdist.check_batch_size(63, "2x4"), BatchSizeError, "63", "62 or 64"),
    (lambda: kdist.check_batch_size("64", "2x4"), BatchSizeError, "positive integer", "'64'"),
    (lambda: kdist.make_dataset(X, Y, distribution="dp"), BatchSizeError, "exactly one of global_batch_size"),
    (
        lambda: kdist.make_dataset(X, Y, global_batch_size=64, per_replica_batch_size=8, distribution="dp"),
        BatchSizeError,
        "exactly one",
    ),
    (lambda: kdist.make_dataset(X, Y[:10], global_batch_size=8, distribution="dp"), BatchSizeError, "sizes [10, 64]"),
    (lambda: kdist.make_dataset(X, Y, global_batch_size=8, shuffle=1, distribution="dp"), ArgumentError, "shuffle"),
    (
        lambda: kdist.make_dataset(X, Y, global_batch_size=8, shuffle=np.ones(2), distribution="dp"),
        ArgumentError,
        "shuffle",
    ),
    (
        lambda: kdist.make_dataset(X, [], global_batch_size=8, distribution="dp"),
        ArgumentTypeError,
        "y holds no arrays",
        "y=[]",
    ),
    (lambda: kdist.make_dataset(X, Y, global_batch_size=8, seed=-3, distribution="dp"), ArgumentError, "seed", "-3"),
    (
        lambda: kdist.make_dataset(X, Y, global_batch_size=8, repeat="yes", distribution="dp"),
        ArgumentTypeError,
        "repeat must be True or False",
    ),
    (lambda: kdist.make_dataset("text", global_batch_size=8, distribution="dp"), ArgumentTypeError, "must be arrays"),
    (lambda: kdist.check_dataset([1, 2], "dp"), BatchSizeError, "needs a tf.data.Dataset", "list"),
    (lambda: kdist.sweep("mlp", (X, Y)), ArgumentTypeError, "build_model must be a function"),
    (lambda: kdist.sweep(mnist_mlp, X), ArgumentTypeError, "tuple (x, y)"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), meshes="some"), ArgumentError, '"all" or a list'),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), meshes=[8]), ArgumentError, "list of mesh spec strings"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), meshes=[]), ArgumentError, "meshes is empty"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), meshes=["2x4", "2x4"]), ArgumentError, "'2x4' twice"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), steps=0), ArgumentError, "steps must be an integer >= 1"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), batch_size=128), ArgumentError, "larger than the 64 samples"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), device_memory="lots"), kdist.SizeError, "device_memory='lots'"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), estimate="exact"), ArgumentError, "estimate must be"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), estimate=np.ones(2)), ArgumentError, "estimate must be"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), strict="yes"), ArgumentTypeError, "strict must be True or False"),
    (lambda: kdist.sweep(mnist_mlp, (X, Y), devices=["cpu:99"]), kdist.SpecError, "Unknown device 'cpu:99'"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case):
    call, error, *words = case
    raises_clearly(call, error, *words)


def test_numpy_integers_are_integers():
    assert kdist.global_batch_size(np.int64(16), "dp") == 128
    assert kdist.check_batch_size(np.int32(64), "2x4") == 32
