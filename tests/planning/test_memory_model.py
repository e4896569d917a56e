"""How the memory model scales: batch, sequence, precision, remat, attention, fsdp, max pools, FFTs; targets and
margins."""

import math

import keras
import numpy as np
import pytest

import kdist
from kdist import PlanError
from kdist.abstract import dtype_policy_scope
from kdist.errors import ArgumentError
from kdist.models import tiny_transformer
from kdist.planning import comm, convolutions, gradient_waits, memory_model
from kdist.planning.buffers import Rules
from kdist.planning.memory_model import GEMM_WORKSPACE
from kdist.planning.targets import DEFAULT_MARGIN, resolve_target
from kdist.planning.timeline import Step
from kdist.planning.trace import TRACE_BATCH
from tests.helpers import SOFTMAX_BACKWARD_READS_PROBABILITIES, step_buffers

LLAMA = dict(
    vocabulary_size=256, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=64, intermediate_dim=128
)


@pytest.fixture(scope="module")
def llama():
    keras_hub = pytest.importorskip("keras_hub")
    return kdist.abstract_model(keras_hub.models.LlamaBackbone, **LLAMA)


def _one(model, batch, seq=None, **options):
    return kdist.plan(model, 1, batch_size=batch, sequence_length=seq, **options).candidates[0]


def test_everything_but_the_state_and_a_gemms_workspace_is_linear_in_the_batch(llama):
    small, big = _one(llama, 8, 128), _one(llama, 32, 128)
    assert (small.weights, small.optimizer) == (big.weights, big.optimizer)
    # Traced once at a prime batch and rescaled: linear, up to where in the step the peak falls.
    assert big.activations == pytest.approx(4 * small.activations, rel=0.01)
    fixed = lambda c: c.weights + c.optimizer + c.workspace  # noqa: E731
    assert big.peak - fixed(big) == pytest.approx(4 * (small.peak - fixed(small)), rel=0.02)
    assert big.other == 4 * small.other


def test_fused_attention_removes_the_sequence_squared_scores(llama):
    """Doubling the sequence doubles every linear term; what is left over is the (sequence x sequence) part."""
    materialized = [_one(llama, 4, s, attention="materialized").activations for s in (128, 256)]
    fused = [_one(llama, 4, s, attention="fused").activations for s in (128, 256)]
    squared_materialized = materialized[1] - 2 * materialized[0]  # scores and probabilities, heads x S^2 per layer
    squared_fused = fused[1] - 2 * fused[0]  # only the mask's additive bias, 1 x S^2 per layer (cuDNN reads it)
    # 30% of the activations and 6 x the fused part under jax 0.10.2; 18% and 2.2 x under 0.12.1
    probabilities_alone = SOFTMAX_BACKWARD_READS_PROBABILITIES
    assert squared_materialized > (0.15 if probabilities_alone else 0.25) * materialized[1]
    assert 0 <= squared_fused < squared_materialized / (2 if probabilities_alone else 4)
    assert fused[0] < materialized[0]


def test_a_logit_soft_cap_is_fused_on_a_tpu_and_computed_by_the_layer_on_a_gpu():
    """keras-hub's Gemma 2 passes its soft cap to Keras's attention on a TPU (Splash takes it), which Keras
    refuses on any other host; on a GPU the layer computes its capped scores itself."""
    pytest.importorskip("keras_hub")
    gemma2 = kdist.zoo.load_model("tiny-gemma2")
    tpu = kdist.plan(gemma2, 1, batch_size=4, sequence_length=128, target="TPU v5p")
    on_tpu = kdist.plan(gemma2, 1, batch_size=4, sequence_length=128, target="TPU v5p", attention="materialized")
    gpu = kdist.plan(gemma2, 1, batch_size=4, sequence_length=128, target="H100", attention="fused")
    assert tpu.attention == "fused" and not any("was asked for" in n for n in tpu.notes)
    assert tpu.candidates[0].activations < 0.75 * on_tpu.candidates[0].activations
    assert any("Gemma 2 logit soft cap off TPU" in n for n in gpu.notes)


