"""The planner's estimated peak memory per device versus XLA's compiled figure, for every mesh.

For three model families (kdist's MNIST MLP, kdist's tiny transformer and a
tiny keras-hub Llama 3 backbone) and every data x fsdp x model mesh of 8 fake
CPU devices, `kdist.plan(..., verify=True)` estimates the per-device peak and
compiles the real Keras training step (Adam, softmax cross-entropy) from
abstract inputs; the compiled figure is argument + output - alias + temp of
`compiled.memory_analysis()`. The issue's target is a ratio within 0.8-1.2.

Run: python benchmarks/planner_vs_compiled.py [--fake-devices 8]
Writes benchmarks/results/planner_vs_compiled.json.
"""

import argparse
import json
import time
from pathlib import Path

from kdist.machine import machine_info

FAMILIES = {
    "mlp": dict(batch_size=64),
    "tiny-transformer": dict(batch_size=16),
    "tiny-llama3": dict(batch_size=8, sequence_length=16),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-devices", type=int, default=8)
    args = parser.parse_args()
    import kdist

    kdist.fake_devices(args.fake_devices)
    from kdist import zoo

    rows = []
    for name, options in FAMILIES.items():
        start = time.perf_counter()
        result = kdist.plan(
            zoo.ENTRIES[name][0], args.fake_devices, verify=True, **options
        )  # the builder: rebuilt per mesh
        seconds = time.perf_counter() - start
        for c in result.candidates:
            if not c.compiled:
                continue
            rows.append(
                {
                    "model": name,
                    "mesh": c.spec,
                    "estimated_peak": c.peak,
                    "compiled_peak": c.compiled["peak"],
                    "ratio": round(c.ratio, 3),
                    "estimate": c.to_dict()["bytes"],
                    "compiled": c.compiled,
                }
            )
        print(
            f"{name}: planned and compiled {sum(1 for c in result.candidates if c.compiled)} meshes in {seconds:.1f} s"
        )
    print(f"\n{'model':18} {'mesh':24} {'estimated':>12} {'compiled':>12} {'est/comp':>9}")
    for r in rows:
        flag = "" if 0.8 <= r["ratio"] <= 1.2 else "  outside 0.8-1.2"
        print(
            f"{r['model']:18} {r['mesh']:24} {r['estimated_peak']:12,d} {r['compiled_peak']:12,d} "
            f"{r['ratio']:9.2f}{flag}"
        )
    within = sum(1 for r in rows if 0.8 <= r["ratio"] <= 1.2)
    print(f"\n{within} of {len(rows)} meshes within 20% of the compiled peak")
    out = Path(__file__).parent / "results" / "planner_vs_compiled.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"machine": machine_info(), "within_20_percent": within, "meshes": len(rows), "rows": rows}, indent=1
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
