"""kdist's main job: train a small model under a preset and report its placement."""

import time

import numpy as np

from kdist.models import mnist_mlp


def random_mnist(samples, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((samples, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(samples,))
    return x, y


def run_demo(spec="2x4", steps=5, batch_size=64, console=None):
    """Build the MLP under `kdist.preset(spec)`, train `steps` steps and print where everything lives.

    Returns the `ShardingReport` and the per-step losses.
    """
    import keras
    from rich.console import Console

    import kdist

    console = console or Console()
    distribution = kdist.preset(spec)
    devices = distribution.device_mesh.devices.ravel()
    console.print(f"[bold]kdist demo[/]: {len(devices)} {devices[0].platform} devices, preset {spec!r} -> {distribution}")
    keras.utils.set_random_seed(0)
    with distribution.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        x, y = random_mnist(steps * batch_size)
        start = time.perf_counter()
        losses = fit_steps(model, x, y, batch_size)
        elapsed = time.perf_counter() - start
    console.print(f"trained {steps} steps of batch {batch_size} in {elapsed:.1f} s; losses: {', '.join(f'{l:.4f}' for l in losses)}")
    report = kdist.inspect(model, distribution)
    console.print(report)
    return report, losses


def fit_steps(model, x, y, batch_size):
    """Fit one epoch over `x, y` in order and return the loss Keras logs after each step."""
    import keras

    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[Record()])
    return losses
