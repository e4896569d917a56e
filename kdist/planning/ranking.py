"""Ranking the candidates, the recommendation and its reason, and advice when nothing fits."""

from kdist.checks import MAX_DEVICES
from kdist.meshes.enumerate import meshes
from kdist.planning.candidates import evaluate, smallest_valid_batch
from kdist.planning.memory_model import batch_shards
from kdist.render.plan import short_seconds
from kdist.units import human_bytes


def rank(result, facts):
    """Order the candidates (valid and fitting first, then the fastest estimated step, then memory) and recommend.

    A candidate fits when its peak is at most the plan's budget: (1 - margin)
    x memory_per_device. Without a step-time estimate (no traced step, or a
    target without known peaks) the least communication ranks first.
    """
    budget = result.budget
    for c in result.candidates:
        c.fits = None if budget is None else c.peak <= budget
    ordered = sorted(
        result.candidates, key=lambda c: (not c.valid, c.fits is False, round(_time(c), 12), c.peak, c.spec)
    )
    for i, c in enumerate(ordered, 1):
        c.rank = i
    result.candidates = ordered
    valid = [c for c in ordered if c.valid]
    if not valid:
        result.advice = _no_valid_mesh(result, facts)
        return
    fitting = [c for c in valid if c.fits is not False]
    if not fitting:
        result.advice = _nothing_fits(result, facts, valid)
        return
    result.recommendation = fitting[0]
    result.reason = _reason(result, fitting[0], fitting)


def _reason(result, best, fitting):
    parts = []
    memory = result.memory_per_device
    band = (
        f" (likely {human_bytes(best.band[0])}-{human_bytes(best.band[1])}, the spread on {best.band_class}"
        + (f": {best.band_why}" if best.band_why else "")
        + ")"
        if best.band
        else ""
    )
    if memory is not None:
        parts.append(
            f"fits {human_bytes(memory)} per device with a {result.margin:.0%} margin: peak {human_bytes(best.peak)}"
            f"{band} against a budget of {human_bytes(result.budget)}"
        )
    else:
        parts.append(
            f"peak {human_bytes(best.peak)} per device{band}; no memory_per_device given and none known for the "
            "target, so every valid mesh counts as fitting"
        )
    timed = best.step_seconds is not None
    if len(fitting) > 1:
        runner = fitting[1]
        what = "fastest estimated step" if timed else "least estimated communication per step"
        parts.append(
            f"{what} of {len(fitting)} candidates: {short_seconds(_time(best))} (next: {runner.spec} at "
            f"{short_seconds(_time(runner))})"
        )
    else:
        parts.append("the only candidate that fits")
    if timed:
        parts.append(_why_fastest(best, fitting))
    elif best.comm:
        axis, comm = max(best.comm.items(), key=lambda kv: kv[1]["seconds"])
        parts.append(f"most of it on the {axis} axis ({human_bytes(comm['bytes'])} per step)")
    return "; ".join(parts)


def _time(c):
    """What the ranking orders by: the estimated step time, or the communication time without one."""
    return c.step_seconds if c.step_seconds is not None else c.comm_seconds


def _why_fastest(best, fitting):
    """Which part of the recommended step dominates, and how it compares with the others."""
    compute, exposed = best.compute_seconds, best.exposed_comm_seconds
    if exposed > compute:
        axis = max(best.comm, key=lambda a: best.comm[a]["seconds"]) if best.comm else None
        where = f", most of it on the {axis} axis ({human_bytes(best.comm[axis]['bytes'])} per step)" if axis else ""
        text = (
            f"communication-bound: {short_seconds(exposed)} of communication not hidden behind "
            f"{short_seconds(compute)} of compute{where}"
        )
    else:
        text = f"compute-bound: {short_seconds(compute)} of compute, {short_seconds(exposed)} of communication exposed"
    least = min(fitting, key=lambda c: c.compute_seconds)
    if least is not best and least.compute_seconds < compute:
        text += f" ({least.spec} computes less, {short_seconds(least.compute_seconds)}, but exposes more communication)"
    return text


def _no_valid_mesh(result, facts):
    n, b = result.devices, result.batch_size
    by_batch = [c for c in result.candidates if c.reason.startswith("batch size")]
    shards = [str(s) for s in sorted({batch_shards(c.axes) for c in by_batch})]
    listed = ", ".join(shards[:-1]) + " or " if len(shards) > 1 else ""
    reasons = (
        [f"batch size {b} does not divide by the {listed}{shards[-1]} batch shards (data x fsdp)"] if shards else []
    )
    reasons += sorted({c.reason for c in result.candidates if c.reason} - {c.reason for c in by_batch})
    smallest = smallest_valid_batch(facts, result.candidates, b)
    if smallest is not None:
        result.suggestions["batch_size"] = smallest[0]
        fix = f"batch_size={smallest[0]}, the smallest that makes a mesh valid ({smallest[1].spec}), or "
    else:
        fix = "rules that split more weights, or "
    return (
        f"No mesh of {n} devices is valid for {result.model!r} with batch size {b}: {'; '.join(reasons)}. To plan: "
        f"{fix}a device count that divides the batch and the model's dimensions."
    )


