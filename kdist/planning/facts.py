"""What the planner reads from a model once, for every candidate: variables, optimizer, inputs, the traced step."""

import copy

import jax
import keras

from kdist.checks import is_int, shown
from kdist.errors import ArgumentError, ArgumentTypeError, KdistError, ModelError, PlanError, cause
from kdist.inspection.inspector import planned_optimizer
from kdist.keras_internals import array_of, deferred, input_struct, output_struct, set_path
from kdist.keras_internals.optimizers import plan_optimizer, state_owners
from kdist.meshes.spec import ParallelDims
from kdist.planning.attention import default_attention
from kdist.planning.position_tables import overrun, position_table_hint, shorter_tables
from kdist.planning.step import compute_dtype, trace_step
from kdist.planning.trace import TRACE_BATCH
from kdist.rules.registry import placer_for
from kdist.rules.rule import Rule
from kdist.units import is_float, itemsize


class ModelFacts:
    """The model's variables (one per group laid out alike), its planned optimizer, inputs and traced step.

    `target` is a `kdist.planning.targets.Target`; `attention` ("fused",
    "materialized" or None: the target's default), `remat` and
    `compiler_rules` (a `kdist.planning.buffers.Rules`, default: the
    target's) say how the step is traced (`kdist.planning.step.trace_step`).
    """

    def __init__(
        self,
        model_or_variables,
        optimizer,
        dtype,
        sequence_length,
        rules,
        target,
        attention=None,
        remat=False,
        compiler_rules=None,
    ):
        self.build = None
        if callable(model_or_variables) and not isinstance(model_or_variables, (keras.layers.Layer, list, tuple)):
            self.build = model_or_variables
            try:
                with deferred():
                    model_or_variables = model_or_variables()
            except KdistError:
                raise
            except Exception as e:  # the caller's own code: name it, with its cause
                raise ModelError(
                    f"The function given for the model ({getattr(self.build, '__name__', self.build)!r}) failed "
                    f"when plan() called it to build the model: {cause(e)}. Fix it, or pass a built model."
                ) from e
        if not isinstance(model_or_variables, (keras.layers.Layer, list, tuple)):
            raise ModelError(
                f"plan() needs a Keras model, a function building one, or a list of variables; received "
                f"{type(model_or_variables).__name__}."
            )
        self.model = model_or_variables
        self.is_model = not isinstance(model_or_variables, (list, tuple))
        self.name = getattr(model_or_variables, "name", "") or "variables"
        self.rules_arg = rules
        self.dtype = dtype
        self.notes = []
        self.sequence_length = sequence_length
        variables = _abstract_variables(model_or_variables)
        trainable = [v for v in variables if getattr(v, "trainable", True)]
        if not variables:
            raise ModelError(
                f"Model {self.name!r} has no variables: build it (call it on an input or use keras.Input) before "
                "planning."
            )
        if not trainable:
            raise ModelError(
                f"Model {self.name!r} has {len(variables)} variables and none is trainable: kdist plans a training "
                "step, which updates trainable weights. Set `trainable = True` on the layers to train."
            )
        self._placers = {}
        self.roles = self._roles(trainable)
        self.variables, self.counts = self._representatives(variables)
        self.optimizer, self.optimizer_name, self.optimizer_variables, self.slots = _planned_optimizer(
            optimizer, [v for v in self.variables if getattr(v, "trainable", True)]
        )
        self.owners = state_owners(self.optimizer_variables, self.slots)  # a repeated weight's own state repeats
        self.inputs = _input_shapes(self.model, sequence_length) if self.is_model else None
        if self.is_model:
            _check_float_output(self.model)
        self.notes += _fixed_batches(self.model) if self.inputs is not None else []
        first_tokens = _fixed_sequence_length(self.inputs) if self.inputs is not None else None
        if sequence_length is None:
            self.sequence_length = first_tokens
        self.tokens_per_example = (sequence_length if is_int(sequence_length) else first_tokens) or 1
        self.target, self.attention, self.remat, self.compiler_rules = target, attention, remat, compiler_rules
        self._trace_cache = {}  # traced programs by layer signature, shared by `retraced` copies
        self._buffer_static = None
        self._timing_static = None
        self._model_splits = {}  # `model_splits`: per layout over the model/expert axes and axis sizes
        self.act_itemsize = self._activation_itemsize()
        self.traced = self._trace()

    def placer(self, dims):
        """The placement engine of a preset on mesh `dims`, with the plan's rules (one per mesh shape)."""
        key = (dims.roles, dims.shape)
        if key not in self._placers:
            self._placers[key] = placer_for(self.rules_arg, dims)
        return self._placers[key]

    def _roles(self, trainable):
        placer = self.placer(ParallelDims.from_sizes({"data": 1, "model": 1, "expert": 1}))
        uses_expert = any(
            isinstance(rule, Rule) and any("expert" in layout for layout in rule.layouts)
            for rule in (placer.match(v.path) for v in trainable)
        )
        if uses_expert:
            self.notes.append("the rules shard some weights over an 'expert' axis: meshes with one are planned too")
        return ("data", "fsdp", "model", "expert") if uses_expert else ("data", "fsdp", "model")

    def _representatives(self, variables):
        """One variable per group that every candidate lays out alike (same rule, shape, dtype, kind), and group sizes.

        A Llama's 126 blocks have the same variables: each candidate's layouts are
        computed for one block and counted 126 times, so planning 512 devices
        takes seconds. The sums are the inspector's, row for row. A variable
        whose rule follows a sibling (a bias following its kernel) is grouped
        with its sibling's group too, and `siblings` names the sibling each
        such representative needs placed first.
        """
        placer = self.placer(ParallelDims.from_sizes({"data": 1, "model": 1, "expert": 1}))
        by_path = {v.path: v for v in variables}

        def key(v, depth=0):
            rule = placer.match(v.path)
            k = (rule, tuple(v.shape), str(v.dtype), bool(getattr(v, "trainable", True)))
            sibling = _sibling(v.path, rule, by_path)
            return k + (key(sibling, depth + 1),) if sibling is not None and depth < 4 else k

        groups = {}
        for v in variables:
            groups.setdefault(key(v), []).append(v)
        representatives = [members[0] for members in groups.values()]
        self._representative = {v.path: members[0].path for members in groups.values() for v in members}
        self.siblings = {
            v.path: sibling
            for v in representatives
            if (sibling := _sibling(v.path, placer.match(v.path), by_path)) is not None
        }
        return representatives, {members[0].path: len(members) for members in groups.values()}

    def representative_index(self, paths):
        """For each variable path: the index of its representative in `self.variables`."""
        index = {v.path: i for i, v in enumerate(self.variables)}
        return [index[self._representative[p]] for p in paths]

    def retraced(self, *, remat=None, compiler_rules=None):
        """These facts with the step traced again with `remat` and/or other `compiler_rules` (a `Rules`).

        Layer programs already traced are reused; only the buffer analysis and
        the timeline are redone.
        """
        remat = self.remat if remat is None else remat
        if remat == self.remat and compiler_rules in (None, self.compiler_rules):
            return self
        other = copy.copy(self)
        other.remat, other.compiler_rules = remat, compiler_rules or self.compiler_rules
        other.notes = []
        other._buffer_static = other._timing_static = None
        other._model_splits = {}
        other.traced = other._trace()
        other.notes = self.notes
        return other

    def _activation_itemsize(self):
        """Bytes per element of the activations the model axis exchanges (communication)."""
        if self.dtype is not None:
            return itemsize(self.dtype)
        return itemsize(compute_dtype(self.model)) if self.is_model else 4

    def _what_if_attention(self):
        """What Keras takes on the target for the `dtype=` given (a model built in it); None: for the model's own."""
        return default_attention(self.target.platform, self.dtype) if self.dtype is not None else None

    def _trace(self):
        if not self.is_model:
            self.notes.append("activations not estimated: pass the model (not a list of variables) to include them")
            return None
        traced = None
        if self.inputs is not None:
            try:
                traced = trace_step(
                    self.model,
                    self.inputs,
                    platform=self.target.platform,
                    attention=self.attention or self._what_if_attention(),
                    remat=self.remat,
                    rules=self.compiler_rules,
                    cache=self._trace_cache,
                )
            except PlanError as e:
                shorter = shorter_tables(self.model, self.sequence_length)
                if shorter:  # the likely cause: a table the sequence overruns
                    raise ArgumentError(overrun(self.model, self.sequence_length, shorter)) from e
                hint = position_table_hint(self.model, self.sequence_length, getattr(e, "layers", ()))
                if hint:
                    raise PlanError(f"{e}{hint}") from e
                raise
            except KdistError:
                raise
            except Exception as e:  # a graph the step model does not handle: say so, never a raw traceback
                raise PlanError(
                    f"The planner could not model the training step of {self.name!r}: {cause(e)}. Plan "
                    f"its variables instead (kdist.plan(model.weights, ...): weights and optimizer state, no "
                    "activations), or report the model."
                ) from e
        if traced is None:
            self.notes.append(
                f"activations not estimated: {self.name!r} is not a functional Keras model (no layer graph to trace)"
            )
            return None
        self.notes.extend(traced.notes)
        shorter = shorter_tables(self.model, self.sequence_length)
        if shorter:
            self.notes.append(
                f"{overrun(self.model, self.sequence_length, shorter, fix=False)} The step traced: a layer shortens "
                "its input before the table, as Whisper's strided encoder does; check the model runs at that length"
            )
        return traced


