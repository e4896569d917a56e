"""Mesh-shape sweeps: train one model under several meshes and compare them.

For each mesh spec, `sweep` builds the model under `kdist.preset(spec)`,
compiles the model's own stateless train step (`model.train_step`, jitted the
way Keras's `fit` jits it) ahead of time, warms it up and times each step with
the devices synchronised. A shape that cannot run is a failed row with the
stage and reason, never a crash.
"""

import dataclasses
import math
import statistics
import time

import numpy as np

from kdist.export import JSONExport
from kdist.machine import machine_info
from kdist.memory import MEMORY_FIELDS, compile_train_step, xla_memory

NO_ESTIMATE = "not requested"
# Timed and bare-loop steps alternate in blocks of this many steps. One step
# keeps the comparison within a few percent even on a loaded machine; blocks
# of 5 already let bursts of load hit one side and not the other.
CHECK_BLOCK = 1


@dataclasses.dataclass
class SweepRow:
    """One mesh shape of a sweep. Times are seconds, memory is bytes per device.

    `memory` is XLA's compiled memory analysis of the train step (argument,
    output, alias, temp, total = argument + output - alias + temp, and peak
    where jax reports it). `state_bytes` is what `kdist.inspect` counts for
    the weights and optimizer state on the fullest device. `losses` has one
    loss per step, warm-up steps first. `direct_step_time` is the median of the
    same compiled step timed in a bare loop, each bare step next to a timed one;
    `agreement` is the median over those pairs of `timed / bare`, minus 1. `loop_overhead_s` is the
    time per step the timing loop spends outside the timed calls.
    """

    mesh: str
    axes: dict = dataclasses.field(default_factory=dict)
    status: str = "ok"
    failure_stage: str = ""
    failure: str = ""
    step_times: list = dataclasses.field(default_factory=list)
    step_time: float = None
    step_time_iqr: float = None
    samples_per_s: float = None
    tokens_per_s: float = None
    build_s: float = None
    compile_s: float = None
    memory: dict = dataclasses.field(default_factory=dict)
    state_bytes: int = None
    estimate_bytes: int = None
    estimate_note: str = NO_ESTIMATE
    losses: list = dataclasses.field(default_factory=list)
    direct_step_times: list = dataclasses.field(default_factory=list)
    direct_step_time: float = None
    agreement: float = None
    loop_overhead_s: float = None
    wall_s: float = 0.0
    fastest: bool = False

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def final_loss(self):
        return self.losses[-1] if self.losses else None

    @property
    def measured_s(self):
        """Seconds inside the measured steps."""
        return float(sum(self.step_times))

    @property
    def overhead_s(self):
        """Seconds this shape took outside its measured steps (build, compile, warm-up, checks)."""
        return self.wall_s - self.measured_s

    def to_dict(self):
        data = dataclasses.asdict(self)
        data.update(final_loss=self.final_loss, measured_s=self.measured_s, overhead_s=self.overhead_s)
        return data


