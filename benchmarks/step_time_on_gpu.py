"""Measured against estimated on a real GPU: step time and peak memory of single-device training steps.

Two halves, because the measuring needs the GPU and the estimate does not:

- `--measure` (on a machine with one GPU: jax with its CUDA plugin, keras,
  keras-hub, kdist on the path) trains each config in a fresh process: built
  with its weights as the shared gpu-truth measure.py builds it, Adam and
  sparse cross-entropy under kdist.preset("dp"), inputs placed on the device
  once; 2 warm-up steps (the first compiles), then `--steps` timed
  `train_on_batch` calls (each returns the loss as a Python float, so a
  timed step has finished on the device). It records the median and fastest
  step, the compile-and-first-step time and `memory_stats()
  ["peak_bytes_in_use"]`, with the machine, no preallocation, and which
  implementations of `jax.nn.dot_product_attention` traced ("cudnn": the
  fused kernel; "xla": scores kept), each call with its query's dtype,
  shape and tracer type (which trace it was). XLA_FLAGS
  gets measure.py's `--xla_gpu_autotune_level=0` (peaks comparable with the
  shared file's; steps 8-156x slower) unless `--xla-flags` says otherwise:
  `--xla-flags ""` runs XLA's defaults, what a user gets. Each run is added
  to the results file; configs run in priority order, no new one starts
  after `--budget` seconds, and each result is saved as it comes.
- `--deviceless` (no GPU; jax's CUDA PJRT plugin, as `planner_vs_gpu.py
  --deviceless`): each measured HELD_OUT_GPU config whose estimate traced
  no fused attention is compiled by XLA:GPU for a deviceless H100, with
  kdist's compile options (cuBLAS GEMMs) and again with Triton GEMMs allowed
  (XLA's default on a GPU, untuned without one); the figures are stored
  under "deviceless", to set the real GPU's peak beside the compile the
  estimate follows.
- without either (any machine): every stored measurement is planned by this
  checkout's kdist for the device kind it ran on (`kdist.plan(model, 1,
  target=...)`), and the estimated step time (compute at the roofline:
  one device has no communication) and peak are set beside the measured.

The configs: the shared file's (but the one that ran out of memory), the
single-device configs that `planner_vs_gpu.py --deviceless` compiled without
a GPU, its predictions outside the file that change only batch, sequence
or precision, and HELD_OUT_GPU (other families and CNNs).

Run: python benchmarks/step_time_on_gpu.py --measure [--xla-flags F] [--truth PATH] [--steps N] [--budget S] [LABEL ...]
     python benchmarks/step_time_on_gpu.py --deviceless
     python benchmarks/step_time_on_gpu.py [--truth PATH]
Writes benchmarks/results/step_time_on_gpu.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from planner_vs_gpu import DEVICELESS, PLAIN, PREDICT, TRUTH, _plan, prediction_config  # noqa: E402  (a sibling)

from kdist.zoo import TINY  # noqa: E402  (after planner_vs_gpu chose the platform: importing kdist imports jax)

OUT = Path(__file__).parent / "results" / "step_time_on_gpu.json"

# Held out on the GPU: families, sizes and CNNs no measured row or band was drawn from (Gemma 2's capped scores,
# Falcon, GPT-NeoX, Phi-3, Qwen3, BERT and RoBERTa base, DeiT and DINOv2 base, three more Keras CNNs), estimated by
# this checkout before they ran. Each is (label, builder, builder config, batch, sequence, dtype policy).
_LM_1024 = dict(vocabulary_size=32000, num_layers=8, hidden_dim=1024, intermediate_dim=4096)
_ENCODER_BASE = dict(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072)
_VIT_BASE = dict(image_shape=(224, 224, 3), num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072)
HELD_OUT_GPU = [
    (
        "gemma2 h1024 8 layers b8 s1024",
        "keras_hub.models.GemmaBackbone",
        dict(
            TINY["gemma2"], **_LM_1024, num_query_heads=8, num_key_value_heads=4, head_dim=128, sliding_window_size=512
        ),
        8,
        1024,
        "float32",
    ),
    (
        "falcon h1024 8 layers b8 s1024",
        "keras_hub.models.FalconBackbone",
        dict(_LM_1024, num_attention_heads=16),
        8,
        1024,
        "float32",
    ),
    (
        "gpt_neox h1024 8 layers b8 s1024",
        "keras_hub.models.GPTNeoXBackbone",
        dict(_LM_1024, num_heads=16, max_sequence_length=1024),
        8,
        1024,
        "float32",
    ),
    (
        "phi3 h1024 8 layers b8 s1024 bf16",
        "keras_hub.models.Phi3Backbone",
        dict(_LM_1024, num_query_heads=16, num_key_value_heads=16),
        8,
        1024,
        "mixed_bfloat16",
    ),
    (
        "qwen3 h1024 8 layers b16 s512",
        "keras_hub.models.Qwen3Backbone",
        dict(_LM_1024, num_query_heads=16, num_key_value_heads=8, head_dim=64),
        16,
        512,
        "float32",
    ),
    ("bert base b32 s512", "keras_hub.models.BertBackbone", _ENCODER_BASE, 32, 512, "float32"),
    ("roberta base b32 s512 bf16", "keras_hub.models.RobertaBackbone", _ENCODER_BASE, 32, 512, "mixed_bfloat16"),
    ("deit base b64", "keras_hub.models.DeiTBackbone", dict(_VIT_BASE, patch_size=16), 64, None, "float32"),
    (
        "dinov2 base b64",
        "keras_hub.models.DINOV2Backbone",
        dict(_VIT_BASE, patch_size=14, position_embedding_shape=(518, 518, 3)),
        64,
        None,
        "float32",
    ),
    ("efficientnetb0 b128", "keras.applications.EfficientNetB0", dict(weights=None), 128, None, "float32"),
    ("mobilenetv2 b128", "keras.applications.MobileNetV2", dict(weights=None), 128, None, "float32"),
    ("densenet121 b64 bf16", "keras.applications.DenseNet121", dict(weights=None), 64, None, "mixed_bfloat16"),
]


def configs(truth):
    """{label: (config, builder overrides)} in priority order: the shared file's, then the other lists."""
    shared = {c["name"]: c for c in json.loads(Path(truth).read_text())["configs"]}
    out = {name: (c, {}) for name, c in shared.items() if isinstance(c.get("measured_peak_bytes"), (int, float))}
    for label, base, over, builder_over, devices, _ in DEVICELESS:
        if devices == 1:
            out[label] = ({**shared[base], **over}, dict(builder_over))
    for label, base, over in PREDICT:
        if set(over) <= set(PLAIN):  # the predictions a training run reproduces as written (no remat, attention)
            out[label] = prediction_config(shared[base], over)
    for label, builder, config, batch_size, sequence_length, dtype_policy in HELD_OUT_GPU:
        row = dict(builder=builder, config=config, batch_size=batch_size, sequence_length=sequence_length)
        out[label] = ({**row, "dtype_policy": dtype_policy}, {})
    return out


