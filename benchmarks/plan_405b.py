"""Planning a Llama-3-405B-shaped model on 8, 64 and 512 devices takes seconds, without those devices.

The keras-hub LlamaBackbone (vocabulary 128256, 126 layers, hidden 16384, 128
query heads, 8 key/value heads, intermediate 53248, bfloat16) is built
abstractly (nothing allocated), then `kdist.plan` ranks every data x fsdp x
model mesh for a batch of 256 sequences of 4096 tokens and 80 GB devices.
Meshes are enumerated from the device count alone: no fake devices are made.

Run: python benchmarks/plan_405b.py
Writes benchmarks/results/plan_405b.json.
"""

import json
import math
import resource
import time
from pathlib import Path

from kdist.machine import machine_info

BATCH, SEQUENCE = 256, 4096  # a million tokens per step
CONFIG = dict(
    vocabulary_size=128256,
    num_layers=126,
    hidden_dim=16384,
    num_query_heads=128,
    num_key_value_heads=8,
    intermediate_dim=53248,
    dtype="bfloat16",
)


def main():
    import keras_hub

    import kdist  # before keras_hub: selects the JAX backend

    start = time.perf_counter()
    model = kdist.abstract_model(keras_hub.models.LlamaBackbone, **CONFIG)
    build_seconds = time.perf_counter() - start
    parameters = sum(math.prod(v.shape) for v in model.weights)
    print(
        f"built {model.name} abstractly: {len(model.weights)} variables, {parameters / 1e9:.1f}e9 parameters, "
        f"{build_seconds:.1f} s"
    )
    runs = []
    for devices in (8, 64, 512):
        start = time.perf_counter()
        result = kdist.plan(model, devices, batch_size=BATCH, sequence_length=SEQUENCE, memory_per_device="80GB")
        seconds = time.perf_counter() - start
        best = result.recommendation
        print(f"\n{devices} devices: {len(result.candidates)} meshes planned in {seconds:.1f} s")
        print(f"  recommendation: {best.spec if best else None}  {result.reason or result.advice}")
        runs.append(
            {
                "devices": devices,
                "seconds": round(seconds, 2),
                "candidates": len(result.candidates),
                "valid": sum(c.valid for c in result.candidates),
                "fitting": sum(bool(c.valid and c.fits) for c in result.candidates),
                "recommendation": best.spec if best else None,
                "recommended_peak": best.peak if best else None,
                "reason": result.reason,
                "advice": result.advice,
                "smallest_peak": min(c.peak for c in result.candidates if c.valid)
                if any(c.valid for c in result.candidates)
                else None,
            }
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
                "parameters": parameters,
                "build_seconds": round(build_seconds, 2),
                "batch_size": BATCH,
                "sequence_length": SEQUENCE,
                "memory_per_device": "80GB",
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