@dataclasses.dataclass
class SweepResult(JSONExport):
    """What `kdist.sweep` returns: one `SweepRow` per mesh spec, and where it ran.

    Print it (a rich table, fastest shape marked), or save it with
    `to_csv`, `to_json` and `plot`.
    """

    rows: list
    machine: dict
    settings: dict
    wall_s: float

    @property
    def ok_rows(self):
        return [r for r in self.rows if r.ok]

    @property
    def failed_rows(self):
        return [r for r in self.rows if not r.ok]

    @property
    def fastest(self):
        """The successful row with the lowest median step time, or None."""
        return min(self.ok_rows, key=lambda r: r.step_time, default=None)

    def row(self, mesh):
        """The row of the spec `mesh`."""
        for r in self.rows:
            if r.mesh == mesh:
                return r
        raise KeyError(f"No row for mesh {mesh!r}; the sweep ran {[r.mesh for r in self.rows]}.")

    @property
    def measured_s(self):
        return sum(r.measured_s for r in self.rows)

    @property
    def overhead(self):
        """The sweep's own cost: wall time outside the measured steps."""
        return {
            "wall_s": self.wall_s,
            "measured_s": self.measured_s,
            "overhead_s": self.wall_s - self.measured_s,
            "overhead_share": (self.wall_s - self.measured_s) / self.wall_s if self.wall_s else 0.0,
            "loop_overhead_per_step_s": _mean([r.loop_overhead_s for r in self.ok_rows]),
        }

    @property
    def loss_spread(self):
        """Largest relative difference of any step's loss from the first successful shape's."""
        rows = [r for r in self.ok_rows if r.losses]
        if len(rows) < 2:
            return 0.0
        reference = np.array(rows[0].losses)
        scale = np.maximum(np.abs(reference), 1e-12)
        return float(max(np.max(np.abs(np.array(r.losses) - reference) / scale) for r in rows[1:]))

    @property
    def note(self):
        """What the times mean on the machine the sweep ran on."""
        m = self.machine
        if m["platform"] != "cpu":
            return f"{m['device_count']} {m['device_kind']} devices."
        return (
            f"{m['device_count']} CPU devices sharing {m['cpu_count']} CPU cores "
            f"({'fake devices' if m['fake_devices'] else 'host CPU'}): step times say nothing "
            "about accelerators. Compare losses and memory; time a real run on the target hardware."
        )

    def to_dict(self):
        return {
            "note": self.note,
            "machine": self.machine,
            "settings": self.settings,
            "overhead": self.overhead,
            "fastest": self.fastest.mesh if self.fastest else None,
            "loss_spread": self.loss_spread,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_csv(self, path):
        import csv

        records = [_csv_record(r) for r in self.rows]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["mesh"])
            writer.writeheader()
            writer.writerows(records)
        return path

    def plot(self, path=None, title=None):
        """Step time and memory per mesh shape as a matplotlib figure; saved as PNG when `path` is given."""
        from kdist.sweep_render import sweep_plot

        return sweep_plot(self, path, title)

    def table(self):
        """The rows as a `rich.table.Table`, fastest shape marked."""
        from kdist.sweep_render import sweep_table

        return sweep_table(self)

    def __rich_console__(self, console, options):
        from kdist.sweep_render import sweep_renderables

        yield from sweep_renderables(self, options.max_width)


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
        progress: show a progress bar.
        console: a `rich.console.Console` for the progress bar.

    Returns:
        A `SweepResult`.
    """
    import jax
    import keras

    specs = _mesh_specs(meshes, devices)
    x, y = _unpack(data)
    n = _num_samples(x)
    batch_size = n if batch_size is None else batch_size
    _check_counts(steps=steps, warmup=warmup, batch_size=batch_size)
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the {n} samples in data; pass more data or a smaller batch_size.")
    device_memory = _device_memory(device_memory, devices)
    if estimate == "planner":
        num_devices = len(devices) if devices is not None else jax.device_count()
        estimate = _default_estimate(build_model, num_devices, batch_size, optimizer if loss is not None else None, rules)
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
    }
    previous = keras.distribution.distribution()
    start = time.perf_counter()
    rows = []
    try:
        with _progress(progress, console) as bar:
            task = bar.add_task("sweep", total=len(specs))
            config = _Config(
                build_model, x, y, batch_size, steps, warmup, loss, optimizer, rules, devices, strict,
                device_memory, estimate, seed, direct_check,
            )
            for spec in specs:
                def stage(text, spec=spec):
                    bar.update(task, description=f"{spec}: {text}")

                rows.append(_run_shape(spec, config, stage))
                bar.advance(task)
    finally:
        keras.distribution.set_distribution(previous)
    wall = time.perf_counter() - start
    result = SweepResult(rows, machine_info(devices if devices is not None else jax.devices()), settings, wall)
    if result.fastest is not None:
        result.fastest.fastest = True
    return result


def mesh_factorisations(num_devices):
    """Every "data x model" spec of `num_devices`: ["8x1", "4x2", "2x4", "1x8"] for 8."""
    return [f"{num_devices // m}x{m}" for m in range(1, num_devices + 1) if num_devices % m == 0]


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
    import keras

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
    import kdist
    from kdist.data import check_batch_size

    stage("building")
    distribution = _attempt("spec", lambda: kdist.preset(spec, devices=config.devices, rules=config.rules))
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
        state, _, warm_logs, _ = _attempt("run", lambda: _steps(compiled, state, batches, config.warmup, 0))
        stage("timing")
        _, times, logs, loop_overhead, direct = _attempt(
            "run", lambda: _timed_steps(compiled, state, batches, config.steps, config.warmup, config.direct_check)
        )
    _record_times(row, config, times, direct, loop_overhead)
    row.losses = _step_losses(warm_logs + logs)


def _prepare(row, spec, config, distribution, batch):
    """Build and compile the model, and record what its layout costs."""
    import kdist

    start = time.perf_counter()
    model = _attempt("build", lambda: _build(config, batch))
    row.build_s = time.perf_counter() - start
    if config.strict:
        _check_strict(spec, distribution)
    row.state_bytes = _attempt("inspect", lambda: int(kdist.inspect(model, distribution).device_bytes().max()))
    if config.estimate is not None:
        try:
            row.estimate_bytes = int(config.estimate(model, distribution))
            row.estimate_note = "planner estimate"
        except Exception as e:  # an estimate is a column, not a reason to fail the shape
            row.estimate_note = f"not available: {_describe(e)}"
    return model


def planner_estimate(build_model, devices, *, batch_size, optimizer="adam", rules=None):
    """An `estimate` for `sweep`: the peak bytes per device `kdist.plan` estimates for each mesh.

    The model is planned once, abstractly (nothing allocated), for all the
    meshes of `devices` devices; each shape then looks its mesh up.
    """
    import kdist

    model = kdist.abstract_model(build_model)
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None) or "adam"
    plan = kdist.plan(model, devices, batch_size=batch_size, optimizer=_optimizer(optimizer), rules=rules)
    by_axes = {tuple(sorted(c.axes.items())): c for c in plan.candidates}

    def estimate(model, distribution):
        sizes = {r: s for r, s in zip(distribution.roles, distribution.device_mesh.shape) if s > 1} or {"data": 1}
        candidate = by_axes.get(tuple(sorted(sizes.items())))
        if candidate is None:
            planned = ", ".join(c.spec for c in plan.candidates)
            raise LookupError(f"the planner has no mesh {sizes} (it planned {planned})")
        if not candidate.valid:
            raise LookupError(f"the planner marks {candidate.spec} invalid: {candidate.reason}")
        return candidate.peak

    return estimate


def _default_estimate(build_model, devices, batch_size, optimizer, rules):
    try:
        return planner_estimate(build_model, devices, batch_size=batch_size, optimizer=optimizer, rules=rules)
    except Exception as e:  # every row then says why the planner could not help
        reason = f"the planner failed: {_describe(e)}"

        def unavailable(model, distribution):
            raise LookupError(reason)

        return unavailable


def _record_times(row, config, times, direct, loop_overhead):
    row.step_times = times
    row.step_time = statistics.median(times)
    low, high = np.percentile(times, [25, 75])
    row.step_time_iqr = float(high - low)
    row.samples_per_s = config.batch_size / row.step_time
    tokens = _tokens_per_sample(config.x)
    row.tokens_per_s = tokens * config.batch_size / row.step_time if tokens else None
    row.loop_overhead_s = loop_overhead / len(times)
    if direct:
        row.direct_step_times = direct
        row.direct_step_time = statistics.median(direct)
        # Each timed step has a bare-loop twin run right next to it: the median
        # of their ratios cancels the load both saw.
        row.agreement = statistics.median(t / d for t, d in zip(times, direct)) - 1


def _attempt(stage, fn):
    try:
        return fn()
    except _Failed:
        raise
    except Exception as e:  # a failed shape is a row, not a crash
        raise _Failed(stage, _describe(e)) from e


def _describe(error):
    text = str(error).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(error).__name__}: {first[:400]}"


def _build(config, batch):
    import keras

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
    model._symbolic_build(data_batch=batch)  # what fit() does first: builds the optimizer and metrics
    return model


def _optimizer(optimizer):
    import keras

    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer()
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))  # one per shape
    return optimizer


def _check_strict(spec, distribution):
    sizes = distribution.axis_sizes
    fsdp = sizes.get("fsdp", (None,))[0]
    unfit = []
    for p in distribution.placements.values():
        if p.source != "fallback" or p.rule is None:
            continue
        wanted = sum(1 for a in p.rule.layouts[0] if a in sizes and sizes[a][1] > 1)
        got = sum(1 for a in p.axes if a is not None and a != fsdp)
        if got < wanted:
            unfit.append(f"{p.path} {p.shape}: {p.reason}")
    if unfit:
        more = f" (and {len(unfit) - 3} more)" if len(unfit) > 3 else ""
        raise _Failed(
            "layout",
            f"mesh {spec!r} cannot divide the model as the rules ask (strict=True): "
            + "; ".join(unfit[:3]) + more,
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
        from kdist.render import human_bytes

        raise _Failed(
            "memory",
            f"mesh {spec!r} does not fit: the compiled step needs {human_bytes(need)} per device, "
            f"the device has {human_bytes(device_memory)}.",
        )


def _steps(compiled, state, batches, count, offset):
    """Run `count` steps, each timed alone. Returns the state, step times, logs and loop overhead."""
    import jax

    times, logs = [], []
    loop_start = time.perf_counter()
    for i in range(count):
        batch = batches[(offset + i) % len(batches)]
        start = time.perf_counter()
        step_logs, state = compiled(state, batch)
        jax.block_until_ready((step_logs, state))
        times.append(time.perf_counter() - start)
        logs.append(step_logs)
    return state, times, logs, time.perf_counter() - loop_start - sum(times)


def _step_losses(logs):
    """Each step's own loss. Keras logs the running mean of the loss over the
    steps so far; with equal batches, step k's loss is k*mean_k - (k-1)*mean_(k-1).
    Reading it this way keeps the timed loop free of metric resets."""
    means = [float(entry["loss"]) for entry in logs]
    return [k * m - (k - 1) * prev for k, (m, prev) in enumerate(zip(means, [0.0] + means), start=1)]


def _timed_steps(compiled, state, batches, steps, offset, check):
    """Time `steps` steps. Returns the state, step times, logs, loop overhead and check times.

    With `check`, a copy of the state runs the same batches through the same
    compiled step in a bare loop, in blocks alternating with the timed ones
    (and alternating which goes first), so both see the same machine load and
    cache. The copy doubles the state's memory while it runs."""
    shadow = _copy(state) if check else None
    times, logs, direct, overhead = [], [], [], 0.0
    for block, start in enumerate(range(0, steps, CHECK_BLOCK)):
        count, first = min(CHECK_BLOCK, steps - start), offset + start
        if shadow is not None and block % 2:
            shadow, bare = _bare_steps(compiled, shadow, batches, count, first)
            direct += bare
        state, block_times, block_logs, block_overhead = _steps(compiled, state, batches, count, first)
        times, logs, overhead = times + block_times, logs + block_logs, overhead + block_overhead
        if shadow is not None and not block % 2:
            shadow, bare = _bare_steps(compiled, shadow, batches, count, first)
            direct += bare
    return state, times, logs, overhead, direct


