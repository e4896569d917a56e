"""Mesh-shape sweeps: train one model under several meshes and compare them.

For each mesh spec, `sweep` builds the model under `kdist.preset(spec)`,
compiles the model's own stateless train step (`model.train_step`, jitted the
way Keras's `fit` jits it) ahead of time, warms it up and times each step with
the devices synchronised. A shape that cannot run is a failed row with the
stage and reason, never a crash.
"""

import dataclasses
import math
import time

import jax
import keras
import numpy as np

from kdist.checks import is_int, non_negative_int, shown
from kdist.devices import resolve_devices
from kdist.errors import ArgumentError, ArgumentTypeError, PlanError, cause
from kdist.inspection.inspector import inspect
from kdist.jax_internals import compile_train_step, memory_limit, xla_memory
from kdist.keras_internals import symbolic_build
from kdist.machine import machine_info
from kdist.meshes.enumerate import data_model_specs
from kdist.presets import build_preset
from kdist.render.progress import steps as steps_progress
from kdist.runtime.data import check_batch_size
from kdist.runtime.sweep_estimate import check_top, default_estimate
from kdist.runtime.sweep_result import SweepResult, SweepRow
from kdist.runtime.timing import record_times, run_steps, step_losses, timed_steps
from kdist.units import human_bytes, parse_size


def sweep(
    build_model,
    data,
    meshes="all",
    *,
    steps=10,
    warmup=2,
    batch_size=None,
    loss=None,
    optimizer="adam",
    rules=None,
    devices=None,
    strict=False,
    device_memory="auto",
    estimate="planner",
    seed=0,
    direct_check=True,
    progress=True,
    console=None,
    top=None,
):
    """Train `build_model()` under each mesh shape and compare step time, memory and losses.

    Each shape gets a fresh model built under `kdist.preset(spec)` from the
    same seed, trained on the same batches, so the losses of all shapes
    should agree: a shape whose losses differ lays the model out wrongly.

    Example:

    ```python
    kdist.fake_devices(8)
    x = np.random.rand(256, 28, 28, 1).astype("float32")
    y = np.random.randint(0, 10, 256)
    result = kdist.sweep(kdist.models.mnist_mlp, (x, y), ["8x1", "4x2", "2x4", "fsdp"],
                         steps=5, batch_size=64, loss="sparse_categorical_crossentropy")
    rich.print(result)           # table, fastest marked
    result.to_csv("sweep.csv"); result.to_json("sweep.json"); result.plot("sweep.png")
    ```

    Args:
        build_model: function returning a Keras model (optionally compiled).
        data: `(x, y)`; `x` may be a dict or list of arrays. Batches of
            `batch_size` samples are taken in order and reused cyclically.
        meshes: "all" (every data x model factorisation of the device count,
            then "dp", "fsdp" and "tp") or a list of mesh specs.
        steps: measured steps per shape.
        warmup: steps run before measuring (after compiling).
        batch_size: global batch size; default: all of `data` as one batch.
        loss: loss for `model.compile`; None keeps the model's own compile.
        optimizer: name, instance (cloned for each shape) or function
            returning one.
        rules: layout rules for every preset (see `kdist.preset`).
        devices: devices to build meshes on (default: all).
        strict: fail a shape when a layout rule had to replicate a dimension
            it meant to shard (by default kdist replicates it and goes on).
        device_memory: bytes per device; a shape whose compiled memory needs
            more fails as "does not fit" before running. "auto": the device's
            own limit where jax reports one (not on CPU); None: no check.
        estimate: "planner" (default: `kdist.plan`'s estimated peak bytes per
            device, planned once for all shapes, abstractly), a function
            `(model, distribution) -> bytes per device`, or None (no column).
        seed: seed for weights and dropout, the same for every shape.
        direct_check: also time the same compiled step in a bare loop,
            alternating with the timed steps, on a copy of the state
            (which doubles the state's memory while timing), and report how
            far the measured step time is from it (`SweepRow.agreement`).
        progress: show progress (a bar on a terminal, one line per stage otherwise).
        console: a `rich.console.Console` for the progress (default: stderr).
        top: sweep only the `top` leading candidates of `kdist.plan` (valid
            meshes that fit first, by estimated step time) instead of
            `meshes`, which must then be "all". Each row then holds the
            planner's estimated step time beside the measured one.

    Returns:
        A `SweepResult`.
    """
    if not callable(build_model):
        raise ArgumentTypeError(
            f"build_model must be a function returning a Keras model; received {shown(build_model)}."
        )
    devices = resolve_devices(devices) if devices is not None else None
    specs = _mesh_specs(meshes, devices)
    x, y = _unpack(data)
    n = _num_samples(x)
    batch_size = n if batch_size is None else batch_size
    _check_counts(steps=steps, warmup=warmup, batch_size=batch_size)
    if batch_size > n:
        raise ArgumentError(
            f"batch_size={batch_size} is larger than the {n} samples in data; pass more data or a smaller batch_size."
        )
    for name, value in (("strict", strict), ("direct_check", direct_check), ("progress", progress)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"{name} must be True or False; received {shown(value)}.")
    non_negative_int(seed, "seed")
    if isinstance(device_memory, str) and device_memory == "auto":
        device_memory = memory_limit((devices or jax.devices())[0])
    elif device_memory is not None:
        device_memory = parse_size(device_memory, "device_memory")
    if not (estimate is None or (isinstance(estimate, str) and estimate == "planner") or callable(estimate)):
        raise ArgumentError(
            'estimate must be "planner", None or a function (model, distribution) -> bytes; '
            f"received {shown(estimate)}."
        )
    if top is not None:
        top = check_top(top, meshes)
    if estimate == "planner" or top is not None:
        num_devices = len(devices) if devices is not None else jax.device_count()
        planned = default_estimate(
            build_model,
            num_devices,
            batch_size,
            _optimizer(optimizer) if loss is not None else None,
            rules,
            strict=top is not None,
            x=x,
        )
        estimate = planned if estimate == "planner" else estimate
        if top is not None:
            specs = [c.spec for c in planned.plan.candidates if c.valid and c.fits is not False][:top]
            if not specs:
                raise PlanError(f"top={top}: the planner found no valid mesh that fits. {planned.plan.advice}")
    settings = {
        "meshes": specs,
        "steps": steps,
        "warmup": warmup,
        "batch_size": batch_size,
        "loss": _name(loss),
        "optimizer": _name(optimizer),
        "rules": getattr(rules, "name", _name(rules)),
        "strict": strict,
        "device_memory": device_memory,
        "seed": seed,
        "top": top,
    }
    previous = keras.distribution.distribution()
    start = time.perf_counter()
    rows = []
    try:
        with steps_progress("sweep", len(specs), console, enabled=progress) as bar:
            config = _Config(
                build_model,
                x,
                y,
                batch_size,
                steps,
                warmup,
                loss,
                optimizer,
                rules,
                devices,
                strict,
                device_memory,
                estimate,
                seed,
                direct_check,
            )
            for spec in specs:

                def stage(text, spec=spec):
                    bar.update(f"{spec}: {text}")

                rows.append(_run_shape(spec, config, stage))
                bar.advance()
    finally:
        keras.distribution.set_distribution(previous)
    wall = time.perf_counter() - start
    result = SweepResult(rows, machine_info(devices if devices is not None else jax.devices()), settings, wall)
    if result.fastest is not None:
        result.fastest.fastest = True
    return result


