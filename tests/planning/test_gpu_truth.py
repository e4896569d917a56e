"""The planner against a real GPU: peaks measured on one H100 (/work/shared/gpu-truth/h100.json), planned on this CPU.

Each config is built abstractly exactly as the file's measure.py builds it
(same builders, the dtype policy set before building) and planned once for
target "H100" on one device. Skips when the file or keras-hub is absent.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest

import kdist
from kdist.planning.buffers import SWITCHES, Rules
from kdist.planning.calibration import (
    MEASURED_RESULTS,
    build_config,
    leave_one_out,
    load_configs,
    rule_sets,
    rules_key,
    truth_bytes,
)
from kdist.planning.candidates import evaluate
from kdist.planning.facts import ModelFacts
from kdist.planning.targets import resolve_target
from tests.helpers import JAX_VERSION

TRUTH = Path("/work/shared/gpu-truth/h100.json")
ROOT = Path(__file__).resolve().parents[2]
# Measured with XLA's autotuning off: 1.89 GB, about its logits (2.1 GB), under its peak under XLA's defaults, which
# hold the logits and their gradient at once, as the estimate does (docs/plan.md, "The loss's gradient beside the
# logits").
AUTOTUNING_OFF_LOSS = "transformer-core-b32s512"
H100_LIMIT = 63763906560  # JAX's default bytes_limit on the H100 that was measured (75% of the card)

pytestmark = pytest.mark.skipif(not TRUTH.exists(), reason=f"{TRUTH} is not on this machine")
# The truth was measured with jax 0.10.2. jax 0.12 traces a different step, for which no H100 figure exists yet: under
# 0.12.0.1 the planner came out 13-19% above the 0.10.2 peaks; under 0.12.1 (whose softmax backward keeps only the
# probabilities) it is lower: Llama 1B at 4 x 2048 tokens, which ran out of memory, is planned to fit. Tracked in the
# README's versions table.
measured_with_another_jax = pytest.mark.skipif(
    JAX_VERSION >= (0, 12),
    reason="the H100 peaks were measured with jax 0.10.2; re-measure with jax >= 0.12",
)


@pytest.fixture(scope="module")
def configs():
    pytest.importorskip("keras_hub")
    return {c["name"]: c for c in load_configs(TRUTH)}


@pytest.fixture(scope="module")
def models(configs):
    return {name: build_config(c) for name, c in configs.items()}


@pytest.fixture(scope="module")
def plans(configs, models):
    return {
        name: kdist.plan(
            models[name], 1, batch_size=c["batch_size"], sequence_length=c["sequence_length"], target="H100"
        )
        for name, c in configs.items()
    }


@measured_with_another_jax
def test_every_config_is_within_10_percent_of_the_h100(configs, plans):
    ratios = {}
    for name, c in configs.items():
        truth, _ = truth_bytes(c)
        ratios[name] = plans[name].candidates[0].peak / truth
    assert len(ratios) == 9
    assert all(0.9 <= r <= 1.1 for r in ratios.values()), ratios


@measured_with_another_jax
def test_fits_on_the_h100_matches_what_ran_and_what_ran_out_of_memory(configs, plans):
    for name, c in configs.items():
        p = plans[name]
        assert p.memory_per_device == H100_LIMIT and p.target == "H100" and p.margin == 0.1
        ran = isinstance(c["measured_peak_bytes"], int)
        assert p.candidates[0].fits is ran, (name, p.candidates[0].peak)
    oom = plans["llama-1b-b4s2048"]
    assert oom.recommendation is None and "No candidate fits" in oom.advice
    # Even XLA's own figure for it (61.07 GB) is over the budget the margin leaves: what ran out of memory.
    assert configs["llama-1b-b4s2048"]["xla_gpu_compiled_bytes"] > oom.budget


@measured_with_another_jax
def test_the_truth_falls_in_the_band(configs, plans):
    for name, c in configs.items():
        low, high = plans[name].candidates[0].band
        assert low <= truth_bytes(c)[0] <= high, name


@measured_with_another_jax
def test_the_switches_generalise_leave_one_out(configs, models):
    """Each config held out in turn: the compiler switches chosen on the other 8 predict it within 5%.

    The choice is among the validated setting and each switch flipped alone (6 settings, to keep the suite
    quick); benchmarks/planner_vs_gpu.py runs the same leave-one-out over all 32.
    """
    default = Rules()
    sets = [default] + [dataclasses.replace(default, **{s: not getattr(default, s)}) for s in SWITCHES]
    assert all(r in rule_sets() for r in sets)
    peaks, truths = {}, {}
    for name, c in configs.items():
        facts = ModelFacts(models[name], "adam", None, c["sequence_length"], None, resolve_target("H100"))
        peaks[name] = {
            rules_key(r): evaluate(facts.retraced(compiler_rules=r), {"data": 1}, c["batch_size"], 1e11, 1e-5).peak
            for r in sets
        }
        truths[name] = truth_bytes(c)[0]
    folds = leave_one_out(peaks, truths)
    assert len(folds) == 9
    assert all(abs(math.log(f["ratio"])) <= math.log(1.05) for f in folds if f["held_out"] != AUTOTUNING_OFF_LOSS), (
        folds
    )
    # The switches matter: some setting is more than 10% off on some config, so they are not free parameters.
    assert max(abs(math.log(p / truths[n])) for n in peaks for p in peaks[n].values()) > math.log(1.1)


@measured_with_another_jax
def test_the_tiny_transformer_follows_xla_defaults_not_autotuning_off(configs, plans):
    """Its estimate holds the logits and their gradient at once, as XLA does under its default flags: within 2% of the
    peak measured so on the same H100 (benchmarks/results/step_time_on_gpu.json), 5-10% over the peak measured with
    autotuning off (the shared file's flag), which held about one logits-sized buffer less."""
    runs = json.loads((ROOT / MEASURED_RESULTS).read_text())["runs"]
    default = [r for run in runs if not run["xla_flags"] for r in run["rows"] if r["config"] == AUTOTUNING_OFF_LOSS]
    c = configs[AUTOTUNING_OFF_LOSS]
    logits = c["batch_size"] * c["config"]["sequence_length"] * c["config"]["vocabulary_size"] * 4  # float32
    peak = plans[AUTOTUNING_OFF_LOSS].candidates[0].peak
    assert len(default) == 1 and 0.98 <= peak / default[0]["measured_peak_bytes"] <= 1.02
    truth = truth_bytes(c)[0]
    assert 1.05 <= peak / truth <= 1.10 and default[0]["measured_peak_bytes"] - truth > 0.8 * logits


def test_the_estimate_follows_the_target_not_this_cpu_host(configs, models):
    """On this CPU-only machine, a bfloat16 Llama planned for a GPU takes the fused attention a GPU would."""
    c = dict(configs["llama-1b-b8s1024"], dtype_policy="mixed_bfloat16")
    model = build_config(c)
    gpu = kdist.plan(model, 1, batch_size=8, sequence_length=1024, target="gpu")
    cpu = kdist.plan(model, 1, batch_size=8, sequence_length=1024, target="cpu")
    assert gpu.attention == "fused" and cpu.attention == "materialized"
    assert gpu.candidates[0].peak < 0.8 * cpu.candidates[0].peak  # no (sequence x sequence) scores kept
    # Mixed precision: float32 master weights and Adam state, bfloat16 activations.
    f32 = kdist.plan(models["llama-1b-b8s1024"], 1, batch_size=8, sequence_length=1024, target="gpu")
    assert gpu.candidates[0].weights == f32.candidates[0].weights
    assert gpu.candidates[0].optimizer == f32.candidates[0].optimizer
    assert gpu.candidates[0].activations < 0.7 * f32.candidates[0].activations
