"""Estimating one candidate mesh: memory per device, communication per step, validity."""

import math

from kdist.meshes.enumerate import spec_of
from kdist.meshes.spec import ParallelDims
from kdist.planning.calibration import (
    FUSED_GPU_HIGH,
    GATED_PRODUCT_HIGH,
    LONG_SPAN_KERNELS,
    LONG_SPAN_LOW,
    MAX_POOL_FSDP_HIGH,
    MIXED_PRECISION_HIGH,
    MOE_FSDP_HIGH,
    MOE_HIGH,
    PRODUCT_NORM_HIGH,
    REMAT_HIGH,
    REMAT_LOW,
    SHARED_INPUT_HIGH,
    STRIDED_LOW,
    band_class,
)
from kdist.planning.comm import communication, validity
from kdist.planning.memory_model import (
    GEMM_WORKSPACE,
    batch_shards,
    buffer_factors,
    collectives_overlap,
    memory_terms,
    placed_variables,
)
from kdist.planning.plan import Candidate
from kdist.planning.timing import step_time
from kdist.units import itemsize


def evaluate(facts, axes, batch_size, bandwidth, latency, timing=True):
    """The `Candidate` of mesh `axes` (role -> size) for `batch_size` examples per step (`timing`: its step time)."""
    candidate = Candidate(spec_of(axes), dict(axes))
    rows = placed_variables(facts, ParallelDims.from_sizes(axes))
    for term, value in memory_terms(facts, rows, axes, batch_size).items():
        setattr(candidate, term, value)
    candidate.band, candidate.band_class, candidate.band_why = band(facts, axes, candidate.peak)
    split = batch_shards(axes)
    trainable = [r for r in rows if r.kind == "trainable"]
    scale = itemsize(facts.dtype) if facts.dtype is not None else None
    candidate.comm = communication(facts, trainable, axes, -(-batch_size // split), bandwidth, latency, scale)
    if timing and facts.traced is not None:
        factor = buffer_factors(facts, rows, axes, -(-batch_size // split))
        estimate = step_time(facts, rows, axes, -(-batch_size // split), candidate.comm, factor)
        if estimate is not None:
            candidate.compute_seconds, candidate.exposed_comm_seconds = estimate["compute"], estimate["exposed_comm"]
            candidate.flops, candidate.hbm_bytes = estimate["flops"], estimate["hbm_bytes"]
    candidate.valid, candidate.reason = validity([r for r in rows if r.kind != "optimizer"], axes, batch_size, split)
    return candidate


def smallest_valid_batch(facts, candidates, batch_size):
    """(batch, candidate): the smallest batch size above `batch_size` that makes one of `candidates` valid (the first
    multiple of its batch shards), or None where no batch size would (every weight axis replicates everything)."""
    found = []
    for c in candidates:
        split = batch_shards(c.axes)
        batch = -(-batch_size // split) * split
        rows = [r for r in placed_variables(facts, ParallelDims.from_sizes(c.axes)) if r.kind != "optimizer"]
        if batch > batch_size and validity(rows, c.axes, batch, split)[0]:
            found.append((batch, c))
    return min(found, key=lambda pair: pair[0], default=None)


REASONS_SEPARATOR = "; "  # between the reasons in a candidate's `band_why`


def band(facts, axes, peak):
    """((low, high) bytes, the class it comes from, why it is wider, less sure or absent) for a candidate."""
    if not facts.target.calibrated:
        return None, "", f"{facts.target.platform.upper()} targets are not calibrated"
    if facts.traced is None:
        return None, "", "activations not estimated: the truth can be far above the estimate"
    cls, why = band_class(axes, facts.traced.family)
    low, high, reasons = cls.low, cls.high, [why] if why else []
    if facts.remat:
        low, high = min(low, REMAT_LOW), max(high, REMAT_HIGH)
        reasons.append(
            f"remat: on configs like it compiled for H100s XLA's figure came to {REMAT_LOW:.2f}-{REMAT_HIGH:.2f}x the "
            "estimate (six keras-hub families on 1 and 8 devices), so the band reaches that"
        )
    if "fused" in facts.traced.attention:
        high = max(high, FUSED_GPU_HIGH)
        reasons.append(
            f"fused attention: where the GPU does not take cuDNN's kernel the step keeps the scores (measured on an "
            f"H100: ViT-Base bf16 up to {FUSED_GPU_HIGH:.2f}x the fused estimate), so the band reaches that"
        )
    on_model_axis, on_fsdp = axes.get("model", 1) > 1, axes.get("fsdp", 1) > 1
    wider = (  # (whether the candidate has the trait, the band's top it takes, why), in this order
        (
            facts.traced.max_pools and on_fsdp and not on_model_axis,
            MAX_POOL_FSDP_HIGH,
            "a max pool on an fsdp mesh: the estimate follows XLA:GPU's order around a pool's gradient on some such "
            "steps and not on others (CNNs with max pools on fsdp meshes of 8 to 16 H100s came to up to",
        ),
        (
            facts.traced.shared_input and on_model_axis,
            SHARED_INPUT_HIGH,
            "an activation several layers read (an encoder's output, read by each decoder layer's cross attention) on "
            "a model axis: XLA:GPU all-reduces their input gradients late, several together, and keeps values of that "
            "backward the estimate does not all count (encoder-decoders on 2 to 64 H100s came to up to",
        ),
        (
            facts.traced.normed_products and on_model_axis,
            PRODUCT_NORM_HIGH,
            "a norm of a sublayer's output projection (Gemma's post-attention and post-MLP norms) on a model axis: "
            "XLA:GPU ran Gemma 3's weight-gradient kernels and those norms' scale-gradient sums after the whole "
            "backward, keeping what they read (Gemma 3 at hidden 512 and 1024 on 8 and 16 H100s came to up to",
        ),
        (
            facts.traced.gated_products,
            GATED_PRODUCT_HIGH,
            "a gated product (a gated MLP): XLA:GPU's fusion cost model decides, by activation, whether it keeps the "
            "two cotangents the estimate keeps or what they are computed from, for the merged weight-gradient GEMM "
            "(gated MLPs of six activations on 1 to 16 H100s came to up to",
        ),
        (
            facts.act_itemsize == 2,
            MIXED_PRECISION_HIGH,
            "16-bit compute: XLA:GPU keeps float32 values and fixed buffers beside the half-size activations that the "
            "estimate does not all count (eight keras-hub families in mixed_bfloat16 on 8 H100s came to up to",
        ),
    )
    for applies, top, why in wider:
        if applies and top > high:
            high = top
            reasons.append(f"{why} {top:.2f}x the estimate), so the band reaches that")
    longest = facts.traced.step.longest_sublayer_backward()
    if longest > LONG_SPAN_KERNELS and collectives_overlap(facts.traced.step, axes) and LONG_SPAN_LOW < low:
        low = LONG_SPAN_LOW
        reasons.append(
            f"a sublayer whose backward runs {longest} kernels (at most {LONG_SPAN_KERNELS} in the configs the bands "
            "come from): the estimate keeps what it reads to its end, the scheduler's worst order, which XLA does not "
            f"take over so long a run (Qwen3.5's gated delta net on 8 H100s: down to {LONG_SPAN_LOW:.2f} of the "
            "estimate), so the band reaches that"
        )
    if facts.traced.strided_normalizations and STRIDED_LOW < low:
        low = STRIDED_LOW
        reasons.append(
            "a softmax over a dimension that does not lie innermost (Gemma 2's grouped scores): the estimate keeps "
            "a value of its input that XLA:GPU writes out on some sizes and meshes and computes again on others "
            f"(Gemma 2 on 4 to 16 H100s: down to {STRIDED_LOW:.2f} of the estimate), so the band reaches that"
        )
    moe_high = MOE_FSDP_HIGH if on_fsdp else MOE_HIGH
    if "expert" in facts.roles and math.prod(axes.values()) > 1 and moe_high > high:
        high = moe_high
        where = "an fsdp mesh" if on_fsdp else "several devices"
        reasons.append(
            f"experts on {where}: XLA's expert layers there are not modelled (kdist's tiny mixture-of-experts "
            f"configs compiled for 8 H100s came to up to {moe_high:.2f}x the estimate), so the band reaches that"
        )
    bounds = (int(peak * low), int(peak * high) + GEMM_WORKSPACE)  # calibrated: a GPU
    return bounds, cls.name, REASONS_SEPARATOR.join(reasons)