def _bare_steps(compiled, state, batches, count, offset):
    """The compiled step timed in a bare loop that keeps nothing."""
    import jax

    times = []
    for i in range(count):
        start = time.perf_counter()
        logs, state = compiled(state, batches[(offset + i) % len(batches)])
        jax.block_until_ready((logs, state))
        times.append(time.perf_counter() - start)
    return state, times


def _copy(state):
    import jax

    return jax.tree.map(lambda a: jax.device_put(a, a.sharding, may_alias=False), state)


# --- data --------------------------------------------------------------------


def _unpack(data):
    if isinstance(data, tuple) and len(data) == 2:
        return data
    raise TypeError(
        f"data must be a tuple (x, y) of arrays (x may be a dict or list of arrays); received {type(data).__name__}."
    )


def _leaves(x):
    import keras

    return keras.tree.flatten(x)


def _num_samples(x):
    sizes = {len(leaf) for leaf in _leaves(x)}
    if len(sizes) != 1:
        raise ValueError(f"The arrays in data have different numbers of samples: {sorted(sizes)}.")
    return sizes.pop()


def _batches(config, distribution):
    """The batches of a run, already laid out on the mesh (so steps time compute, not transfer)."""
    import keras

    count = min(_num_samples(config.x) // config.batch_size, max(config.steps + config.warmup, 1))

    def put(array, i):
        array = np.asarray(array[i * config.batch_size : (i + 1) * config.batch_size])
        return keras.distribution.distribute_tensor(array, distribution.get_data_layout(array.shape))

    return [(*keras.tree.map_structure(lambda a, i=i: put(a, i), (config.x, config.y)), None) for i in range(count)]


def _tokens_per_sample(x):
    """Tokens per sample for sequence inputs (integer ids of rank >= 2), else None."""
    for leaf in _leaves(x):
        leaf = np.asarray(leaf[:1])
        if np.issubdtype(leaf.dtype, np.integer) and leaf.ndim >= 2:
            return math.prod(leaf.shape[1:])
    return None


def random_data(model, samples, seed=0):
    """Random inputs and targets that fit a built single-output model, and a loss for them.

    Float inputs are uniform in [0, 1); integer inputs (token ids) are below
    the smallest `Embedding.input_dim` of the model. A last output dimension
    of 1 gets float targets and "mse"; otherwise integer class targets and
    sparse categorical cross-entropy (from logits unless the output layer
    applies a softmax). Works on a model built by `kdist.abstract_model`.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    (x, y), loss = random_data(model, samples=256)
    ```

    Returns:
        `((x, y), loss)`.
    """
    import keras

    if len(model.outputs) != 1:
        raise ValueError(
            f"random_data() handles single-output models; {model.name!r} has {len(model.outputs)} outputs. "
            "Pass your own (x, y) and loss to kdist.sweep."
        )
    rng = np.random.default_rng(seed)
    vocabulary = min((layer.input_dim for layer in model._flatten_layers() if isinstance(layer, keras.layers.Embedding)), default=2)
    inputs = [_random_input(rng, t, samples, vocabulary) for t in model.inputs]
    x = inputs[0] if len(inputs) == 1 else inputs
    output = model.outputs[0]
    shape = tuple(output.shape[1:])
    if shape[-1] == 1:
        return (x, rng.random((samples, *shape), dtype=np.float32)), "mse"
    y = rng.integers(0, shape[-1], size=(samples, *shape[:-1]))
    layer = output._keras_history.operation
    softmax = getattr(layer, "activation", None) is keras.activations.softmax
    return (x, y), keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax)


