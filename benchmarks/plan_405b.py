"""Planning a Llama-3-405B-shaped model on 64-512 GPUs of 80 GB: what fits, with and without remat, in seconds.

The keras-hub LlamaBackbone (vocabulary 128256, 126 layers, hidden 16384, 128
query heads, 8 key/value heads, intermediate 53248) with an untied LM head
(logits = hidden @ the reversed token embedding, as LlamaCausalLM has it) is
built abstractly under "mixed_bfloat16" (float32 master weights and Adam
state, bfloat16 activations): nothing is allocated. `kdist.plan` then ranks
every data x fsdp x model mesh for 64 sequences of 8192 tokens on 80 GB
devices (10% kept free), planned for a GPU: fused (flash) attention, as
Keras takes it on a GPU for bfloat16. Each device count is planned plain
and with per-layer rematerialisation (`remat=True`, about +33% compute).
Meshes are enumerated from the device count alone: no devices are made.

Run: python benchmarks/plan_405b.py
Writes benchmarks/results/plan_405b.json.
"""

import json
import math
import resource
import time
from pathlib import Path

from kdist.abstract import dtype_policy_scope
from kdist.machine import machine_info
from kdist.zoo import PUBLISHED

BATCH, SEQUENCE = 64, 8192  # half a million tokens per step
MEMORY = "80GB"
CONFIG = PUBLISHED["llama3-405b"][1]


def build():
    import keras
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(**CONFIG)
    logits = backbone.token_embedding(backbone.output, reverse=True)
    return keras.Model(backbone.inputs, logits, name="llama3_405b_lm")


def main():
    import keras_hub  # noqa: F401  (fails early when keras-hub is missing)

    import kdist  # before keras_hub: selects the JAX backend

    start = time.perf_counter()
    with dtype_policy_scope("mixed_bfloat16"):
        model = kdist.abstract_model(build)
    build_seconds = time.perf_counter() - start
    parameters = sum(math.prod(v.shape) for v in model.weights)
    print(f"built {model.name} abstractly: {parameters / 1e9:.1f}e9 parameters, {build_seconds:.1f} s")
    runs = []
    for devices in (64, 128, 256, 512):
        for remat in (False, True):
            start = time.perf_counter()
            result = kdist.plan(
                model, devices, batch_size=BATCH, sequence_length=SEQUENCE, memory_per_device=MEMORY, remat=remat
            )
            seconds = time.perf_counter() - start
            valid = [c for c in result.candidates if c.valid]
            best = result.recommendation or min(valid, key=lambda c: c.peak)
            runs.append(
                {
                    "devices": devices,
                    "remat": remat,
                    "attention": result.attention,
                    "seconds": round(seconds, 2),
                    "candidates": len(result.candidates),
                    "valid": len(valid),
                    "fitting": sum(bool(c.valid and c.fits) for c in result.candidates),
                    "recommendation": result.recommendation.spec if result.recommendation else None,
                    "best": best.spec,
                    "best_peak": best.peak,
                    "best_terms": best.to_dict()["bytes"],
                    "best_band": list(best.band) if best.band else None,
                    "smallest_peak": min(c.peak for c in valid),
                    "reason": result.reason,
                    "advice": result.advice,
                    "suggestions": result.suggestions,
                }
            )
            r = runs[-1]
            print(
                f"{devices:4d} devices, remat={remat!s:5}: {r['fitting']:2d} of {r['valid']:2d} valid meshes fit; "
                f"best {best.spec} at {best.peak / 1e9:.1f} GB ({seconds:.1f} s)"
            )
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"\npeak RSS {peak_rss / 2**30:.2f} GiB")
    out = Path(__file__).parent / "results" / "plan_405b.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "config": CONFIG,
                "dtype_policy": "mixed_bfloat16",
                "lm_head": "untied (reversed token embedding)",
                "parameters": parameters,
                "build_seconds": round(build_seconds, 2),
                "batch_size": BATCH,
                "sequence_length": SEQUENCE,
                "memory_per_device": MEMORY,
                "peak_rss_bytes": peak_rss,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