def test_the_gpu_default_attention_follows_the_compute_dtype(llama):
    assert kdist.plan(llama, 1, batch_size=4, sequence_length=64, target="gpu").attention == "materialized"
    assert kdist.plan(llama, 1, batch_size=4, sequence_length=64, target="tpu").attention == "fused"
    with dtype_policy_scope("mixed_bfloat16"):
        keras_hub = pytest.importorskip("keras_hub")
        half = kdist.abstract_model(keras_hub.models.LlamaBackbone, **LLAMA)
    p = kdist.plan(half, 1, batch_size=4, sequence_length=64, target="gpu")
    assert p.attention == "fused" and any("attention traced fused" in n for n in p.notes)
    full = _one(llama, 4, 64, attention="fused")
    mixed = p.candidates[0]
    assert mixed.weights == full.weights and mixed.optimizer == full.optimizer  # float32 master weights and Adam
    assert mixed.activations < 0.75 * full.activations  # bfloat16 activations (norms and the loss stay f32)


def test_the_gpu_default_attention_follows_a_dtype_what_if_as_if_the_model_were_built_in_it(llama):
    half = kdist.plan(llama, 1, batch_size=4, sequence_length=64, target="gpu", dtype="bfloat16")
    assert half.attention == "fused" and any("built in dtype='bfloat16'" in n for n in half.notes)
    given = kdist.plan(llama, 1, batch_size=4, sequence_length=64, target="gpu", dtype="bfloat16", attention="fused")
    assert half.candidates[0].peak == given.candidates[0].peak
    assert kdist.plan(llama, 1, batch_size=4, sequence_length=64, target="gpu", dtype="float32").attention == (
        "materialized"
    )


def test_remat_lowers_the_peak_and_says_what_it_costs(llama):
    plain = kdist.plan(llama, 1, batch_size=8, sequence_length=256)
    remat = kdist.plan(llama, 1, batch_size=8, sequence_length=256, remat=True)
    a, b = plain.candidates[0], remat.candidates[0]
    assert b.peak < (0.7 if SOFTMAX_BACKWARD_READS_PROBABILITIES else 0.6) * a.peak  # 0.63 and 0.59
    assert b.activations < a.activations / 3
    assert b.weights == a.weights and b.optimizer == a.optimizer
    assert remat.remat and any("+33% compute" in n for n in remat.notes)


def test_nothing_fits_without_remat_then_the_advice_offers_it(llama):
    plain = _one(llama, 8, 256)
    remat = _one(llama, 8, 256, remat=True)
    budget = (remat.peak + plain.peak) / 2 / (1 - DEFAULT_MARGIN)  # between the two peaks, margin included
    p = kdist.plan(llama, 1, batch_size=8, sequence_length=256, memory_per_device=int(budget))
    cost = remat.compute_seconds / plain.compute_seconds - 1  # the estimate's own, quoted
    assert p.recommendation is None and "remat=True" in p.advice and f"+{cost:.0%} compute" in p.advice
    assert p.suggestions["remat"] is True
    assert kdist.plan(
        llama, 1, batch_size=8, sequence_length=256, memory_per_device=int(budget), remat=True
    ).recommendation


def test_fsdp_keeps_gathered_weights_and_data_parallel_does_not():
    model = kdist.abstract_model(tiny_transformer, hidden_dim=256, sequence_length=64)
    p = kdist.plan(model, 8, batch_size=16)
    assert p.candidate("data=8").gathered == 0
    fsdp = p.candidate("fsdp=8")
    assert fsdp.gathered > fsdp.weights  # whole weights gathered over fsdp, beyond the shards
    assert fsdp.optimizer < p.candidate("data=8").optimizer / 4


def test_an_embedding_gradient_is_scattered_in_place_into_its_zeros():
    """Beside the state, the step holds the table's gradient once, not its zeros and the scattered result apart."""
    vocabulary, width = 200_000, 64

    def build():
        tokens = keras.Input((8,), dtype="int32")
        pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(vocabulary, width)(tokens))
        return keras.Model(tokens, keras.layers.Dense(4)(pooled))

    candidate = kdist.plan(kdist.abstract_model(build), 1, batch_size=8).candidates[0]
    table = vocabulary * width * 4
    assert table <= step_buffers(candidate) < 1.5 * table


def test_reduced_gradients_keep_their_kernels_operands_until_their_group_is_reduced(llama, monkeypatch):
    """XLA runs a weight-gradient kernel as late as its combined reduction, on a model axis too (docs/plan.md)."""
    monkeypatch.setattr(memory_model, "scheduler_lasts", lambda step, last, axes: last)  # that model alone
    one = _one(llama, 4, 128)
    data = lambda: kdist.plan(llama, 2, batch_size=8, sequence_length=128).candidate("data=2")  # noqa: E731
    model = lambda: kdist.plan(llama, 2, batch_size=4, sequence_length=128).candidate("model=2")  # noqa: E731
    combined, combined_model = data(), model()
    monkeypatch.setattr(comm, "COMBINE_THRESHOLD", 1)  # each gradient reduced as soon as it is made
    assert step_buffers(data()) == step_buffers(one)  # the same per-device batch, the trace order's lifetimes
    assert step_buffers(combined) > step_buffers(one)
    assert model().peak < combined_model.peak  # on a model axis too: each kernel alone no longer waits
    monkeypatch.setattr(comm, "COMBINE_THRESHOLD", 2**60)  # one reduction of every gradient, at the end
    assert step_buffers(data()) >= step_buffers(combined)


