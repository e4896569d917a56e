"""A model's whole training step, traced once: each layer call per distinct signature, strung along the graph.

`trace_step` walks the functional graph: the forward of every node, the
loss (Keras's sparse cross-entropy from logits on each float output), the
backward of every node in reverse (cotangents of a tensor read twice are
summed, gradients of a weight used twice too), then the optimizer update.
A layer is traced once per (class, weights, argument shapes, config): a
Llama's 126 identical blocks trace one block. The result (`TracedStep`) is
mesh-independent; `kdist.planning.memory_model` scales it per candidate.
"""

import dataclasses
import functools
import math
import time

import jax
import keras

from kdist.errors import KdistError, PlanError, cause
from kdist.keras_internals import (
    KerasTensor,
    deferred,
    input_struct,
    layer_config,
    layers,
    nodes_by_depth,
    output_layer,
    output_struct,
)
from kdist.planning.attention import default_attention, forced_attention
from kdist.planning.buffers import Rules, analyse
from kdist.planning.gradient_waits import gates, normalizes_a_product
from kdist.planning.layouts import copy_operands
from kdist.planning.timeline import Step
from kdist.planning.trace import TRACE_BATCH, Loop, label_shape, loss_reads, trace_layer, trace_loss
from kdist.units import is_float, itemsize


@dataclasses.dataclass
class TracedStep:
    """A model's training step at batch TRACE_BATCH: its `Step` timeline and how it was traced.

    `variables`: the model's variables, indexed as in `step.weight_of`;
    `attention`: what the layers took ("fused", "materialized", both joined by
    "+", or "none"); `requested`: what was asked; `remat`: per-layer
    rematerialisation; `notes`: what the plan should say about the trace.
    """

    step: Step
    variables: list
    platform: str
    requested: str
    attention: str
    remat: bool
    seconds: float
    programs: int
    notes: list
    convolutions: bool = False
    labels: tuple = ()  # per output the loss reads (float, rank >= 2, in order): its labels' traced shape (`verify`)
    shared_input: bool = False  # an activation several weighted layers read (an encoder's output), `candidates.band`

    @property
    def family(self):
        """ "transformer" (some attention traced), "cnn" (convolutions, no attention) or "other"."""
        if self.attention != "none":
            return "transformer"
        return "cnn" if self.convolutions else "other"

    @property
    def max_pools(self):
        """Whether the step takes a max pool's gradient (`convolutions.max_pool_gradient`): `candidates.band`."""
        return bool(self.step.overlapped)

    @property
    def strided_normalizations(self):
        """Whether a softmax sums a dimension not innermost as its input lies, whose input the estimate keeps
        (`column_reductions.strided_normalizations`): `candidates.band`."""
        return None in self.step.column_rows.values()

    @functools.cached_property
    def gated_products(self):
        """Whether the forward multiplies the outputs of two matrix products of one input, elementwise (a gated MLP,
        `gradient_waits.gates`): `candidates.band`."""
        return gates(self.step)

    @functools.cached_property
    def normed_products(self):
        """Whether a weight gradient is summed from a matrix product's output alone (a norm of a sublayer's output
        projection, Gemma's), `gradient_waits.normalizes_a_product`: `candidates.band`."""
        return normalizes_a_product(self.step)


def compute_dtype(model):
    """The dtype the model's layers compute in (bfloat16 under "mixed_bfloat16")."""
    policy = getattr(model, "dtype_policy", None)
    return str(getattr(policy, "compute_dtype", None) or getattr(model, "compute_dtype", None) or "float32")


def _gathered_itemsizes(model, variables):
    """Per variable: the itemsize of FSDP's gathered copy, the compute dtype of the innermost layer holding it (a
    float weight is cast to it for its kernels; keras-hub's SmolLM3 builds its attention and MLP without the
    backbone's policy, so they compute in float32 under a bfloat16 one), else its own."""
    owner = {}
    for layer in layers(model):  # parents first: the innermost wins
        for v in layer.weights:
            owner[id(v)] = layer
    return [
        itemsize(compute_dtype(owner.get(id(v), model))) if is_float(v.dtype) else itemsize(v.dtype) for v in variables
    ]