def batch(model, batch_size, sequence_length):
    """One batch as measure.py makes it: token ids in [0, 1000), masks of ones, images in [0, 1), int labels.

    A model with a dict of outputs gets labels for each (kdist.plan traces a loss on each float output of rank
    >= 2); measure.py's models have one output, which gets them.
    """
    import numpy as np

    rng = np.random.default_rng(0)

    def shape(tensor):
        return [batch_size] + [sequence_length if d is None else d for d in tensor.shape[1:]]

    xs = {}
    for t in model.inputs:
        if "int" in str(t.dtype):
            xs[t.name] = rng.integers(0, 1000, size=shape(t)).astype(str(t.dtype))
            if "mask" in t.name:
                xs[t.name] = np.ones(shape(t), dtype=str(t.dtype))
            if "segment" in t.name:
                xs[t.name] = np.zeros(shape(t), dtype=str(t.dtype))
        else:
            xs[t.name] = rng.random(shape(t), dtype=np.float32)

    def labels(out):
        return rng.integers(0, int(out.shape[-1]), size=shape(out)[:-1]).astype("int32")

    if isinstance(model.output, dict):  # a loss on each output, as kdist.plan traces one (BERT: pooled and sequence)
        y = {name: labels(out) for name, out in model.output.items()}
    else:
        y = labels(model.outputs[0])
    return (xs if len(xs) > 1 else next(iter(xs.values()))), y


