"""The step time of one candidate mesh: compute from the traced step, communication scheduled beside it.

An estimate, never a measurement (docs/plan.md, "Step time"):

- compute: every kernel of the traced step (`kdist.planning.timeline.Step`)
  on one device of the mesh, at the roofline of the target: max(FLOPs /
  peak FLOP/s of its dtype, bytes read and written / memory bandwidth),
  summed over kernels. FLOPs are the matrix products' and convolutions'
  (`kdist.planning.trace.eqn_flops`), scaled like the memory model's
  buffers (the batch shard, the model/expert split).
- communication (`kdist.planning.comm`), placed in time by `schedule`:
  gradient all-reduces (data) and reduce-scatters (fsdp) start when their
  gradient is made and run beside the rest of the backward pass, each
  before its weight's optimizer update (all but the last layer's are hidden
  when the backward is long enough); fsdp's
  all-gathers are prefetched one weight ahead of the kernel needing them;
  the model axis's activation all-reduces and the expert axis's all-to-alls
  sit on the critical path: fully exposed.
"""

import numpy as np

from kdist.planning.model_splits import model_split_factors
from kdist.planning.trace import TRACE_BATCH
from kdist.units import is_float, itemsize


def schedule(compute, items):
    """Seconds of a step whose kernels take `compute` seconds each, with collectives run on one stream beside them.

    items: (seconds, issue, need) per collective: it may start when kernel
    `issue` starts (`issue` = the number of kernels: at the end) and must end
    before kernel `need` starts (None: before the step ends). The stream runs
    collectives in the order they may start, one at a time; a kernel waits
    for the collectives it needs, and the wait delays every later kernel.
    Returns (step seconds, exposed communication seconds): the step minus
    the sum of `compute`.

    >>> schedule([1.0, 1.0, 1.0], [(0.5, 1, None)])   # a reduction of what the first kernel made: hidden
    (3.0, 0.0)
    >>> schedule([1.0, 1.0, 1.0], [(2.5, 2, None)])   # of what the second made: 1.5 s past the last kernel
    (4.5, 1.5)
    >>> schedule([1.0, 1.0], [(0.5, 0, 0)])           # a gather the first kernel needs: all exposed
    (2.5, 0.5)
    >>> schedule([1.0, 1.0, 1.0], [(0.5, 1, 2)])      # made by the first kernel, needed by the third: hidden
    (3.0, 0.0)
    """
    compute = np.asarray(compute, dtype=float)
    end = np.cumsum(compute)
    start = np.append(end - compute, end[-1] if len(end) else 0.0)  # start[n]: the end of the last kernel
    total = float(start[-1])
    delay, free = 0.0, 0.0
    for seconds, issue, need in sorted(items, key=lambda item: (start[item[1]], item[2] is None)):
        finish = max(free, start[issue] + delay) + seconds
        free = finish
        if need is not None and finish > start[need] + delay:
            delay = finish - start[need]
    step = float(max(total + delay, free))
    return step, step - total


def step_time(facts, rows, axes, local_batch, comm, factor):
    """{compute, exposed_comm, flops, hbm_bytes} of one training step on one device of mesh `axes`.

    `rows`: the candidate's placed variables; `comm`: its collectives
    (`kdist.planning.comm.communication`); `factor`: the memory model's
    per-buffer scale (`buffer_factors`). None without a traced step or
    without the target's peaks.
    """
    peaks = facts.target.peaks
    if facts.traced is None or peaks is None:
        return None
    flops_per_s, bandwidth, _ = peaks
    static = _static(facts)
    step = facts.traced.step
    n_events = len(step.events)
    scale = itemsize(facts.dtype) if facts.dtype is not None else None
    # Bytes each kernel reads and writes: its buffers at this mesh, the weights it reads as one device holds them.
    sizes = np.asarray(step.size, dtype=np.float64) * factor
    per_weight = np.array([_held_bytes(r, scale) for r in rows[: len(facts.variables)]] + [0.0])
    sizes = np.where(static["external_weight"], per_weight[static["rep"]], sizes)
    hbm = np.bincount(static["pair_event"], weights=sizes[static["pair_buffer"]], minlength=n_events)
    # FLOPs of each kernel on one device: the batch shard, the model/expert split of its operands.
    event_split = np.ones(n_events)
    np.minimum.at(event_split, static["pair_event"], model_split_factors(facts, rows, axes)[static["pair_buffer"]])
    # A kernel reading (or making the gradient of) weights is split as the most split of them is over model/expert
    # (a product's kernel, not the replicated bias or norm scale fused beside it).
    weight_split = np.array([r.gathered_bytes / (r.full_bytes or 1) for r in rows[: len(facts.variables)]] + [1.0])
    by_weights = np.full(n_events, np.inf)
    np.minimum.at(by_weights, static["weight_pair_event"], weight_split[static["weight_pair_rep"]])
    event_split = np.where(np.isfinite(by_weights), by_weights, event_split)
    flops = static["flops"] * event_split * np.where(static["batched"], local_batch / TRACE_BATCH, 1.0)
    peak = np.array([flops_per_s.get(facts.dtype or d, flops_per_s["float32"]) for d in static["dtypes"]])
    seconds = np.maximum(flops / peak[static["dtype_id"]], hbm / bandwidth)
    total, exposed = schedule(seconds, _collectives(facts, rows, axes, comm, scale))
    exposed += sum(comm[a]["seconds"] for a in ("model", "expert") if a in comm)  # on the critical path
    return {
        "compute": float(seconds.sum()),
        "exposed_comm": float(exposed),
        "flops": float(flops.sum()),
        "hbm_bytes": float(hbm.sum()),
    }