def _nothing_fits(result, facts, valid):
    smallest = min(valid, key=lambda c: c.peak)
    memory, budget = result.memory_per_device, result.budget
    state = smallest.weights + smallest.optimizer + smallest.gathered + smallest.workspace  # no batch shrinks these
    text = (
        f"No candidate fits {human_bytes(memory)} per device with a {result.margin:.0%} margin (a budget of "
        f"{human_bytes(budget)}). The smallest per-device requirement is {human_bytes(smallest.peak)} "
        f"({smallest.spec}: weights {human_bytes(smallest.weights)}, optimizer {human_bytes(smallest.optimizer)}, "
        f"activations {human_bytes(smallest.activations)}, transient buffers {human_bytes(smallest.transient)}, "
        f"inputs {human_bytes(smallest.other)})."
    )
    options = []
    remat = _with_remat(result, facts, valid)
    if remat is not None:
        result.suggestions["remat"] = True
        options.append(remat)
    batch = _largest_fitting_batch(result, facts, valid)
    if batch:
        result.suggestions["batch_size"] = batch
        options.append(f"a batch size of at most {batch} on {result.devices} devices")
    devices = _devices_that_fit(result, facts)
    if devices:
        result.suggestions["devices"] = devices
        options.append(f"{devices} devices (the first multiple of {result.devices} by doubling where a mesh fits)")
    if not options:
        if state > budget:
            smaller = " or a smaller dtype (dtype='bfloat16')" if facts.act_itemsize > 2 else ""
            workspace = f", XLA:GPU's {human_bytes(smallest.workspace)} cuBLAS workspace" if smallest.workspace else ""
            return text + (
                f" Without activations it still needs {human_bytes(state)} (weights, optimizer state, gathered "
                f"weights{workspace}), and more devices (doubling from {result.devices}) do not bring it under the "
                f"budget: shard more of the model (rules), rematerialise (remat=True), use a different optimizer"
                f"{smaller}, or give each device more memory."
            )
        return text + " Use more devices or a smaller batch."
    return text + " To fit: " + ", or ".join(options) + "."


def _with_remat(result, facts, valid):
    """The advice of rematerialising when it makes a mesh fit (and the plan did not already), else None."""
    if facts.remat or facts.traced is None:
        return None
    rematted = facts.retraced(remat=True)
    best = None
    for c in valid:
        peak = evaluate(rematted, c.axes, result.batch_size, result.bandwidth, result.latency, False).peak
        best = (peak, c) if best is None or peak < best[0] else best
    peak, c = best
    if peak > result.budget:
        return None
    timed = evaluate(rematted, c.axes, result.batch_size, result.bandwidth, result.latency)
    if timed.compute_seconds and c.compute_seconds:
        cost = f"+{timed.compute_seconds / c.compute_seconds - 1:.0%} compute per step, estimated"
    else:
        cost = "about +33% compute per step, each layer's forward made again"
    return f"remat=True (per-layer rematerialisation: {c.spec} then peaks at {human_bytes(peak)}, at {cost})"


def _largest_fitting_batch(result, facts, valid):
    """The largest batch size below the requested one with which some mesh fits, or None."""
    memory, best = result.budget, None
    for c in valid:
        split = batch_shards(c.axes)
        state = c.weights + c.optimizer + c.gathered + c.live_gradients + c.workspace
        per_example = (c.peak - state) / max(1, result.batch_size // split)
        if state >= memory or not per_example:
            continue
        batch = min(int((memory - state) // per_example) * split, result.batch_size - split)
        for _ in range(4):  # activations are not exactly linear in the batch: check, then step down
            if batch <= 0 or (best is not None and batch <= best):
                break
            if evaluate(facts, c.axes, batch, result.bandwidth, result.latency, False).peak <= memory:
                best = batch
                break
            batch -= split
    return best


def _devices_that_fit(result, facts, factor_limit=64):
    """The smallest device count, doubling from `devices`, at which some mesh fits; None when doubling stops helping."""
    n, previous = result.devices * 2, None
    while n <= min(result.devices * factor_limit, MAX_DEVICES):
        smallest = None
        for axes in meshes(n, ("fsdp", "model")):  # replicas never lower per-device memory
            c = evaluate(facts, axes, result.batch_size, result.bandwidth, result.latency, False)
            if not c.valid:
                continue
            if c.peak <= result.budget:
                return n
            smallest = c.peak if smallest is None else min(smallest, c.peak)
        if smallest is not None and previous is not None and smallest > 0.9 * previous:
            return None  # what is left does not shrink with more devices
        previous = smallest if smallest is not None else previous
        n *= 2
    return None
