"""The tiny model and data that launched test scripts and in-process references share."""

import functools

import keras
import numpy as np

import kdist

GLOBAL_BATCH = 16
EXAMPLES = 64  # 4 batches per epoch


def data():
    rng = np.random.default_rng(0)
    return rng.random((EXAMPLES, 16), dtype=np.float32), rng.integers(0, 4, size=(EXAMPLES,))


def build():
    """A compiled two-layer MLP whose variable paths do not depend on what was built before."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="d1"), keras.layers.Dense(4, name="d2")],
        name="tiny",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01, name="adam"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class RecordLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:  # batches skipped on resume have no logs
            self.losses.append(float(logs["loss"]))


def train(spec, *, epochs=1, callbacks=()):
    """Train under `kdist.preset(spec)`; returns (per-step losses, model)."""
    record = RecordLosses()
    dist = kdist.preset(spec)
    with dist.scope():
        model = build()
        model.fit(
            kdist.make_dataset(*data(), global_batch_size=GLOBAL_BATCH),
            epochs=epochs,
            verbose=0,
            callbacks=[record, *callbacks],
        )
    return record.losses, model


@functools.lru_cache(maxsize=None)
def reference():
    """The uninterrupted single-process runs (8 devices) that tests compare with, computed once per session.

    Returns {"dp": losses of one epoch, "2x4": losses of two epochs, "state": {path: array} after them}.
    """
    dp_losses, _ = train("dp")
    losses, model = train("2x4", epochs=2)
    return {"dp": dp_losses, "2x4": losses, "state": state(model)}


def state(model):
    """{path: value} of the model's weights and optimizer variables."""
    variables = [*model.trainable_variables, *model.non_trainable_variables, *model.optimizer.variables]
    return {v.path: np.asarray(v.value) for v in variables}