def _sibling(path, rule, by_path):
    """The variable a rule that follows a sibling (e.g. a bias its "kernel") takes its layout from, or None."""
    follows = getattr(rule, "follows", ())
    if not follows:
        return None
    return by_path.get(path.rpartition("/")[0] + "/" + follows[0])


def _variables(subject):
    if not isinstance(subject, (list, tuple)):
        return list(subject.trainable_variables) + list(subject.non_trainable_variables)
    for item in subject:
        if not all(hasattr(item, name) for name in ("path", "shape", "dtype")):
            raise ArgumentTypeError(
                f"plan() takes a list of Keras variables as model_or_variables; received a list holding "
                f"{type(item).__name__} {shown(item)}. Pass model.weights, or the model itself."
            )
    return list(subject)


def _abstract_variables(model_or_variables):
    """The variables, as deferred copies when they hold values (so layouts are planned, not read)."""
    variables = _variables(model_or_variables)
    if not any(array_of(v) is not None for v in variables):
        return variables
    copies = []
    for v in variables:
        with deferred():
            copy = keras.Variable(
                initializer="zeros", shape=tuple(v.shape), dtype=v.dtype, trainable=v.trainable, name=v.name
            )
        set_path(copy, v.path)
        copies.append(copy)
    return copies


def _planned_optimizer(optimizer, trainable):
    """(optimizer, name, variables, {id(slot): reference}) built on deferred variables: nothing allocated."""
    if optimizer is None:
        return None, "none", [], {}
    built = planned_optimizer(optimizer)
    variables, slots = plan_optimizer(built, trainable)
    return built, built.name, variables, slots