def _random_input(rng, tensor, samples, vocabulary):
    shape = (samples, *tensor.shape[1:])
    if None in shape:
        raise ValueError(f"Input {tensor.name!r} has an unknown dimension {tuple(tensor.shape)}; random_data() needs fixed shapes.")
    if np.issubdtype(np.dtype(tensor.dtype), np.integer):
        return rng.integers(0, vocabulary, size=shape).astype(tensor.dtype)
    return rng.random(shape, dtype=np.float32).astype(tensor.dtype)


# --- settings ----------------------------------------------------------------


def _mesh_specs(meshes, devices):
    import jax

    if isinstance(meshes, str):
        if meshes != "all":
            raise ValueError(f'meshes must be "all" or a list of mesh specs such as ["8x1", "2x4"]; received {meshes!r}.')
        n = len(devices) if devices is not None else jax.device_count()
        return [*mesh_factorisations(n), "dp", "fsdp", "tp"]
    specs = list(meshes)
    if not specs:
        raise ValueError("meshes is empty: pass \"all\" or at least one mesh spec.")
    duplicated = sorted({s for s in specs if specs.count(s) > 1})
    if duplicated:
        raise ValueError(f"meshes lists {duplicated[0]!r} twice.")
    return specs


def _check_counts(**counts):
    for name, value in counts.items():
        smallest = 0 if name == "warmup" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise ValueError(f"{name} must be an integer >= {smallest}; received {name}={value!r}.")


