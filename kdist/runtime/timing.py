"""Timing compiled training steps: each step alone, with the devices synchronised, and a bare loop beside it."""

import statistics
import time

import jax
import numpy as np

# Timed and bare-loop steps alternate in blocks of this many steps. One step
# keeps the comparison within a few percent even on a loaded machine; blocks
# of 5 already let bursts of load hit one side and not the other.
CHECK_BLOCK = 1


def run_steps(compiled, state, batches, count, offset):
    """Run `count` steps, each timed alone. Returns the state, step times, logs and loop overhead."""
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


def step_losses(logs):
    """Each step's own loss. Keras logs the running mean of the loss over the
    steps so far; with equal batches, step k's loss is k*mean_k - (k-1)*mean_(k-1).
    Reading it this way keeps the timed loop free of metric resets."""
    means = [float(entry["loss"]) for entry in logs]
    return [k * m - (k - 1) * prev for k, (m, prev) in enumerate(zip(means, [0.0] + means), start=1)]


def timed_steps(compiled, state, batches, steps, offset, check):
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
        state, block_times, block_logs, block_overhead = run_steps(compiled, state, batches, count, first)
        times, logs, overhead = times + block_times, logs + block_logs, overhead + block_overhead
        if shadow is not None and not block % 2:
            shadow, bare = _bare_steps(compiled, shadow, batches, count, first)
            direct += bare
    return state, times, logs, overhead, direct


def _bare_steps(compiled, state, batches, count, offset):
    """The compiled step timed in a bare loop that keeps nothing."""
    times = []
    for i in range(count):
        start = time.perf_counter()
        logs, state = compiled(state, batches[(offset + i) % len(batches)])
        jax.block_until_ready((logs, state))
        times.append(time.perf_counter() - start)
    return state, times


def _copy(state):
    return jax.tree.map(lambda a: jax.device_put(a, a.sharding, may_alias=False), state)


def record_times(row, batch_size, tokens_per_sample, times, direct, loop_overhead):
    """Fill a sweep row's timing fields from the timed (and bare-loop) step times."""
    row.step_times = times
    row.step_time = statistics.median(times)
    low, high = np.percentile(times, [25, 75])
    row.step_time_iqr = float(high - low)
    row.samples_per_s = batch_size / row.step_time
    row.tokens_per_s = tokens_per_sample * batch_size / row.step_time if tokens_per_sample else None
    row.loop_overhead_s = loop_overhead / len(times)
    if direct:
        row.direct_step_times = direct
        row.direct_step_time = statistics.median(direct)
        # Each timed step has a bare-loop twin run right next to it: the median
        # of their ratios cancels the load both saw.
        row.agreement = statistics.median(t / d for t, d in zip(times, direct)) - 1
