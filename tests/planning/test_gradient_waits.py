"""Where the weight-gradient kernels of a step on several devices run: near their combined reduction, and on a
remat step over fsdp by the next block's gathers."""

from collections import Counter

import keras
import numpy as np

import kdist
from kdist.planning.facts import ModelFacts
from kdist.planning.gradient_waits import gates, normalizes_a_product, reduction_groups, reduction_order
from kdist.planning.step import trace_step
from kdist.planning.targets import resolve_target
from tests.planning.test_memory_model import _recorded_factors


def _mlp_blocks(blocks=3, hidden=32, dtype=None):
    """Residual MLP blocks: each Dense is a layer call of its own, so a remat step recomputes and gathers per Dense."""
    inputs = keras.Input((16, hidden))
    x = inputs
    for _ in range(blocks):
        h = keras.layers.Dense(4 * hidden, activation="relu", dtype=dtype)(x)
        x = keras.layers.add([x, keras.layers.Dense(hidden, dtype=dtype)(h)])
        x = keras.layers.LayerNormalization(dtype=dtype)(x)
    return keras.Model(inputs, keras.layers.Dense(4, dtype=dtype)(x))


def _step(monkeypatch, remat, dtype=None):
    seen = _recorded_factors(monkeypatch)
    model = kdist.abstract_model(lambda: _mlp_blocks(dtype=dtype))
    kdist.plan(model, 8, batch_size=64, target="h100", remat=remat)
    return seen[0][0].traced.step


def test_on_a_remat_step_over_fsdp_a_kernel_runs_by_the_next_blocks_gathers(monkeypatch):
    """Llama 3 with remat on fsdp=8 of 8 deviceless H100s holds only the running block's MLP cotangents at XLA's
    peak (the estimate kept both blocks' to the combined reduction: 1.407 of XLA's figure, 1.106 since); on
    fsdp=4,model=2 XLA holds the block before's too, and the kernels keep waiting there (docs/plan.md, "Remat,
    compiled")."""
    step = _step(monkeypatch, remat=True)
    ones = np.ones(len(step.size))
    waiting = reduction_order(step, ones, {"fsdp": 8})[1]  # without remat: every kernel waits for the group
    fsdp = reduction_order(step, ones, {"fsdp": 8}, remat=True)[1]
    model = reduction_order(step, ones, {"fsdp": 4, "model": 2}, remat=True)[1]
    assert np.array_equal(model, waiting)
    born, last = step.lifetimes()[:2]
    gathers = sorted({born[g] for g, term in enumerate(step.term) if term == "gathered" and born[g] > step.bwd_start})
    assert gathers  # each Dense's recomputed forward gathers its kernel again
    ((group_end, _),) = reduction_groups(step, np.asarray(step.size, dtype=np.float64))
    spans = step.sublayer_spans  # (first, last event, (layer call, sublayer)) of each run of the backward
    call = lambda t: next(key[0] for first, _, key in reversed(spans) if first <= t)  # noqa: E731
    earlier = 0
    for u, _, reads in step.gradient_kernels():
        later = [e for e in gathers if e > u and call(e) != call(u)]  # another layer's recomputed forward
        by = min(group_end, later[0]) if later else group_end
        assert all(fsdp[r] <= max(by, last[r]) for r in reads)
        earlier += any(fsdp[r] < waiting[r] for r in reads)
    assert earlier >= 4  # the kernels of every block but the one the backward ends with run before the group's end


def test_without_remat_the_backward_gathers_nothing_and_every_kernel_waits(monkeypatch):
    step = _step(monkeypatch, remat=False)
    ones = np.ones(len(step.size))
    born = step.lifetimes()[0]
    assert not any(step.term[g] == "gathered" and born[g] > step.bwd_start for g in range(len(step.size)))
    assert np.array_equal(
        reduction_order(step, ones, {"fsdp": 8}, remat=True)[1], reduction_order(step, ones, {"fsdp": 8})[1]
    )