def _sublayer_step(platform="gpu"):
    """A forward kernel, then a sublayer's backward of three kernels (events 1-3), then the optimizer update."""
    step = Step(Rules(platform=platform))
    activation, earlier, temporary, gradient = (
        step.new(8, (8,), term) for term in ("activations", "backward", "backward", "gradients")
    )
    step.events = [
        ([activation, earlier], (), ()),
        ([temporary, gradient], (activation,), ()),
        ([], (earlier, temporary), ()),
        ([], (), ()),
        ([], (gradient,), ()),
    ]
    step.sublayer_spans = [(1, 3, "attention")]
    return step


def test_the_schedulers_worst_order_keeps_what_a_sublayers_backward_reads_until_its_last_kernel():
    step = _sublayer_step()
    assert list(step.lifetimes()[1]) == [1, 2, 2, 4]  # the trace's order
    # Activations and backward temporaries read last inside the run live to its end; the gradient keeps its own.
    assert list(memory_model.scheduler_lasts(step, None, {"data": 2})) == [3, 3, 3, 4]
    assert memory_model.scheduler_lasts(step, None, {"data": 1}) is None  # one device: no collectives to overlap
    cpu = _sublayer_step("cpu")
    assert memory_model.scheduler_lasts(cpu, None, {"model": 2}) is None  # XLA:CPU: synchronous collectives


def test_on_several_gpus_the_estimate_takes_the_schedulers_worst_order(llama, monkeypatch):
    def data(**options):
        return kdist.plan(llama, 2, batch_size=8, sequence_length=128, **options).candidate("data=2")

    monkeypatch.setattr(memory_model, "workspace_peak", lambda step, curves: None)  # the trace's order alone
    worst, on_cpu = data(), data(target="cpu")
    monkeypatch.setattr(memory_model, "scheduler_lasts", lambda step, last, axes: last)
    assert step_buffers(worst) > step_buffers(data())
    assert on_cpu.peak == data(target="cpu").peak


def _gemm_step(read, beside, platform="gpu"):
    """`read` MiB read by a GEMM (event 1), then `beside` MiB made beside it by an elementwise kernel (event 2)."""
    step = Step(Rules(platform=platform))
    first, second = step.new(read * 2**20, (1,)), step.new(beside * 2**20, (1,))
    step.events = [([first], (), ()), ([], (first,), ()), ([second], (first,), ()), ([], (second,), ())]
    step.event_gemms = [False, True, False, False]
    return step


def _swept(step):
    """(step, its live bytes per term after each event in the trace's order)."""
    return step, step.sweep(1.0)


def test_a_gpu_step_peaks_at_a_gemm_with_its_cublas_workspace_where_that_is_higher():
    """XLA:GPU's GEMM holds a 4 MiB workspace while it runs: 10 + 4 MiB at the GEMM beats 10 + 2 MiB after it; 1 + 4
    MiB at the GEMM does not beat 1 + 6 MiB."""
    t, live = memory_model.workspace_peak(*_swept(_gemm_step(10, 2)))
    assert (t, live["workspace"], sum(live.values())) == (1, GEMM_WORKSPACE, 14 * 2**20)
    t, live = memory_model.workspace_peak(*_swept(_gemm_step(1, 6)))
    assert (t, live["workspace"], sum(live.values())) == (2, 0, 7 * 2**20)
    no_gemm = _gemm_step(10, 2)
    no_gemm.event_gemms = [False] * 4
    assert memory_model.workspace_peak(*_swept(no_gemm)) is None
    assert memory_model.workspace_peak(*_swept(_gemm_step(10, 2, "tpu"))) is None  # cuBLAS is a GPU's
    model = kdist.abstract_model(tiny_transformer)
    gpu, tpu = (kdist.plan(model, 8, batch_size=16, target=t).candidate("fsdp=8") for t in ("gpu", "tpu"))
    assert (gpu.workspace, tpu.workspace) == (GEMM_WORKSPACE, 0)  # a step of a few MB peaks at a GEMM on a GPU
    assert gpu.transient == gpu.live_gradients + gpu.loss + gpu.backward + gpu.gathered + gpu.workspace


