"""Tracing one layer call (or the loss) forward and backward into a flat program over numbered buffers.

Each call is traced with `jax.vjp` under `jax.make_jaxpr`, from abstract
weights and inputs: nothing is compiled or allocated. Sub-programs (jit,
custom_jvp / custom_vjp, checkpoint) are inlined, and so is the branch a
`cond` takes where a static size fixes its index (XLA folds it), so the
result is one straight-line list of operations per call: the forward part,
then the backward part. `kdist.planning.buffers` decides which of its values XLA
would write to memory; `kdist.planning.step` strings the calls of a model
together.
"""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import keras
from jax.extend.core import Literal

from kdist.keras_internals import nodes_by_depth, operation_fn, sublayers
from kdist.planning.attention import FUSED, fused_flops
from kdist.planning.propagation import LOOPS, PARAMS
from kdist.units import is_float

TRACE_BATCH = 7919  # a prime batch size: batch dimensions are recognisable in traced shapes, sizes scale linearly

# Operations whose body is another jaxpr, inlined into the flat program.
INLINE = {
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "checkpoint",
    "remat",
    "remat2",
    "custom_lin",
    "named_call",
}
_BODY = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_TRANSFORMED = re.compile(r"\w+\((.*)\)")
_CHECKPOINT_SCOPES = ("", "rematted_computation")  # what jax.checkpoint puts on the name stack before the layer
# A matrix product's algorithm that rounds its operands to 16 bits (`jax.lax.DotAlgorithmPreset`): XLA:GPU writes a
# float32 operand in that type for cuBLAS (`_rounded_operands`). The _X3/_X6/_X9 presets split float32 in parts instead.
ROUNDING_ALGORITHMS = {
    "BF16_BF16_F32": "bfloat16",
    "BF16_BF16_BF16": "bfloat16",
    "F16_F16_F32": "float16",
    "F16_F16_F16": "float16",
}


class Flat:
    """A straight-line program: `eqns` [(primitive name, input ids, output ids)] over numbered values."""

    def __init__(self):
        self.size, self.shape, self.dtype, self.eqns = [], [], [], []
        self.flops = []  # per equation: 2 x the multiply-adds of a matrix product or convolution (a scan: its body's
        # x its length), else 0
        self.scopes = []  # per equation: its name stack, e.g. "transpose(jvp(block))/self_attention/softmax"
        self.params = []  # per equation: the parameter `kdist.planning.propagation` reads (a loop: its `Loop`), or None
        self.fixed = {}  # value id -> a scalar fixed at trace time (a static size compared with 0), as XLA folds it
        self.rounded = {}  # (value id, 16-bit dtype) -> its cast that matrix products read (`_rounded_operands`)

    def new(self, aval):
        """A new value id for an abstract value (bytes at the traced shape)."""
        shape = tuple(getattr(aval, "shape", ()))
        dtype = str(getattr(aval, "dtype", None))
        self.size.append(math.prod(shape) * _itemsize(dtype))
        self.shape.append(shape)
        self.dtype.append(dtype)
        return len(self.size) - 1

    def append(self, name, ins, outs, scope, params=None, flops=0):
        """Append an equation: its primitive name, input and output ids, name stack, parameter and FLOPs."""
        self.eqns.append((name, ins, outs))
        self.scopes.append(scope)
        self.params.append(params)
        self.flops.append(flops)

    def walk(self):
        """(primitive name, output shapes, scope) of every equation, a loop's body's after the loop's own."""
        for (name, _, outs), params, scope in zip(self.eqns, self.params, self.scopes):
            yield name, [self.shape[o] for o in outs], scope
            if isinstance(params, Loop):
                yield from params.body.walk()


@dataclasses.dataclass
class Loop:
    """A scan's or while loop's body, flattened, for `kdist.planning.propagation` to follow splits through.

    The body's inputs `ins` are `consts`, `carry`, then a scan's per-step
    slices of its stacked inputs; its outputs `outs` are the carry, then a
    scan's per-step results, which it stacks. `reads`: per operand of the
    loop's operation (literals left out), the body input it becomes (None:
    a while loop's condition consts).
    """

    body: Flat
    ins: list
    outs: list
    consts: int
    carry: int
    reads: list


