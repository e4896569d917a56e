"""Independent branches of the backward: which kernels may wait past another branch, and what that keeps alive."""

import functools

import keras
import numpy as np
import pytest

import kdist
from kdist.abstract import dtype_policy_scope
from kdist.planning import branches, memory_model
from kdist.planning.facts import ModelFacts
from kdist.planning.step import trace_step
from kdist.planning.targets import resolve_target
from kdist.planning.trace import TRACE_BATCH

SOURCE, TARGET, WIDTH = 24, 8, 16


def _step(build):
    model = kdist.abstract_model(build)
    return trace_step(model, ModelFacts(model, "adam", None, None, None, resolve_target("gpu")).inputs).step


def _dense_stack(x, layers=3, width=WIDTH):
    for _ in range(layers):
        x = keras.layers.Dense(width, activation="gelu")(x)
    return x


def _encoder_decoder(width=WIDTH, source_length=SOURCE, target_length=TARGET):
    """An encoder over 24 positions and a decoder over 8 whose attention reads the encoder's output: past the
    attention's backward, the decoder's query path and the encoder's backward depend on nothing of each other."""
    source, target = keras.Input((source_length, width)), keras.Input((target_length, width))
    attended = keras.layers.Attention()([_dense_stack(target, width=width), _dense_stack(source, width=width)])
    return keras.Model([source, target], keras.layers.Dense(10)(attended))


def _chain():
    tokens = keras.Input((SOURCE, WIDTH))
    return keras.Model(tokens, keras.layers.Dense(10)(_dense_stack(tokens, layers=4)))


def _parallel():
    """Two stacks reading one projection, summed (GPT-NeoX's parallel attention and MLP): their backward branches
    meet again in the projection's input cotangent."""
    tokens = keras.Input((SOURCE, WIDTH))
    projected = keras.layers.Dense(WIDTH)(tokens)
    summed = keras.layers.Add()([_dense_stack(projected, layers=2), _dense_stack(projected, layers=2)])
    return keras.Model(tokens, keras.layers.Dense(10)(summed))


def _lengths(step, buffers):
    """The sequence lengths (second dimension) of the batch-sized buffers among `buffers`."""
    return {step.shape[b][1] for b in buffers if step.shape[b][0] == TRACE_BATCH}


def _made_in(step, window):
    y0, y1 = window
    return [b for made, _, _ in step.events[y0 : y1 + 1] for b in made]


def _swept(step):
    """The trace order's live bytes per term at the traced batch (factor 1 for every buffer), the factors, the
    buffers' last reads."""
    factor, last = np.ones(len(step.size)), step.lifetimes()[1]
    return step.sweep(factor, last), factor, last


def test_the_branch_traced_first_keeps_what_it_reads_while_the_other_branch_runs():
    """The decoder's query path waits past the encoder's backward: the decoder's values its kernels read stay
    alive over the encoder's kernels, where the trace has freed them; nowhere else does the curve rise."""
    step = _step(_encoder_decoder)
    curves, factor, last = _swept(step)
    sizes = np.asarray(step.size, dtype=np.float64)
    across = {}  # window -> deferred values freed before its end, for windows over the other side's kernels
    for window, read in branches.forks(step).items():
        freed = read[last[read] < window[1]]
        sides = _lengths(step, freed), _lengths(step, _made_in(step, window))
        if len(freed) and len(sides[0]) == len(sides[1]) == 1 and sides[0] != sides[1]:
            across[window] = freed
    assert across, "no branch waits past the other side's backward"
    assert {length for freed in across.values() for length in _lengths(step, freed)} <= {SOURCE, TARGET}
    deferred = branches.with_deferred_branches(step, curves, factor, last)
    raised = sum(deferred.values()) - sum(curves.values())
    assert raised.min() >= 0 and raised.max() > 0
    (window, freed), *_ = sorted(across.items(), key=lambda item: -sizes[item[1]].sum())
    end = window[1]
    assert raised[end] >= sizes[freed[last[freed] < end]].sum() - 1e-6  # at least the widest branch's values
    assert raised.max() <= max(sizes[read].sum() for read in branches.forks(step).values()) + 1e-6  # one at a time
    inside = np.zeros(len(raised), dtype=bool)
    for y0, y1 in branches.forks(step):
        inside[y0 : y1 + 1] = True
    assert not raised[~inside].any()


@pytest.mark.parametrize("build", [_chain, _parallel])
def test_a_chain_of_layers_and_branches_that_meet_again_are_left_in_the_traces_order(build):
    """Each kernel of a stack's backward needs the one before it (weight gradients aside); two branches that meet
    again at a sum are left to the trace's order (XLA's figures do not show it deferring them): nothing is
    kept longer."""
    step = _step(build)
    curves, factor, last = _swept(step)
    deferred = branches.with_deferred_branches(step, curves, factor, last)
    assert all(np.array_equal(deferred[term], curves[term]) for term in curves)


def test_a_weight_gradient_cast_to_float32_is_no_branch():
    """Under mixed precision a weight gradient's product is 16-bit and a cast makes the float32 gradient: the
    product passes nothing on to the backward, so it is no branch (the reduction groups decide when it runs)."""
    with dtype_policy_scope("mixed_bfloat16"):
        step = _step(_chain)
    products = [t for t in range(step.bwd_start, len(step.events)) if step.event_gemms[t]]
    sixteen_bit = [t for t in products if any(step.dtype[b] == "bfloat16" and len(step.shape[b]) == 2
                                              for b in step.events[t][0])]  # fmt: skip
    assert sixteen_bit, "no 16-bit weight-gradient product in the step"
    curves, factor, last = _swept(step)
    deferred = branches.with_deferred_branches(step, curves, factor, last)
    assert all(np.array_equal(deferred[term], curves[term]) for term in curves)


def test_a_plan_on_several_devices_counts_the_deferred_branch_and_one_device_does_not(monkeypatch):
    """On data=2 XLA's latency-hiding scheduler may run the decoder's query path late: the plan's peak counts it.
    One device has no collectives to hide and keeps the trace's order."""
    model = kdist.abstract_model(functools.partial(_encoder_decoder, width=256, source_length=1024, target_length=128))
    plan = lambda devices: kdist.plan(model, devices, batch_size=16).candidates[0].peak  # noqa: E731
    deferred, alone = plan(2), plan(1)
    monkeypatch.setattr(memory_model, "with_deferred_branches", lambda step, curves, factor, last: curves)
    assert plan(2) < deferred and plan(1) == alone
