"""XLA:GPU's own buffers at its memory peak beside the planner's terms at its peak, mesh by mesh.

For each mesh the training step is compiled for deviceless H100s (needs
jax-cuda13-pjrt) with XLA's dumps on, and the dump's buffer assignment and
live ranges are read back: the temporary heap XLA reserves, the most bytes
of it alive at one instruction (the rest is heap fragmentation; every value
counts, so values sharing one buffer count twice and a packed heap can show
a fragmentation just under 0), where in the step that instruction is, and
the values alive there grouped by the part of the step that made them
(forward, backward, optimizer, collectives) and by shape, and each of at
least 1 MiB with the jax operation that made it and its live range. The planner's
terms at its own peak stand beside them: the term-by-term comparison behind
the "Every mesh of 8 devices" section of docs/plan.md.

Run: JAX_PLATFORMS=cpu python benchmarks/xla_buffers_at_peak.py --model gpt2 --devices 8 \
         --meshes "data=8;fsdp=8;model=8"
     JAX_PLATFORMS=cpu python benchmarks/xla_buffers_at_peak.py --model gpt_neox --devices 16 --dtype bfloat16 \
         --sequence 512 --meshes "data=16"
     JAX_PLATFORMS=cpu python benchmarks/xla_buffers_at_peak.py --model gpt2 --devices 1 --batch 4
     JAX_PLATFORMS=cpu python benchmarks/xla_buffers_at_peak.py --model llama3 --batch 256 --remat --meshes "data=8"
     JAX_PLATFORMS=cpu python benchmarks/xla_buffers_at_peak.py --model deberta_v3 --width 1024,4 --dtype bfloat16 \
         --meshes "data=2,model=4"
     JAX_PLATFORMS=cpu XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true \
         python benchmarks/xla_buffers_at_peak.py --model gpt2 --devices 8 --meshes "data=8;fsdp=8"
Appends to benchmarks/results/xla_buffers_at_peak.json (one entry per model, device count, batch and
XLA_FLAGS; a rerun replaces the rows of the meshes it compiles and keeps the others, each with the date of
the run that took it as `taken`; each entry also stores, as `latency_hiding_scheduler`, the module config's
xla_gpu_enable_latency_hiding_scheduler: false by default in jax 0.10.2's compile, yet the scheduler runs
either way, see benchmarks/xla_scheduler_memory.py).
The dump folder this script makes is removed at the end.
"""

import argparse
import collections
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

DUMP = tempfile.mkdtemp(prefix="kdist-xla-dump-")
XLA_FLAGS = os.environ.get("XLA_FLAGS", "")  # the caller's, recorded with the results
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU
os.environ["XLA_FLAGS"] = f"{XLA_FLAGS} --xla_dump_to={DUMP}".strip()

# After XLA_FLAGS: jax reads them once.
from planner_vs_deviceless_sharded import (  # noqa: E402
    PLAN_OPTIONS,
    VERIFY_TARGET,
    at_width,
    config_named,
    hub_builder,
    resized,
)

RESULTS = Path(__file__).parent / "results" / "xla_buffers_at_peak.json"
SUFFIX = "gpu_after_optimizations"


def latency_hiding_scheduler(prefix):
    """The module config's xla_gpu_enable_latency_hiding_scheduler (not whether the scheduler ran: it runs anyway)."""
    module = ".".join(Path(prefix).name.split(".")[:2])  # module_0001.jit_train_step
    config = (Path(prefix).parent / f"{module}.config.pbtxt").read_text()
    return re.search(r"xla_gpu_enable_latency_hiding_scheduler: (\w+)", config).group(1) == "true"


def newest_dump():
    """The path prefix of the newest training-step module XLA dumped (module ids grow with each compile)."""
    names = [p.name for p in Path(DUMP).glob(f"module_*.jit_train_step.*{SUFFIX}-buffer-assignment.txt")]
    newest = max(names, key=lambda n: int(n.split(".")[0].split("_")[1]))
    return str(Path(DUMP) / newest.replace("-buffer-assignment.txt", ""))


def xla_peak(prefix):
    """Heap size, the most live bytes at one instruction, and the values alive there, from XLA's dump."""
    assignment = Path(prefix + "-buffer-assignment.txt").read_text()
    temp = re.search(r"allocation \d+: size (\d+), preallocated-temp:\n((?: value:.*\n)+)", assignment)
    values = []
    for m in re.finditer(r"<\d+ (\S+) @0> \(size=(\d+),offset=\d+\): (\S+)", temp.group(2)):
        name = m.group(1) if "{" in m.group(1) else m.group(1) + "{}"
        values.append((name, int(m.group(2)), m.group(3).split("{")[0]))
    ranges = Path(prefix + "-live-range.txt").read_text().split("BufferLiveRange:")[1].split("Live ranges at")[0]
    spans = re.finditer(r"^\s+(\S+):(\d+)-(\d+)$", ranges, re.M)
    live = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in spans}
    values = [v for v in values if v[1] > 0 and v[0] in live]
    events = collections.Counter()
    for name, size, _ in values:
        start, end = live[name]
        events[start] += size
        events[end + 1] -= size
    alive, best, at = 0, -1, 0
    for t in sorted(events):
        alive += events[t]
        if alive > best:
            best, at = alive, t
    ops = _op_names(Path(prefix + ".txt").read_text())
    groups, named = collections.Counter(), []
    for name, size, shape in values:
        start, end = live[name]
        if start <= at <= end:
            op_name = ops.get(name.split("{")[0], "")
            groups[(_part(op_name), shape)] += size
            if size >= 2**20:
                named.append({"bytes": size, "shape": shape, "op_name": op_name, "live": [start, end]})
    return {
        "heap": int(temp.group(1)),
        "max_live": best,
        "fragmentation": round(1 - best / int(temp.group(1)), 4),
        "peak_in": _part(_peak_op(prefix, at, ops)),
        "alive_at_peak": [
            {"part": part, "shape": shape, "bytes": size}
            for (part, shape), size in sorted(groups.items(), key=lambda kv: -kv[1])
        ],
        "values_at_peak": sorted(named, key=lambda v: (-v["bytes"], v["live"])),  # each of at least 1 MiB, by name
    }


