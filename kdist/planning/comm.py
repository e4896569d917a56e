"""Communication per training step: the collectives of each mesh axis and their alpha-beta time (docs/plan.md)."""

import math

# XLA's combiners merge independent all-reduces, all-gathers and reduce-scatters up to this many bytes
# (kDefault{AllReduce,AllGather,ReduceScatter}CombineThreshold, xla/service/collective_utils.h): the latency
# term counts the combined collectives, not one per variable.
COMBINE_THRESHOLD = 30 * 1024 * 1024


def communication(facts, rows, axes, local_batch, bandwidth, latency, scale):
    """Per mesh axis: the collectives of one training step, their payload bytes and alpha-beta seconds."""
    comm = {}
    tokens = local_batch * facts.tokens_per_example
    grads = [(r, r.bytes(scale) * r.count) for r in rows]
    d = axes.get("data", 1)
    if d > 1:
        comm["data"] = collectives(
            [("all-reduce", "gradients", sum(b for _, b in grads), _count(grads))], d, bandwidth, latency
        )
    f = axes.get("fsdp", 1)
    if f > 1:
        on = [(r, b) for r, b in grads if r.split_over("fsdp")]
        off = [(r, b) for r, b in grads if not r.split_over("fsdp")]
        gathered = sum(b * f for _, b in on)
        comm["fsdp"] = collectives(
            [
                ("all-gather", "weights (forward)", gathered, _count(on)),
                ("all-gather", "weights (backward)", gathered, _count(on)),
                ("reduce-scatter", "gradients", gathered, _count(on)),
                ("all-reduce", "gradients of unsharded weights", sum(b for _, b in off), _count(off)),
            ],
            f,
            bandwidth,
            latency,
        )
    for axis in ("model", "expert"):
        n = axes.get(axis, 1)
        if n == 1:
            continue
        features = [(activation_features(r, axis), r.count) for r in rows]
        features = [(x, c) for x, c in features if x]
        kind = "all-reduce" if axis == "model" else "all-to-all"
        what = "activations of sharded layers" if axis == "model" else "tokens routed to experts"
        payload = sum(tokens * x * facts.act_itemsize * c for x, c in features)
        items = [(kind, what, payload, sum(c for _, c in features), False)]  # each waits for the layer before
        comm[axis] = collectives(items, n, bandwidth, latency)
    return comm


def _count(rows):
    return sum(r.count for r, _ in rows)


def activation_features(row, axis):
    """Features of the activation a layer with this weight exchanges over `axis`, or 0.

    A weight split over its first dimension (row-parallel: attention output,
    MLP down, a vocabulary-sharded embedding) all-reduces its output in the
    forward pass; one split over a later dimension (column-parallel: q/k/v,
    MLP up) all-reduces its input's gradient in the backward pass.
    """
    dims = [axis in ((a,) if isinstance(a, str) else (a or ())) for a in row.spec]
    if not any(dims) or len(row.shape) < 2:
        return 0
    if axis == "expert":
        return row.shape[1]
    return row.shape[-1] if dims[0] else row.shape[0]


def collectives(items, n, bandwidth, latency):
    """Alpha-beta cost of collectives over an axis of `n` devices.

    all-reduce: 2(n-1)/n * bytes / bandwidth + 2(n-1) * latency per launch;
    all-gather, reduce-scatter, all-to-all: (n-1)/n * bytes / bandwidth + (n-1) * latency.
    items: (kind, of what, bytes, count[, combinable]); `count` collectives of
    weights and gradients (combinable, the default) are launched as
    ceil(bytes / COMBINE_THRESHOLD) combined ones (at most `count`), as XLA's
    combiners do; activations' collectives (combinable False) one by one.
    """
    listed, total_bytes, seconds = [], 0, 0.0
    for kind, what, nbytes, count, *combinable in items:
        if not count:
            continue
        launches = count
        if (combinable or [True])[0] and kind != "all-to-all":
            launches = min(count, max(1, math.ceil(nbytes / COMBINE_THRESHOLD)))
        steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
        t = steps / n * nbytes / bandwidth + steps * latency * launches
        listed.append(
            {"kind": kind, "of": what, "bytes": int(nbytes), "count": count, "launches": launches, "seconds": t}
        )
        total_bytes += int(nbytes)
        seconds += t
    return {"size": n, "collectives": listed, "bytes": total_bytes, "seconds": seconds}


def validity(rows, axes, batch_size, split):
    """(valid, reason) of a candidate: its batch shards divide the batch, and each weight axis splits some weight."""
    if batch_size % split:
        return False, f"batch size {batch_size} does not divide by the {split} batch shards (data x fsdp)"
    for axis in ("model", "expert", "fsdp"):
        if axes.get(axis, 1) > 1 and not any(r.split_over(axis) for r in rows):
            return False, f"no weight divides by {axis}={axes[axis]}: every weight would be replicated over it"
    return True, ""
