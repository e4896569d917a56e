"""The memory of one training step on one device, term by term (docs/plan.md, "Memory per device").

Weights, gradients and optimizer state come from each variable's placement
(the placement engine's layouts: the inspector's numbers exactly). The
rest comes from the traced step's timeline (`kdist.planning.step`): every
buffer is rescaled to the candidate's mesh (its batch shard, its model-axis
shard, its weight's shard), and the sweep's peak gives what is alive then:
the activations kept for the backward pass, the gradients made so far, the
loss's buffers, backward temporaries and FSDP's gathered weights.

    peak = weights + optimizer + inputs + max over the step of the live buffers
"""

import dataclasses
import math

import keras
import numpy as np

from kdist.meshes.layout import shard_bytes, split_by
from kdist.planning import model_splits, partial_sums, unreduced
from kdist.planning.branches import with_deferred_branches
from kdist.planning.column_reductions import FEWEST_ROWS, RACE_FREE_COLUMNS
from kdist.planning.convolutions import AFTER_FIRST_POOL, EARLY, LATE
from kdist.planning.gradient_waits import reduction_groups, reduction_order
from kdist.planning.timeline import TERMS
from kdist.planning.trace import TRACE_BATCH
from kdist.units import is_float, itemsize

# XLA:GPU's DotMerger merges GEMMs of which one moves at most this many bytes (xla_gpu_dot_merger_threshold_mb: 32).
DOT_MERGER_BYTES = 32 * 2**20
# XLA:GPU gives each cuBLAS GEMM custom call a workspace, an s8[4194304] output alive while the GEMM runs (every
# deviceless compile's buffer assignment): where XLA's peak is at a GEMM it holds one (`workspace_peak`).
GEMM_WORKSPACE = 4 * 2**20
# On a mesh that splits the batch beside a model axis of at least this many devices, XLA:GPU gathers a matrix
# product's operand again where its weight gradient runs instead of keeping the forward's whole copy (`regathered`);
# beside a model axis of 2, only an operand a forward kernel other than a matrix product reads split too.
REGATHER_MODEL_AXIS = 3


@dataclasses.dataclass(frozen=True)
class PlacedVariable:
    """A representative variable laid out on one candidate mesh; `count` variables are laid out alike.

    `gathered_bytes`: what one device holds of it after FSDP's all-gather
    (its shard with the fsdp axis undone), equal to `shard_bytes` when fsdp
    does not split it.
    """

    kind: str
    shape: tuple
    dtype: str
    spec: tuple
    shard_bytes: int
    count: int
    gathered_bytes: int = 0

    def bytes(self, itemsize_override=None):
        """Bytes on one device of one of these variables, in `itemsize_override` bytes per element for floats."""
        if itemsize_override is None or not is_float(self.dtype):
            return self.shard_bytes
        return self.shard_bytes // itemsize(self.dtype) * itemsize_override

    def split_over(self, axis):
        return any(split_by(self.spec, axis))

    @property
    def full_bytes(self):
        return math.prod(self.shape) * itemsize(self.dtype)


def placed_variables(facts, dims):
    """Every representative variable (weights, then optimizer state) laid out on mesh `dims`."""
    placer, sizes = facts.placer(dims), dims.axis_sizes
    rows, by_path = [], {}
    for v in facts.variables:
        sibling = facts.siblings.get(v.path)
        if sibling is not None:  # placed first: the variable's rule follows its layout
            placer.place(sibling.path, sibling.shape)
        spec = placer.place(v.path, v.shape).axes
        kind = "trainable" if getattr(v, "trainable", True) else "non_trainable"
        row = _row(kind, v, spec, sizes, facts.counts.get(v.path, 1))
        rows.append(row)
        by_path[v.path] = row
    for v in facts.optimizer_variables:
        reference = facts.slots.get(id(v))
        if reference is not None:
            spec, count = by_path[reference.path].spec, by_path[reference.path].count
        else:  # the optimizer's own: counted as often as the weight it was made for
            owner = facts.owners.get(id(v))
            spec = placer.place(v.path, v.shape, optimizer_state=True).axes
            count = by_path[owner.path].count if owner is not None else 1
        rows.append(_row("optimizer", v, spec, sizes, count))
    return rows


def _row(kind, variable, spec, sizes, count):
    shape, dtype = tuple(variable.shape), str(variable.dtype)
    size = itemsize(dtype)
    gathered = shard_bytes(shape, spec, {**sizes, "fsdp": 1}, size)
    return PlacedVariable(kind, shape, dtype, tuple(spec), shard_bytes(shape, spec, sizes, size), count, gathered)