# --- one shape -------------------------------------------------------------


@dataclasses.dataclass
class _Config:
    build_model: object
    x: object
    y: object
    batch_size: int
    steps: int
    warmup: int
    loss: object
    optimizer: object
    rules: object
    devices: object
    strict: bool
    device_memory: int
    estimate: object
    seed: int
    direct_check: bool


class _Failed(Exception):
    def __init__(self, stage, reason):
        super().__init__(reason)
        self.stage, self.reason = stage, reason


def _run_shape(spec, config, stage):
    row = SweepRow(spec)
    start = time.perf_counter()
    keras.backend.clear_session()  # the same layer names for every shape, and the last shape's memory freed
    try:
        _measure(row, spec, config, stage)
    except _Failed as e:
        row.status, row.failure_stage, row.failure = "failed", e.stage, e.reason
    row.wall_s = time.perf_counter() - start
    return row


def _measure(row, spec, config, stage):
    stage("building")
    distribution = _attempt("spec", lambda: build_preset(spec, devices=config.devices, rules=config.rules))
    row.axes = dict(zip(distribution.device_mesh.axis_names, (int(s) for s in distribution.device_mesh.shape)))
    _attempt("data", lambda: check_batch_size(config.batch_size, distribution))
    with distribution.scope():
        batches = _attempt("data", lambda: _batches(config, distribution))
        model = _prepare(row, spec, config, distribution, batches[0])
        stage("compiling")
        start = time.perf_counter()
        state = _state(model)
        compiled = _attempt("compile", lambda: compile_train_step(model, state, batches[0]))
        row.compile_s = time.perf_counter() - start
        row.memory = xla_memory(compiled)
        _check_fits(spec, row.memory, config.device_memory)
        stage("warming up")
        state, _, warm_logs, _ = _attempt("run", lambda: run_steps(compiled, state, batches, config.warmup, 0))
        stage("timing")
        _, times, logs, loop_overhead, direct = _attempt(
            "run", lambda: timed_steps(compiled, state, batches, config.steps, config.warmup, config.direct_check)
        )
    record_times(row, config.batch_size, _tokens_per_sample(config.x), times, direct, loop_overhead)
    row.losses = step_losses(warm_logs + logs)


def _prepare(row, spec, config, distribution, batch):
    """Build and compile the model, and record what its layout costs."""
    start = time.perf_counter()
    model = _attempt("build", lambda: _build(config, batch))
    row.build_s = time.perf_counter() - start
    if config.strict:
        _check_strict(spec, distribution)
    row.state_bytes = _attempt("inspect", lambda: int(inspect(model, distribution).device_bytes().max()))
    if config.estimate is not None:
        try:
            row.estimate_bytes = int(config.estimate(model, distribution))
            row.estimate_note = "planner estimate"
            candidate = getattr(config.estimate, "candidate", None)
            if candidate is not None:
                row.estimate_step_time = candidate(distribution).step_seconds
                row.estimate_target = config.estimate.plan.target
        except Exception as e:  # an estimate is a column, not a reason to fail the shape
            row.estimate_note = f"not available: {cause(e, lines=1, limit=400)}"
    return model


