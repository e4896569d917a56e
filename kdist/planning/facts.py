"""What the planner reads from a model once, for every candidate: variables, optimizer state, inputs, activations."""

import jax
import keras

from kdist.errors import ArgumentError, ModelError, PlanError
from kdist.inspection.inspector import planned_optimizer
from kdist.keras_internals import array_of, deferred, input_struct, output_struct, plan_optimizer, set_path
from kdist.meshes.spec import ParallelDims
from kdist.planning.activations import TRACE_BATCH, saved_activations
from kdist.rules.registry import placer_for
from kdist.rules.rule import Rule
from kdist.units import is_float, itemsize


class ModelFacts:
    """The model's variables (one per group laid out alike), its planned optimizer, inputs and residuals."""

    def __init__(self, model_or_variables, optimizer, dtype, sequence_length, rules):
        self.build = None
        if callable(model_or_variables) and not isinstance(model_or_variables, (keras.layers.Layer, list, tuple)):
            self.build = model_or_variables
            with deferred():
                model_or_variables = model_or_variables()
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
        if not trainable:
            raise ModelError(
                f"Model {self.name!r} has no trainable variables: build it (call it on an input or use keras.Input) "
                "before planning."
            )
        self._placers = {}
        self.roles = self._roles(trainable)
        self.variables, self.counts = self._representatives(variables)
        self.optimizer, self.optimizer_name, self.optimizer_variables, self.slots = _planned_optimizer(
            optimizer, [v for v in self.variables if getattr(v, "trainable", True)]
        )
        self.inputs = _input_shapes(self.model, sequence_length) if self.is_model else None
        if self.inputs is not None and sequence_length is None:
            self.sequence_length = _fixed_sequence_length(self.inputs)
        self.tokens_per_example = self.sequence_length or 1
        self.label_shapes = _label_shapes(self.model, self.sequence_length) if self.inputs is not None else []
        self.residuals, self.act_itemsize = self._activations()

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
        takes seconds. The sums are the inspector's, row for row.
        """
        placer = self.placer(ParallelDims.from_sizes({"data": 1, "model": 1, "expert": 1}))
        groups = {}
        for v in variables:
            key = (placer.match(v.path), tuple(v.shape), str(v.dtype), bool(getattr(v, "trainable", True)))
            groups.setdefault(key, []).append(v)
        representatives = [members[0] for members in groups.values()]
        return representatives, {members[0].path: len(members) for members in groups.values()}

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
        outputs = _outputs(self.model)
        act_itemsize = itemsize(
            self.dtype or (outputs[0].dtype if outputs else getattr(self.model, "compute_dtype", "float32"))
        )
        if self.dtype is not None:
            residuals = [
                (shape, act_itemsize if floating else size, count) for shape, size, count, floating in residuals
            ]
        else:
            residuals = [(shape, size, count) for shape, size, count, _ in residuals]
        return residuals, act_itemsize


def _variables(subject):
    if isinstance(subject, (list, tuple)):
        return list(subject)
    return list(subject.trainable_variables) + list(subject.non_trainable_variables)


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


def _input_shapes(model, sequence_length):
    """The model's input structure as ShapeDtypeStructs at batch TRACE_BATCH (None if it has no inputs)."""
    inputs = input_struct(model)
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
    for s in keras.tree.flatten(inputs):
        if len(s.shape) >= 2 and not is_float(s.dtype):
            return int(s.shape[1])  # token ids: (batch, sequence)
    return None


def _outputs(model):
    """The model's symbolic outputs, flattened ([] when it has no layer graph)."""
    struct = output_struct(model)
    return keras.tree.flatten(struct) if struct is not None else []


def check_dtype(dtype):
    """`dtype` as a float dtype name, or None."""
    if dtype is None:
        return None
    try:
        ok = is_float(dtype)
    except TypeError:
        ok = False
    if not ok:
        raise ArgumentError(
            f"dtype must be a floating-point dtype such as 'bfloat16' or 'float32'; received dtype={dtype!r}."
        )
    return dtype