def batch_shards(axes):
    """How many ways mesh `axes` (role -> size) splits the batch: data x fsdp."""
    return axes.get("data", 1) * axes.get("fsdp", 1)


def total_bytes(rows, itemsize_override=None):
    return int(sum(r.bytes(itemsize_override) * r.count for r in rows))


def memory_terms(facts, rows, axes, batch_size):
    """Per-device bytes of each term of the step's peak on mesh `axes` (role -> size), and where the peak is.

    Returns weights, gradients (all of them: the gradient state), optimizer,
    other (the batch shard), and from the timeline at its peak: activations,
    live_gradients, loss, backward, gathered, workspace (a GEMM's, where the
    peak is at one: `workspace_peak`), transient (the sum of those five) and
    phase ("forward", "backward" or "optimizer update"; None untraced).
    """
    scale = itemsize(facts.dtype) if facts.dtype is not None else None
    trainable = [r for r in rows if r.kind == "trainable"]
    local_batch = -(-batch_size // batch_shards(axes))
    terms = {
        "weights": total_bytes([r for r in rows if r.kind in ("trainable", "non_trainable")], scale),
        "gradients": total_bytes(trainable, scale),
        "optimizer": total_bytes([r for r in rows if r.kind == "optimizer"], scale),
        "other": input_bytes(facts, local_batch),
    }
    traced = facts.traced
    if traced is None:  # no layer graph: every gradient is counted alive, activations are unknown
        live = {"activations": 0, "gradients": terms["gradients"], "loss": 0, "backward": 0, "gathered": 0}
        live["unreduced"], live["workspace"], phase = 0, 0, None
    else:
        factor, copies = regathered(facts, rows, axes, buffer_factors(facts, rows, axes, local_batch))
        factor, sums = partial_sums.reduced_at_once(facts, rows, axes, factor, batch_shards(axes) > 1)
        born, ordered = reduction_order(traced.step, factor, axes, traced.remat) or (None, None)

        def swept(last, deferred=False):  # live bytes per term after each event, the copies gathered again among
            # the gathered, the partial sums before their reduce-scatter among the backward's; `deferred`: with a
            # branch of the backward run late where that costs most
            last = merged_gemm_lasts(traced.step, last, factor, axes)
            curves = traced.step.sweep(factor, last, born)
            if deferred:
                curves = with_deferred_branches(traced.step, curves, factor, last)
            return curves | {"gathered": curves["gathered"] + copies, "backward": curves["backward"] + sums}

        overlap = collectives_overlap(traced.step, axes)  # XLA's scheduler reorders the step
        curves = swept(scheduler_lasts(traced.step, ordered, axes), deferred=overlap)
        t = int(sum(curves.values()).argmax())
        live = {term: int(curves[term][t]) for term in TERMS} | {"workspace": 0}
        # the trace's order: without collectives no scheduler reorders it, and `curves` is that already
        in_order = swept(ordered) if overlap else curves
        at_gemm = workspace_peak(traced.step, in_order)
        if at_gemm is not None and sum(at_gemm[1].values()) > sum(live.values()):
            t, live = at_gemm
        phase = traced.step.phase(t)
    terms["activations"] = live["activations"]
    terms["live_gradients"] = live["gradients"]
    terms["loss"], terms["gathered"] = live["loss"], live["gathered"]
    terms["backward"] = live["backward"] + live["unreduced"]  # FSDP's whole local gradients before reduce-scatter
    terms["workspace"] = live["workspace"]
    terms["transient"] = live["gradients"] + live["loss"] + terms["backward"] + live["gathered"] + live["workspace"]
    terms["phase"] = phase
    return terms


def workspace_peak(step, curves):
    """(event, {term: bytes}) where `curves` peak with a cuBLAS workspace beside a GEMM, on a GPU target; else None.

    XLA:GPU gives each cuBLAS GEMM a workspace (`GEMM_WORKSPACE`),
    alive while it runs: where XLA's peak is at a GEMM it holds one. On a
    small step that is most of what XLA compiles over the rest of the
    estimate (CLIP's vision encoder on fsdp=8: 36.3 MB of step buffers
    against XLA's 40.4 MB, its peak at the backward's first GEMM). `curves`
    (`Step.sweep`) are the trace's order, without the scheduler's worst
    order, which bounds from above what is alive anywhere in a sublayer's
    backward and is not an order at which a GEMM runs (docs/plan.md, "The
    cuBLAS workspace").
    """
    if step.rules.platform != "gpu" or not any(step.event_gemms):
        return None
    workspace = GEMM_WORKSPACE * np.append(np.asarray(step.event_gemms, dtype=np.int64), 0)  # none after the last event
    t = int((sum(curves.values()) + workspace).argmax())
    return t, {term: int(curves[term][t]) for term in TERMS} | {"workspace": int(workspace[t])}


def regathered(facts, rows, axes, factor):
    """`factor` with the buffers a matrix product gathers again counted split, and the whole copies per event.

    On a mesh that splits the batch beside a model axis of `REGATHER_MODEL_AXIS`
    devices or more, XLA:GPU keeps the split value a projection's forward
    gathers (a normalized residual stream split over hidden), not the whole
    copy, and gathers it again for the kernels that read it: a weight
    gradient's at the end of the backward, where it runs, every layer's in one
    combined all-gather (RoBERTa and DeiT on data=2,model=4, CLIP's vision
    encoder on fsdp=2,model=4, Llama 3 and Falcon on data=2,model=3:
    docs/plan.md, "Gathered again"). So each kernel reading one holds its
    whole copy while it runs, and a reduction group's weight-gradient kernels
    (`reduction_groups`) hold theirs together at the group's end, each buffer
    once (the query's, key's and value's share their input's). Beside a
    model axis of 2 only a buffer a forward kernel other than a matrix
    product reads too is gathered again (a post-norm residual stream:
    XLM-RoBERTa on data=2,model=2); a pre-norm block's normalized value keeps
    its whole copy (DeiT on data=4,model=2). A value a cast down to 16 bits
    makes (a float32 norm's output, mixed precision's copies) keeps its
    gathered copy, as do other meshes, one device and other platforms.
    Returns (factor, copies: bytes per event, zeros where nothing is gathered again).
    """
    step = facts.traced.step
    copies = np.zeros(len(step.events) + 1)
    shares = model_splits.regather_shares(facts, rows, axes)
    if shares is None or batch_shards(axes) == 1 or step.rules.platform != "gpu":
        return factor, copies
    if axes.get("model", 1) < REGATHER_MODEL_AXIS:
        shares = np.where(_read_elementwise_in_forward(step), shares, 1.0)
    sizes, split = np.asarray(step.size, dtype=np.float64), factor * shares
    extra = sizes * (factor - split)
    for t, reads in reduction_groups(step, sizes * split):
        copies[t] += extra[np.unique(np.concatenate(reads))].sum()
    events, buffers = step.reads()
    others = np.bincount(events, weights=extra[buffers], minlength=len(step.events))
    others[[t for t, _, _ in step.gradient_kernels()]] = 0  # the weight gradients' kernels: by group, above
    copies[: len(step.events)] += others
    return split, copies


def _read_elementwise_in_forward(step):
    """Per buffer: whether a forward kernel other than a matrix product reads it (a post-norm residual stream)."""
    events, buffers = step.reads()
    other = (events < step.bwd_start) & ~np.asarray(step.event_gemms, dtype=bool)[events]
    return np.bincount(buffers[other], minlength=len(step.size)) > 0


def collectives_overlap(step, axes):
    """Whether XLA overlaps collectives with compute on mesh `axes`: several devices, not XLA:CPU (whose
    collectives are not asynchronous)."""
    return math.prod(axes.values()) > 1 and step.rules.platform != "cpu"


def scheduler_lasts(step, last, axes):
    """Each buffer's last read when XLA's latency-hiding scheduler orders the backward, or `last` unchanged.

    On a mesh of several devices XLA:GPU's latency-hiding scheduler orders
    kernels to hide the collectives, not to save memory (until the step nears
    its limit, `targets.scheduler_limit`). Modelled as the worst order within
    each sublayer's backward (`Step.sublayer_spans`: an attention, an MLP, a
    block's own operations): every activation or backward temporary the run
    reads for the last time stays alive until its last kernel (docs/plan.md).
    One device (nothing to overlap) and XLA:CPU (collectives are not
    asynchronous) keep the trace's order.
    """
    if not collectives_overlap(step, axes):
        return last
    last = (step.lifetimes()[1] if last is None else last).copy()
    if not step.sublayer_spans:
        return last
    firsts, ends = (np.array(column) for column in zip(*[(f, e) for f, e, _ in step.sublayer_spans]))
    span = np.maximum(np.searchsorted(firsts, last, side="right") - 1, 0)  # the last span starting at or before
    terms = np.array(step.term)
    kept = ((terms == "activations") | (terms == "backward")) & (last >= firsts[span]) & (last <= ends[span])
    last[kept] = ends[span[kept]]
    return last


def merged_gemm_lasts(step, last, factor, axes):
    """Each buffer's last read when XLA:GPU merges biased GEMMs that share an input, or `last` unchanged.

    XLA's DotMerger makes one GEMM of those that read the same input with the
    same dimension numbers when one of them moves at most `DOT_MERGER_BYTES`
    (its input and output; the weights are left out), and the merged output
    lives until the last read of any part of it (xla/service/dot_merger.h).
    On a mesh of several devices XLA's scheduler reads it again in the
    layer's backward, where it adds one projection's bias afresh (k's, for
    the query-gradient GEMM: GPT-2, BERT and ViT on data=8; on one device it
    does that in the forward): the merged output stays alive until the last
    read of the biased sums, beside them but for the one made afresh. So all
    but the smallest of the group's GEMM outputs live that long (docs/plan.md,
    "Merged q/k/v projections"); GEMMs without a bias (whose sums are their
    outputs) all live until the last read of any of them. One device and
    other platforms keep the trace's lives.
    """
    if math.prod(axes.values()) == 1 or step.rules.platform != "gpu" or not step.merged:
        return last
    last = (step.lifetimes()[1] if last is None else last).copy()
    sizes = np.asarray(step.size, dtype=np.float64) * factor
    for shared, outs, sums in step.merged:
        kept = [x for x in sums if x is not None]
        if not kept or ((0.0 if shared is None else sizes[shared]) + sizes[outs]).min() > DOT_MERGER_BYTES:
            continue
        longer = outs if list(sums) == list(outs) else sorted(outs, key=lambda o: sizes[o])[1:]
        last[longer] = np.maximum(last[longer], last[kept].max())
    return last


def _pool_orders(step, axes, factor, events):
    """Per max pool gradient event of `events`: when XLA's scheduler makes its indices (`Step.overlapped`).

    `EARLY` where a collective runs in the backward before it, to overlap
    with them: on a model axis its all-reduces of input gradients do,
    elsewhere a combined reduction of weight gradients (`reduction_groups`,
    their bytes from `factor`) that starts before the event. Else, where a
    data axis all-reduces the gradients, `AFTER_FIRST_POOL` for every pool
    but the backward's first; `LATE` for the rest, and on one device or
    XLA:CPU (`collectives_overlap`).
    """
    late = np.full(len(events), LATE)
    if not collectives_overlap(step, axes) or not step.overlapped:
        return late
    if axes.get("model", 1) > 1:
        return np.full(len(events), EARLY)
    groups = reduction_groups(step, np.asarray(step.size, dtype=np.float64) * factor)
    first_pool = events[events >= 0].min()  # the backward's first max pool gradient
    after = (events > first_pool) if axes.get("data", 1) > 1 else np.zeros(len(events), dtype=bool)
    order = np.where(after, AFTER_FIRST_POOL, late)
    return np.where(events > groups[0][0], EARLY, order) if groups else order


def buffer_factors(facts, rows, axes, local_batch):
    """Per traced buffer: the factor from its bytes at the traced batch to its bytes on one device of `axes`.

    - a weight's copy (mixed precision's cast) or gradient: its weight's
      shard / full size, from the candidate's placement;
    - FSDP's gathered copy: the weight gathered over fsdp (still split over
      model/expert), 0 when fsdp does not split it;
    - a buffer with a batch dimension: x local batch / TRACE_BATCH;
    - a buffer the model (expert) axis splits, followed from the weights'
      layouts through the step (`kdist.planning.model_splits`): / its size;
    - a whole copy XLA's partitioner makes (an FFT's, `Step.unpartitioned`):
      the global batch less the device's own part (the FFT's own operand
      and output, counted beside it) where the batch is split; where a model
      axis alone splits it, one more part (XLA's distributed FFT); else 0;
    - a column reduction's side output (`Step.column_rows`): 0 where the
      device's rows are more than `column_reductions.RACE_FREE_COLUMNS` or
      fewer than `FEWEST_ROWS` (a softmax's input, rows None: on every mesh);
    - with `dtype=`: float buffers in that dtype.
    """
    static = _static(facts)
    shard, gathered = np.ones(len(facts.variables) + 1), np.zeros(len(facts.variables) + 1)
    for i, r in enumerate(rows[: len(facts.variables)]):
        full = r.full_bytes or 1
        shard[i] = r.shard_bytes / full
        gathered[i] = r.gathered_bytes / full if r.split_over("fsdp") else 0.0
    out = model_splits.model_split_factors(facts, rows, axes)
    out = np.where(static["batch"], out * local_batch / TRACE_BATCH, out)
    own = out[static["copied"]]  # an unpartitioned copy's: the device's part, the buffer it copies
    rep = static["rep"]  # -1 (no weight) picks the sentinel: shard 1, gathered 0
    out = np.where(static["weighty"], shard[rep], out)
    out = np.where(static["gathered"], gathered[rep], out)
    made = _pool_orders(facts.traced.step, axes, out, static["overlapped_before"])
    out = np.where((static["overlapped"] >= 0) & (static["overlapped"] != made), 0.0, out)
    whole = np.where(static["batch"], local_batch * batch_shards(axes) / TRACE_BATCH, 1.0)
    if batch_shards(axes) > 1:  # gathered: the whole batch beside the device's part
        beyond_own = np.maximum(whole - own, 0.0)
    else:  # features split over a model axis: XLA's own distributed FFT holds two more parts while it runs
        beyond_own = np.where(own < whole, own, 0.0)
    out = np.where(static["unpartitioned"], beyond_own, out)
    unreduced.lookup_factors(facts.traced.step, rows, static["rep"], out, axes.get("fsdp", 1))
    rows = static["column_rows"] * local_batch  # a column reduction's side output: written for some row counts
    out = np.where((rows > 0) & ((rows > RACE_FREE_COLUMNS) | (rows < FEWEST_ROWS)), 0.0, out)
    if facts.dtype is not None:
        out = out * np.where(static["floating"], itemsize(facts.dtype) / static["itemsize"], 1.0)
    return out


def _static(facts):
    """What `buffer_factors` needs of the traced step that no mesh changes (computed once per plan)."""
    if facts._buffer_static is not None:
        return facts._buffer_static
    step = facts.traced.step
    rep_of = facts.representative_index([v.path for v in facts.traced.variables])
    n = len(step.size)
    var = np.array([step.weight_of.get(g, -1) if step.weight_of.get(g) is not None else -1 for g in range(n)])
    rep = np.array([rep_of[v] if v >= 0 else -1 for v in var], dtype=int)
    terms = np.array(step.term)
    batch = np.array(step.batch, dtype=bool)
    floating = np.array([_floating(d) for d in step.dtype])
    sizes = np.array([_itemsize(d) for d in step.dtype], dtype=float)
    copied = np.array([step.unpartitioned.get(g, g) for g in range(n)], dtype=int)
    facts._buffer_static = {
        "rep": rep,
        "batch": batch,
        "weighty": (rep >= 0) & (terms != "external") & ~batch & (terms != "gathered") & (terms != "unreduced"),
        "gathered": (terms == "gathered") | (terms == "unreduced"),
        "unpartitioned": copied != np.arange(n),
        "floating": floating,
        "itemsize": np.where(sizes > 0, sizes, 1.0),
        # a max pool gradient's buffer: when it is made (`convolutions.LATE`, ...), kept only on the meshes where
        # XLA makes it then, for the pool at event "overlapped_before"; -1: any other buffer (`_pool_orders`)
        "overlapped": np.array([int(step.overlapped[g][0]) if g in step.overlapped else -1 for g in range(n)]),
        "overlapped_before": np.array([step.overlapped[g][1] if g in step.overlapped else -1 for g in range(n)]),
        "copied": copied,  # an FFT's whole copy -> the buffer it copies; any other buffer -> itself
        "column_rows": np.array([step.column_rows.get(g) or 0 for g in range(n)]),  # 0: on every mesh
    }
    return facts._buffer_static


def _floating(dtype):
    try:
        return is_float(dtype)
    except TypeError:
        return False


def _itemsize(dtype):
    try:
        return itemsize(dtype)
    except TypeError:
        return 0


def input_bytes(facts, local_batch):
    """One batch shard of inputs and integer labels (one per output position)."""
    if facts.inputs is None:
        return 0
    total = 0
    for s in keras.tree.flatten(facts.inputs):
        total += local_batch * math.prod(s.shape[1:]) * itemsize(s.dtype)
    for shape in facts.traced.labels if facts.traced is not None else ():  # batch TRACE_BATCH, or 1: shared
        total += (local_batch if shape[0] == TRACE_BATCH else shape[0]) * math.prod(shape[1:]) * 4
    return int(total)