def _attempt(stage, fn):
    try:
        return fn()
    except _Failed:
        raise
    except Exception as e:  # a failed shape is a row, not a crash
        raise _Failed(stage, cause(e, lines=1, limit=400)) from e


def _build(config, batch):
    keras.utils.set_random_seed(config.seed)
    model = config.build_model()
    if config.loss is not None:
        model.compile(optimizer=_optimizer(config.optimizer), loss=config.loss)
    elif not getattr(model, "compiled", False):
        raise _Failed(
            "build",
            "the model is not compiled and sweep() received loss=None: pass loss=... "
            "(e.g. loss='sparse_categorical_crossentropy') or compile the model in build_model.",
        )
    symbolic_build(model, batch)  # what fit() does first: builds the optimizer and metrics
    return model


def _optimizer(optimizer):
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer()
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))  # one per shape
    return optimizer


def _check_strict(spec, distribution):
    unfit = [f"{p.path} {p.shape}: {p.reason}" for p in distribution.placements.values() if p.replicated_dims]
    if unfit:
        more = f" (and {len(unfit) - 3} more)" if len(unfit) > 3 else ""
        raise _Failed(
            "layout",
            f"mesh {spec!r} cannot divide the model as the rules ask (strict=True): " + "; ".join(unfit[:3]) + more,
        )


def _state(model):
    return (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )


def _check_fits(spec, memory, device_memory):
    if device_memory is None or not memory:
        return
    need = max(memory["total"], memory.get("peak", 0))
    if need > device_memory:
        raise _Failed(
            "memory",
            f"mesh {spec!r} does not fit: the compiled step needs {human_bytes(need)} per device, "
            f"the device has {human_bytes(device_memory)}.",
        )


# --- data --------------------------------------------------------------------


def _unpack(data):
    if isinstance(data, tuple) and len(data) == 2:
        return data
    raise ArgumentTypeError(
        f"data must be a tuple (x, y) of arrays (x may be a dict or list of arrays); received {type(data).__name__}."
    )


def _num_samples(x):
    sizes = {len(leaf) for leaf in keras.tree.flatten(x)}
    if len(sizes) != 1:
        raise ArgumentError(f"The arrays in data have different numbers of samples: {sorted(sizes)}.")
    return sizes.pop()


def _batches(config, distribution):
    """The batches of a run, already laid out on the mesh (so steps time compute, not transfer)."""
    count = min(_num_samples(config.x) // config.batch_size, max(config.steps + config.warmup, 1))

    def put(array, i):
        array = np.asarray(array[i * config.batch_size : (i + 1) * config.batch_size])
        return keras.distribution.distribute_tensor(array, distribution.get_data_layout(array.shape))

    return [(*keras.tree.map_structure(lambda a, i=i: put(a, i), (config.x, config.y)), None) for i in range(count)]


def _tokens_per_sample(x):
    """Tokens per sample for sequence inputs (integer ids of rank >= 2), else None."""
    for leaf in keras.tree.flatten(x):
        leaf = np.asarray(leaf[:1])
        if np.issubdtype(leaf.dtype, np.integer) and leaf.ndim >= 2:
            return math.prod(leaf.shape[1:])
    return None


# --- settings ----------------------------------------------------------------


def _mesh_specs(meshes, devices):
    if isinstance(meshes, str):
        if meshes != "all":
            raise ArgumentError(
                f'meshes must be "all" or a list of mesh specs such as ["8x1", "2x4"]; received {shown(meshes)}.'
            )
        n = len(devices) if devices is not None else jax.device_count()
        return [*data_model_specs(n), "dp", "fsdp", "tp"]
    if not hasattr(meshes, "__iter__") or not all(isinstance(s, str) for s in meshes):
        raise ArgumentError(
            f'meshes must be "all" or a list of mesh spec strings such as ["8x1", "2x4"]; received {shown(meshes)}.'
        )
    specs = list(meshes)
    if not specs:
        raise ArgumentError('meshes is empty: pass "all" or at least one mesh spec.')
    duplicated = sorted({s for s in specs if specs.count(s) > 1})
    if duplicated:
        raise ArgumentError(f"meshes lists {duplicated[0]!r} twice.")
    return specs


def _check_counts(**counts):
    for name, value in counts.items():
        smallest = 0 if name == "warmup" else 1
        if not is_int(value) or value < smallest:
            raise ArgumentError(f"{name} must be an integer >= {smallest}; received {name}={shown(value)}.")


def _name(obj):
    if obj is None or isinstance(obj, str):
        return obj
    return getattr(obj, "name", None) or getattr(obj, "__name__", None) or type(obj).__name__
