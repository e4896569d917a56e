"""Mesh planner: which split of N devices to train a model on, and why.

`kdist.plan` enumerates every mesh of N devices (data x fsdp x model, and an
expert axis when the rules use one), and for each estimates per-device memory
(weights, gradients, optimizer state, activations) and communication per
training step, from the model's real variables, the layouts kdist's rules give
them (the same computation as `kdist.inspect`) and the activations autodiff
saves for each layer. With `verify=True` it also compiles the real Keras
training step for each mesh on fake devices, from abstract inputs, and puts
XLA's memory analysis beside the estimate. See docs/plan.md for the formulas.
"""

import copy
import dataclasses
import math
import time

import numpy as np

from kdist.abstract import deferred
from kdist.errors import KdistError
from kdist.export import JSONExport
from kdist.memory import (
    MEMORY_FIELDS, TRACE_BATCH, compile_train_step, is_float, itemsize, parse_size, saved_activations, xla_memory,
)

DEFAULT_BANDWIDTH = 100e9  # bytes/s per device, one direction (about one TPU ICI link or a fraction of NVLink)
DEFAULT_LATENCY = 10e-6  # seconds per collective step
_RANKS = ("data", "fsdp", "model", "expert")


class PlanError(KdistError, ValueError):
    """The planner received input it cannot plan for (the message says what to pass instead)."""