def _merged_step(platform="gpu"):
    """Three GEMMs of one input (event 0), their biased sums (1-3), read again in the backward (4, 5)."""
    step = Step(Rules(platform=platform))
    x, q, k, v, qb, kb, vb = (step.new(size, (size,)) for size in (8, 8, 8, 4, 8, 8, 4))
    step.events = [([q, k, v], (x,), ()), ([qb], (q,), ()), ([kb], (k,), ()), ([vb], (v,), ()), ([], (qb,), ())]
    step.events.append(([], (kb, vb), ()))
    step.merged = [(x, [q, k, v], [qb, kb, vb])]
    return step


def test_merged_biased_gemms_keep_their_outputs_until_the_last_read_of_their_sums(monkeypatch):
    """DotMerger: the merged output lives while any biased sum is read; one of them is made afresh from it."""
    step = _merged_step()
    assert list(step.lifetimes()[1]) == [0, 1, 2, 3, 4, 5, 5]  # the trace's order
    # q's and k's outputs live until the sums' last read; v's, the smallest, is the one XLA adds its bias to afresh.
    assert list(memory_model.merged_gemm_lasts(step, None, 1.0, {"data": 2})) == [0, 5, 5, 3, 4, 5, 5]
    assert memory_model.merged_gemm_lasts(step, None, 1.0, {"data": 1}) is None  # one device: XLA adds k's bias there
    assert memory_model.merged_gemm_lasts(_merged_step("cpu"), None, 1.0, {"data": 2}) is None
    monkeypatch.setattr(memory_model, "DOT_MERGER_BYTES", 11)  # each GEMM moves 12 bytes or more: none merged
    assert list(memory_model.merged_gemm_lasts(step, None, 1.0, {"data": 2})) == [0, 1, 2, 3, 4, 5, 5]


def test_merged_gemms_without_a_bias_all_live_until_the_last_read_of_any_of_them():
    step = _merged_step()
    x, q, k, v = range(4)
    step.events = [([q, k, v], (x,), ()), ([], (q,), ()), ([], (v,), ()), ([], (k,), ())]
    step.merged = [(x, [q, k, v], [q, k, v])]
    assert list(step.lifetimes()[1][:4]) == [0, 1, 3, 2]
    assert list(memory_model.merged_gemm_lasts(step, None, 1.0, {"data": 2})[:4]) == [0, 3, 3, 3]


def test_an_attentions_biased_q_k_v_are_merged_on_several_gpus(monkeypatch):
    model = kdist.abstract_model(tiny_transformer)
    plan = lambda devices: kdist.plan(model, devices, batch_size=16).candidates[0]  # noqa: E731
    merged, one = kdist.plan(model, 8, batch_size=16).candidate("data=8"), plan(1)
    monkeypatch.setattr(memory_model, "DOT_MERGER_BYTES", 0)
    assert step_buffers(merged) > step_buffers(kdist.plan(model, 8, batch_size=16).candidate("data=8"))
    assert one.peak == plan(1).peak


def test_targets_and_their_memory():
    h100 = resolve_target("h100")
    assert (h100.name, h100.platform, h100.memory) == ("H100", "gpu", 63763906560) and h100.calibrated
    assert resolve_target("NVIDIA H100 80GB HBM3").name == "H100"
    assert not resolve_target("tpu").calibrated and resolve_target("cpu").memory is None
    assert resolve_target(None).name == "gpu"  # this machine has no accelerator: a GPU is planned for
    with pytest.raises(ArgumentError, match=r"target='abacus' is not a platform or a device kind.*'H100'"):
        resolve_target("abacus")


def test_fits_keeps_the_margin():
    model = kdist.abstract_model(tiny_transformer)
    peak = _one(model, 16).peak
    just_over = kdist.plan(model, 1, batch_size=16, memory_per_device=int(peak * 1.05))
    assert just_over.candidates[0].fits is False and just_over.recommendation is None
    assert "10% margin" in just_over.advice
    roomy = kdist.plan(model, 1, batch_size=16, memory_per_device=int(peak * 1.2))
    assert roomy.candidates[0].fits and "10% margin" in roomy.reason
    low, high = roomy.recommendation.band
    assert low < peak < high
    assert kdist.plan(model, 1, batch_size=16, memory_per_device=int(peak * 1.05), margin=0).recommendation
    with pytest.raises(ArgumentError, match=r"margin must be a fraction.*received margin=1\.5"):
        kdist.plan(model, 1, batch_size=16, margin=1.5)
    with pytest.raises(
        PlanError, match=r"attention must be one of 'fused', 'materialized'; received attention='flash'"
    ):
        kdist.plan(model, 1, batch_size=16, attention="flash")
    with pytest.raises(PlanError, match="remat must be True or False"):
        kdist.plan(model, 1, batch_size=16, remat="yes")