def check_sequence_length(sequence_length):
    """`sequence_length` as None, a positive int, or {input name: an int >= 0, or a tuple of them}."""
    if sequence_length is None or (is_int(sequence_length) and sequence_length >= 1):
        return sequence_length
    if isinstance(sequence_length, dict):
        for name, length in sequence_length.items():
            dims = tuple(length) if isinstance(length, (tuple, list)) else (length,)
            if not isinstance(name, str) or not dims or not all(is_int(d) and d >= 0 for d in dims):
                raise PlanError(
                    f"sequence_length maps an input's name to its length (an int >= 0 for every unknown dimension "
                    f"of that input, or a tuple with one per dimension); received {shown(name)}: {shown(length)}."
                )
        return {name: length if is_int(length) else tuple(length) for name, length in sequence_length.items()}
    raise PlanError(
        "sequence_length must be a positive integer (the length of every unknown input dimension) or a dict of "
        f"lengths by input name ({{'encoder_token_ids': 512, 'decoder_token_ids': 128}}); received "
        f"{shown(sequence_length)}."
    )


def unknown_dims(shape):
    """The positions of an input's unknown dimensions after the batch: the ones `sequence_length` sets."""
    return [i for i, d in enumerate(shape) if d is None and i > 0]


def _fixed_batches(model):
    """A note for each input whose batch size the model fixes: planned at the batch given instead."""
    return [
        f"input {t.name!r} of model {model.name!r} fixes its batch at {t.shape[0]} (keras.Input(batch_size=...)): "
        "planned at each mesh's share of batch_size instead, as fit() feeds it"
        for t in keras.tree.flatten(input_struct(model))
        if len(t.shape) and t.shape[0] is not None
    ]


