"""Shared test helpers: training a model for a few steps and reading its losses."""

import keras
import numpy as np


def train_losses(build, distribution, x, y, *, steps, batch_size, loss="sparse_categorical_crossentropy", optimizer="adam"):
    """Per-step losses of `build()` trained under `distribution` (None: one device)."""
    keras.utils.set_random_seed(0)
    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    def fit():
        model = build()
        model.compile(optimizer=optimizer, loss=loss)
        model.fit(x[: steps * batch_size], y[: steps * batch_size], batch_size=batch_size, shuffle=False, verbose=0, callbacks=[Record()])
        return model

    if distribution is None:
        model = fit()
    else:
        with distribution.scope():
            model = fit()
    return np.array(losses), model


def random_images(samples, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((samples, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, size=(samples,))
