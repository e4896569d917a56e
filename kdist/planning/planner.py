"""Mesh planner: which split of N devices to train a model on, and why.

`kdist.plan` enumerates every mesh of N devices (data x fsdp x model, and an
expert axis when the rules use one), and for each estimates per-device memory
(weights, optimizer state, the activations and transient buffers alive at the
step's peak) and communication per training step, from the model's real
variables, the layouts kdist's placement engine gives them and the model's
training step traced once for the target accelerator. With `verify=True` it
also compiles the real Keras training step for each mesh, from abstract
inputs, and puts XLA's memory analysis beside the estimate. See docs/plan.md
for the memory model and its calibration.
"""

import time

from kdist.checks import MAX_BATCH, MAX_DEVICES, MAX_LATENCY_SECONDS, non_negative_number, one_of, positive_int, shown
from kdist.errors import PlanError
from kdist.meshes.enumerate import meshes
from kdist.planning.attention import ATTENTION
from kdist.planning.calibration import (
    AUTOTUNED_HIGH,
    LHS_HIGH,
    LHS_RESULTS,
    MEASURED_RESULTS,
    MEASURED_SHORT_STEP,
    MEASURED_STEP,
    SHORT_STEP,
    band_class,
)
from kdist.planning.candidates import REASONS_SEPARATOR, evaluate
from kdist.planning.deviceless import COMPILER_OPTIONS, gpu_devices
from kdist.planning.facts import ModelFacts, check_dtype, check_sequence_length
from kdist.planning.memory_model import GEMM_WORKSPACE
from kdist.planning.plan import Plan
from kdist.planning.ranking import rank
from kdist.planning.targets import DEFAULT_MARGIN, check_margin, cpu_proxy_note, resolve_target, scheduler_limit
from kdist.planning.verify import verify as verify_plan
from kdist.render.progress import steps
from kdist.units import human_bytes, human_seconds, parse_size

DEFAULT_BANDWIDTH = 100e9  # bytes/s per device, one direction (about one TPU ICI link or a fraction of NVLink)
DEFAULT_LATENCY = 10e-6  # seconds per collective step