def measure_one(config, builder_over, steps):
    """Train one config on the local GPU; returns the measured figures."""
    import jax
    import keras

    import kdist
    from kdist.planning.calibration import build_config

    taken = set()  # the implementations of jax.nn.dot_product_attention that traced: Keras tries cuDNN, then XLA
    original = jax.nn.dot_product_attention

    calls = set()  # each traced call: implementation, query dtype and shape, and the tracer's type (which trace)

    def recorded(query, *args, implementation=None, **kwargs):
        out = original(query, *args, implementation=implementation, **kwargs)
        taken.add(str(implementation))
        calls.add(f"{implementation} {query.dtype} {tuple(query.shape)} {type(query).__name__}")
        return out

    jax.nn.dot_product_attention = recorded
    keras.distribution.set_distribution(kdist.preset("dp"))
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(config.get("dtype_policy", "float32"))
    model = build_config(config, abstract=False, **builder_over)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if isinstance(model.output, dict):
        loss_fn = {name: loss_fn for name in model.output}
    model.compile(optimizer="adam", loss=loss_fn)
    x, y = jax.device_put(batch(model, config["batch_size"], config["sequence_length"]))
    start = time.perf_counter()
    model.train_on_batch(x, y)
    first = time.perf_counter() - start
    model.train_on_batch(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "step_seconds_median": statistics.median(times),
        "step_seconds_min": min(times),
        "steps_timed": steps,
        "compile_and_first_step_seconds": round(first, 2),
        "measured_peak_bytes": stats.get("peak_bytes_in_use"),
        "bytes_limit": stats.get("bytes_limit"),
        "last_loss": float(loss if not isinstance(loss, list) else loss[0]),
        "device_kind": jax.devices()[0].device_kind,
        "attention_implementations": sorted(taken),  # empty: the layers computed their scores themselves
        "attention_calls": sorted(calls),
    }


