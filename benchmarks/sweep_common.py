"""Shared driver of the sweep benchmarks (sweep_mlp.py, sweep_cnn.py, sweep_transformer.py).

Runs `kdist.sweep` over every mesh shape of 8 fake CPU devices, prints the
table, saves CSV, JSON (with the machine it ran on) and PNG under
benchmarks/results/, and prints how well the measured step time agrees with
the same compiled step timed in a bare loop (target: within 5%).
"""

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
AGREEMENT_TARGET = 0.05


def main(name, build, description, batch_size, steps=40, warmup=5):
    parser = argparse.ArgumentParser(description=f"kdist.sweep benchmark: {description}")
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices (default 8)")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--meshes", default="all", help='comma-separated specs or "all"')
    args = parser.parse_args()

    import kdist

    kdist.fake_devices(args.devices)
    from rich.console import Console

    from kdist.runtime.sample_data import random_data

    console = Console(width=160)
    samples = args.batch_size * min(args.steps + args.warmup, 8)
    data, loss = random_data(kdist.abstract_model(build), samples, seed=0)
    meshes = "all" if args.meshes == "all" else args.meshes.split(",")
    result = kdist.sweep(
        build,
        data,
        meshes,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        loss=loss,
        console=console,
    )
    console.print(result)

    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"sweep_{name}"
    result.to_csv(stem.with_suffix(".csv"))
    result.to_json(stem.with_suffix(".json"))
    import matplotlib.pyplot as plt

    plt.close(result.plot(stem.with_suffix(".png"), title=f"kdist sweep: {description}"))
    summary = agreement_summary(result)
    data = json.loads(stem.with_suffix(".json").read_text())
    data["benchmark"] = {"name": name, "description": description, "agreement": summary}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2))

    console.print(
        "\n[bold]Measured step time vs the same compiled step timed directly[/] (target within "
        f"{AGREEMENT_TARGET:.0%}):"
    )
    for mesh, agreement in summary["per_shape"].items():
        mark = "ok" if abs(agreement) <= AGREEMENT_TARGET else "OUTSIDE"
        console.print(f"  {mesh:>6}: {agreement:+.2%}  {mark}")
    console.print(
        f"  {summary['within']} of {summary['shapes']} shapes within {AGREEMENT_TARGET:.0%}; "
        f"median |difference| {summary['median_abs']:.2%}"
    )
    o = result.overhead
    console.print(
        f"Sweep overhead: {o['overhead_s']:.1f} s of {o['wall_s']:.1f} s wall time outside measured steps "
        f"({o['overhead_share']:.0%}); timing loop adds {o['loop_overhead_per_step_s'] * 1e6:.0f} µs per step "
        "outside the timed calls."
    )
    console.print(f"Wrote {stem}.csv, .json, .png")
    return result


def agreement_summary(result):
    import statistics

    per_shape = {r.mesh: r.agreement for r in result.ok_rows if r.agreement is not None}
    values = [abs(v) for v in per_shape.values()]
    return {
        "target": AGREEMENT_TARGET,
        "per_shape": per_shape,
        "shapes": len(values),
        "within": sum(v <= AGREEMENT_TARGET for v in values),
        "median_abs": statistics.median(values) if values else None,
    }