def plan(
    model_or_variables,
    devices,
    *,
    batch_size,
    sequence_length=None,
    optimizer="adam",
    dtype=None,
    memory_per_device=None,
    bandwidth=DEFAULT_BANDWIDTH,
    latency=DEFAULT_LATENCY,
    rules=None,
    verify=False,
    progress=False,
    target=None,
    attention=None,
    remat=False,
    margin=DEFAULT_MARGIN,
    verify_target=None,
):
    """Rank every mesh of `devices` devices for training a model, and recommend one.

    Nothing is allocated: build big models with `kdist.abstract_model`. The
    mesh sizes come from the device count alone, so planning for 512 devices
    needs no devices; `verify=True` compiles on `devices` (fake) devices.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    p = kdist.plan(model, devices=8, batch_size=32, memory_per_device="16GB")
    print(p)                          # ranking, recommendation and why
    p.recommendation.spec             # e.g. "data=8"
    p.recommendation.band             # (low, high) bytes the truth fell in on the calibration
    keras.distribution.set_distribution(p.preset())
    kdist.plan(model, 8, batch_size=32, target="H100", remat=True)   # for H100s, layers rematerialised
    ```

    Args:
        model_or_variables: a Keras model (built, or built abstractly), a
            zero-argument function that builds one (needed by `verify` for
            models that cannot be rebuilt from their config), or a list of
            variables (no activation estimate then). A keras-hub task (a
            causal LM, a classifier) is planned whole, with its head; the
            estimate takes sparse cross-entropy over each float output, the
            loss keras-hub's language models and classifiers compile with.
        devices: the number of devices, a positive integer.
        batch_size: the global batch size.
        sequence_length: the length of unknown (None) input dimensions after
            the batch, e.g. tokens per example of a keras-hub backbone; or a
            dict by input name where inputs differ (a seq2seq model's
            `{"encoder_token_ids": 512, "decoder_token_ids": 128, ...}`), each
            an int for all of that input's unknown dimensions or a tuple with
            one per dimension (an empty prompt: 0).
        optimizer: a Keras optimizer name, config or instance; its real
            slot variables are planned (Adam: 2 per weight).
        dtype: count weights, gradients, optimizer state and activations in
            this dtype instead of the model's own (e.g. "bfloat16"). For mixed
            precision build the model under `keras.config.set_dtype_policy(
            "mixed_bfloat16")` instead: float32 weights, bfloat16 activations.
        memory_per_device: memory of one device: bytes or "80GB", "80GiB", "8e10".
            Default: what one device of the target may use (the local
            accelerator's `memory_stats()["bytes_limit"]`, or JAX's default
            for a named device kind such as "H100"); None when unknown.
        bandwidth: bytes per second per device for collectives (or "100GB/s").
        latency: seconds per collective step (the alpha of the alpha-beta model).
        rules: layout rules, as `kdist.preset` takes them (default: kdist's rules).
        verify: True to compile the training step of every valid candidate on
            (fake) devices and record XLA's memory analysis in
            `candidate.compiled`; or a list of the specs to verify.
        progress: show the verification's progress (a bar on a terminal,
            one line per candidate otherwise, on stderr).
        target: the accelerator to plan for: "gpu", "tpu", "cpu" or a device
            kind ("H100", "A100-80GB", "TPU v5p", ...). Default: the local
            accelerator if there is one, else "gpu". The estimate follows
            the target's compiler, whichever machine computes it.
        attention: "fused" (flash / Splash: no sequence x sequence scores
            kept) or "materialized"; default: what Keras takes on the target
            for the model's compute dtype, or for `dtype` where given (fused on
            TPU, and on GPU for bfloat16/float16).
        remat: True to rematerialise every layer (`keras.remat`): only layer
            inputs are kept for the backward pass, which recomputes each
            layer's forward (about +33% compute per step).
        margin: the fraction of `memory_per_device` kept free for allocator
            fragmentation, workspaces and the estimate's error (default 0.1):
            a candidate fits when its peak is at most (1 - margin) x memory.
        verify_target: with `verify`, a GPU kind ("H100") to compile for
            without one: XLA:GPU's figure instead of this machine's backend's.
            Needs jax's CUDA PJRT plugin (`pip install jax-cuda13-pjrt==<jaxlib
            version>`, Linux only) and JAX_PLATFORMS=cpu; see
            `kdist.planning.deviceless`.

    Returns:
        A `Plan`.
    """
    start = time.perf_counter()
    devices = positive_int(devices, "devices", maximum=MAX_DEVICES, error=PlanError)
    batch_size = positive_int(batch_size, "batch_size", maximum=MAX_BATCH, error=PlanError)
    sequence_length = check_sequence_length(sequence_length)
    memory = parse_size(memory_per_device, "memory_per_device") if memory_per_device is not None else None
    bandwidth = parse_size(bandwidth, "bandwidth")
    latency = non_negative_number(latency, "latency", unit="seconds", maximum=MAX_LATENCY_SECONDS, error=PlanError)
    dtype = check_dtype(dtype)
    verify = _verify_option(verify)
    target = resolve_target(target)
    if attention is not None:
        one_of(attention, "attention", ATTENTION, error=PlanError)
    if not isinstance(remat, bool):
        raise PlanError(f"remat must be True or False; received remat={shown(remat)}.")
    margin = check_margin(margin)
    if verify_target is not None and not verify:
        raise PlanError(f"verify_target={verify_target!r} says what to compile for: pass it with verify=True.")
    source = "memory_per_device"
    if memory is None and target.memory is not None:
        memory, source = target.memory, target.memory_source
    facts = ModelFacts(model_or_variables, optimizer, dtype, sequence_length, rules, target, attention, remat)
    candidates = [evaluate(facts, axes, batch_size, bandwidth, latency) for axes in meshes(devices, facts.roles)]
    result = Plan(
        facts.name,
        devices,
        batch_size,
        facts.sequence_length,
        facts.optimizer_name,
        memory,
        bandwidth,
        latency,
        candidates,
        notes=_notes(facts, bandwidth, latency) + _band_notes(facts, devices, candidates) + list(facts.notes),
        rules=rules,
        target=target.name,
        memory_source=source if memory is not None else "",
        margin=margin,
        attention=facts.traced.attention if facts.traced is not None else "",
        remat=remat,
    )
    rank(result, facts)
    result.notes += _scheduler_fit_notes(result, facts.target) + _band_fit_notes(result)
    if verify:
        chosen = None if verify is True else verify
        devices = gpu_devices(verify_target, result.devices) if verify_target is not None else None
        options = COMPILER_OPTIONS if devices is not None else None
        with steps("plan --verify", sum(c.valid for c in result.candidates), enabled=progress) as bar:
            verify_plan(result, facts, chosen, lambda spec: bar.next(f"compiling the step on {spec}"), devices, options)
        backends = {c.compiled["backend"] for c in result.candidates if c.compiled}
        if "cpu" in backends and target.platform != "cpu":
            result.notes.append(cpu_proxy_note())
    result.seconds = time.perf_counter() - start
    return result