def test_a_named_device_kind_brings_its_memory():
    model = kdist.abstract_model(tiny_transformer)
    p = kdist.plan(model, 8, batch_size=16, target="H100")
    assert p.memory_per_device == 63763906560 and "H100" in p.memory_source
    assert kdist.plan(model, 8, batch_size=16, target="H100", memory_per_device="8GB").memory_per_device == 8 * 10**9


def _recorded_factors(monkeypatch):
    """A list that each plan's candidates append to: (facts, axes, buffer factors), as `buffer_factors` made them."""
    seen = []
    original = memory_model.buffer_factors
    monkeypatch.setattr(
        memory_model, "buffer_factors", lambda *a: seen.append((a[0], a[2], original(*a))) or seen[-1][2]
    )
    return seen


def _max_pooled(padded, wide_head):
    images = keras.Input((32, 32, 8))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(images)
    if padded:  # ResNet50's and DenseNet121's stems pad the ReLU's output before the pool
        x = keras.layers.ZeroPadding2D(1)(x)
    x = keras.layers.Conv2D(16, 3, padding="same")(keras.layers.MaxPooling2D(2)(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    if wide_head:  # 8.4M weights (33.6 MB) whose gradients the backward makes before the pool's
        x = keras.layers.Dense(4096)(keras.layers.Dense(2048)(x))
    return keras.Model(images, keras.layers.Dense(10)(x))


@pytest.mark.parametrize("wide_head", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_a_max_pools_gradient_holds_indices_and_zeros_as_xla_gpu_schedules_them(monkeypatch, padded, wide_head):
    """XLA:GPU's max-pool gradient: one int32 index per dimension of the pooled shape, written with each window's
    maximum (the pool's dtype, alive while it is made), scattered into zeros of the input's shape. Where a collective
    runs in the backward before the pool's (a model axis's all-reduces, a combined reduction of over 30 MB of weight
    gradients: a wide head's), the latency-hiding scheduler computes the indices early in the backward to overlap it;
    on one device, or with every gradient reduced in one collective at the end, they come with the pool's backward.
    The zeros come with them, but a pool reading a ReLU's output shares the ReLU's zeros, two buffers alive from the
    forward (docs/plan.md, "Max pools")."""
    seen = _recorded_factors(monkeypatch)
    model = kdist.abstract_model(_max_pooled, padded, wide_head)
    kdist.plan(model, 1, batch_size=64)
    kdist.plan(model, 2, batch_size=128)
    (facts, one_axes, one), (_, _, two) = seen[0], next(s for s in seen if s[1] == {"data": 2})
    split = next(s[2] for s in seen if s[1] == {"model": 2})  # the model axis all-reduces input gradients
    assert math.prod(one_axes.values()) == 1
    step = facts.traced.step
    early = [g for g, (flag, _) in step.overlapped.items() if flag]
    late = [g for g, (flag, _) in step.overlapped.items() if not flag]
    side = 34 if padded else 32
    pooled = TRACE_BATCH * (side // 2) ** 2 * 16
    zeros = [g for g in step.derived if step.shape[g][1:] == (side, side, 16)]
    assert [step.size[g] for g in late] == [pooled * 4 * 4, pooled * 4]  # 4 int32 indices and the maximum
    assert [step.size[g] for g in zeros] == [TRACE_BATCH * side**2 * 16 * 4] * (1 if padded else 2)
    assert len(early) == (3 if padded else 2)  # the indices, the maximum, and the zeros of a padded input
    born, last = step.lifetimes()[:2]
    assert all(born[g] == step.bwd_start for g in early) and all(born[g] > step.bwd_start for g in late)
    assert all(last[g] < born[g] for g in early + late if step.dtype[g] == "float32" and g not in zeros)  # unread
    assert all(one[g] == 0 for g in early) and all(one[g] > 0 for g in late)
    assert all((two[g] > 0) == wide_head for g in early) and all((two[g] > 0) != wide_head for g in late)
    assert all(split[g] > 0 for g in early) and all(split[g] == 0 for g in late)
    if padded:  # zeros of their own, made with the indices
        assert zeros[0] in early
    else:  # the ReLU's: made in its forward, on every mesh
        assert all(born[g] < step.bwd_start and one[g] > 0 and two[g] > 0 for g in zeros)


def _pooled_thrice():
    x = images = keras.Input((32, 32, 3))
    for width in (8, 16, 32):
        x = keras.layers.MaxPooling2D(2)(keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x))
    return keras.Model(images, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))


def test_where_a_data_axis_reduces_at_the_end_every_pool_but_the_first_has_its_indices_after_the_first(monkeypatch):
    """keras-hub's VGG and a three-pool toy on data=8, one all-reduce at the end: XLA:GPU makes the backward's first
    pool's indices with its gradient, and every other pool's right after that gradient, one after another (toy:
    0.852 of XLA's figure with each pool's at its own gradient, 1.052 so); on fsdp=8 and one device each with its own
    (docs/plan.md, "A ReLU before a max pool")."""
    seen = _recorded_factors(monkeypatch)
    model = kdist.abstract_model(_pooled_thrice)
    kdist.plan(model, 2, batch_size=64)
    factors = {tuple(sorted((k, v) for k, v in axes.items() if v > 1)): f for _, axes, f in seen}
    step = seen[0][0].traced.step
    born = step.lifetimes()[0]
    pools = sorted({pool for _, pool in step.overlapped.values()})
    assert len(pools) == 3
    after = [g for g, (when, _) in step.overlapped.items() if when == convolutions.AFTER_FIRST_POOL]
    assert len(after) == 4 and sorted(born[after]) == [pools[0] + 1] * 2 + [pools[0] + 2] * 2  # indices and maxima
    for mesh, chosen in (((("data", 2),), convolutions.AFTER_FIRST_POOL), ((("fsdp", 2),), convolutions.LATE)):
        kept = [g for g, (when, pool) in step.overlapped.items() if factors[mesh][g] > 0 and pool > pools[0]]
        assert {step.overlapped[g][0] for g in kept} == {chosen}, mesh
    first = [g for g, (_, pool) in step.overlapped.items() if pool == pools[0] and factors[(("data", 2),)][g] > 0]
    assert {step.overlapped[g][0] for g in first} == {convolutions.LATE}


class _FourierMixing(keras.layers.Layer):
    """FNet's token mixing: the real part of a 2-D FFT over the sequence and the features."""

    def call(self, x):
        return keras.ops.fft2((x, keras.ops.zeros_like(x)))[0]


def _fourier():
    tokens = keras.Input((16, 32))
    x = keras.layers.Dense(32)(_FourierMixing()(keras.layers.Dense(32)(tokens)))
    return keras.Model(tokens, keras.layers.Dense(10)(x))


def test_an_fft_holds_whole_copies_of_its_operand_and_output_on_several_devices(monkeypatch):
    """XLA's SPMD partitioner has no rule for an FFT over a split batch: it gathers the operand to every device and
    transforms all of it (FNet on fsdp=8, docs/plan.md). Each FFT makes a whole copy of its operand and of its output,
    alive while it runs, counted as what it holds beyond the device's own operand and output (the FFT's own buffers):
    with them the global batch on any mesh that splits the batch; nothing on one. Where a model axis alone splits the
    features XLA transforms them split, and each copy is one more part of the device's size."""
    seen = _recorded_factors(monkeypatch)
    model = kdist.abstract_model(_fourier)
    kdist.plan(model, 1, batch_size=64)
    kdist.plan(model, 8, batch_size=64)
    facts, _, one = seen[0]
    step = facts.traced.step
    copies = sorted(step.unpartitioned)
    assert len(copies) == 4  # the forward FFT's and its transpose's, operand and output each
    assert all(step.dtype[g] == "complex64" and step.size[g] == TRACE_BATCH * 16 * 32 * 8 for g in copies)
    born, last = step.lifetimes()[:2]
    assert all(born[g] == last[g] for g in copies)  # made and read by the FFT's own kernel
    assert all(one[g] == 0 for g in copies)
    for axes in ({"data": 8}, {"fsdp": 8}, {"data": 2, "model": 4}):
        factors = next(f for _, a, f in seen if a == axes)
        own = [factors[step.unpartitioned[g]] for g in copies]  # the FFT's own operand and output: a shard
        assert all(0 < f < 64 / TRACE_BATCH for f in own), axes
        whole = [factors[g] + f for g, f in zip(copies, own)]
        assert whole == pytest.approx([64 / TRACE_BATCH] * 4), axes  # with its own part, the whole batch of 64
    features_split = next(f for _, a, f in seen if a == {"model": 8})  # XLA's distributed FFT: one more part each
    own = [features_split[step.unpartitioned[g]] for g in copies]
    assert [features_split[g] for g in copies] == pytest.approx([f if f < 64 / TRACE_BATCH else 0 for f in own])
    assert 0 < min(own) < 64 / TRACE_BATCH  # the forward FFT's operand is split; its transpose's is not: no copy


def _float32_inside_bfloat16():
    """A bfloat16 model whose middle layer keeps float32, as keras-hub's SmolLM3 builds its attention and MLP without
    the backbone's dtype policy."""
    with dtype_policy_scope("bfloat16"):
        x = keras.Input((512,))
        y = keras.layers.Dense(1024, dtype="float32", name="full")(keras.layers.Dense(1024, name="half")(x))
        return keras.Model(x, keras.layers.Dense(8, name="head")(y))


def test_fsdp_gathers_each_weight_in_the_dtype_of_the_layer_that_computes_with_it(monkeypatch):
    """XLA gathers a weight for the kernels of the layer that holds it, in that layer's compute dtype: a float32
    layer's gathered copy is twice a bfloat16 one's, whatever the model's policy says (docs/plan.md)."""
    seen = _recorded_factors(monkeypatch)
    model = kdist.abstract_model(_float32_inside_bfloat16)
    assert model.compute_dtype == "bfloat16"
    kdist.plan(model, 2, batch_size=16).candidate("fsdp=2")
    facts = seen[0][0]
    step = facts.traced.step
    paths = [v.path for v in facts.traced.variables]
    gathered = {paths[step.weight_of[g]]: step.size[g] for g in range(len(step.size)) if step.term[g] == "gathered"}
    assert gathered["full/kernel"] == 1024 * 1024 * 4
    assert gathered["half/kernel"] == 512 * 1024 * 2


def _normalized_projection(hidden=32, gated=False, dtype=None):
    """A learned position table summed into the residual stream, normalized and projected up and down: on a model
    axis the rules split the table's hidden size, and the projections gather what they contract whole. `gated`:
    a second up projection of the same normalized value (a gated MLP's), its sum with the first read down."""
    tokens = keras.Input((16,), dtype="int32")
    positions = keras.Input((16,), dtype="int32")
    table = keras.layers.Embedding(16, hidden, name="position_table", dtype=dtype)
    h = keras.layers.Embedding(48, hidden, dtype=dtype)(tokens) + table(positions)
    normalized = keras.layers.LayerNormalization(name="norm", dtype=dtype)(h)
    x = keras.layers.Dense(2 * hidden, activation="gelu", name="up", dtype=dtype)(normalized)
    if gated:
        x = x + keras.layers.Dense(2 * hidden, activation="gelu", name="gate", dtype=dtype)(normalized)
    down = keras.layers.Dense(hidden, dtype=dtype)(x)
    return keras.Model([tokens, positions], keras.layers.Dense(48, dtype=dtype)(h + down))


def _recorded_regathered(monkeypatch):
    """A list that gets (facts, axes, factor, `memory_model.regathered`'s result) of each call while planning."""
    seen = []
    original = memory_model.regathered
    monkeypatch.setattr(
        memory_model, "regathered", lambda *a: seen.append((a[0], dict(a[2]), a[3], original(*a))) or seen[-1][3]
    )
    return seen


@pytest.mark.parametrize("name, post_norm", [("tiny-bert", True), ("tiny-llama", False)])
def test_on_a_model_axis_of_two_only_a_post_norm_residual_stream_is_gathered_again(monkeypatch, name, post_norm):
    """With a model axis of 2 beside a batch split XLA:GPU gathers a projection's operand again where a forward
    kernel other than a matrix product reads it split too (a post-norm block's normalized residual stream, read
    by the next residual sum: BERT's), and keeps the whole copy where only matrix products read it (a pre-norm
    block's normalized value: the Llama's); docs/plan.md, "Gathered again"."""
    seen = _recorded_regathered(monkeypatch)
    kdist.plan(kdist.zoo.load_model(name), 8, batch_size=16, sequence_length=16)
    step = seen[0][0].traced.step
    events, buffers = step.reads()
    two = [(axes, factor, split) for _, axes, factor, (split, _) in seen if axes.get("model") == 2]
    assert two
    for axes, factor, split in two:
        again = [g for g in range(len(step.size)) if split[g] < factor[g]]
        assert bool(again) == post_norm, axes
        for g in again:
            readers = events[buffers == g]
            assert any(t < step.bwd_start and not step.event_gemms[t] for t in readers), (axes, g)
            assert split[g] == pytest.approx(factor[g] / 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_a_16_bit_value_is_gathered_again_as_a_float32_one_is_but_a_cast_keeps_its_gathered_copy(monkeypatch, dtype):
    """In 16 bits the projections' gathered values are gathered again as in float32 (EdRec in bfloat16 on
    data=2,model=4 of 8 deviceless H100s holds no whole copy of its gated MLP's product, which the estimate kept:
    1.352 of XLA's figure, 1.131 since), but the copy of a float32 value cast down to 16 bits (a norm's output,
    computed in float32) keeps its gathered copy (RoBERTa in mixed_bfloat16 on data=2,model=4: docs/plan.md,
    "Gathered again"). At hidden 48 over a model axis of 3 float32 gathers the normalized value again too."""
    seen = _recorded_regathered(monkeypatch)
    again = {}
    for policy in (None, dtype):
        seen.clear()
        model = kdist.abstract_model(lambda: _normalized_projection(48, dtype=policy))
        kdist.plan(model, 6, batch_size=12, target="h100")
        step = seen[0][0].traced.step
        (factor, split), *_ = [(f, s) for _, axes, f, (s, _) in seen if axes == {"data": 2, "model": 3}]
        again[policy] = sorted(step.shape[g][1:] for g in range(len(step.size)) if split[g] < factor[g])
    assert again[None] == [(16, 48), (16, 48), (16, 96)]  # the normalized value, the residual sum, the up output
    assert again[dtype] == [(16, 48), (16, 96)]  # the residual sum and the up output: not the norm's cast


@pytest.mark.parametrize(
    "target, gated, devices, hidden",
    [("gpu", False, 8, 32), ("gpu", False, 6, 48), ("gpu", True, 6, 48), ("cpu", False, 8, 32), ("cpu", False, 6, 48)],
)
def test_a_projections_input_is_gathered_again_beside_a_batch_split_and_a_model_axis_of_three_or_more(
    monkeypatch, target, gated, devices, hidden
):
    """On data=2,model=3, data=2,model=4 and fsdp=2,model=4 XLA:GPU keeps the split value a projection gathers and
    gathers it again for each kernel that reads it, a weight gradient's at its reduction group's end, once however
    many of the group's kernels read it (docs/plan.md, "Gathered again"); with a model axis of 2 (where only matrix
    products read it), without a batch split, and on XLA:CPU it keeps the whole copy."""
    seen = _recorded_regathered(monkeypatch)
    model = kdist.abstract_model(lambda: _normalized_projection(hidden, gated))
    kdist.plan(model, devices, batch_size=12 if devices == 6 else 16, target=target)
    step = seen[0][0].traced.step
    weight_gradients = {t for t, _, _ in step.gradient_kernels()}
    for _, axes, factor, (split, copies) in seen:
        again = [g for g in range(len(step.size)) if split[g] < factor[g]]
        if target == "cpu" or axes.get("model", 1) < memory_model.REGATHER_MODEL_AXIS or len(axes) == 1:
            assert not again and not copies.any(), axes
            continue
        # the up projection's output the next one reads, the residual sum the head reads (and at 48 over 3 the
        # normalized value the up projection reads)
        assert {step.shape[g][1:] for g in again} == {(16, 2 * hidden), (16, hidden)}, axes
        assert all(split[g] == pytest.approx(factor[g] / axes["model"]) for g in again)
        extra = {g: step.size[g] * (factor[g] - split[g]) for g in again}
        groups = gradient_waits.reduction_groups(step, np.asarray(step.size) * split)
        for t, (_, read, _) in enumerate(step.events):
            held = sum(extra.get(g, 0) for g in set(read)) if t not in weight_gradients else 0
            held += sum(sum(extra.get(g, 0) for g in set().union(*reads)) for end, reads in groups if end == t)
            assert copies[t] == pytest.approx(held), (axes, t)
        assert any(copies[end] > 0 for end, _ in groups)  # the up projection's weight gradient, at its group's end
        if gated:  # the up and gate projections' weight gradients read one gathered value (48 over 3), held once
            read_again = [[g for r in reads for g in r if extra.get(g)] for _, reads in groups]
            assert any(len(set(read)) < len(read) for read in read_again)