@dataclasses.dataclass
class Candidate:
    """One mesh of the plan, with its per-device estimates.

    Bytes are per device (the fullest device). `comm` maps each mesh axis to
    `{"size", "collectives": [{"kind", "of", "bytes", "count", "seconds"}, ...],
    "bytes": payload bytes per step, "seconds": alpha-beta time}`.
    `compiled` holds XLA's memory analysis when the plan was verified.
    """

    spec: str
    axes: dict
    valid: bool = True
    reason: str = ""
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    transient: int = 0
    other: int = 0
    comm: dict = dataclasses.field(default_factory=dict)
    fits: bool = None
    rank: int = None
    compiled: dict = None

    @property
    def peak(self):
        """Estimated peak bytes on one device: the sum of every term."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient + self.other

    @property
    def comm_seconds(self):
        return sum(c["seconds"] for c in self.comm.values())

    @property
    def comm_bytes(self):
        return sum(c["bytes"] for c in self.comm.values())

    @property
    def shape(self):
        """"data x fsdp x model [x expert]" sizes, e.g. "2x1x4"."""
        return "x".join(str(self.axes.get(r, 1)) for r in _RANKS if r != "expert" or "expert" in self.axes)

    @property
    def ratio(self):
        """Estimated / compiled peak, when verified."""
        if not self.compiled or not self.compiled.get("peak"):
            return None
        return self.peak / self.compiled["peak"]

    def to_dict(self):
        return {
            "spec": self.spec,
            "axes": dict(self.axes),
            "valid": self.valid,
            "reason": self.reason,
            "rank": self.rank,
            "fits": self.fits,
            "bytes": {
                "weights": self.weights,
                "gradients": self.gradients,
                "optimizer": self.optimizer,
                "activations": self.activations,
                "transient": self.transient,
                "other": self.other,
                "peak": self.peak,
            },
            "comm": self.comm,
            "comm_seconds": self.comm_seconds,
            "compiled": self.compiled,
            "estimate_over_compiled": self.ratio,
        }


@dataclasses.dataclass
class Plan(JSONExport):
    """What `kdist.plan` returns: the candidates, ranked, and a recommendation.

    Print it (a rich table, the recommendation marked), or use `to_dict()` /
    `to_json()`. `recommendation` is None when no candidate is valid or none
    fits `memory_per_device`; `advice` then says what would make one fit, and
    `suggestions` holds the numbers ("batch_size", "devices") it found.
    """

    model: str
    devices: int
    batch_size: int
    sequence_length: int
    optimizer: str
    memory_per_device: int
    bandwidth: float
    latency: float
    candidates: list
    recommendation: Candidate = None
    reason: str = ""
    advice: str = ""
    suggestions: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    rules: object = None

    def candidate(self, spec):
        """The candidate whose spec (e.g. "data=2,model=4") or shape (e.g. "2x1x4") is `spec`."""
        for c in self.candidates:
            if spec in (c.spec, c.shape):
                return c
        raise KeyError(f"No candidate {spec!r}; candidates are {[c.spec for c in self.candidates]}.")

    def preset(self, **kwargs):
        """`kdist.preset` of the recommendation, with the rules the plan used."""
        from kdist.presets import preset

        if self.recommendation is None:
            raise PlanError(f"The plan has no recommendation. {self.advice}")
        kwargs.setdefault("rules", self.rules)
        return preset(self.recommendation.spec, **kwargs)

    def to_dict(self):
        return {
            "model": self.model,
            "devices": self.devices,
            "batch_size": self.batch_size,
            "sequence_length": self.sequence_length,
            "optimizer": self.optimizer,
            "memory_per_device": self.memory_per_device,
            "bandwidth": self.bandwidth,
            "latency": self.latency,
            "recommendation": self.recommendation.spec if self.recommendation else None,
            "reason": self.reason,
            "advice": self.advice,
            "suggestions": dict(self.suggestions),
            "notes": list(self.notes),
            "seconds": self.seconds,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def __rich_console__(self, console, options):
        yield from plan_renderables(self)

    def __str__(self):
        from kdist.render import to_text

        return to_text(self, width=120)

    def __repr__(self):
        best = self.recommendation.spec if self.recommendation else None
        return f"<Plan model={self.model!r} devices={self.devices} candidates={len(self.candidates)} recommendation={best!r}>"


def plan(
    model_or_variables,
    devices,
    *,
    batch_size,
    sequence_length=None,
    optimizer="adam",
    dtype=None,
    memory_per_device=None,
    bandwidth=DEFAULT_BANDWIDTH,
    latency=DEFAULT_LATENCY,
    rules=None,
    verify=False,
):
    """Rank every mesh of `devices` devices for training a model, and recommend one.

    Nothing is allocated: build big models with `kdist.abstract_model`. The
    mesh sizes come from the device count alone, so planning for 512 devices
    needs no devices; `verify=True` compiles on `devices` (fake) devices.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    p = kdist.plan(model, devices=8, batch_size=32, memory_per_device="16GB")
    print(p)                          # table, recommendation marked
    p.recommendation.spec             # e.g. "data=8"
    keras.distribution.set_distribution(p.preset())
    ```

    Args:
        model_or_variables: a Keras model (built, or built abstractly), a
            zero-argument function that builds one (needed by `verify` for
            models that cannot be rebuilt from their config), or a list of
            variables (no activation estimate then).
        devices: the number of devices, a positive integer.
        batch_size: the global batch size.
        sequence_length: the length of unknown (None) input dimensions after
            the batch, e.g. tokens per example of a keras-hub backbone.
        optimizer: a Keras optimizer name, config or instance; its real
            slot variables are planned (Adam: 2 per weight).
        dtype: count weights, gradients, optimizer state and activations in
            this dtype instead of the model's own (e.g. "bfloat16").
        memory_per_device: memory of one device: bytes or "80GB", "80GiB", "8e10".
        bandwidth: bytes per second per device for collectives (or "100GB/s").
        latency: seconds per collective step (the alpha of the alpha-beta model).
        rules: layout rules, as `kdist.preset` takes them (default: kdist's rules).
        verify: True to compile the training step of every valid candidate on
            (fake) devices and record XLA's memory analysis in
            `candidate.compiled`; or a list of the specs to verify.

    Returns:
        A `Plan`.
    """
    start = time.perf_counter()
    devices = _positive_int(devices, "devices")
    batch_size = _positive_int(batch_size, "batch_size")
    if sequence_length is not None:
        sequence_length = _positive_int(sequence_length, "sequence_length")
    memory = parse_size(memory_per_device, "memory_per_device") if memory_per_device is not None else None
    bandwidth = parse_size(bandwidth, "bandwidth")
    latency = _non_negative(latency, "latency")
    facts = _ModelFacts(model_or_variables, optimizer, dtype, sequence_length, rules)
    candidates = [_evaluate(facts, axes, batch_size, bandwidth, latency) for axes in meshes(devices, facts.roles)]
    result = Plan(
        facts.name, devices, batch_size, facts.sequence_length, facts.optimizer_name, memory,
        bandwidth, latency, candidates, notes=list(facts.notes), rules=rules,
    )
    _rank(result, facts)
    if verify:
        _verify(result, facts, None if verify is True else set(verify))
    result.seconds = time.perf_counter() - start
    return result


# --- Meshes --------------------------------------------------------------------------------------


def meshes(devices, roles=("data", "fsdp", "model")):
    """Every assignment of `devices` to `roles` whose sizes multiply to `devices`.

    Each mesh is a dict role -> size with the axes of size 1 left out (the
    single-device mesh is `{"data": 1}`).

    >>> [m for m in meshes(4, ("data", "model"))]
    [{'data': 4}, {'data': 2, 'model': 2}, {'model': 4}]
    """
    out = []
    for sizes in _factorisations(devices, len(roles)):
        axes = {r: s for r, s in zip(roles, sizes) if s > 1}
        out.append(axes or {"data": 1})
    return out


def _factorisations(n, k):
    if k == 1:
        return [(n,)]
    return [(d, *rest) for d in _divisors(n)[::-1] for rest in _factorisations(n // d, k - 1)]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def spec_of(axes):
    return ",".join(f"{role}={size}" for role, size in axes.items())


# --- The model: variables, optimizer state, activations ------------------------------------------


class _ModelFacts:
    """What the planner reads from the model once, for all candidates."""

    def __init__(self, model_or_variables, optimizer, dtype, sequence_length, rules):
        self.build = None
        if callable(model_or_variables) and not _is_model_or_list(model_or_variables):
            self.build = model_or_variables
            with deferred():
                model_or_variables = model_or_variables()
        self.model = model_or_variables
        self.is_model = not isinstance(model_or_variables, (list, tuple))
        self.name = getattr(model_or_variables, "name", "") or "variables"
        self.rules_arg = rules
        self._rule_sets = {}
        self.dtype = dtype
        self.notes = []
        self.sequence_length = sequence_length
        variables = _variables(_abstract_subject(model_or_variables))
        trainable = [v for v in variables if getattr(v, "trainable", True)]
        if not trainable:
            raise PlanError(f"Model {self.name!r} has no trainable variables: build it (call it on an input or use keras.Input) before planning.")
        self.roles = self._roles(trainable)
        self.subject, self.counts = self._representatives(variables)
        self.optimizer, self.optimizer_name = _planned_optimizer(optimizer, [v for v in self.subject if v.trainable])
        self.inputs = _input_shapes(self.model, sequence_length) if self.is_model else None
        if self.inputs is not None and sequence_length is None:
            self.sequence_length = _fixed_sequence_length(self.inputs)
        self.tokens_per_example = self.sequence_length or 1
        self.label_shapes = _label_shapes(self.model, self.sequence_length) if self.inputs is not None else []
        self.residuals, self.act_itemsize = self._activations()

    def _roles(self, trainable):
        rules = self.rule_set(("data", "model", "expert"))
        uses_expert = any(
            rule is not None and any("expert" in layout for layout in rule.layouts)
            for rule in (rules.match(v.path) for v in trainable)
        )
        if uses_expert:
            self.notes.append("the rules shard some weights over an 'expert' axis: meshes with one are planned too")
        return ("data", "fsdp", "model", "expert") if uses_expert else ("data", "fsdp", "model")

    def _representatives(self, variables):
        """One variable per group that every candidate lays out alike (same rule, shape, dtype, kind), and group sizes.

        A Llama's 126 blocks have the same variables: each candidate's layouts are
        computed for one block and counted 126 times, so planning 512 devices
        takes seconds. The sums are the inspector's, row for row.
        """
        rules = self.rule_set(("data", "model", "expert"))
        groups = {}
        for v in variables:
            key = (id(rules.match(v.path)), tuple(v.shape), str(v.dtype), bool(getattr(v, "trainable", True)))
            groups.setdefault(key, []).append(v)
        representatives = [members[0] for members in groups.values()]
        return representatives, {members[0].path: len(members) for members in groups.values()}

    def rule_set(self, roles):
        """The rule set `kdist.preset` would use on a mesh with `roles`, with rule matches cached."""
        from kdist.parallel_dims import ParallelDims
        from kdist.presets import resolve_rules

        spec = ",".join(f"{r}=1" for r in roles)
        rules = resolve_rules(self.rules_arg, ParallelDims.parse(spec, 1))
        if id(rules) not in self._rule_sets:
            self._rule_sets[id(rules)] = _cached_matches(rules)
        return self._rule_sets[id(rules)]

    def _activations(self):
        if not self.is_model:
            self.notes.append("activations not estimated: pass the model (not a list of variables) to include them")
            return [], 4
        residuals = saved_activations(self.model, self.inputs) if self.inputs is not None else None
        if residuals is None:
            self.notes.append(
                f"activations not estimated: {self.name!r} is not a functional Keras model (no layer graph to trace)"
            )
            return [], 4
        out = _model_output_dtype(self.model)
        act_itemsize = itemsize(self.dtype or out)
        if self.dtype is not None:
            residuals = [(shape, act_itemsize if floating else size, count) for shape, size, count, floating in residuals]
        else:
            residuals = [(shape, size, count) for shape, size, count, _ in residuals]
        return residuals, act_itemsize


def _cached_matches(rules):
    """A copy of `rules` whose `match` remembers each path's rule (planning asks again for every candidate)."""
    cached = copy.copy(rules)
    matches = {}

    def match(path):
        if path not in matches:
            matches[path] = rules.match(path)
        return matches[path]

    cached.match = match
    return cached


def _is_model_or_list(obj):
    import keras

    return isinstance(obj, (keras.layers.Layer, list, tuple))


def _variables(subject):
    if isinstance(subject, (list, tuple)):
        return list(subject)
    return list(subject.trainable_variables) + list(subject.non_trainable_variables)


def _abstract_subject(model_or_variables):
    """The model, or deferred copies of its variables when they hold values (so layouts are planned, not read)."""
    from kdist.inspector import is_live

    variables = _variables(model_or_variables)
    if not any(is_live(v) for v in variables):
        return model_or_variables
    return [_deferred_copy(v) for v in variables]


def _deferred_copy(variable):
    import keras

    with deferred():
        copy = keras.Variable(initializer="zeros", shape=tuple(variable.shape), dtype=variable.dtype, trainable=variable.trainable, name=variable.name)
    copy._path = variable.path
    return copy


def _planned_optimizer(optimizer, trainable):
    """A new Keras optimizer like `optimizer`, built on deferred variables (nothing allocated), as the inspector plans it."""
    from kdist.inspector import new_optimizer, plan_optimizer

    if optimizer is None:
        return None, "none"
    built = new_optimizer(optimizer)  # an instance is copied from its config, never built again
    plan_optimizer(built, trainable)
    return built, built.name


# --- Activations ---------------------------------------------------------------------------------


def _input_shapes(model, sequence_length):
    """The model's input structure as ShapeDtypeStructs at batch TRACE_BATCH (None if it has no inputs)."""
    import jax
    import keras

    functional = getattr(model, "_functional", None) or model
    inputs = getattr(functional, "_inputs_struct", None)
    if inputs is None:
        return None

    def struct(t):
        dims = list(t.shape)
        for i, d in enumerate(dims):
            if d is None and i > 0:
                if sequence_length is None:
                    raise PlanError(
                        f"Input {t.name!r} of model {model.name!r} has shape {tuple(t.shape)}: pass sequence_length= "
                        "(--seq-len) for its unknown dimensions."
                    )
                dims[i] = sequence_length
        if dims and dims[0] is None:
            dims[0] = TRACE_BATCH
        return jax.ShapeDtypeStruct(tuple(dims), t.dtype)

    return keras.tree.map_structure(struct, inputs)


def _label_shapes(model, sequence_length):
    """Per-example shapes of the integer labels of the surrogate loss: each float output without its last dimension."""
    return [
        tuple(sequence_length if d is None else d for d in o.shape[1:-1])
        for o in _outputs(model)
        if is_float(o.dtype) and len(o.shape) >= 2
    ]


def _fixed_sequence_length(inputs):
    import keras

    for s in keras.tree.flatten(inputs):
        if len(s.shape) >= 2 and not is_float(s.dtype):
            return int(s.shape[1])  # token ids: (batch, sequence)
    return None


def _model_output_dtype(model):
    outputs = _outputs(model)
    return outputs[0].dtype if outputs else getattr(model, "compute_dtype", "float32")


def _outputs(model):
    """The model's symbolic outputs, flattened ([] when it has no layer graph)."""
    import keras

    struct = getattr(getattr(model, "_functional", None) or model, "_outputs_struct", None)
    return keras.tree.flatten(struct) if struct is not None else []


# --- One candidate -------------------------------------------------------------------------------


def _placeholder_distribution(facts, axes):
    """A ShardedDistribution over placeholder device names: layouts need no real devices."""
    from keras.distribution import DeviceMesh

    from kdist.distribution import ShardedDistribution

    names, sizes = list(axes), [axes[r] for r in axes]
    n = math.prod(sizes)
    device_mesh = DeviceMesh(tuple(sizes), names, np.array([f"plan:{i}" for i in range(n)]).reshape(sizes))
    return ShardedDistribution(device_mesh, facts.rule_set(tuple(names)), roles=names, spec=spec_of(axes))


def _evaluate(facts, axes, batch_size, bandwidth, latency):
    from kdist.inspector import inspect

    candidate = Candidate(spec_of(axes), dict(axes))
    report = inspect(facts.subject, _placeholder_distribution(facts, axes), optimizer=facts.optimizer)
    rows = {kind: [] for kind in ("trainable", "non_trainable", "optimizer", "metric")}
    for r in report.variables:
        count = facts.counts.get(r.slot_of or r.path, 1)
        rows[r.kind].extend([r] * count)
    scale = _dtype_scale(facts)
    candidate.weights = _max_bytes(rows["trainable"] + rows["non_trainable"], scale)
    candidate.gradients = _max_bytes(rows["trainable"], scale)
    candidate.optimizer = _max_bytes(rows["optimizer"], scale)
    split = axes.get("data", 1) * axes.get("fsdp", 1)
    local_batch = -(-batch_size // split)
    candidate.other = _max_bytes(rows["metric"], scale) + _input_bytes(facts, local_batch)
    sharded_sizes = _sharded_dim_sizes(rows["trainable"], axes)
    candidate.activations = _activation_bytes(facts, local_batch, sharded_sizes, axes)
    candidate.transient = _transient_bytes(rows["trainable"], axes, scale)
    candidate.comm = _communication(facts, rows["trainable"], axes, local_batch, bandwidth, latency, scale)
    candidate.valid, candidate.reason = _validity(rows["trainable"] + rows["non_trainable"], axes, batch_size, split)
    return candidate


def _dtype_scale(facts):
    if facts.dtype is None:
        return None
    return itemsize(facts.dtype)


def _row_bytes(row, itemsize):
    per_device = int(row.device_bytes.max(initial=0))
    if itemsize is None or not is_float(row.dtype):
        return per_device
    return per_device // row.itemsize * itemsize


def _max_bytes(rows, itemsize):
    if not rows:
        return 0
    if itemsize is None:
        return int(np.sum([r.device_bytes for r in rows], axis=0).max())
    return sum(_row_bytes(r, itemsize) for r in rows)


def _names(axes):
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _split_dims(row, axis):
    """For each dimension of the row's variable: whether `axis` splits it."""
    return [axis in _names(a) for a in row.spec]


def _sharded_over(row, axis):
    return any(_split_dims(row, axis))


def _sharded_dim_sizes(rows, axes):
    """For the model and expert axes: sizes of weight dimensions split over them, minus sizes left whole beside them."""
    out = {}
    for axis in ("model", "expert"):
        if axes.get(axis, 1) == 1:
            continue
        split, whole = set(), set()
        for r in rows:
            dims = _split_dims(r, axis)
            if any(dims):
                for d, on in zip(r.shape, dims):
                    (split if on else whole).add(d)
        out[axis] = split - whole
    return out


def _activation_bytes(facts, local_batch, sharded_sizes, axes):
    """Saved activations on one device (see docs/plan.md, "Activations")."""
    total = 0
    for shape, element_bytes, count in facts.residuals:
        size = math.prod(shape) * element_bytes
        if any(d % TRACE_BATCH == 0 for d in shape):
            size = size * local_batch / TRACE_BATCH
        for axis, sizes in sharded_sizes.items():
            if any(d in sizes for d in shape):
                size /= axes[axis]
        total += size * count
    return int(total)


def _transient_bytes(rows, axes, itemsize):
    """Buffers that live during the step besides the state (see docs/plan.md, "Transient buffers").

    With the batch split (data or fsdp > 1), each device's gradients exist once
    before their all-reduce / reduce-scatter and once after: the unreduced
    copy is fsdp times a sharded weight's shard. Weights all-gathered over
    fsdp are kept whole from the forward to the backward pass (Keras does not
    rematerialise), beyond their shards.
    """
    f = axes.get("fsdp", 1)
    total = 0
    for r in rows:
        shard = _row_bytes(r, itemsize)
        on_fsdp = f > 1 and _sharded_over(r, "fsdp")
        if axes.get("data", 1) * f > 1:
            total += shard * (f if on_fsdp else 1)
        if on_fsdp:
            total += shard * (f - 1)
    return total


def _input_bytes(facts, local_batch):
    """One batch shard of inputs and integer labels (one per output position)."""
    if facts.inputs is None:
        return 0
    import keras

    total = 0
    for s in keras.tree.flatten(facts.inputs):
        total += local_batch * math.prod(s.shape[1:]) * itemsize(s.dtype)
    for shape in facts.label_shapes:
        total += local_batch * math.prod(shape) * 4
    return int(total)


def _communication(facts, rows, axes, local_batch, bandwidth, latency, itemsize):
    """Per mesh axis: the collectives of one training step, their payload bytes and alpha-beta seconds."""
    comm = {}
    tokens = local_batch * facts.tokens_per_example
    grads = [(r, _row_bytes(r, itemsize)) for r in rows]
    d = axes.get("data", 1)
    if d > 1:
        comm["data"] = _collectives([("all-reduce", "gradients", sum(b for _, b in grads), len(grads))], d, bandwidth, latency)
    f = axes.get("fsdp", 1)
    if f > 1:
        on = [(r, b) for r, b in grads if _sharded_over(r, "fsdp")]
        off = [(r, b) for r, b in grads if not _sharded_over(r, "fsdp")]
        gathered = sum(b * f for _, b in on)
        comm["fsdp"] = _collectives(
            [
                ("all-gather", "weights (forward)", gathered, len(on)),
                ("all-gather", "weights (backward)", gathered, len(on)),
                ("reduce-scatter", "gradients", gathered, len(on)),
                ("all-reduce", "gradients of unsharded weights", sum(b for _, b in off), len(off)),
            ],
            f, bandwidth, latency,
        )
    for axis in ("model", "expert"):
        n = axes.get(axis, 1)
        if n == 1:
            continue
        features = [_activation_features(r, axis) for r in rows]
        features = [x for x in features if x]
        kind = "all-reduce" if axis == "model" else "all-to-all"
        what = "activations of sharded layers" if axis == "model" else "tokens routed to experts"
        payload = sum(tokens * x * facts.act_itemsize for x in features)
        comm[axis] = _collectives([(kind, what, payload, len(features))], n, bandwidth, latency)
    return comm


def _activation_features(row, axis):
    """Features of the activation a layer with this weight exchanges over `axis`, or 0.

    A weight split over its first dimension (row-parallel: attention output,
    MLP down, a vocabulary-sharded embedding) all-reduces its output in the
    forward pass; one split over a later dimension (column-parallel: q/k/v,
    MLP up) all-reduces its input's gradient in the backward pass.
    """
    dims = _split_dims(row, axis)
    if not any(dims) or len(row.shape) < 2:
        return 0
    if axis == "expert":
        return row.shape[1]
    return row.shape[-1] if dims[0] else row.shape[0]


def _collectives(items, n, bandwidth, latency):
    """Alpha-beta cost of collectives over an axis of `n` devices.

    all-reduce: 2(n-1)/n * bytes / bandwidth + 2(n-1) * latency per collective;
    all-gather, reduce-scatter, all-to-all: (n-1)/n * bytes / bandwidth + (n-1) * latency.
    """
    listed, total_bytes, seconds = [], 0, 0.0
    for kind, what, nbytes, count in items:
        if not count:
            continue
        steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
        t = steps / n * nbytes / bandwidth + steps * latency * count
        listed.append({"kind": kind, "of": what, "bytes": int(nbytes), "count": count, "seconds": t})
        total_bytes += int(nbytes)
        seconds += t
    return {"size": n, "collectives": listed, "bytes": total_bytes, "seconds": seconds}


def _validity(rows, axes, batch_size, split):
    if batch_size % split:
        return False, f"batch size {batch_size} does not divide by the {split} batch shards (data x fsdp)"
    for axis in ("model", "expert", "fsdp"):
        if axes.get(axis, 1) > 1 and not any(_sharded_over(r, axis) for r in rows):
            return False, f"no weight divides by {axis}={axes[axis]}: every weight would be replicated over it"
    return True, ""


# --- Ranking and advice --------------------------------------------------------------------------


def _rank(result, facts):
    memory = result.memory_per_device
    for c in result.candidates:
        c.fits = None if memory is None else c.peak <= memory
    ordered = sorted(
        result.candidates, key=lambda c: (not c.valid, c.fits is False, round(c.comm_seconds, 12), c.peak, c.spec)
    )
    for i, c in enumerate(ordered, 1):
        c.rank = i
    result.candidates = ordered
    valid = [c for c in ordered if c.valid]
    if not valid:
        result.advice = _no_valid_mesh(result)
        return
    fitting = [c for c in valid if c.fits is not False]
    if not fitting:
        result.advice = _nothing_fits(result, facts, valid)
        return
    best = fitting[0]
    result.recommendation = best
    result.reason = _reason(best, fitting, memory)


def _reason(best, fitting, memory):
    parts = []
    if memory is not None:
        parts.append(f"fits {_gb(memory)} per device (peak {_gb(best.peak)}, {_gb(memory - best.peak)} free)")
    else:
        parts.append(f"peak {_gb(best.peak)} per device (no memory_per_device given: every valid mesh counted as fitting)")
    if len(fitting) > 1:
        runner = fitting[1]
        parts.append(
            f"least estimated communication per step of {len(fitting)} candidates: {_ms(best.comm_seconds)} "
            f"(next: {runner.spec} at {_ms(runner.comm_seconds)})"
        )
    else:
        parts.append("the only candidate that fits")
    if best.comm:
        main = max(best.comm.items(), key=lambda kv: kv[1]["seconds"])
        parts.append(f"most of it on the {main[0]} axis ({_gb(main[1]['bytes'])} per step)")
    return "; ".join(parts)


def _no_valid_mesh(result):
    reasons = sorted({c.reason for c in result.candidates if c.reason})
    n, b = result.devices, result.batch_size
    suggestion = f"use a batch size divisible by {n}" if b % n else "use a device count the model's dimensions divide by"
    return (
        f"No mesh of {n} devices is valid for {result.model!r} with batch size {b}: "
        + "; ".join(reasons)
        + f". To plan: {suggestion} (e.g. batch_size={n * max(1, -(-b // n))}), or a device count that divides the batch."
    )


def _nothing_fits(result, facts, valid):
    smallest = min(valid, key=lambda c: c.peak)
    memory = result.memory_per_device
    state = smallest.peak - smallest.activations
    text = (
        f"No candidate fits {_gb(memory)} per device. The smallest per-device requirement is {_gb(smallest.peak)} "
        f"({smallest.spec}: weights {_gb(smallest.weights)}, gradients {_gb(smallest.gradients)}, optimizer "
        f"{_gb(smallest.optimizer)}, activations {_gb(smallest.activations)}, transient buffers {_gb(smallest.transient)})."
    )
    options = []
    batch = _largest_fitting_batch(result, facts, valid)
    if batch:
        result.suggestions["batch_size"] = batch
        options.append(f"a batch size of at most {batch} on {result.devices} devices")
    devices = _devices_that_fit(result, facts)
    if devices:
        result.suggestions["devices"] = devices
        options.append(f"{devices} devices (the first multiple of {result.devices} by doubling where a mesh fits)")
    if not options:
        if state > memory:
            smaller = " or a smaller dtype (dtype='bfloat16')" if facts.act_itemsize > 2 else ""
            return text + (
                f" Without activations it still needs {_gb(state)} (weights, gradients, optimizer state and transient "
                f"buffers), and more devices (doubling from {result.devices}) do not bring it under the budget: "
                f"shard more of the model (rules), rematerialise, or use a different optimizer{smaller}."
            )
        return text + " Use more devices or a smaller batch."
    return text + " To fit: " + ", or ".join(options) + "."


def _largest_fitting_batch(result, facts, valid):
    """The largest batch size below the requested one with which some mesh fits, or None."""
    memory, best = result.memory_per_device, None
    for c in valid:
        split = c.axes.get("data", 1) * c.axes.get("fsdp", 1)
        per_example = (c.activations + c.other) / max(1, result.batch_size // split)
        state = c.peak - c.activations - c.other
        if state >= memory or not per_example:
            continue
        batch = min(int((memory - state) // per_example) * split, result.batch_size - split)
        for _ in range(4):  # activations are not exactly linear in the batch: check, then step down
            if batch <= 0 or (best is not None and batch <= best):
                break
            if _evaluate(facts, c.axes, batch, result.bandwidth, result.latency).peak <= memory:
                best = batch
                break
            batch -= split
    return best


def _devices_that_fit(result, facts, factor_limit=64):
    """The smallest device count, doubling from `devices`, at which some mesh fits; None when doubling stops helping."""
    n, previous = result.devices * 2, None
    while n <= result.devices * factor_limit:
        smallest = None
        for axes in meshes(n, ("fsdp", "model")):  # replicas never lower per-device memory
            c = _evaluate(facts, axes, result.batch_size, result.bandwidth, result.latency)
            if not c.valid:
                continue
            if c.peak <= result.memory_per_device:
                return n
            smallest = c.peak if smallest is None else min(smallest, c.peak)
        if smallest is not None and previous is not None and smallest > 0.9 * previous:
            return None  # what is left does not shrink with more devices
        previous = smallest if smallest is not None else previous
        n *= 2
    return None


# --- Verification --------------------------------------------------------------------------------


def _verify(result, facts, specs=None):
    import jax

    n = result.devices
    if jax.device_count() < n:
        raise PlanError(
            f"verify=True compiles on {n} devices, but JAX has {jax.device_count()}. Call "
            f"kdist.fake_devices({n}) before importing jax or keras, or run `kdist plan ... --verify --fake-devices {n}`."
        )
    unknown = (specs or set()) - {c.spec for c in result.candidates} - {c.shape for c in result.candidates}
    if unknown:
        raise PlanError(f"verify names {sorted(unknown)}, which are not candidates: {[c.spec for c in result.candidates]}.")
    for c in result.candidates:
        if c.valid and (specs is None or c.spec in specs or c.shape in specs):
            c.compiled = compiled_memory(facts, c, result.batch_size)


def compiled_memory(facts, candidate, batch_size):
    """XLA's memory analysis of the Keras training step of the model on `candidate`'s mesh.

    The model is rebuilt abstractly, compiled with the planned optimizer and a
    softmax cross-entropy loss on each output, and `model.train_step` is
    lowered from `jax.ShapeDtypeStruct`s carrying the candidate's shardings:
    nothing is allocated.
    """
    import jax
    import keras
    from jax.sharding import NamedSharding, PartitionSpec

    from kdist.inspector import inspect, new_optimizer
    from kdist.presets import preset

    if facts.optimizer is None:
        raise PlanError("verify=True compiles a training step, which needs an optimizer: pass optimizer='adam' (or another).")
    dist = preset(candidate.spec, devices=jax.devices()[: math.prod(candidate.axes.values())], rules=facts.rules_arg)
    mesh = dist.device_mesh.backend_mesh
    clone = _rebuild(facts)
    x = keras.tree.map_structure(lambda s: jax.ShapeDtypeStruct((batch_size, *s.shape[1:]), s.dtype), facts.inputs)
    outputs = keras.tree.map_structure(lambda t: t, (getattr(clone, "_functional", None) or clone)._outputs_struct)
    seq = facts.sequence_length or 1
    y = keras.tree.map_structure(
        lambda t: jax.ShapeDtypeStruct((batch_size, *(seq if d is None else d for d in t.shape[1:-1])), "int32"), outputs
    )
    loss = keras.tree.map_structure(lambda _: keras.losses.SparseCategoricalCrossentropy(from_logits=True), outputs)
    optimizer = new_optimizer(facts.optimizer)  # its scalars hold values: made outside the deferred scope
    with deferred():
        clone.compile(optimizer=optimizer, loss=loss)
        clone._symbolic_build(data_batch=(x, y))
        clone.optimizer.build(clone.trainable_variables)
    report = inspect(clone, dist)
    specs = {r.path: r.spec for r in report.variables}

    def sharded(v):
        return jax.ShapeDtypeStruct(tuple(v.shape), v.dtype, sharding=NamedSharding(mesh, PartitionSpec(*specs[v.path])))

    groups = (clone.trainable_variables, clone.non_trainable_variables, clone.optimizer.variables, clone.metrics_variables)
    state = tuple([sharded(v) for v in group] for group in groups)

    def data_struct(s):
        axes = dist.get_data_layout(s.shape).axes
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, PartitionSpec(*axes)))

    data = keras.tree.map_structure(data_struct, (x, y))
    with dist.scope():
        memory = xla_memory(compile_train_step(clone, state, data))
    # "peak" is XLA's total, argument + output - alias + temp: every buffer of the step counted
    # once (the CPU backend's peak_memory_in_bytes leaves temporaries out, so it is not used).
    return {**{k: memory[k] for k in MEMORY_FIELDS}, "xla_peak_memory": memory.get("peak") or 0, "peak": memory["total"]}


def _rebuild(facts):
    if facts.build is not None:
        with deferred():
            return facts.build()
    model = facts.model
    try:
        with deferred():
            return model.__class__.from_config(model.get_config())
    except Exception as e:
        raise PlanError(
            f"verify=True rebuilds the model for each mesh, and {model.name!r} cannot be rebuilt from its config ({e}). "
            "Pass the function that builds it instead of the model: kdist.plan(build_fn, ...)."
        ) from None


# --- Rendering -----------------------------------------------------------------------------------


def plan_renderables(p):
    """Rich renderables of a plan: the candidates table, then the recommendation or the advice."""
    from rich.table import Table
    from rich.text import Text

    verified = any(c.compiled for c in p.candidates)
    memory = f", {_gb(p.memory_per_device)} per device" if p.memory_per_device else ""
    seq = f", sequence {p.sequence_length}" if p.sequence_length else ""
    title = f"Plan for {p.model!r} on {p.devices} devices: batch {p.batch_size}{seq}, {p.optimizer}{memory}"
    table = Table(title=title, title_justify="left")
    columns = ["#", "mesh", "weights", "grads", "optimizer", "activ.", "transient", "peak"]
    columns += ["compiled", "est/comp"] if verified else []
    columns += ["comm/step", "traffic by axis", "note"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("mesh", "note") else "right")
    for c in p.candidates:
        mark = "★ " if c is p.recommendation else ""
        note = c.reason if not c.valid else ("does not fit" if c.fits is False else "")
        row = [
            f"{c.rank}", mark + c.spec, _gb(c.weights), _gb(c.gradients), _gb(c.optimizer), _gb(c.activations),
            _gb(c.transient), _gb(c.peak),
        ]
        if verified:
            row += [_gb(c.compiled["peak"]) if c.compiled else "", f"{c.ratio:.2f}" if c.ratio else ""]
        traffic = " ".join(f"{axis}:{_short_bytes(x['bytes'])}" for axis, x in c.comm.items())
        row += [_ms(c.comm_seconds), traffic, note]
        style = "bold green" if c is p.recommendation else ("dim" if not c.valid or c.fits is False else None)
        table.add_row(*row, style=style)
    yield table
    if p.recommendation is not None:
        yield Text(f"Recommended: {p.recommendation.spec} ({p.recommendation.shape}) — {p.reason}.", style="bold")
    else:
        yield Text(p.advice, style="bold red")
    for note in p.notes:
        yield Text(f"note: {note}", style="dim")


# --- Small helpers -------------------------------------------------------------------------------


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"{name} must be a positive integer; received {value!r}.")
    return int(value)


def _non_negative(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise PlanError(f"{name} must be a non-negative number of seconds; received {value!r}.")
    return float(value)


def _gb(n):
    from kdist.render import human_bytes

    return human_bytes(n)


def _short_bytes(n):
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.3g}{unit}"
        n /= 1024


def _ms(seconds):
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