def eqn_flops(eqn):
    """FLOPs of a matrix product, convolution or fused attention (2 per multiply-add) at the traced shapes; 0 for
    anything else.

    dot_general: 2 x |output| x |contracted dimensions|. conv_general_dilated:
    2 x |output| x |kernel| / output features (each output element is one
    dot product over a kernel's input features x window; this also holds for
    grouped convolutions and for the weight-gradient convolution), divided by
    the input dilation: the input gradient of a strided convolution is a
    convolution of the cotangent spread with zeros, which cuDNN skips. Fused attention:
    `kdist.planning.attention.fused_flops`.
    """
    if eqn.primitive in FUSED:
        return fused_flops(eqn)
    name = eqn.primitive.name
    if name not in ("dot_general", "conv_general_dilated"):
        return 0
    out = math.prod(getattr(eqn.outvars[0].aval, "shape", ()))
    lhs, rhs = (tuple(getattr(v.aval, "shape", ())) for v in eqn.invars[:2])
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        return 2 * out * math.prod(lhs[d] for d in contract)
    kernel_out = rhs[eqn.params["dimension_numbers"].rhs_spec[0]] or 1
    dilated = math.prod(eqn.params.get("lhs_dilation") or (1,))  # a strided conv's input gradient: zeros skipped
    return 2 * out * math.prod(rhs) // kernel_out // dilated


def _itemsize(dtype):
    if dtype.startswith("key<"):
        return 8  # a threefry key: two uint32
    if dtype in ("None", "float0"):
        return 0
    try:
        return jnp.dtype(dtype).itemsize
    except TypeError:
        return 4


def _loop(eqn, operands, scope):
    """The `Loop` of a scan or while operation whose operands have ids `operands` (None: a literal), under `scope`."""
    params = eqn.params
    if eqn.primitive.name == "while":
        body, skip, consts = params["body_jaxpr"], params["cond_nconsts"], params["body_nconsts"]
        carry = len(operands) - skip - consts
    else:
        body, skip, (consts, carry) = params["jaxpr"], 0, _scan_counts(params)
    flat = Flat()
    ins = [flat.new(v.aval) for v in getattr(body, "jaxpr", body).invars]
    reads = [ins[k - skip] if k >= skip else None for k, x in enumerate(operands) if x is not None]
    return Loop(flat, ins, flatten(body, ins, flat, scope), consts, carry, reads)