def test_a_waiting_kernel_makes_its_gradient_where_it_runs(monkeypatch):
    """The residual MLP blocks on data=8: each gradient is born at its reduction group's end, where its kernel runs
    reading its operands, so none is alive in the backward before the first group's end (the trace's births had
    them there). Llama 3 in bfloat16 (hidden 1024, 4 layers, batch 32 x 256) on data=8 of 8 deviceless H100s: XLA
    runs the weight-gradient GEMMs after the backward, beside the combined all-reduces, and holds none of their
    gradients through it, only their operands; the estimate, holding both, was 1.082 of XLA's figure, 1.057 since
    (docs/plan.md, "Weight-gradient kernels wait for their reduction")."""
    step = _step(monkeypatch, remat=False)
    ones = np.ones(len(step.size))
    born, last = reduction_order(step, ones, {"data": 8})
    kernels = iter(step.gradient_kernels())
    groups = reduction_groups(step, np.asarray(step.size, dtype=np.float64))
    for group_end, reads in groups:
        for _ in reads:
            u, grads, read = next(kernels)
            assert u <= group_end and (born[grads] == group_end).all() and (last[read] >= group_end).all()
    first_end = groups[0][0]
    made_where_traced = step.sweep(ones, last)["gradients"][step.bwd_start : first_end]
    assert (
        made_where_traced.max() > 0 and step.sweep(ones, last, born)["gradients"][step.bwd_start : first_end].max() == 0
    )


def test_a_mixed_precision_gradient_waits_with_the_kernel_making_it_in_16_bits(monkeypatch):
    """Under mixed_bfloat16 a weight-gradient GEMM or bias sum makes a bfloat16 gradient that a cast makes
    float32; XLA:GPU fuses the cast into the optimizer update and runs the GEMM where it runs in float32, beside
    the reduction (Falcon in mixed_bfloat16 on model=8 of 8 deviceless H100s holds each layer's norm inputs and
    cotangents until the backward's end). So the waiting kernel is the GEMM or sum, not the cast: its operands
    wait, and the cast's float32 gradient is made where it runs (the estimate had the casts wait, reading the
    small bfloat16 gradients alone: Falcon 0.908 of XLA's figure, 1.021 since; docs/plan.md, "Weight-gradient
    kernels wait for their reduction")."""
    full = _step(monkeypatch, remat=False)
    mixed = _step(monkeypatch, remat=False, dtype="mixed_bfloat16")
    kinds = lambda step: [(step.event_gemms[u], step.event_kinds[u]) for u, _, _ in step.gradient_kernels()]  # noqa: E731
    assert kinds(mixed) == kinds(full) and sum(gemm for gemm, _ in kinds(mixed)) == 7  # the 7 Dense kernels
    sizes = np.asarray(mixed.size, dtype=np.float64)
    born, last = reduction_order(mixed, np.ones(len(sizes)), {"data": 8})
    traced_born = mixed.lifetimes()[0]
    kernels = iter(mixed.gradient_kernels())
    for group_end, reads in reduction_groups(mixed, sizes):
        for _ in reads:
            u, grads, read = next(kernels)
            assert (traced_born[grads] > u).any() or mixed.event_kinds[u] == "reduction"  # the cast, after it
            assert (born[grads] == group_end).all() and (last[read] >= group_end).all()
            if mixed.event_gemms[u]:  # reads an activation and a cotangent, not the small 16-bit gradient alone
                assert sum(mixed.batch[r] for r in read) == 2


def _shared_blocks(calls=4, hidden=32):
    """One Dense layer called `calls` times (ALBERT's layer sharing): its kernel's gradient sums one part per call."""
    inputs = keras.Input((16, hidden))
    shared = keras.layers.Dense(hidden, use_bias=False)
    x = inputs
    for _ in range(calls):
        x = keras.layers.LayerNormalization()(keras.layers.add([x, shared(x)]))
    return keras.Model(inputs, keras.layers.Dense(4)(x))