def _check_float_output(model):
    """Refuse a model whose outputs are all integers (an argmax): no loss on them differentiates its weights."""
    outputs = output_struct(model)
    outputs = [] if outputs is None else keras.tree.flatten(outputs)
    if outputs and not any(is_float(t.dtype) for t in outputs):
        raise ModelError(
            f"Model {model.name!r} has no floating-point output (its outputs are {[str(t.dtype) for t in outputs]}): "
            "kdist plans a training step, whose loss must be differentiable in an output. Plan the model that makes "
            "the values these outputs are taken from (before the argmax), or its variables alone "
            "(kdist.plan(model.weights, ...))."
        )


def _input_shapes(model, sequence_length):
    """The model's input structure as ShapeDtypeStructs at batch TRACE_BATCH (None if it has no inputs).

    Unknown dimensions after the batch take `sequence_length`: one int for all, or per input name (an int for each
    of that input's unknown dimensions, or a tuple with one per dimension).
    """
    inputs = input_struct(model)
    if inputs is None:
        return None
    named = isinstance(sequence_length, dict)
    flat = keras.tree.flatten(inputs)
    names = [t.name for t in flat]
    if named and set(sequence_length) - set(names):
        raise PlanError(
            f"sequence_length names {sorted(set(sequence_length) - set(names))}, which model {model.name!r} has no "
            f"input called: its inputs are {names}."
        )
    fixed = not any(unknown_dims(t.shape) for t in flat)
    if is_int(sequence_length) and fixed and _fixed_sequence_length(flat) != sequence_length:
        raise PlanError(
            f"sequence_length={sequence_length} has nothing to set: every input of model {model.name!r} has a fixed "
            f"shape ({', '.join(f'{t.name!r} {tuple(t.shape)}' for t in flat)}). Leave sequence_length out, or build "
            "the model with the length you plan for."
        )
    unnamed = [t.name for t in flat if unknown_dims(t.shape) and t.name not in sequence_length] if named else []
    if unnamed:
        raise PlanError(
            f"sequence_length={shown(sequence_length)} gives no length to input(s) {unnamed} of model "
            f"{model.name!r}, whose shapes have unknown dimensions: add each name with its length."
        )

    def lengths(t, count):
        if sequence_length is None:
            raise PlanError(
                f"Input {t.name!r} of model {model.name!r} has shape {tuple(t.shape)}: pass sequence_length= "
                "(--seq-len) for its unknown dimensions, one length for all inputs or a dict by input name."
            )
        if not named:
            return (sequence_length,) * count
        given = sequence_length[t.name]
        if is_int(given):
            return (given,) * count
        if len(given) != count:
            raise PlanError(
                f"sequence_length[{t.name!r}]={given} has {len(given)} lengths, and input {t.name!r} of model "
                f"{model.name!r} (shape {tuple(t.shape)}) has {count} unknown dimension(s) after the batch: give one "
                "per dimension, or one int for all of them."
            )
        return given

    def struct(t):
        dims = list(t.shape)
        unknown = unknown_dims(dims)
        if named and t.name in sequence_length and not unknown:
            raise PlanError(
                f"sequence_length names input {t.name!r} of model {model.name!r}, whose shape {tuple(t.shape)} has "
                "no unknown dimension after the batch: leave it out."
            )
        for i, length in zip(unknown, lengths(t, len(unknown)) if unknown else ()):
            dims[i] = length
        if dims:  # a batch keras.Input(batch_size=...) fixes too: the plan's is batch_size (`_fixed_batches`)
            dims[0] = TRACE_BATCH
        return jax.ShapeDtypeStruct(tuple(dims), t.dtype)

    return keras.tree.map_structure(struct, inputs)


def _fixed_sequence_length(inputs):
    for s in keras.tree.flatten(inputs):
        if len(s.shape) >= 2 and not is_float(s.dtype):
            return int(s.shape[1])  # token ids: (batch, sequence)
    return None


def check_dtype(dtype):
    """`dtype` as a float dtype name, or None."""
    if dtype is None:
        return None
    try:
        ok = is_float(dtype)
    except (TypeError, ValueError):  # numpy reads "a,b" as a record format and refuses some
        ok = False
    if not ok:
        policy = (
            f" {dtype!r} is a Keras dtype policy: build the model under keras.config.set_dtype_policy({dtype!r}) and "
            "leave dtype= out (dtype= puts the whole state in one dtype)."
            if isinstance(dtype, str) and dtype.startswith("mixed_")
            else ""
        )
        raise ArgumentError(
            "dtype must be a floating-point dtype such as 'bfloat16' or 'float32'; "
            f"received dtype={shown(dtype)}.{policy}"
        )
    return dtype