def _notes(facts, bandwidth, latency):
    """What the estimate is for: the target and its calibration, attention, step time and remat."""
    target = facts.target
    calibration = "" if target.calibrated else "; not calibrated on this platform: no band"
    notes = [f"estimated for {target.name} (XLA:{target.platform.upper()} buffer rules{calibration})"]
    if facts.traced is not None and facts.traced.attention != "none":
        notes.append(f"attention traced {facts.traced.attention}" + _attention_why(facts))
    notes.append(_step_time_note(facts, bandwidth, latency))
    if facts.remat:
        notes.append(
            "remat: each layer's forward is recomputed in the backward pass, up to about +33% compute per step (a "
            "forward is about a third of forward + backward); each mesh's compute time counts what is recomputed"
        )
    return notes


def _band_notes(facts, devices, candidates):
    """Which class of calibration configs each band comes from, and why some are wider or absent."""
    if not facts.target.calibrated:
        return []
    classes = {c.band_class: band_class(c.axes, facts.traced.family)[0] for c in candidates if c.band_class}.values()
    notes = []
    if classes:
        spreads = ", ".join(f"{b.name} {b.low - 1:+.0%}/{b.high - 1:+.0%}" for b in classes)
        notes.append(
            f"band: the truth fell within these of the estimate on configs like each mesh (H100, measured or "
            f"XLA:GPU's figure; kdist.planning.calibration.BANDS): {spreads}; each top plus the "
            f"{GEMM_WORKSPACE / 2**20:g} MiB workspace XLA:GPU gives a cuBLAS GEMM, which the estimate counts only "
            f"where its own order peaks at one"
        )
        notes.append(
            f"band: the estimate follows XLA:GPU's compile without a GPU; on one H100 under XLA's default flags "
            f"(autotuned GEMMs) measured peaks came to up to {AUTOTUNED_HIGH - 1:+.0%} over that compile "
            f"({MEASURED_RESULTS}, inside the bands)"
        )
    if devices > 1 and any(c.band for c in candidates):
        notes.append(
            "band: with collectives XLA:GPU's latency-hiding scheduler orders the backward to overlap them, not to "
            "save memory (while under its limit, 95% of 80% of the device's memory): the estimate takes the worst "
            f"order within each sublayer's backward, and XLA's figure came to at most {LHS_HIGH - 1:+.0%} over it on "
            f"the stored meshes of several devices ({LHS_RESULTS} and others, inside the bands; docs/plan.md)"
        )
    for why in sorted({why for c in candidates if c.band_why for why in c.band_why.split(REASONS_SEPARATOR)}):
        notes.append(f"band: {why}")
    return notes


