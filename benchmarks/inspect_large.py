"""Time and peak memory of `kdist.inspect` on big models built abstractly (no weights allocated).

Cases: a Llama-3-70B-shaped keras-hub LlamaBackbone (723 variables; 70.55e9
parameters in bfloat16) on a 2x4 mesh, with planned Adam state (2,171
variables), and with Adam on an 8x16 mesh (128 fake devices); a synthetic
model of 10,000 variables (2,500 blocks of 4) on 2x4, and with Adam (30,002
variables). Each case runs in a fresh subprocess, so its peak RSS is its own:
import, build the model abstractly, inspect, render the 80-column text table,
export JSON. Times are wall-clock seconds of one run each.

Run: python benchmarks/inspect_large.py [--cases llama3-70b synthetic-10k ...]
Writes benchmarks/results/inspect_large.json.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from kdist.machine import machine_info
from kdist.zoo import PUBLISHED

LLAMA3_70B = dict(PUBLISHED["llama3-70b"][1], dtype="bfloat16")
CASES = {
    # name: (model, mesh, fake devices, optimizer)
    "llama3-70b 2x4": ("llama3-70b", "2x4", 8, None),
    "llama3-70b 2x4 adam": ("llama3-70b", "2x4", 8, "adam"),
    "llama3-70b 8x16 adam": ("llama3-70b", "8x16", 128, "adam"),
    "synthetic-10k 2x4": ("synthetic-10k", "2x4", 8, None),
    "synthetic-10k 2x4 adam": ("synthetic-10k", "2x4", 8, "adam"),
}
RESULTS = Path(__file__).parent / "results" / "inspect_large.json"
LIMIT_S, LIMIT_MIB = 10.0, 2048


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def synthetic(blocks=2500):
    """A Keras model of `blocks` blocks, each two Dense layers (512 -> 2048 -> 512) with kernel and bias."""
    import keras

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.up = keras.layers.Dense(2048, name="up")
            self.down = keras.layers.Dense(512, name="down")

        def build(self, input_shape):
            self.up.build((None, 512))
            self.down.build((None, 2048))

    class Synthetic(keras.Model):
        def __init__(self):
            super().__init__(name="synthetic")
            self.blocks = [Block(name=f"block_{i}") for i in range(blocks)]

        def build(self, input_shape):
            for block in self.blocks:
                block.build(input_shape)

    model = Synthetic()
    model.build((None, 512))
    return model


def measure(case):
    """Run in the child process and return the numbers of one case."""
    model_name, spec, devices, optimizer = CASES[case]
    start = time.perf_counter()
    import kdist

    kdist.fake_devices(devices)
    import keras_hub

    out = {"case": case, "model": model_name, "mesh": spec, "devices": devices, "optimizer": optimizer}
    out["import_s"] = time.perf_counter() - start
    start = time.perf_counter()
    if model_name == "llama3-70b":
        model = kdist.abstract_model(keras_hub.models.LlamaBackbone, **LLAMA3_70B)
    else:
        model = kdist.abstract_model(synthetic)
    out["build_s"] = time.perf_counter() - start
    out["rss_after_build_mib"] = peak_rss_mib()
    distribution = kdist.preset(spec)
    start = time.perf_counter()
    report = kdist.inspect(model, distribution, optimizer=optimizer)
    out["inspect_s"] = time.perf_counter() - start
    assert all(v._value is None for v in model.variables), "weights were allocated"
    start = time.perf_counter()
    text = str(report)
    out["render_s"] = time.perf_counter() - start
    start = time.perf_counter()
    report.to_json()
    out["to_json_s"] = time.perf_counter() - start
    summary = report.summary
    out.update(
        variables=summary["num_variables"],
        parameters=sum(v.nbytes // v.itemsize for v in report.variables if v.kind == "trainable"),
        total_gib=summary["total_bytes"] / 2**30,
        max_device_gib=summary["max_device_bytes"] / 2**30,
        imbalance=summary["imbalance"],
        text_lines=len(text.splitlines()),
        peak_rss_mib=peak_rss_mib(),
    )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    load_at_start = os.getloadavg()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "KDIST_FAKE_DEVICES")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    results = []
    for case in args.cases:
        proc = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.exit(f"case {case!r} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["within_targets"] = r["inspect_s"] < LIMIT_S and r["peak_rss_mib"] < LIMIT_MIB
        results.append(r)
        print(
            f"{case:24} {r['variables']:6d} vars  build {r['build_s']:5.2f} s  inspect {r['inspect_s']:5.2f} s  "
            f"render {r['render_s']:5.2f} s  json {r['to_json_s']:5.2f} s  peak RSS {r['peak_rss_mib']:6.0f} MiB",
            flush=True,
        )
    import kdist  # noqa: F401  (machine info needs jax with the kdist backend choice)

    data = {
        "machine": {**machine_info(), "load_average_1_5_15_min_at_start": load_at_start},
        "targets": {"inspect_s": LIMIT_S, "peak_rss_mib": LIMIT_MIB},
        "results": results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
