"""Training steps per second in a 2-process run by input kind: numpy arrays, tf.data (make_dataset), own rows.

Runs itself under `kdist.launch` as 2 processes x 4 fake CPU devices (a proxy:
CPU devices and gloo collectives on one machine, nothing like accelerators
over a network). Every process trains `kdist.models.mnist_mlp` under one
preset on the same seeded data, one epoch per timing, repeats interleaved
(order alternating) after one untimed warm-up epoch of each kind:

- numpy: `fit(x, y, batch_size=B)`; every process passes the whole arrays
  and kdist feeds each its rows of every global batch;
- tf.data: `fit(kdist.make_dataset(x, y, global_batch_size=B))`, the same way;
- own rows: `auto_shard_dataset=False`, each process passing only its half of
  every batch (what a per-host pipeline would hand over: the floor for the
  cost of passing the global batch);
- keras tf.data: Keras's own `keras.distribution.DataParallel` (with "dp"
  only) on the same dataset, which Keras shards per process (rebatch + shard):
  what kdist's tf.data path replaced.

Run: python benchmarks/multiprocess_inputs.py [--preset dp] [--examples 4096] [--batch-size 256] [--repeats 5]
Writes benchmarks/results/multiprocess_inputs.json.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

KINDS = ("numpy", "tf.data", "own rows", "keras tf.data")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="dp")
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    import kdist

    argv = [__file__, "--worker", *sys.argv[1:]]
    result = kdist.launch(argv, num_processes=2, devices_per_process=4, capture=True, stream=None, timeout=1800)
    if result.returncode:
        sys.exit(result.report())
    (line,) = [line for line in result.outputs[0] if line.startswith("RESULT ")]
    out = json.loads(line[len("RESULT ") :])
    path = Path(__file__).parent / "results" / "multiprocess_inputs.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{out['note']}\npreset {args.preset}, global batch {args.batch_size}, {out['steps_per_epoch']} steps/epoch")
    for kind, row in out["inputs"].items():
        print(f"  {kind:13s} {row['steps_per_s_median']:7.1f} steps/s (epochs {row['epoch_s']})")
    print(f"written to {path}")


def worker(args):
    import kdist

    kdist.initialize()
    import jax
    import keras
    import numpy as np

    from kdist.machine import machine_info

    rng = np.random.default_rng(0)
    x = rng.random((args.examples, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, args.examples)
    process, processes = jax.process_index(), jax.process_count()
    half = args.batch_size // processes
    rows = np.concatenate(
        [np.arange(s + process * half, s + (process + 1) * half) for s in range(0, args.examples, args.batch_size)]
    )
    models, fits = {}, {}
    kinds = KINDS if args.preset == "dp" else KINDS[:-1]
    for kind in kinds:
        if kind == "keras tf.data":
            dist = keras.distribution.DataParallel(devices=jax.devices())
        else:
            dist = kdist.preset(args.preset)
            dist.auto_shard_dataset = kind != "own rows"
        with dist.scope():
            keras.utils.set_random_seed(0)
            model = kdist.models.mnist_mlp()
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        models[kind] = (dist, model)
    dataset = kdist.make_dataset(x, y, global_batch_size=args.batch_size, distribution=models["tf.data"][0])
    fits["numpy"] = lambda m: m.fit(x, y, batch_size=args.batch_size, shuffle=False, verbose=0)
    fits["tf.data"] = lambda m: m.fit(dataset, verbose=0)
    fits["own rows"] = lambda m: m.fit(x[rows], y[rows], batch_size=half, shuffle=False, verbose=0)
    fits["keras tf.data"] = fits["tf.data"]
    times = {kind: [] for kind in kinds}
    for repeat in range(args.repeats + 1):  # the first repeat compiles and warms up
        for kind in kinds if repeat % 2 else reversed(kinds):
            dist, model = models[kind]
            with dist.scope():
                start = time.perf_counter()
                fits[kind](model)
                elapsed = time.perf_counter() - start
            if repeat:
                times[kind].append(round(elapsed, 4))
    steps = args.examples // args.batch_size
    result = {
        "benchmark": "multiprocess_inputs",
        "note": "fake CPU devices (2 processes x 4, gloo, one machine): a proxy, not an accelerator figure",
        "preset": args.preset,
        "processes": processes,
        "examples": args.examples,
        "global_batch_size": args.batch_size,
        "steps_per_epoch": steps,
        "repeats": args.repeats,
        "inputs": {
            kind: {"epoch_s": t, "steps_per_s_median": round(steps / statistics.median(t), 2)}
            for kind, t in times.items()
        },
        "machine": machine_info(),
    }
    if process == 0:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