def test_a_weight_several_calls_read_has_one_gradient_sum_and_one_whole_copy_reduced(monkeypatch):
    """XLA sums the calls' parts of a shared weight's gradient as they come, GEMMs written over the running sum
    (cuBLAS's output aliased to its addend), and reduces the sum alone: ALBERT in bfloat16 (hidden 1024, 4 calls of
    one layer) on fsdp=8 of 8 deviceless H100s holds at most three whole copies of a kernel's gradient (two parts
    and their sum) where the estimate held seven, each part and each partial sum with its whole local copy, at the
    reduction group's end (1.357 of XLA's figure, 1.090 since; docs/plan.md, "Weight-gradient kernels wait for
    their reduction")."""
    seen = _recorded_factors(monkeypatch)
    kdist.plan(kdist.abstract_model(_shared_blocks), 8, batch_size=64, target="h100")
    step = seen[0][0].traced.step
    parts = Counter(v for g, v in step.weight_of.items() if step.term[g] == "gradients")
    (shared,) = [v for v, n in parts.items() if n > 1]
    mine = [g for g, v in step.weight_of.items() if v == shared]
    grads = [g for g in mine if step.term[g] == "gradients"]
    assert len(grads) == 4 + 3  # a part per call, and the running sums
    (whole,) = [g for g in mine if step.term[g] == "unreduced"]
    final = next(g for v, g, _ in step.final_grads if v == shared)  # the sum the optimizer reads
    assert step.lifetimes()[0][whole] == step.lifetimes()[0][final]  # made whole where the sum is, to be reduced
    only = np.zeros(len(step.size))
    only[mine] = 1.0
    born, last = reduction_order(step, only, {"fsdp": 8})
    curves = step.sweep(only, last, born)
    ((group_end, _),) = reduction_groups(step, np.asarray(step.size, dtype=np.float64))
    size = step.size[grads[0]]
    assert curves["unreduced"][group_end] == size
    # each running sum written over the sum (or part) it adds to, the last part under the sum's whole copy: 3 of 7
    assert curves["gradients"][group_end] == 3 * size


def _normed_blocks(where):
    """Two residual blocks whose LayerNormalization takes the Dense's output ("product": Gemma's post-sublayer norm),
    the residual sum ("sum": BERT's post-norm) or the block's input ("input": a pre-norm)."""
    inputs = keras.Input((16, 32))
    x = inputs
    for _ in range(2):
        norm = keras.layers.LayerNormalization()
        if where == "product":
            x = keras.layers.add([x, norm(keras.layers.Dense(32)(x))])
        elif where == "sum":
            x = norm(keras.layers.add([x, keras.layers.Dense(32)(x)]))
        else:
            x = keras.layers.add([x, keras.layers.Dense(32)(norm(x))])
    return keras.Model(inputs, keras.layers.Dense(4)(x))


def test_only_a_norm_of_a_matrix_products_output_is_found(monkeypatch):
    found = {}
    for where in ("product", "sum", "input"):
        seen = _recorded_factors(monkeypatch)
        kdist.plan(kdist.abstract_model(lambda w=where: _normed_blocks(w)), 8, batch_size=64, target="h100")
        traced = seen[0][0].traced
        assert traced.normed_products == normalizes_a_product(traced.step)
        found[where] = traced.normed_products
    assert found == {"product": True, "sum": False, "input": False}


def _mlp(kind):
    """Two pre-norm residual MLP blocks: "gated" (tanh of one projection times another of the same input), "plain"
    (a GELU between two projections) or "two inputs" (the product of projections of two different inputs)."""
    tokens = keras.Input((16, 32))
    x = tokens
    for _ in range(2):
        h = keras.layers.LayerNormalization()(x)
        if kind == "gated":
            gate = keras.layers.Activation("tanh")(keras.layers.Dense(64, use_bias=False)(h))
            hidden = keras.layers.Multiply()([gate, keras.layers.Dense(64, use_bias=False)(h)])
        elif kind == "plain":
            hidden = keras.layers.Dense(64, activation="gelu")(h)
        else:
            hidden = keras.layers.Multiply()([keras.layers.Dense(64)(h), keras.layers.Dense(64)(x)])
        x = keras.layers.Add()([x, keras.layers.Dense(32, use_bias=False)(hidden)])
    return keras.Model(tokens, keras.layers.Dense(4)(x))


def test_a_gated_product_of_two_projections_of_one_input_is_found_and_nothing_else():
    """`gates`: the outputs of two matrix products of one input, multiplied elementwise in the forward (a gated MLP),
    whatever the layers that compute them; not an MLP without a gate, nor a product of projections of two different
    inputs."""
    found = {}
    for kind in ("gated", "plain", "two inputs"):
        model = kdist.abstract_model(lambda k=kind: _mlp(k))
        traced = trace_step(model, ModelFacts(model, "adam", None, None, None, resolve_target("gpu")).inputs)
        assert traced.gated_products == gates(traced.step)
        found[kind] = traced.gated_products
    assert found == {"gated": True, "plain": False, "two inputs": False}
