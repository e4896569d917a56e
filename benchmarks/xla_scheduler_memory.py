"""How much memory XLA:GPU's latency-hiding scheduler adds to a training step's peak, mesh by mesh.

XLA:GPU schedules a module twice: its memory scheduler picks the order with
the least memory (list, DFS or post-order), then the latency-hiding
scheduler (LHS) reorders it to overlap the asynchronous collectives with
compute, within a memory limit (a share of the device's memory). The
deviceless compile of the `gpu-verify` extra runs both, whatever the
module config's `xla_gpu_enable_latency_hiding_scheduler` says. This script
compiles each mesh in a child process with XLA's scheduler logs on and reads
back the LHS's "memory pressure peak" before and after it reorders, its
limit, and XLA's compiled figure, beside the planner's estimate. Where the
LHS's first order goes past its limit, XLA logs that order's pressure and
schedules again; only the compiled figure shows the final order.

Run (needs jax-cuda13-pjrt, the `gpu-verify` extra):
     JAX_PLATFORMS=cpu python benchmarks/xla_scheduler_memory.py --model gpt2 --devices 8 --meshes "data=8;fsdp=8"
     ... --slop-factor 1    (XLA_FLAGS=--xla_gpu_memory_limit_slop_factor=1: the LHS's limit becomes 1% of
                             the device memory it plans with instead of its default share)
     ... --reestimate       (the stored rows keep XLA's figures and get this checkout's estimate, without
                             compiling)
Appends to benchmarks/results/xla_scheduler_memory.json (one row per model, device count, batch, mesh
and slop factor), with the machine it ran on.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "xla_scheduler_memory.json"
CHILD = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import kdist
kdist.fake_devices({devices})
from kdist.machine import machine_info
from planner_vs_deviceless_sharded import PLAN_OPTIONS, VERIFY_TARGET, config_named, hub_builder
label, cls, config, batch, sequence = config_named({model!r})
result = kdist.plan(hub_builder(cls, config), {devices}, batch_size={batch} or batch, sequence_length=sequence,
                    **PLAN_OPTIONS, verify=[{mesh!r}], verify_target=VERIFY_TARGET)
c = next(c for c in result.candidates if c.compiled)
row = {{"target": "H100 (deviceless XLA:GPU)", "config": label, "batch": {batch} or batch, "mesh": c.spec,
       "estimate": c.peak, "xla_gpu_deviceless": c.compiled["peak"], "machine": machine_info()}}
print("RESULT " + json.dumps(row), flush=True)
"""
PRESSURE = re.compile(r"Memory pressure peak \(bytes\): (\d+)")
LIMIT = re.compile(r"LatencyHidingScheduler current memory usage: (\d+) bytes\. Current limit: (\d+)")
CHOSEN = re.compile(r"Chose min-memory (\w[\w ]*?) sequence")


def measure(model, devices, batch, mesh, slop_factor):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="0",
        TF_CPP_VMODULE="latency_hiding_scheduler=1,hlo_memory_scheduler=2",
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")]),
    )
    if slop_factor is not None:
        env["XLA_FLAGS"] = f"--xla_gpu_memory_limit_slop_factor={slop_factor}"
    code = CHILD.format(benchmarks=str(Path(__file__).parent), devices=devices, model=model, batch=batch, mesh=mesh)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{mesh}: the compile failed:\n{out.stderr[-3000:]}")
    row = json.loads(lines[-1][len("RESULT ") :])
    pressure = [int(p) for p in PRESSURE.findall(out.stderr)]
    limits = LIMIT.findall(out.stderr)
    chosen = CHOSEN.findall(out.stderr)
    row.update(
        devices=devices,
        slop_factor=slop_factor,
        memory_scheduler=chosen[-1] if chosen else None,
        pressure_before_lhs=pressure[0] if pressure else None,
        pressure_after_lhs=pressure[-1] if pressure else None,
        lhs_limit=int(limits[-1][1]) if limits else None,
    )
    return row


def reestimate(rows):
    """Each stored row's estimate recomputed by this checkout's planner (one plan per config, device count, batch)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from planner_vs_deviceless_sharded import CONFIGS, HELD_OUT, PLAN_OPTIONS, hub_builder

    import kdist

    labels = {label: (cls, config, sequence) for label, cls, config, _, sequence in CONFIGS + HELD_OUT}
    plans = {}
    for row in rows:
        key = (row["config"], row["devices"], row["batch"])
        if key not in plans:
            cls, config, sequence = labels[row["config"]]
            plans[key] = kdist.plan(hub_builder(cls, config), row["devices"], batch_size=row["batch"],
                                    sequence_length=sequence, **PLAN_OPTIONS)  # fmt: skip
        row["estimate"] = plans[key].candidate(row["mesh"]).peak


def _mb(value):
    return f"{value / 1e6:7.1f}" if value is not None else "    n/a"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", default="gpt2", help="a label prefix of planner_vs_deviceless_sharded.CONFIGS or HELD_OUT"
    )
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--batch", type=int, default=0, help="global batch (default: the config's)")
    parser.add_argument("--meshes", default="data=8", help="';'-separated mesh specs")
    parser.add_argument("--slop-factor", type=int, default=None, help="XLA's --xla_gpu_memory_limit_slop_factor")
    parser.add_argument("--reestimate", action="store_true", help="recompute the stored rows' estimates only")
    args = parser.parse_args()
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    if args.reestimate:
        reestimate(saved["rows"])
        RESULTS.write_text(json.dumps(saved, indent=1) + "\n")
        return print(f"wrote {RESULTS}")
    for mesh in [m for m in args.meshes.split(";") if m]:
        row = measure(args.model, args.devices, args.batch, mesh, args.slop_factor)
        print(
            f"{row['config'][:36]:36} {row['mesh']:16} estimate {_mb(row['estimate'])} MB"
            f" | XLA {_mb(row['xla_gpu_deviceless'])} MB"
            f" | LHS pressure {_mb(row['pressure_before_lhs'])} -> {_mb(row['pressure_after_lhs'])} MB"
            f" (limit {_mb(row['lhs_limit'])} MB; memory scheduler: {row['memory_scheduler']})",
            flush=True,
        )
        key = ("config", "devices", "batch", "mesh", "slop_factor")
        saved["rows"] = [r for r in saved["rows"] if any(r.get(k) != row[k] for k in key)] + [row]
        RESULTS.write_text(json.dumps(saved, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
