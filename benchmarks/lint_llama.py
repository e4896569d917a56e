"""Lint time and peak memory for Llama-3-8B-, 70B- and 405B-shaped keras-hub backbones built abstractly.

Each size runs in a fresh subprocess so that its peak RSS is its own. In each,
the backbone is built with `kdist.abstract_model` (no weights allocated), then
linted with kdist's default rules (rules="auto") on a 2x4 and an 8x16 mesh
(the linter needs no devices for a mesh, so 128 devices are not required), and
with keras-hub's own `LlamaBackbone.get_layout_map` on 2x4. Lint times are
the median of 3 runs; the Python memory the lint allocates is measured with
tracemalloc in a separate run.

Run: python benchmarks/lint_llama.py [--sizes llama3-8b llama3-70b llama3-405b]
Writes benchmarks/results/lint_llama.json.
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from kdist.machine import machine_info
from kdist.zoo import PUBLISHED

# Published Llama 3 / 3.1 configurations, as kdist's zoo holds them.
CONFIGS = {name: PUBLISHED[name][1] for name in ("llama3-8b", "llama3-70b", "llama3-405b")}
MESHES = ("2x4", "8x16")
RESULTS = Path(__file__).parent / "results" / "lint_llama.json"


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(size):
    """Run in the child process: build, lint, and return the numbers."""
    start = time.perf_counter()
    import keras_hub

    import kdist

    import_s = time.perf_counter() - start
    rss_after_import = peak_rss_mib()
    start = time.perf_counter()
    backbone = kdist.abstract_model(keras_hub.models.LlamaBackbone, **CONFIGS[size])
    build_s = time.perf_counter() - start
    rss_after_build = peak_rss_mib()
    assert all(not hasattr(v, "_value") or v._value is None for v in backbone.variables), "weights were allocated"

    runs = {f"auto {mesh}": ("auto", mesh) for mesh in MESHES}
    runs["keras-hub map 2x4"] = (
        keras_hub.models.LlamaBackbone.get_layout_map(kdist.mesh("2x4", axis_names=("batch", "model"))),
        None,
    )
    lints = {}
    for name, (rules, mesh) in runs.items():
        times = []
        for _ in range(3):
            start = time.perf_counter()
            report = kdist.lint(rules, backbone, mesh)
            times.append(time.perf_counter() - start)
        tracemalloc.start()
        kdist.lint(rules, backbone, mesh)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        lints[name] = {
            "median_s": statistics.median(times),
            "traced_peak_mib": traced_peak / 2**20,
            "counts": report.counts(),
            "codes": sorted(report.codes()),
            "sharded_share": report.summary["sharded_share"],
            "replicated_share": report.summary["replicated_share"],
            "top_replicated": [t["path"] for t in report.summary["top_replicated"]],
        }
    return {
        "size": size,
        "config": CONFIGS[size],
        "variables": len(backbone.variables),
        "parameters": sum(math.prod(v.shape) for v in backbone.variables),
        "import_s": import_s,
        "build_s": build_s,
        "peak_rss_mib": {
            "after_import": rss_after_import,
            "after_build": rss_after_build,
            "after_lint": peak_rss_mib(),
        },
        "lint": lints,
    }


def run_child(size):
    env = dict(os.environ, KERAS_BACKEND="jax", KDIST_FAKE_DEVICES="8", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, __file__, "--child", size], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode:
        raise RuntimeError(f"{size} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results):
    lines = [
        f"{'model':<12} {'vars':>5} {'params':>8} {'build s':>8} {'rss MiB':>8}  {'lint':<18} {'lint s':>7} "
        f"{'traced MiB':>10}  "
        f"{'err/warn/info':>13} {'sharded':>8} {'replicated':>10}"
    ]
    for r in results:
        for name, lint in r["lint"].items():
            c = lint["counts"]
            lines.append(
                f"{r['size']:<12} {r['variables']:>5} {r['parameters'] / 1e9:>7.1f}B {r['build_s']:>8.2f} "
                f"{r['peak_rss_mib']['after_lint']:>8.0f}  {name:<18} {lint['median_s']:>7.3f} "
                f"{lint['traced_peak_mib']:>10.1f}  "
                f"{c['error']:>3}/{c['warning']:>3}/{c['info']:>3}   {lint['sharded_share']:>8.1%} "
                f"{lint['replicated_share']:>10.1%}"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    load_before = os.getloadavg()
    results = [run_child(size) for size in args.sizes]
    print(table(results))
    os.environ.setdefault("KERAS_BACKEND", "jax")
    data = {
        "benchmark": "lint_llama",
        "what": "kdist.lint on abstractly built keras-hub LlamaBackbones; each size in a fresh process",
        "meshes": list(MESHES),
        "results": results,
        "machine": dict(machine_info(), load_average_before=load_before, load_average_after=os.getloadavg()),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