def _device_memory(device_memory, devices):
    if device_memory != "auto":
        return device_memory
    import jax

    device = (list(devices) if devices is not None else jax.devices())[0]
    try:
        stats = device.memory_stats() or {}
    except RuntimeError:  # a backend without memory statistics (jax raises JaxRuntimeError: UNIMPLEMENTED)
        stats = {}
    return stats.get("bytes_limit")


def _progress(enabled, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=not enabled, transient=True,
    )


def _name(obj):
    if obj is None or isinstance(obj, str):
        return obj
    return getattr(obj, "name", None) or getattr(obj, "__name__", None) or type(obj).__name__


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _csv_record(row):
    ms = lambda s: None if s is None else round(s * 1e3, 4)  # noqa: E731
    return {
        "mesh": row.mesh,
        "axes": " ".join(f"{k}={v}" for k, v in row.axes.items()),
        "status": row.status,
        "fastest": row.fastest,
        "step_time_ms": ms(row.step_time),
        "step_time_iqr_ms": ms(row.step_time_iqr),
        "samples_per_s": row.samples_per_s,
        "tokens_per_s": row.tokens_per_s,
        "build_s": row.build_s,
        "compile_s": row.compile_s,
        **{f"memory_{k}_bytes": row.memory.get(k) for k in (*MEMORY_FIELDS, "total", "peak")},
        "state_bytes": row.state_bytes,
        "estimate_bytes": row.estimate_bytes,
        "estimate_note": row.estimate_note,
        "final_loss": row.final_loss,
        "losses": " ".join(f"{v:.6g}" for v in row.losses),
        "direct_step_time_ms": ms(row.direct_step_time),
        "agreement": row.agreement,
        "loop_overhead_ms": ms(row.loop_overhead_s),
        "wall_s": row.wall_s,
        "overhead_s": row.overhead_s,
        "failure_stage": row.failure_stage,
        "failure": row.failure,
    }