def _scheduler_fit_notes(result, target):
    """The fitting meshes that XLA:GPU's latency-hiding scheduler could still carry past memory_per_device."""
    limit = scheduler_limit(target)
    memory = result.memory_per_device
    if result.devices == 1 or limit is None or memory is None:
        return []
    worst = {c.spec: min(c.peak * LHS_HIGH, max(c.peak, limit)) for c in result.candidates if c.valid and c.fits}
    close = [spec for spec, peak in worst.items() if peak > memory]
    if not close:
        return []
    return [
        f"fit: {', '.join(close)} fit by the estimate, but on a mesh with collectives XLA:GPU's figure came to up "
        f"to {LHS_HIGH - 1:.0%} over it, and its latency-hiding scheduler may fill up to {human_bytes(limit)} of "
        f"{target.name} (95% of 80% of its memory), past memory_per_device ({human_bytes(memory)}): a larger margin= "
        'leaves them out (docs/plan.md, "What the latency-hiding scheduler adds")'
    ]


def _band_fit_notes(result):
    """The fitting meshes whose band reaches past memory_per_device: on configs like them the truth might not fit."""
    memory = result.memory_per_device
    if memory is None:
        return []
    past = [c for c in result.candidates if c.valid and c.fits and c.band and c.band[1] > memory]
    if not past:
        return []
    listed = ", ".join(f"{c.spec} (up to {human_bytes(c.band[1])})" for c in past)
    return [
        f"fit: {listed} fit by the estimate, but their bands reach past memory_per_device ({human_bytes(memory)}): "
        "on configs like them the truth came to that much over the estimate (the notes on bands say which); a "
        "larger margin= leaves them out"
    ]


def _step_time_note(facts, bandwidth, latency):
    """What the step-time estimate assumes (`bandwidth` bytes/s, `latency` s per collective), or why there is none."""
    target = facts.target
    if facts.traced is None:
        return "no step-time estimate without a traced step: ranked by estimated communication"
    if target.peaks is None:
        return (
            f"no step-time estimate: the peak FLOP/s and memory bandwidth of {target.name} are not known to kdist "
            "(target= a device kind such as 'H100' gives them): ranked by estimated communication"
        )
    assumed = f" ({target.name}: an {target.peaks_kind}'s figures assumed)" if target.peaks_kind != target.name else ""
    (low, high), (short_low, short_high) = MEASURED_STEP, MEASURED_SHORT_STEP
    return (
        f"step times are estimates, not measurements: compute at the roofline of {target.peaks_kind}{assumed} "
        f"({target.peaks[2]}), communication at {bandwidth / 1e9:.3g} GB/s per device and {human_seconds(latency)} "
        "per collective step (bandwidth=, latency=); gradient reductions overlap the backward "
        "pass, fsdp gathers are prefetched one weight ahead, model/expert collectives are exposed (docs/plan.md, "
        f'"Step time"). The roofline is a lower bound: on one H100, measured steps took {low:.2f}-{high:.2f}x the '
        f"estimate where it was {SHORT_STEP * 1e3:.0f} ms or more, and {short_low:.2f}-{short_high:.2f}x where less "
        f"({MEASURED_RESULTS})"
    )


def _attention_why(facts):
    if facts.attention is not None:
        return " (attention= given)"
    if facts.dtype is not None:
        return f" (what Keras takes on {facts.target.platform.upper()} for a model built in dtype={facts.dtype!r})"
    return f" (what Keras takes on {facts.target.platform.upper()} for this compute dtype)"


def _verify_option(verify):
    if isinstance(verify, bool):
        return verify
    if isinstance(verify, str) or not hasattr(verify, "__iter__") or not all(isinstance(s, str) for s in verify):
        raise PlanError(
            f'verify must be True, False or a list of candidate specs such as ["data=8"]; received {shown(verify)}.'
        )
    return set(verify)
