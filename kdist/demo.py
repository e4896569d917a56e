"""kdist's main job: train a small model under a preset and report its placement."""

import time

import jax
import keras
import numpy as np
from rich.console import Console

from kdist.checks import positive_int
from kdist.inspection.inspector import inspect
from kdist.models import mnist_mlp
from kdist.presets import build_preset
from kdist.runtime.data import check_batch_size

DEFAULT_MESH = "2x4"


def random_mnist(samples, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((samples, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=(samples,))
    return x, y


def demo_mesh(num_devices):
    """The demo's mesh on `num_devices` devices: "2x4" on 8; "2xN/2" on other even counts of 4 and more; else "dp"."""
    if num_devices == 8:
        return DEFAULT_MESH
    if num_devices >= 4 and num_devices % 2 == 0:
        return f"2x{num_devices // 2}"
    return "dp"


def run_demo(spec=None, steps=5, batch_size=64, console=None):
    """Build the MLP under `kdist.preset(spec)`, train `steps` steps and print where everything lives.

    Without `spec`, the mesh fits the devices JAX has (see `demo_mesh`), and
    a line says which devices and why. Returns the `ShardingReport` and the
    per-step losses.
    """
    steps = positive_int(steps, "steps")
    batch_size = positive_int(batch_size, "batch_size")
    console = console or Console()
    devices = jax.devices()
    console.print(_devices_line(devices), highlight=False)
    chosen = spec is None
    if chosen:
        spec = demo_mesh(len(devices))
        if spec != DEFAULT_MESH:
            console.print(
                f"The default mesh {DEFAULT_MESH!r} needs 8 devices and JAX has "
                f"{_count(len(devices), devices[0].platform)}: "
                f"using {spec!r}. Pass --mesh to choose, or --fake-devices 8 to run {DEFAULT_MESH!r} on 8 fake CPU "
                "devices.",
                highlight=False,
            )
    distribution = build_preset(spec)
    used = distribution.device_mesh.devices.ravel()
    console.print(
        f"[bold]kdist demo[/]: {_count(len(used), used[0].platform)}, preset {spec!r} -> {distribution}",
        highlight=False,
    )
    replicas = distribution.num_model_replicas
    if chosen and batch_size % replicas:
        batch_size = -(-batch_size // replicas) * replicas
        console.print(
            f"batch size rounded up to {batch_size}, a multiple of the {replicas} model replicas", highlight=False
        )
    check_batch_size(batch_size, distribution)
    keras.utils.set_random_seed(0)
    with distribution.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        x, y = random_mnist(steps * batch_size)
        start = time.perf_counter()
        losses = fit_steps(model, x, y, batch_size)
        elapsed = time.perf_counter() - start
    console.print(
        f"trained {steps} steps of batch {batch_size} in {elapsed:.1f} s; losses: "
        f"{', '.join(f'{v:.4f}' for v in losses)}"
    )
    report = inspect(model, distribution)
    console.print(report)
    return report, losses


def fit_steps(model, x, y, batch_size):
    """Fit one epoch over `x, y` in order and return the loss Keras logs after each step."""
    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))

    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[Record()])
    return losses


def _devices_line(devices):
    platform = devices[0].platform
    if platform == "cpu" and len(devices) > 1:
        why = "fake CPU devices: no accelerator is installed (--fake-devices N to change)"
    elif platform == "cpu":
        why = "the machine's CPU, no accelerator found (--fake-devices 8 for 8 fake CPU devices)"
    else:
        why = f"{devices[0].device_kind}, JAX's real devices"
    return f"devices: {_count(len(devices), platform)} ({why})"


def _count(n, platform):
    return f"{n} {platform} device" + ("" if n == 1 else "s")
