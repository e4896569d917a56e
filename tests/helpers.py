"""Shared test helpers: training a model for a few steps and reading its losses; a model whose weight starts as a
Python float; the jax version the suite runs on; a plan candidate's step buffers."""

import jax
import keras
import numpy as np

from kdist.demo import fit_steps
from kdist.demo import random_mnist as random_images  # noqa: F401  (re-exported for the tests)

JAX_VERSION = tuple(int(part) for part in jax.__version__.split(".") if part.isdigit())
# jax 0.12.1 keeps `jax.nn.softmax` a custom_jvp call in a differentiated step: its backward reads the probabilities
# alone (0.10.2's reads the exponentials and their sums), one score-sized value per attention layer fewer.
SOFTMAX_BACKWARD_READS_PROBABILITIES = JAX_VERSION >= (0, 12, 1)


def train_losses(
    build, distribution, x, y, *, steps, batch_size, loss="sparse_categorical_crossentropy", optimizer="adam"
):
    """Per-step losses of `build()` trained under `distribution` (None: one device), and the model."""
    keras.utils.set_random_seed(0)

    def fit():
        model = build()
        model.compile(optimizer=optimizer, loss=loss)
        n = steps * batch_size
        return np.array(fit_steps(model, x[:n], y[:n], batch_size)), model

    if distribution is None:
        return fit()
    with distribution.scope():
        return fit()


def raises_clearly(call, error, *words):
    """Assert `call()` raises kdist's `error` whose message contains every one of `words` (a bad-input table row)."""
    import pytest

    import kdist

    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, kdist.KdistError), (
        f"{type(caught.value).__name__} is not a kdist error: {caught.value}"
    )
    for word in words:
        assert word in str(caught.value), f"{word!r} not in: {caught.value}"


class ScaledByAFloat(keras.layers.Layer):
    """A scalar weight whose initializer returns a Python float, as keras-hub's CLIPHead's logit scale does."""

    def build(self, shape):
        self.scale = self.add_weight(shape=(), initializer=lambda shape, dtype=None: 2.0)

    def call(self, x):  # no compute_output_shape: Keras traces the call, reading the weight, to build a model
        return keras.ops.exp(self.scale) * x


def float_scaled_model():
    """A Dense layer of 16 on 8 inputs, scaled by `ScaledByAFloat`."""
    inputs = keras.Input((8,))
    return keras.Model(inputs, ScaledByAFloat()(keras.layers.Dense(16)(inputs)))


def step_buffers(candidate):
    """A plan candidate's peak less its state and inputs: what the step's buffers hold."""
    return candidate.peak - candidate.weights - candidate.optimizer - candidate.other
