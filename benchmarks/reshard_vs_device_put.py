"""Time of kdist.reshard versus a plain jax.device_put of the same arrays to the same shardings.

Small transformers (two sizes) are trained one step (so Adam's slots exist)
and moved through a cycle of meshes (8x1 -> 2x4 -> 1x8 -> fsdp -> 8x1). For each hop,
repeats interleave (order alternating) two timed moves from the same start:

- reshard: `kdist.reshard(model, target)`: planning (target layouts, bytes
  per device), copying the variables whose sharding changes, re-labelling
  the others, dropping the compiled functions; until the arrays are ready.
- device_put: one `jax.device_put(all state arrays, their target shardings)`
  with the shardings computed beforehand (not timed), until ready. The copies
  are released after the timer stops; reshard's time includes releasing the
  old copies of what it moved, a cost of moving that a bare device_put does
  not pay (large when the old copies are replicated, as from 8x1).

The plan alone (`dry_run=True`) is timed too. Untimed reshards put the model
back on the hop's source mesh between repeats.

Run: python benchmarks/reshard_vs_device_put.py [--repeats 15] [--models 256x4x8192,512x4x16384]
Writes benchmarks/results/reshard_vs_device_put.json.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from kdist.machine import machine_info

CYCLE = ("8x1", "2x4", "1x8", "fsdp", "8x1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--models", default="256x4x8192,512x4x16384", help="hidden x layers x vocabulary, comma-separated"
    )
    parser.add_argument("--fake-devices", type=int, default=8)
    args = parser.parse_args()

    import kdist

    if args.fake_devices:
        kdist.fake_devices(args.fake_devices)
    import jax
    import keras

    runs = []
    for config in args.models.split(","):
        hidden, layers, vocabulary = (int(n) for n in config.split("x"))
        runs.append(run_model(kdist, jax, keras, hidden, layers, vocabulary, args.repeats))
        keras.backend.clear_session()
    ratios = [h["ratio_reshard_over_device_put"] for r in runs for h in r["hops"]]
    result = {
        "benchmark": "reshard_vs_device_put",
        "repeats": args.repeats,
        "runs": runs,
        "ratio_reshard_over_device_put_median": statistics.median(ratios),
        "machine": machine_info(),
    }
    out = Path(__file__).parent / "results" / "reshard_vs_device_put.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"median ratio reshard / device_put over all hops: {result['ratio_reshard_over_device_put_median']:.2f}; "
        f"written to {out}"
    )


def run_model(kdist, jax, keras, hidden, layers, vocabulary, repeats):
    import numpy as np

    from kdist import resharding as reshard_module

    keras.distribution.set_distribution(kdist.preset(CYCLE[0]))
    keras.utils.set_random_seed(0)
    model = kdist.models.tiny_transformer(
        vocabulary_size=vocabulary, sequence_length=32, hidden_dim=hidden, num_heads=4, num_layers=layers
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tokens = np.random.default_rng(0).integers(0, vocabulary, size=(16, 32))
    model.fit(tokens, tokens, batch_size=16, verbose=0)
    entries = reshard_module._state_variables(model)
    state_bytes = sum(v.value.nbytes for v, _ in entries)
    name = f"tiny_transformer(hidden={hidden}, layers={layers}, vocabulary={vocabulary}), adam, after one step"
    print(f"{name}: {model.count_params():,} parameters, {state_bytes / 2**20:.0f} MiB of state")

    hops = []
    for source, target in zip(CYCLE, CYCLE[1:]):
        source_dist, target_dist = kdist.preset(source), kdist.preset(target)
        times = {"reshard": [], "device_put": [], "plan": []}
        kdist.reshard(model, source_dist)
        plan = kdist.plan_reshape(model, target_dist)
        layouts = reshard_module._target_layouts(entries, target_dist)
        shardings = [layouts[id(v)][1] for v, _ in entries]
        for repeat in range(repeats + 1):  # the first repeat warms up
            order = ("reshard", "device_put", "plan") if repeat % 2 == 0 else ("plan", "device_put", "reshard")
            for what in order:
                kdist.reshard(model, source_dist)
                copies = None  # a plain device_put frees nothing: its copies live past the timer
                start = time.perf_counter()
                if what == "reshard":
                    kdist.reshard(model, target_dist)
                elif what == "plan":
                    kdist.plan_reshape(model, target_dist)
                else:
                    copies = jax.block_until_ready(jax.device_put([v.value for v, _ in entries], shardings))
                elapsed = time.perf_counter() - start
                del copies
                if repeat:
                    times[what].append(elapsed)
        median = {what: statistics.median(t) for what, t in times.items()}
        hops.append(
            {
                "from": source,
                "to": target,
                "variables": len(entries),
                "variables_copied_by_reshard": plan.count,
                "bytes_received_per_device": [int(b) for b in plan.device_bytes],
                "median_s": median,
                "ratio_reshard_over_device_put": median["reshard"] / median["device_put"],
                "overhead_s": median["reshard"] - median["device_put"],
            }
        )
        print(
            f"  {source:>5} -> {target:<5} copied {plan.count:>3}/{len(entries)}  reshard "
            f"{median['reshard'] * 1e3:8.2f} ms  "
            f"device_put {median['device_put'] * 1e3:8.2f} ms  ratio {hops[-1]['ratio_reshard_over_device_put']:.2f}  "
            f"(plan alone {median['plan'] * 1e3:.2f} ms)"
        )
    del entries
    return {"model": name, "parameters": int(model.count_params()), "state_bytes": int(state_bytes), "hops": hops}


if __name__ == "__main__":
    main()