def trace_step(model, inputs, *, platform="gpu", attention=None, remat=False, rules=None, cache=None):
    """Trace `model`'s training step for `platform`, or None when it has no layer graph.

    inputs: the model's input structure as `jax.ShapeDtypeStruct`s at batch
    TRACE_BATCH. attention: "fused" or "materialized" (default: what Keras
    takes on `platform` for the model's compute dtype). remat: wrap every
    layer call in `jax.checkpoint` (`keras.remat`): only layer inputs are
    saved, the backward recomputes each layer. rules: the compiler
    behaviours (`Rules`, default: those of `platform`). cache: a dict of
    traced programs to reuse across calls on the same model.
    """
    by_depth = nodes_by_depth(model)
    if not by_depth:
        return None
    start = time.perf_counter()
    rules = rules or Rules(platform=platform)
    cache = {} if cache is None else cache
    mode = attention or default_attention(platform, compute_dtype(model))
    step = Step(rules)
    variables = list(model.trainable_variables) + list(model.non_trainable_variables)
    index = {id(v): i for i, v in enumerate(variables)}
    step.var_bytes = [math.prod(v.shape) * itemsize(v.dtype) for v in variables]
    step.var_itemsize = [itemsize(v.dtype) for v in variables]
    walk = _Walk(step, index, cache, rules, remat, mode, platform)
    input_tensors = keras.tree.flatten(input_struct(model))
    for kt, s in zip(input_tensors, keras.tree.flatten(inputs)):
        walk.tensor[id(kt)] = step.external(s.shape, s.dtype)
        walk.known[id(kt)] = s
    walk.model_inputs = {id(kt) for kt in input_tensors}
    walk.sequence = next((s.shape[1] for s in keras.tree.flatten(inputs) if len(s.shape) > 1), 1)
    with deferred(), forced_attention(mode, platform) as taken:
        for depth in sorted(by_depth, reverse=True):
            for node in by_depth[depth]:
                if not node.is_input and node.operation is not None:
                    walk.forward(node)
        labels = walk.loss(keras.tree.flatten(output_struct(model)))
        walk.backward(model.trainable_variables)
        step.emit(remat=remat, gather_itemsize=_gathered_itemsizes(model, variables))
    taken = "+".join(sorted(taken))
    notes = []
    if not taken:  # no dot_product_attention call: scores computed by the layers, or no attention at all
        taken = "materialized" if walk.materialized_scores() else "none"
        if taken == "materialized" and mode == "fused":
            notes.append(
                "attention 'fused' was asked for, but the attention layers compute their scores themselves (e.g. "
                "Keras MultiHeadAttention with dropout, keras-hub's Gemma 2 logit soft cap off TPU): they are counted "
                "materialized"
            )
    elif taken != mode:
        notes.append(f"attention {mode!r} was asked for; the layers took {taken!r}")
    seconds = time.perf_counter() - start
    eqns = [e for p in walk.programs.values() for e in p.flat.walk()]  # loop bodies included
    if any(name == "while" for name, _, _ in eqns):
        notes.append(
            "the step runs a while loop, whose number of steps the trace cannot know: its FLOPs are not in the "
            "step-time estimate"
        )
    convolutions = any(name.startswith("conv_general") for name, _, _ in eqns)
    programs, shared = len(walk.programs), walk.shared_input()
    return TracedStep(
        step, variables, platform, mode, taken, remat, seconds, programs, notes, convolutions, labels, shared
    )