def _op_names(hlo):
    """Instruction name -> the jax op_name XLA kept in its metadata (collectives and copies have none)."""
    out = {}
    for m in re.finditer(r"^\s+(?:ROOT )?%(\S+) = (.*)$", hlo, re.M):
        op_name = re.search(r'op_name="([^"]*)"', m.group(2))
        out[m.group(1)] = op_name.group(1) if op_name else m.group(1)
    return out


def _peak_op(prefix, at, ops):
    sequence = Path(prefix + "-live-range.txt").read_text().split("BufferLiveRange:")[0]
    names = dict(re.findall(r"^\s+(\d+):(\S+)$", sequence, re.M))
    return ops.get(names.get(str(at), ""), names.get(str(at), ""))


def _part(op_name):
    if "transpose(jvp(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    if "/adam/" in op_name or "optimizer" in op_name:
        return "optimizer"
    if re.match(r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|wrapped_concatenate)", op_name):
        return "collectives"
    return "other"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2", help="a label prefix of planner_vs_deviceless_sharded.CONFIGS")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--meshes", default="", help="';'-separated mesh specs (default: every candidate)")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
    parser.add_argument("--sequence", type=int, default=None, help="tokens per example (default: the config's)")
    parser.add_argument("--dtype", default=None, help="a Keras dtype policy for the model (named in its label)")
    parser.add_argument("--remat", action="store_true", help="plan and compile with remat=True (named in the label)")
    parser.add_argument("--width", default="", help="HIDDEN,LAYERS for a widened family (h256, 2 layers), e.g. 1024,4")
    args = parser.parse_args()

    import kdist  # after XLA_FLAGS
    from kdist.machine import machine_info

    kdist.fake_devices(args.devices)
    # The label keeps the config's batch: `--batch` is stored beside it.
    entry = config_named(args.model)
    if args.width:
        if not re.fullmatch(r"\d+,\d+", args.width) or "h256 2 layers" not in entry[0]:
            parser.error(f"--width takes HIDDEN,LAYERS for a widened family (h256, 2 layers); got {args.width!r}")
        entry = at_width(entry, *(int(n) for n in args.width.split(",")))
    label, cls, config, batch, sequence = resized(entry, sequence=args.sequence, dtype=args.dtype)
    batch = args.batch or batch
    label += " remat" if args.remat else ""
    build = hub_builder(cls, config)
    common = dict(batch_size=batch, sequence_length=sequence, remat=args.remat, **PLAN_OPTIONS)
    specs = [s for s in args.meshes.split(";") if s] or [
        c.spec for c in kdist.plan(build, args.devices, **common).candidates if c.valid
    ]
    rows = []
    for spec in specs:
        start = time.perf_counter()
        result = kdist.plan(build, args.devices, **common, verify=[spec], verify_target=VERIFY_TARGET)
        candidate = next(c for c in result.candidates if c.compiled)
        dump = newest_dump()
        xla, scheduler = xla_peak(dump), latency_hiding_scheduler(dump)
        terms = candidate.to_dict()["bytes"]
        state = terms["weights"] + terms["optimizer"]
        rows.append(
            {
                "mesh": candidate.spec,
                "estimate": candidate.peak,
                "xla_gpu_deviceless": candidate.compiled["peak"],
                "estimate_step_buffers": candidate.peak - state - terms["other"],
                "estimate_terms": terms,
                "estimate_peak_in": candidate.phase,
                "xla": xla,
            }
        )
        top = ", ".join(f"{g['part']} {g['shape']} {g['bytes'] / 1e6:.0f}" for g in xla["alive_at_peak"][:4])
        print(
            f"{candidate.spec:18} estimate {candidate.peak / 1e6:7.1f} MB (step buffers "
            f"{rows[-1]['estimate_step_buffers'] / 1e6:6.1f}, peak in the {candidate.phase}) | XLA heap "
            f"{xla['heap'] / 1e6:6.1f}, most alive {xla['max_live'] / 1e6:6.1f} (fragmentation "
            f"{xla['fragmentation']:.1%}), peak in the {xla['peak_in']}: {top} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
    key = {"config": label, "devices": args.devices, "batch": batch, "xla_flags": XLA_FLAGS}
    # An earlier run with the same key keeps its rows of the meshes this run did not compile, each with its date.
    earlier = next((r for r in saved["runs"] if {k: r.get(k, "") for k in key} == key), None)
    kept = []
    if earlier is not None:
        saved["runs"].remove(earlier)
        run = {row["mesh"] for row in rows}
        kept = [{"taken": earlier["machine"]["date"], **row} for row in earlier["rows"] if row["mesh"] not in run]
    saved["runs"].append({**key, "latency_hiding_scheduler": scheduler, "machine": machine_info(), "rows": kept + rows})
    RESULTS.write_text(json.dumps(saved, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    shutil.rmtree(DUMP)


if __name__ == "__main__":
    main()