def _collectives(facts, rows, axes, comm, scale):
    """(seconds, issue event, need event or None) of the data and fsdp axes' collectives, each weight's share."""
    step = facts.traced.step
    born, _, _, _ = step.lifetimes()
    rep = facts.representative_index([v.path for v in facts.traced.variables])
    grad_bytes = {v: rows[rep[v]].bytes(scale) for v, _, _ in step.final_grads}
    items = []

    def share(axis, of, chosen):
        if axis not in comm:
            return {}
        seconds = sum(c["seconds"] for c in comm[axis]["collectives"] if c["of"] == of)
        total = sum(grad_bytes.get(v, 0) for v in chosen) or 1
        return {v: seconds * grad_bytes.get(v, 0) / total for v in chosen}

    sharded = {v for v in grad_bytes if rows[rep[v]].split_over("fsdp")} if axes.get("fsdp", 1) > 1 else set()
    reductions = {**share("data", "gradients", list(grad_bytes))}
    fsdp_reductions = {
        **share("fsdp", "gradients", sorted(sharded)),
        **share("fsdp", "gradients of unsharded weights", sorted(set(grad_bytes) - sharded)),
    }
    for v, g, update in step.final_grads:  # from the end of the kernel making the gradient to its update
        for table in (reductions, fsdp_reductions):
            if v in table:
                items.append((table[v], int(born[g]) + 1, update))
    split = step.bwd_start if step.bwd_start is not None else len(step.events)
    for backward, of in ((False, "weights (forward)"), (True, "weights (backward)")):
        seconds = share("fsdp", of, sorted(sharded))
        needs = []
        for v in seconds:
            times = [t for t in step.weight_uses.get(v, ()) if (t >= split) == backward]
            if times:
                needs.append((times[0], v))
        previous = 0
        for need, v in sorted(needs):  # each gather may start when the kernel needing the one before starts
            items.append((seconds[v], previous, need))
            previous = need
    return items


def _held_bytes(row, scale):
    """Bytes of one weight a kernel reads on one device: its shard, gathered over fsdp, in the planned dtype."""
    if scale is None or not is_float(row.dtype):
        return row.gathered_bytes
    return row.gathered_bytes // itemsize(row.dtype) * scale


def _static(facts):
    """The per-event arrays the step time needs that no mesh changes (computed once per plan)."""
    if facts._timing_static is not None:
        return facts._timing_static
    step = facts.traced.step
    pair_event, pair_buffer = [], []
    for t, (made, used, _) in enumerate(step.events):
        for b in (*made, *used):
            pair_event.append(t)
            pair_buffer.append(b)
    batched = [any(d > 0 and d % TRACE_BATCH == 0 for s in shapes for d in s) for shapes in step.event_shapes]
    dtypes = sorted(set(step.event_dtype)) or ["float32"]
    rep_of = facts.representative_index([v.path for v in facts.traced.variables])
    var = [step.weight_of.get(g) for g in range(len(step.size))]
    rep = np.array([rep_of[v] if v is not None else -1 for v in var], dtype=int)
    pair_event, pair_buffer = np.array(pair_event, dtype=int), np.array(pair_buffer, dtype=int)
    pair_rep = rep[pair_buffer]
    static = {
        "weight_pair_event": pair_event[pair_rep >= 0],
        "weight_pair_rep": pair_rep[pair_rep >= 0],
        "pair_event": pair_event,
        "pair_buffer": pair_buffer,
        "batched": np.array(batched, dtype=bool),
        "flops": np.array(step.event_flops, dtype=np.float64),
        "dtypes": dtypes,
        "dtype_id": np.array([dtypes.index(d) for d in step.event_dtype], dtype=int),
        "rep": rep,
        "external_weight": (np.array(step.term) == "external") & (rep >= 0),
    }
    facts._timing_static = static
    return static