def _scan_counts(params):
    """(consts, carry) of a scan: its parameters, or from jax 0.12 the sizes of its input tree's first two parts."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts.vals)), len(list(carry.vals))


def _body(eqn):
    if eqn.primitive.name not in INLINE:
        return None
    return next((eqn.params[p] for p in _BODY if p in eqn.params), None)


def _folded(eqn, operands):
    """The outputs of a scalar operation on fixed scalars `operands` (an equality of a static size and 0), else []."""
    scalar = eqn.outvars and all(getattr(v.aval, "shape", None) == () for v in eqn.outvars)
    nested = _body(eqn) is not None or eqn.primitive.name in LOOPS or eqn.primitive.name == "cond"
    if not operands or not scalar or nested or eqn.effects or any(x is None for x in operands):
        return []
    try:
        out = eqn.primitive.bind(*operands, **eqn.params)
    except Exception:  # an operation that cannot run eagerly here: left to the program, unfolded
        return []
    return list(out) if eqn.primitive.multiple_results else [out]


def _as_compiled(name, operands):
    """The primitive XLA runs: a division by a scalar fixed at trace time is a multiplication by its inverse (the
    algebraic simplifier's A / Const => A * (1 / Const): dropout's scaling), cheap in any float type; an integer one
    is multiplies and shifts, cheap too (`InstructionFusion::IsExpensive`)."""
    if name == "div" and operands[0] is None and operands[1] is not None:
        return "mul"
    return name


def _taken_branch(eqn, value):
    """The branch a `cond` with a fixed index takes, else None."""
    if eqn.primitive.name != "cond" or value(eqn.invars[0]) is None:
        return None
    branches = eqn.params["branches"]
    return branches[min(max(int(value(eqn.invars[0])), 0), len(branches) - 1)]


def flatten(jaxpr, in_ids, flat, scope="", in_values=()):
    """Append `jaxpr`'s operations to `flat` (sub-jaxprs inlined); returns the ids of its outputs.

    `in_values`: per input, the scalar it is fixed to at trace time, or None (an inlined call's literal operand).
    """
    if hasattr(jaxpr, "jaxpr"):  # a ClosedJaxpr
        jaxpr = jaxpr.jaxpr
    env = dict(zip(jaxpr.invars, in_ids))
    fixed_inputs = {v: x for v, x in zip(jaxpr.invars, in_values) if x is not None}
    for v in jaxpr.constvars:
        env[v] = flat.new(v.aval)

    def get(v):
        return None if isinstance(v, Literal) else env.get(v)

    def value(v):
        if isinstance(v, Literal):
            return v.val
        return fixed_inputs[v] if v in fixed_inputs else flat.fixed.get(env.get(v))

    for eqn in jaxpr.eqns:
        ins = [get(v) for v in eqn.invars]
        operands = [value(v) for v in eqn.invars]  # fixed at trace time, or None
        folded = _folded(eqn, operands)
        body = _body(eqn)
        stack = "/".join(filter(None, (scope, str(eqn.source_info.name_stack))))
        branch = _taken_branch(eqn, value)
        if branch is not None:  # XLA keeps only the branch a fixed index picks (its conditional simplifier)
            body, ins = branch, ins[1:]
        if body is not None:
            outs = flatten(body, ins, flat, stack, operands[len(operands) - len(ins) :])
            for v, o in zip(eqn.outvars, outs):
                env[v] = o if o is not None else flat.new(v.aval)
            continue
        ins = _rounded_operands(eqn, ins, flat, stack)
        outs = [flat.new(v.aval) for v in eqn.outvars]
        env.update(zip(eqn.outvars, outs))
        flat.fixed.update(zip(outs, folded))
        if eqn.primitive.name in LOOPS:
            params = _loop(eqn, ins, stack)
            flops = eqn.params.get("length", 0) * sum(params.body.flops)  # a while loop's count is unknown
        else:
            params, flops = _params(eqn, value), eqn_flops(eqn)
        name = _as_compiled(eqn.primitive.name, operands)
        flat.append(name, [i for i in ins if i is not None], outs, stack, params, flops)
    return [get(v) for v in jaxpr.outvars]


def _rounded_operands(eqn, ins, flat, stack):
    """`ins`, each float32 operand of a matrix product whose algorithm rounds its operands to 16 bits replaced by
    a cast of it to that type, appended to `flat` before the first product reading it so (one cast for all).

    jax's `dot_general` with `precision=BF16_BF16_F32` (the backward of
    `jax.nn.dot_product_attention` in bfloat16: a float32 score gradient
    times bfloat16 keys) lowers to `algorithm=dot_bf16_bf16_f32`, and
    XLA:GPU writes the float32 operand as bfloat16: GPT-NeoX's compiled step
    in bfloat16 has the softmax backward's fusion write `bf16[16,512,512]`
    for the query and key gradients' GEMMs (docs/plan.md, "Which values are
    buffers").
    """
    if eqn.primitive.name != "dot_general":
        return ins
    narrow = ROUNDING_ALGORITHMS.get(getattr(eqn.params.get("precision"), "name", None))
    if narrow is None:
        return ins
    out = []
    for x in ins:
        if x is not None and flat.dtype[x] == "float32" and (x, narrow) not in flat.rounded:
            flat.rounded[x, narrow] = flat.new(jax.ShapeDtypeStruct(flat.shape[x], narrow))
            flat.append("convert_element_type", [x], [flat.rounded[x, narrow]], stack)
        out.append(flat.rounded.get((x, narrow), x))
    return out


def _params(eqn, value):
    """What `Flat.params` keeps of `eqn`: the parameter in `propagation.PARAMS`; a pad's padding config and
    padding value (None when not fixed at trace time), which `zero_pads` reads; else None."""
    name = eqn.primitive.name
    if name == "pad":
        return eqn.params["padding_config"], value(eqn.invars[1])
    return eqn.params.get(PARAMS[name]) if name in PARAMS else None


@dataclasses.dataclass
class Program:
    """One traced call: forward operations (the first `n_fwd`), then backward ones, over `flat`'s ids.

    `w`: trainable weights; `c`: inputs not differentiated (non-trainable
    weights, integer inputs, the model's inputs); `a`: differentiated inputs;
    `out`: forward outputs; `ct`: their cotangents; `gw`: weight gradients;
    `ga`: input cotangents. `kdist.planning.buffers.analyse` adds the rest.
    """

    flat: Flat
    n_fwd: int
    w: list
    c: list
    a: list
    out: list
    ct: list
    gw: list
    ga: list
    name: str = ""
    sublayers: list = dataclasses.field(default_factory=list)  # per equation: see `sublayer_paths`


def trace_program(fn, trainable, const, diff, remat=False, name=""):
    """Trace `fn(trainable, diff, const) -> outputs` and its vjp with respect to `trainable` and `diff`.

    With `remat`, `fn` is wrapped in `jax.checkpoint` (what `keras.remat` and
    `keras.RematScope` do on JAX): only its inputs are saved, and the
    backward part recomputes the forward.
    """
    inner = jax.checkpoint(fn) if remat else fn

    def forward(tw, da, cs):
        return jax.vjp(lambda t, d: inner(t, d, cs), tw, da)

    closed, (out_shape, pullback_shape) = jax.make_jaxpr(forward, return_shape=True)(trainable, diff, const)
    n_out = len(jax.tree.leaves(out_shape))
    saved_shapes, pullback_tree = jax.tree.flatten(pullback_shape)

    def backward(saved, cotangents):
        return jax.tree.unflatten(pullback_tree, saved)(cotangents)

    def cotangent(s):
        floating = jnp.issubdtype(s.dtype, jnp.inexact)
        return jax.ShapeDtypeStruct(s.shape, s.dtype if floating else jax.dtypes.float0)

    backward_closed = jax.make_jaxpr(backward)(saved_shapes, jax.tree.map(cotangent, out_shape))
    flat = Flat()
    n_t, n_d = len(jax.tree.leaves(trainable)), len(jax.tree.leaves(diff))
    in_ids = [flat.new(v.aval) for v in closed.jaxpr.invars]
    outs = flatten(closed, in_ids, flat)
    n_fwd = len(flat.eqns)
    outvars = closed.jaxpr.outvars
    saved = [o if o is not None else flat.new(v.aval) for o, v in zip(outs[n_out:], outvars[n_out:])]
    ct = [flat.new(v.aval) for v in backward_closed.jaxpr.invars[len(saved) :]]
    fixed = [v.val if isinstance(v, Literal) else flat.fixed.get(o) for o, v in zip(outs[n_out:], outvars[n_out:])]
    grads = flatten(backward_closed, saved + ct, flat, in_values=fixed)
    grads = [o if o is not None else flat.new(v.aval) for o, v in zip(grads, backward_closed.jaxpr.outvars)]
    fwd_outs = [o if o is not None else flat.new(v.aval) for o, v in zip(outs[:n_out], outvars[:n_out])]
    w, a, c = in_ids[:n_t], in_ids[n_t : n_t + n_d], in_ids[n_t + n_d :]
    return Program(flat, n_fwd, w, c, a, fwd_outs, ct, grads[:n_t], grads[n_t : n_t + n_d], name=name)


def trace_layer(op, trainable, non_trainable, leaves, treedef, diff_pos, const_pos, shapes, remat):
    """The program of one call of layer `op` in training mode.

    `leaves`/`treedef`: the call's arguments, flattened; the leaves at
    `diff_pos` (float tensors made by other layers) are differentiated, those
    at `const_pos` are not; `shapes` maps positions to `jax.ShapeDtypeStruct`s.
    """

    def fn(tw, da, cs):
        full = list(leaves)
        nt, consts = cs[: len(non_trainable)], cs[len(non_trainable) :]
        for i, x in zip(diff_pos, da):
            full[i] = x
        for i, x in zip(const_pos, consts):
            full[i] = x
        args, kwargs = jax.tree.unflatten(treedef, full)
        mapping = list(zip(trainable, tw)) + list(zip(non_trainable, nt))
        with keras.StatelessScope(state_mapping=mapping):
            outputs = keras.tree.flatten(operation_fn(op, training=True)(*args, **kwargs))
            return [x.value if isinstance(x, keras.Variable) else x for x in outputs]  # a weight returned as it is

    tw = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in trainable]
    cs = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in non_trainable] + [shapes[i] for i in const_pos]
    program = trace_program(fn, tw, cs, [shapes[i] for i in diff_pos], remat=remat, name=op.name)
    program.sublayers = sublayer_paths(op, program.flat.scopes)
    return program


def sublayer_paths(layer, scopes):
    """Per name stack in `scopes`: the path below `layer` of the innermost layer with sublayers that ran it.

    "transpose(jvp(block))/self_attention/softmax" -> "self_attention" (a
    layer with query, key, ... sublayers; softmax has none); an operation of
    the block's own call, or of a leaf layer directly under it, -> "". A leaf
    layer of a functional model (a backbone nested in a task or a segmenter)
    is a node of its graph, as the model's own layers are: its own path.
    """
    memo = {}
    for scope in scopes:
        if scope not in memo:
            path, current = [], layer
            for name in _below(layer, [_unwrapped(c) for c in scope.split("/")]):
                child = next((s for s in sublayers(current) if s.name == name), None)
                if child is None:
                    break
                if not sublayers(child):
                    if nodes_by_depth(current) is not None:  # a node of a functional graph: its own path
                        path.append(name)
                    break
                path.append(name)
                current = child
            memo[scope] = "/".join(path)
    return [memo[s] for s in scopes]


def _below(layer, names):
    """The name stack `names` below `layer`: the first name is the layer's own, or, where the call ran under
    `jax.checkpoint` (`remat=True`), the checkpoint's ("" and "rematted_computation" for its recomputed forward)
    before it."""
    first = 0
    while first < len(names) - 1 and names[first] in _CHECKPOINT_SCOPES and names[first] != layer.name:
        first += 1
    return names[first + 1 :] if names[first] == layer.name else names[1:]


def _unwrapped(component):
    """A name stack component without its transformations: "transpose(jvp(block))" -> "block"."""
    while (inner := _TRANSFORMED.fullmatch(component)) is not None:
        component = inner.group(1)
    return component


def loss_reads(output):
    """Whether the surrogate loss (`trace_loss`) reads a model output: a float one of rank 2 or more."""
    return is_float(output.dtype) and len(output.shape) >= 2


def label_shape(output_shape):
    """The shape of the int labels of the surrogate loss (`trace_loss`) on an output of `output_shape`: the output's
    without its class dimension, or with it where it is 1 (a one-channel map: Keras's loss squeezes a label of the
    output's rank, where it would squeeze the output to the labels' rank and refuse the pair)."""
    shape = tuple(output_shape)
    return shape if shape[-1:] == (1,) else shape[:-1]


def trace_loss(y, labels):
    """The program of Keras's `SparseCategoricalCrossentropy(from_logits=True)` on output `y` and int `labels`."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return trace_program(lambda tw, da, cs: loss(cs[0], da[0]), [], [labels], [y], name="loss")
