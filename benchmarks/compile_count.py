"""Compilations and time to the first steps under plain Keras, Keras's distributions and kdist presets.

For one model (kdist.models.tiny_transformer with a metric), each
distribution runs in a fresh process, on 1 device and on 8 (fake CPU devices
here; an accelerator machine's own devices with --real-devices): fit, fit,
evaluate, predict, fit, counting XLA compilations of Keras's train/test/
predict steps during each call and timing the first two fits (their first
step includes the compilations). Then, in one process per device count, the
steady-state `train_on_batch` time of each kdist preset and of the same
layout written by hand with Keras's own classes, interleaved step by step so
machine noise hits both alike: the ratio kdist/hand-written should stay
within 1.02.

Run: python benchmarks/compile_count.py [--steps 200] [--real-devices]
Writes benchmarks/results/compile_count.json (with the machine it ran on).
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

OPS = ("fit", "fit", "evaluate", "predict", "fit")
DISTRIBUTIONS = {
    1: ["plain", "keras_dp", "keras_mp", "dp", "fsdp"],
    8: ["plain", "keras_dp", "keras_mp", "dp", "2x4", "fsdp"],
}
BATCH = 32
SAMPLES = 8 * BATCH


def data():
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(0, 512, (SAMPLES, 32)), rng.integers(0, 512, (SAMPLES, 32))


def build(distribution):
    import keras

    import kdist

    keras.utils.set_random_seed(0)
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        model = kdist.models.tiny_transformer()
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def distribution_named(name, devices):
    """None for plain Keras; Keras's DataParallel; Keras's ModelParallel with the layouts of the "2x4" preset
    (on 1 device "1x1") written by hand; or a kdist preset."""
    import keras

    import kdist

    if name == "plain":
        return None
    if name == "keras_dp":
        return keras.distribution.DataParallel()
    if name == "keras_mp":
        return by_hand(kdist.preset("2x4" if devices == 8 else "1x1"))
    return kdist.preset(name)


def by_hand(preset):
    """The preset's layouts written with Keras's own classes: a LayoutMap of its placements in a ModelParallel."""
    import keras

    import kdist

    if not preset.placements:  # build the model once under the preset to record where it puts each variable
        with preset.scope():
            kdist.models.tiny_transformer()
        keras.backend.clear_session()
    layout_map = keras.distribution.LayoutMap(preset.device_mesh)
    for path, placement in preset.placements.items():
        layout_map[path] = placement.axes
    (batch_axis,) = preset.batch_axes  # Keras's ModelParallel splits the batch over one axis only
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=batch_axis)


def child_first_steps(name):
    import jax

    from kdist.jax_internals import KERAS_STEPS, count_compiles

    distribution = distribution_named(name, jax.device_count())
    x, y = data()
    model = build(distribution)
    rows = []
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        for op in OPS:
            start = time.perf_counter()
            with count_compiles(KERAS_STEPS) as count:
                if op == "predict":
                    out = model.predict(x, batch_size=BATCH, verbose=0)
                else:
                    out = getattr(model, op)(x, y, batch_size=BATCH, verbose=0)
                jax.block_until_ready(jax.tree.leaves(getattr(out, "history", out)))
            rows.append({"op": op, "compiles": count[0], "seconds": round(time.perf_counter() - start, 3)})
    return {"distribution": name, "devices": jax.device_count(), "ops": rows}


def child_steady(names, steps):
    import jax

    x, y = data()
    x, y = x[:BATCH], y[:BATCH]
    pairs = []
    for name in names:
        preset = distribution_named(name, jax.device_count())
        kdist_model = build(preset)
        hand = by_hand(preset)
        hand_model = build(hand)
        same = all(
            a.value.sharding.is_equivalent_to(b.value.sharding, a.value.ndim)
            for a, b in zip(kdist_model.variables, hand_model.variables)
        )
        pairs.append((name, same, (preset, kdist_model), (hand, hand_model)))
    times = {name: {"kdist": [], "hand": []} for name, *_ in pairs}
    for step in range(steps):
        for name, _, mine, theirs in pairs:
            order = [("kdist", *mine), ("hand", *theirs)]
            for who, distribution, model in order if step % 2 == 0 else order[::-1]:
                with distribution.scope():
                    start = time.perf_counter()
                    logs = model.train_on_batch(x, y, return_dict=True)
                    jax.block_until_ready(logs["loss"])
                    times[name][who].append(time.perf_counter() - start)
    warm = min(5, steps // 4)
    out = {}
    for name, same, *_ in pairs:
        median = {who: statistics.median(v[warm:]) for who, v in times[name].items()}
        out[name] = {
            "same_variable_layouts": same,
            "median_step_s": median,
            "ratio_kdist_over_hand_written": median["kdist"] / median["hand"],
        }
    return {"devices": jax.device_count(), "steps_timed": steps - warm, "presets": out}


def run_child(args, devices, real):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "KDIST_FAKE_DEVICES")}
    if not real:
        env["KDIST_FAKE_DEVICES"] = str(devices)
    elif devices == 1:
        env["CUDA_VISIBLE_DEVICES"] = "0"  # one of the machine's GPUs
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    command = [sys.executable, __file__, "--child", json.dumps(args), "--devices", str(devices)]
    if real:
        command.append("--real-devices")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"child {args} on {devices} device(s) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steady-state steps per model")
    parser.add_argument("--real-devices", action="store_true", help="use the machine's accelerators (1 and all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    import kdist  # noqa: F401  (selects the JAX backend; KDIST_FAKE_DEVICES gives the fake devices)

    if args.child:
        job = json.loads(args.child)
        result = child_first_steps(job["first"]) if "first" in job else child_steady(job["steady"], job["steps"])
        print(json.dumps(result))
        return

    from kdist.machine import machine_info

    device_counts = (1, 8)  # with --real-devices: 1 and all of the machine's (the 8-device list needs 8)
    results = {"first_steps": [], "steady": []}
    for devices in device_counts:
        for name in DISTRIBUTIONS[devices]:
            row = run_child({"first": name}, devices, args.real_devices)
            results["first_steps"].append(row)
            ops = " ".join(f"{r['op']}:{r['compiles']}" for r in row["ops"])
            fits = [r["seconds"] for r in row["ops"] if r["op"] == "fit"][:2]
            print(f"{devices} device(s) {name:9s} compiles {ops}   first two fits {fits[0]:.2f} s, {fits[1]:.2f} s")
        presets = [n for n in DISTRIBUTIONS[devices] if n in ("dp", "2x4", "fsdp")]
        steady = run_child({"steady": presets, "steps": args.steps}, devices, args.real_devices)
        results["steady"].append(steady)
        for name, row in steady["presets"].items():
            ratio = row["ratio_kdist_over_hand_written"]
            print(f"{devices} device(s) {name:9s} steady step kdist/hand-written {ratio:.3f}")

    plain = {
        row["devices"]: [r["compiles"] for r in row["ops"]]
        for row in results["first_steps"]
        if row["distribution"] == "plain"
    }
    summary = {
        "kdist_presets_compile_as_plain_keras": all(
            [r["compiles"] for r in row["ops"]] == plain[row["devices"]]
            for row in results["first_steps"]
            if row["distribution"] in ("dp", "2x4", "fsdp")
        ),
        "steady_ratio_within_1_02": all(
            abs(row["ratio_kdist_over_hand_written"] - 1) <= 0.02
            for s in results["steady"]
            for row in s["presets"].values()
        ),
    }
    print(json.dumps(summary))
    import jax

    result = {
        "benchmark": "compile_count",
        "model": "kdist.models.tiny_transformer (2 layers, hidden 64, vocabulary 512, sequence 32), adam, accuracy",
        "batch_size": BATCH,
        "ops": OPS,
        "devices_were": "real"
        if args.real_devices
        else "fake CPU devices (a proxy: says nothing of accelerator times)",
        **summary,
        **results,
        "machine": machine_info(jax.devices()),
    }
    out = (
        Path(__file__).parent
        / "results"
        / f"compile_count{'_' + jax.devices()[0].platform if args.real_devices else ''}.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
