"""Training step time under kdist.preset("2x4") vs a hand-written keras ModelParallel of the same layout.

Both distributions lay out every variable identically (the hand-written
LayoutMap is built from the preset's own placements), so XLA should compile
the same program: the step-time ratio should be within 1.02. Steps of the two
models are interleaved in one run so machine noise hits both alike.

Run: python benchmarks/preset_vs_modelparallel.py [--steps 60] [--fake-devices 8]
Writes benchmarks/results/preset_vs_modelparallel.json.
"""

import argparse
import json
import re
import statistics
import time
from pathlib import Path

from kdist.machine import machine_info


def build_mlp():
    import keras

    return keras.Sequential(
        [
            keras.Input((1024,)),
            keras.layers.Dense(2048, activation="relu", name="up"),
            keras.layers.Dense(2048, activation="relu", name="mid"),
            keras.layers.Dense(1024, name="down"),
        ],
        name="bench_mlp",
    )


def prepared(distribution, x, y):
    import keras

    keras.utils.set_random_seed(0)
    with distribution.scope():
        model = build_mlp()
        model.compile(optimizer="adam", loss="mse")
        model.train_on_batch(x, y)  # compile
    return model


def hlo_of(model, distribution, x, y):
    """The optimized HLO instructions of the model's jitted train step, without source metadata."""
    import jax

    with distribution.scope():
        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables],
        )
        data = (distribution_put(distribution, x), distribution_put(distribution, y), None)
        compiled = jax.jit(model.train_step).lower(state, data).compile()
    instructions = (line for line in compiled.as_text().splitlines() if re.match(r"\s*(%|ROOT |ENTRY )", line))
    return [re.sub(r", metadata=\{[^}]*\}", "", line) for line in instructions]


def distribution_put(distribution, array):
    import jax

    return jax.device_put(array, distribution.get_data_layout(array.shape).backend_layout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--fake-devices", type=int, default=8)
    args = parser.parse_args()

    import kdist

    if args.fake_devices:
        kdist.fake_devices(args.fake_devices)
    import jax
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch_size, 1024), dtype=np.float32)
    y = rng.standard_normal((args.batch_size, 1024), dtype=np.float32)

    preset = kdist.preset("2x4")
    kdist_model = prepared(preset, x, y)
    layout_map = keras.distribution.LayoutMap(preset.device_mesh)
    for path, placement in preset.placements.items():
        layout_map[path] = placement.axes
    by_hand = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")
    hand_model = prepared(by_hand, x, y)

    same_layouts = all(
        a.value.sharding.spec == b.value.sharding.spec for a, b in zip(kdist_model.variables, hand_model.variables)
    )
    same_program = hlo_of(kdist_model, preset, x, y) == hlo_of(hand_model, by_hand, x, y)

    times = {"kdist": [], "keras": []}
    runs = [("kdist", kdist_model, preset), ("keras", hand_model, by_hand)]
    for step in range(args.steps):
        for name, model, dist in runs if step % 2 == 0 else runs[::-1]:
            with dist.scope():
                start = time.perf_counter()
                logs = model.train_on_batch(x, y, return_dict=True)
                jax.block_until_ready(logs["loss"])
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t[5:]) for name, t in times.items()}
    ratio = median["kdist"] / median["keras"]
    result = {
        "benchmark": "preset_vs_modelparallel",
        "model": "MLP 1024-2048-2048-1024, adam, mse",
        "batch_size": args.batch_size,
        "steps_timed": args.steps - 5,
        "mesh": "2x4",
        "median_step_s": median,
        "ratio_kdist_over_keras": ratio,
        "within_1_02": abs(ratio - 1) <= 0.02,
        "same_variable_layouts": same_layouts,
        "same_compiled_program": same_program,
        "machine": machine_info(),
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results" / "preset_vs_modelparallel.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
