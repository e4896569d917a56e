"""Peak memory while loading a ~1B-parameter keras-hub preset onto 8 fake devices: plain from_preset vs kdist.load.

A Llama backbone with a ~1.1B-parameter config (TinyLlama's shape: vocabulary
32000, hidden 2048, 22 layers, 32 query / 4 key-value heads, intermediate
5632) and random weights is saved once with `save_to_preset` (bfloat16 by
default, to fit this machine), then each (preset, method) pair is loaded in a
fresh process on 8 fake CPU devices:

- plain: `keras_hub.models.Backbone.from_preset(dir, dtype=...)` inside
  `kdist.preset(spec).scope()` (Keras builds and initialises every variable,
  then `load_weights` replaces each one);
- kdist: `kdist.load(dir, distribution=kdist.preset(spec), dtype=...)`.

Measured during the load, against the loaded model's own size:

- per-device bytes: every live jax array's shards by device
  (`jax.live_arrays()`), sampled every 5 ms by a thread and, for kdist.load,
  also after each slice and variable it reads (`kdist.checkpoint.peak_memory`).
  XLA's temporaries inside a compiled initializer are not live arrays, and a
  transient shorter than the sampling period can be missed: these are lower
  bounds of the true peaks;
- host RSS: sampled the same way, and the process's lifetime peak
  (`getrusage` ru_maxrss, which includes the imports: compare it with the RSS
  before the load).

On fake CPU devices every device is host memory: the RSS holds all 8 devices'
shards plus the host's own copies. These figures are a proxy for a real
accelerator's memory, not a measurement of one.

Run: python benchmarks/load_sharded_preset.py [--layers 22] [--dtype bfloat16] [--specs fsdp,2x4]
Writes benchmarks/results/load_sharded_preset.json.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA_1B = dict(
    vocabulary_size=32000,
    num_layers=22,
    num_query_heads=32,
    hidden_dim=2048,
    intermediate_dim=5632,
    num_key_value_heads=4,
)
METHODS = ("plain", "kdist")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=LLAMA_1B["num_layers"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--specs", default="fsdp,2x4")
    parser.add_argument("--fake-devices", type=int, default=8)
    parser.add_argument("--child", nargs=3, metavar=("PRESET", "SPEC", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--save", metavar="PRESET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.dtype, args.fake_devices)))
        return
    if args.save:
        print(json.dumps(save(args.save, args.layers, args.dtype)))
        return

    scratch = tempfile.mkdtemp(prefix="kdist_load_bench_")
    try:
        preset = os.path.join(scratch, "llama")
        saved = json.loads(_child(["--save", preset, "--layers", str(args.layers), "--dtype", args.dtype]))
        print(
            f"saved {saved['parameters']:,} parameters ({saved['file_bytes'] / 2**30:.2f} GiB of {args.dtype}) "
            f"in {saved['seconds']:.0f} s"
        )
        runs = []
        for spec in args.specs.split(","):
            for method in METHODS:
                run = json.loads(
                    _child(
                        [
                            "--child",
                            preset,
                            spec,
                            method,
                            "--dtype",
                            args.dtype,
                            "--fake-devices",
                            str(args.fake_devices),
                        ]
                    )
                )
                runs.append(run)
                print(_line(run))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    from kdist.machine import machine_info

    result = {
        "benchmark": "load_sharded_preset",
        "what": "peak memory during the load of a keras-hub preset, fake CPU devices (a proxy: every device is host "
        "memory); per-device bytes are jax live arrays sampled every 5 ms (and after each slice kdist.load reads), "
        "lower bounds of the true peaks",
        "model": saved,
        "bound": "per device: its shards of the model + the largest variable unsharded; host RSS growth: every fake "
        "device's shards (they are all host memory) + the largest variable",
        "runs": runs,
        "machine": dict(machine_info(), fake_devices=True, device_count=args.fake_devices, platform="cpu (fake)"),
    }
    out = Path(__file__).parent / "results" / "load_sharded_preset.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out}")


def save(preset, layers, dtype):
    """Build the Llama backbone with random weights on one device and save it as a keras-hub preset."""
    import keras_hub  # Keras on JAX: _child sets KERAS_BACKEND

    start = time.perf_counter()
    backbone = keras_hub.models.LlamaBackbone(**dict(LLAMA_1B, num_layers=layers), dtype=dtype)
    backbone.save_to_preset(preset)
    return {
        "class": "LlamaBackbone",
        "config": dict(LLAMA_1B, num_layers=layers),
        "dtype": dtype,
        "parameters": int(backbone.count_params()),
        "variables": len(backbone.weights),
        "file_bytes": os.path.getsize(os.path.join(preset, "model.weights.h5")),
        "seconds": time.perf_counter() - start,
    }


def measure(preset, spec, method, dtype, fake_devices):
    """Load the preset under `spec` with `method` in this (fresh) process; peaks against the sharded size."""
    import kdist

    kdist.fake_devices(fake_devices)  # before anything starts jax's devices
    import jax
    import keras_hub

    from kdist.checkpoint.peak_memory import PeakMemory

    distribution = kdist.preset(spec)
    start = time.perf_counter()
    with PeakMemory(interval=0.005) as peak:
        if method == "plain":
            with distribution.scope():
                model = keras_hub.models.Backbone.from_preset(preset, dtype=dtype)
        else:
            model = kdist.load(preset, distribution=distribution, dtype=dtype)
        jax.block_until_ready([v.value for v in model.weights])
    seconds = time.perf_counter() - start
    sharded, largest = {}, 0
    for v in model.weights:
        largest = max(largest, v.value.nbytes)
        for shard in v.value.addressable_shards:
            sharded[str(shard.device)] = sharded.get(str(shard.device), 0) + shard.data.nbytes
    growth = {str(d): int(b) for d, b in peak.growth().items()}
    devices = sorted(sharded)
    worst = max(devices, key=lambda d: growth.get(d, 0) - sharded[d])
    total = sum(v.value.nbytes for v in model.weights)
    return {
        "spec": spec,
        "method": method,
        "seconds": seconds,
        "model_bytes_unsharded": total,
        "largest_variable_bytes": largest,
        "sharded_bytes_per_device": [sharded[d] for d in devices],
        "peak_bytes_per_device": [growth.get(d, 0) for d in devices],
        "worst_device": worst,
        "worst_excess_over_sharded_bytes": growth.get(worst, 0) - sharded[worst],
        "within_bound": all(growth.get(d, 0) <= sharded[d] + largest for d in devices),
        "rss_before_load_bytes": peak.rss_baseline,
        "rss_peak_sampled_bytes": peak.rss_peak,
        "rss_after_load_bytes": peak.rss_final,
        "rss_peak_lifetime_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_peak_over_before_bytes": peak.rss_peak - peak.rss_baseline,
        "sharded_bytes_all_devices": sum(sharded.values()),  # all fake devices live in this process's memory
        "host_bound_bytes": sum(sharded.values()) + largest,
        "rss_within_host_bound": peak.rss_peak - peak.rss_baseline <= sum(sharded.values()) + largest,
        "samples": peak.samples,
    }


def _child(arguments):
    root = str(Path(__file__).resolve().parents[1])
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    done = subprocess.run(
        [sys.executable, __file__, *arguments], env=env, capture_output=True, text=True, timeout=3000, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def _line(run):
    gib = 2**30
    return (
        f"{run['spec']:>5} {run['method']:>5}: {run['seconds']:6.1f} s; per device peak "
        f"{max(run['peak_bytes_per_device']) / gib:.2f} GiB vs sharded {max(run['sharded_bytes_per_device']) / gib:.2f}"
        f" GiB (+ largest variable {run['largest_variable_bytes'] / gib:.2f}: within bound {run['within_bound']}); "
        f"host RSS +{run['rss_peak_over_before_bytes'] / gib:.2f} GiB over before the load vs all devices' shards "
        f"{run['sharded_bytes_all_devices'] / gib:.2f} GiB (model {run['model_bytes_unsharded'] / gib:.2f} GiB) "
        "[fake CPU devices]"
    )


if __name__ == "__main__":
    main()
