"""Bad input to kdist.inspect and kdist.grid_view: a kdist error naming what is wrong."""

import jax.numpy as jnp
import keras
import pytest

import kdist
from kdist.errors import ArgumentError, ArgumentTypeError, ModelError
from kdist.models import mnist_mlp
from tests.helpers import raises_clearly

MODEL = kdist.abstract_model(mnist_mlp)
CASES = [
    (lambda: kdist.inspect("mlp"), ModelError, "needs a Keras model", "str"),
    (lambda: kdist.inspect(42), ModelError, "needs a Keras model", "int"),
    (lambda: kdist.inspect([]), ModelError, "non-empty list of Keras variables"),
    (lambda: kdist.inspect(keras.Sequential([keras.layers.Dense(2)])), ModelError, "not built", "keras.Input"),
    (lambda: kdist.inspect(MODEL), ArgumentError, "no distribution"),
    (lambda: kdist.inspect(MODEL, 42), ArgumentTypeError, "distribution must be", "int"),
    (lambda: kdist.inspect(MODEL, "2x3"), kdist.SpecError, "'2x3' asks for 6 devices"),
    (lambda: kdist.inspect(MODEL, "2x4", optimizer=3), ArgumentTypeError, "optimizer must be a name"),
    (lambda: kdist.inspect(MODEL, "2x4", optimizer="adamz"), ArgumentError, "Unknown optimizer 'adamz'"),
    (lambda: kdist.inspect(MODEL, "2x4").device_bytes("weights"), ArgumentError, "Unknown kind 'weights'"),
    (lambda: kdist.inspect(MODEL, "2x4").select("("), ArgumentError, "Invalid variable regex '('"),
    (lambda: kdist.grid_view(jnp.zeros(3)), ArgumentError, "needs an array with a NamedSharding"),
    (lambda: kdist.grid_view("kernel"), ArgumentError, "needs a jax.Array or a Keras variable", "str"),
    (lambda: kdist.grid_view(jnp.zeros(3), name=3), ArgumentError, "name must be a title string", "name=3"),
    (
        lambda: kdist.inspect(MODEL, "2x4").grid("mlp/d1/kernel", rows="batch"),
        ArgumentError,
        "'batch' is not in the mesh",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case):
    call, error, *words = case
    raises_clearly(call, error, *words)


def test_an_unknown_variable_is_a_key_error_with_similar_paths():
    with pytest.raises(KeyError, match="Similar paths"):
        kdist.inspect(MODEL, "2x4").variable("mlp/d9/kernel")