class _Walk:
    """The graph walk of `trace_step`: global ids of tensors, programs per signature, gradients."""

    def __init__(self, step, index, cache, rules, remat, mode, platform):
        self.step, self.index, self.cache, self.rules = step, index, cache, rules
        self.remat, self.mode, self.platform = remat, mode, platform
        self.tensor, self.known, self.weights = {}, {}, {}
        self.programs, self.analysed, self.calls = {}, set(), []
        self.cotangents = {}

    def struct(self, t):
        dims = [TRACE_BATCH if (d is None and i == 0) else d for i, d in enumerate(t.shape)]
        return jax.ShapeDtypeStruct(tuple(self.sequence if d is None else d for d in dims), t.dtype)

    def weight_id(self, v):
        if id(v) not in self.weights:
            self.weights[id(v)] = self.step.external(v.shape, v.dtype)
            if id(v) in self.index:
                self.step.weight_of[self.weights[id(v)]] = self.index[id(v)]
        return self.weights[id(v)]

    def program(self, key, make):
        if key not in self.cache:
            self.cache[key] = copy_operands(make()) if self.platform == "gpu" else make()
        p = self.programs[key] = self.cache[key]
        if key not in self.analysed:
            analyse(p, self.rules)
            self.analysed.add(key)
        return p

    def forward(self, node):
        op = node.operation
        leaves, treedef = jax.tree.flatten(
            (node.arguments.args, node.arguments.kwargs), is_leaf=lambda x: isinstance(x, KerasTensor)
        )
        tensors = [(i, leaf) for i, leaf in enumerate(leaves) if isinstance(leaf, KerasTensor)]
        diff_pos = [i for i, t in tensors if is_float(t.dtype) and id(t) not in self.model_inputs]
        const_pos = [i for i, _ in tensors if i not in diff_pos]
        trainable = list(getattr(op, "trainable_variables", []))
        non_trainable = list(getattr(op, "non_trainable_variables", []))
        shapes = {i: self.known[id(t)] if id(t) in self.known else self.struct(t) for i, t in tensors}
        key = (
            type(op).__name__,
            tuple((tuple(v.shape), str(v.dtype)) for v in trainable),
            tuple((tuple(v.shape), str(v.dtype)) for v in non_trainable),
            repr([shapes.get(i, leaf) for i, leaf in enumerate(leaves)]),
            tuple(diff_pos),
            _config_key(op),
            self.remat,
            self.mode,
            self.platform,
        )
        try:
            p = self.program(
                key,
                lambda: trace_layer(
                    op, trainable, non_trainable, leaves, treedef, diff_pos, const_pos, shapes, self.remat
                ),
            )
        except KdistError:
            raise
        except Exception as e:  # any failure of a layer's own code under tracing: name the layer
            why = cause(e)
            batch = (
                f" (a batch of {TRACE_BATCH} is the planner's: it traces at that batch)"
                if str(TRACE_BATCH) in why
                else ""
            )
            error = PlanError(
                f"The planner could not trace layer {op.name!r} ({type(op).__name__}) of the training step: "
                f"{why}{batch}. Plan the model's variables instead (kdist.plan(model.weights, ...): "
                "weights and optimizer state, no activations), or report the layer."
            )
            error.layers = (op, *layers(op), *(output_layer(t) for _, t in tensors))  # it, within it, read by it
            raise error from e
        inputs = {lid: self.weight_id(v) for lid, v in zip(p.w, trainable)}
        inputs.update((lid, self.weight_id(v)) for lid, v in zip(p.c[: len(non_trainable)], non_trainable))
        inputs.update((lid, self.tensor[id(leaves[i])]) for lid, i in zip(p.c[len(non_trainable) :], const_pos))
        inputs.update((lid, self.tensor[id(leaves[i])]) for lid, i in zip(p.a, diff_pos))
        inst = self.step.instance(p, inputs, None)
        self.step.agenda.append(("run", inst, 0, p.n_fwd))
        for kt, lid in zip(keras.tree.flatten(node.outputs), p.out):
            self.tensor[id(kt)] = inst[1][lid]
            self.known[id(kt)] = jax.ShapeDtypeStruct(p.flat.shape[lid], p.flat.dtype[lid])
        self.calls.append((node, inst, trainable, diff_pos, leaves))

    def shared_input(self):
        """Whether layers with weights of their own read one activation (batch first, rank 3 or more) in two or more
        calls: an encoder's output that each decoder layer's cross attention reads."""
        readers = {}
        for node, _, trainable, diff_pos, leaves in self.calls:
            for i in diff_pos if trainable else ():
                if leaves[i].shape[0] is None and len(leaves[i].shape) >= 3:
                    readers.setdefault(id(leaves[i]), set()).add(id(node.operation))
        return any(len(ops) > 1 for ops in readers.values())

    def loss(self, outputs):
        """Keras's SparseCategoricalCrossentropy(from_logits=True) on each float output of rank >= 2; returns the
        labels' traced shape of each: batch TRACE_BATCH, or 1 for an output every example shares (SAM's positions)."""
        self.step.agenda.append(("loss_start",))
        shapes = []
        for kt in outputs:
            if not loss_reads(kt):
                continue
            y = self.known[id(kt)]
            labels = jax.ShapeDtypeStruct(label_shape(y.shape), "int32")
            shapes.append(labels.shape)
            lp = self.program(("loss", repr(y)), lambda: trace_loss(y, labels))
            inputs = {
                lp.a[0]: self.tensor[id(kt)],
                lp.c[0]: self.step.external(labels.shape, "int32"),
                lp.ct[0]: self.step.external(),
            }
            inst = self.step.instance(lp, inputs, "loss")
            self.step.agenda.append(("run", inst, 0, len(lp.flat.eqns)))
            self.step.add_cotangent(self.cotangents, self.tensor[id(kt)], inst[1][lp.ga[0]])
        return tuple(shapes)

    def backward(self, trainable_variables):
        """Every call's backward in reverse, summing cotangents and gradients; then the optimizer update."""
        grads = {}
        for node, inst, trainable, diff_pos, leaves in reversed(self.calls):
            p, mapping = inst
            for kt, lid in zip(keras.tree.flatten(node.outputs), p.ct):
                g = self.cotangents.get(self.tensor[id(kt)])
                mapping[lid] = g if g is not None else self.step.external()
                self.step.readers.setdefault(mapping[lid], []).append((inst, lid))
            self.step.agenda.append(("run", inst, p.n_fwd, len(p.flat.eqns)))
            for lid, v in zip(p.gw, trainable):
                g = mapping[lid]
                if g is None:  # a zero gradient: this call does not use the variable
                    continue
                if id(v) in grads:  # a weight used by several calls: its gradients are summed
                    total = self.step.new(self.step.size[g], self.step.shape[g], "gradients", self.step.dtype[g])
                    self.step.weight_of[total] = self.index.get(id(v))
                    self.step.agenda.append(("acc", total, [grads[id(v)], g]))
                    g = total
                grads[id(v)] = g
            for lid, i in zip(p.ga, diff_pos):
                self.step.add_cotangent(self.cotangents, self.tensor[id(leaves[i])], mapping[lid])
        for v in trainable_variables:
            if id(v) in grads:
                self.step.agenda.append(("opt", grads[id(v)]))

    def materialized_scores(self):
        """Whether some traced call computes attention itself: its forward multiplies two values computed from its
        inputs over batch dimensions (q k^T, p v: full, windowed or reduced scores alike). Not a product with a
        weight (a Dense's, an LSTM's), nor one over no batch dimension (a weight's gradient)."""
        return any(_multiplies_activations(p) for p in self.programs.values())


def _multiplies_activations(p):
    """Whether program `p`'s forward has a batched matrix product of two values made from its inputs other than its
    trainable weights (the model's own inputs included: a nested backbone's first layer reads them)."""
    return _batched_product(p.flat, set(p.a) | set(p.c), p.n_fwd)


def _batched_product(flat, made, end=None):
    """Whether `flat` (up to equation `end`) multiplies two values of `made`, or values made from them, over batch
    dimensions; in a loop that reads them every body input counts (RWKV's and a gated delta net's state updates)."""
    for (prim, ins, outs), params in zip(flat.eqns[:end], flat.params):
        if not made.intersection(ins):
            continue
        if prim == "dot_general" and len(ins) == 2 and params[1][0] and made.issuperset(ins):
            return True
        if isinstance(params, Loop) and _batched_product(params.body, set(params.ins)):
            return True
        made.update(outs)
    return False


def _config_key(op):
    try:
        config = dict(layer_config(op))
    except Exception:  # any failure of a layer's get_config: the signature then goes without it
        return ""
    config.pop("name", None)
    return repr(sorted(config.items(), key=lambda kv: kv[0]))