def measure(args, known):
    """Measure each config in a fresh process; the run is added to the results file, row by row."""
    from kdist.machine import machine_info

    env = dict(
        os.environ,
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip(),
    )
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    run = {"machine": machine_info(), "xla_flags": env["XLA_FLAGS"], "steps_timed": args.steps, "rows": []}
    results["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    for label in args.labels or list(known):
        if time.perf_counter() - began > args.budget:
            print(f"budget of {args.budget} s spent: {label} and later not measured", flush=True)
            break
        command = [sys.executable, __file__, "--one", label, "--truth", args.truth, "--steps", str(args.steps)]
        try:
            child = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
            lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
            output = child.stderr or child.stdout or "no output"
            row = json.loads(lines[-1][7:]) if lines else {"error": output[-600:]}
        except subprocess.TimeoutExpired:
            row = {"error": f"timed out after {args.timeout} s"}
        run["rows"].append({"config": label, **row})
        print(json.dumps(run["rows"][-1]), flush=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


def deviceless(args, known):
    """XLA:GPU's figure for the measured held-out configs, compiled without a GPU, beside the measured peaks."""
    import kdist
    import kdist.planning.planner as planner
    from kdist.machine import machine_info
    from kdist.planning.calibration import build_config

    results = json.loads(args.out.read_text())
    unfused = {
        row["config"]
        for run in results["runs"]
        for row in run["rows"]
        if "error" not in row and row["estimate"]["attention"] != "fused"
    }
    figures = {label: {} for label, *_ in HELD_OUT_GPU if label in unfused}
    for name, options in (("xla_gpu_deviceless", planner.COMPILER_OPTIONS), ("xla_gpu_deviceless_triton_gemm", {})):
        planner.COMPILER_OPTIONS = options  # this benchmark's switch; kdist.plan always compiles with cuBLAS GEMMs
        for label in figures:
            config, builder_over = known[label]
            try:
                build = lambda c=config, b=builder_over: build_config(c, **b)  # noqa: E731
                plan = _plan(kdist, build, config, attention="materialized", verify=True, verify_target="H100")
                figures[label][name] = plan.candidates[0].compiled["peak"]
            except Exception as e:  # Triton GEMMs untuned can fail XLA's tiling (kdist.planning.deviceless)
                figures[label][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            print(f"{label:46} {name:32} {figures[label][name]}", flush=True)
    note = "XLA:GPU compiled for a deviceless H100 on this CPU-only machine (jax's CUDA PJRT plugin); no autotuning"
    results["deviceless"] = {"machine": {**machine_info(), "note": note}, "configs": figures}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


def estimate(args, known):
    """Set this checkout's estimate beside every stored measurement, print the table and save it."""
    import kdist
    from kdist.planning.calibration import build_config

    results = json.loads(args.out.read_text())
    plans = {}
    for run in results["runs"]:
        machine = run["machine"]
        print(f"\n{machine['device_kind']}, {machine['date']}, XLA_FLAGS={run['xla_flags']!r}; estimates by this kdist")
        print(f"{'config':46} {'step ms':>8} {'est ms':>7} {'ratio':>6} {'peak GB':>8} {'est GB':>7} {'ratio':>6}")
        kind = next((k for k in ("H100", "H200") if k in machine["device_kind"]), None)
        for row in run["rows"]:
            if "error" in row:
                print(f"{row['config']:46} not measured: {row['error'].splitlines()[-1][:60]}")
                continue
            config, builder_over = known[row["config"]]
            if (row["config"], kind) not in plans:
                plans[row["config"], kind] = kdist.plan(
                    build_config(config, **builder_over),
                    1,
                    batch_size=config["batch_size"],
                    sequence_length=config["sequence_length"],
                    target=kind,
                )
            plan = plans[row["config"], kind]
            best = plan.candidates[0]
            row["estimate"] = {
                "target": kind,
                "step_seconds": best.step_seconds,
                "flops": best.flops,
                "hbm_bytes": best.hbm_bytes,
                "peak_bytes": best.peak,
                "fits": best.fits,
                "attention": plan.attention,
            }
            row["measured_over_estimated_step"] = round(row["step_seconds_median"] / best.step_seconds, 3)
            row["estimated_over_measured_peak"] = round(best.peak / row["measured_peak_bytes"], 3)
            print(
                f"{row['config']:46} {row['step_seconds_median'] * 1e3:8.1f} {best.step_seconds * 1e3:7.1f} "
                f"{row['measured_over_estimated_step']:6.2f} {row['measured_peak_bytes'] / 1e9:8.2f} "
                f"{best.peak / 1e9:7.2f} {row['estimated_over_measured_peak']:6.3f}"
            )
    results["estimated_by"] = {"kdist": kdist.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels", nargs="*", help="configs to measure (default: all, in priority order)")
    parser.add_argument("--truth", default=TRUTH)
    parser.add_argument("--measure", action="store_true", help="train on this machine's GPU and time it")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget", type=float, default=400, help="seconds after which no new config starts")
    parser.add_argument("--timeout", type=float, default=180, help="seconds one config may take")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--xla-flags", default="--xla_gpu_autotune_level=0", help="added to XLA_FLAGS (measure.py's)")
    parser.add_argument("--deviceless", action="store_true", help="compile the held-out configs without a GPU")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    known = configs(args.truth)
    if args.one:
        os.environ.setdefault("KERAS_BACKEND", "jax")
        print("RESULT " + json.dumps(measure_one(*known[args.one], args.steps)), flush=True)
    elif args.measure:
        measure(args, known)
    elif args.deviceless:
        deviceless(args, known)
    else:
        estimate(args, known)


if __name__ == "__main__":
    main()
