"""A depthwise convolution's kernel split over fsdp (the old default) or whole (kdist's rule): XLA:GPU's peak.

With its channels split over fsdp, XLA:GPU's SPMD partitioner reshards a
depthwise convolution's activations to the kernel's channel split instead of
gathering the kernel (docs/plan.md, "Depthwise kernels under fsdp"). This
experiment compiles a small model (a 1 x 1 convolution to 512 channels, a
depthwise convolution, a 1 x 1 convolution; 28 x 28 images, batch 64) for 8
deviceless H100s, with 3 x 3 and 7 x 7 depthwise kernels (both over the
placer's 4096 elements), twice: with kdist's rules (the kernel whole over
fsdp) and with a rule that names the kernel's channels as its `fsdp_dim`
(split, as the placer did before).

Run: JAX_PLATFORMS=cpu python benchmarks/depthwise_under_fsdp.py   (needs jax-cuda13-pjrt)
Writes benchmarks/results/depthwise_under_fsdp.json.
"""

import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

from planner_vs_deviceless_sharded import PLAN_OPTIONS, VERIFY_TARGET, compiled_rows  # noqa: E402

MESHES = ["data=8", "fsdp=8", "data=2,fsdp=4"]


def model(window):
    import keras

    x = images = keras.Input((28, 28, 16))
    x = keras.layers.Conv2D(512, 1, name="expand")(x)
    x = keras.layers.DepthwiseConv2D(window, padding="same", name="depthwise")(x)
    x = keras.layers.Conv2D(64, 1, name="project")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(images, keras.layers.Dense(10, name="head")(x))


def main():
    import kdist
    from kdist.machine import machine_info
    from kdist.rules import KERAS_CORE, Rule, RuleSet

    kdist.fake_devices(8)
    split = RuleSet([Rule(r"depthwise/kernel", (), "split over fsdp on its channels", fsdp_dim=2), *KERAS_CORE])
    rows = []
    for window in (3, 7):
        for kernel, rules in (("whole (kdist)", None), ("split", split)):
            result = kdist.plan(
                lambda: model(window),
                8,
                batch_size=64,
                rules=rules,
                **PLAN_OPTIONS,
                verify=MESHES,
                verify_target=VERIFY_TARGET,
            )
            for row in compiled_rows(result, window=window, kernel=kernel):
                rows.append(row)
                print(
                    f"{window} x {window} {kernel:14} {row['mesh']:14} {row['estimate'] / 1e6:6.1f} MB "
                    f"{row['xla_gpu_deviceless'] / 1e6:6.1f} MB",
                    flush=True,
                )
    out = Path(__file__).parent / "results" / "depthwise_under_fsdp.json"
    body = {"machine": machine_info(), "target": "8 H100s (deviceless XLA:GPU)", "rows": rows}
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
