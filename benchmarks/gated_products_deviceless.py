"""Gated MLPs of six activations: the estimate against XLA:GPU's figure compiled for deviceless H100s.

A gated MLP multiplies an activation of one projection of its input by
another projection of it, act(x Wg) * (x Wu). XLA:GPU's DotMerger merges
the two projections' GEMMs, forward and backward, and its fusion cost model
decides, by activation, whether the merged weight-gradient GEMM's operand
(the two cotangents side by side) is written from the cotangents or
computed again from what they are computed from, the forward products'
output and the gradient of their product, which it then keeps until that
GEMM runs (docs/plan.md, "Gated products"). The estimate keeps the
cotangents. This experiment compiles a stack of such MLPs (LayerNorm, gate
and up projections to 4 x hidden, the product, a down projection, a
residual add; hidden 256, 256 tokens, batch 32) with tanh, GELU (tanh),
sigmoid, x², SiLU and the exact GELU, on every candidate mesh of 4 and 8
devices and on one, and on data=16 and fsdp=16, and records the estimate,
XLA's figure and the band the plan prints. `calibration.GATED_PRODUCT_HIGH`
is the most XLA's figure came to over the estimate here.

Run: JAX_PLATFORMS=cpu python benchmarks/gated_products_deviceless.py   (needs jax-cuda13-pjrt; one process per
device count)
Writes benchmarks/results/gated_products_deviceless.json.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

from planner_vs_deviceless_sharded import PLAN_OPTIONS, VERIFY_TARGET  # noqa: E402
from planner_vs_gpu import band_fields  # noqa: E402

ACTIVATIONS = ("tanh", "gelu_tanh", "sigmoid", "square", "silu", "gelu")
# devices -> the meshes compiled (True: every candidate)
MESHES = {1: True, 4: True, 8: True, 16: ["data=16", "fsdp=16"]}
HIDDEN, TOKENS, LAYERS, BATCH = 256, 256, 2, 32


def model(activation):
    import keras
    from keras import ops

    act = {
        "tanh": ops.tanh,
        "gelu_tanh": lambda x: ops.gelu(x, approximate=True),
        "sigmoid": ops.sigmoid,
        "square": ops.square,
        "silu": ops.silu,
        "gelu": lambda x: ops.gelu(x, approximate=False),
    }[activation]
    x = tokens_in = keras.Input((TOKENS, HIDDEN))
    for i in range(LAYERS):
        h = keras.layers.LayerNormalization(name=f"norm{i}")(x)
        gate = keras.layers.Dense(4 * HIDDEN, use_bias=False, name=f"gate{i}")(h)
        up = keras.layers.Dense(4 * HIDDEN, use_bias=False, name=f"up{i}")(h)
        product = keras.layers.Multiply(name=f"product{i}")([keras.layers.Activation(act, name=f"act{i}")(gate), up])
        down = keras.layers.Dense(HIDDEN, use_bias=False, name=f"down{i}")(product)
        x = keras.layers.Add(name=f"residual{i}")([x, down])
    return keras.Model(tokens_in, keras.layers.Dense(16, name="head")(x))


def rows_on(devices):
    """The rows of one device count (a process of its own: JAX's fake device count is fixed once it starts)."""
    import kdist

    kdist.fake_devices(devices)
    rows = []
    for activation in ACTIVATIONS:
        result = kdist.plan(
            lambda: model(activation),
            devices,
            batch_size=BATCH,
            **PLAN_OPTIONS,
            verify=MESHES[devices],
            verify_target=VERIFY_TARGET,
        )
        for c in result.candidates:
            if not c.compiled:
                continue
            reference = c.compiled["peak"]
            row = {"activation": activation, "devices": devices, "mesh": c.spec, "estimate": c.peak}
            row |= {"xla_gpu_deviceless": reference, "ratio": round(c.peak / reference, 3), **band_fields(c, reference)}
            rows.append(row)
            print(
                f"{activation:10} {devices:2} {c.spec:22} {c.peak / 1e6:7.1f} MB {reference / 1e6:7.1f} MB "
                f"{row['ratio']:6.3f}",
                file=sys.stderr,
                flush=True,
            )
    return rows


def main():
    from kdist.machine import machine_info

    if len(sys.argv) > 1:  # one device count, its rows as JSON on stdout
        print(json.dumps(rows_on(int(sys.argv[1]))))
        return
    rows = []
    for devices in MESHES:
        run = subprocess.run([sys.executable, __file__, str(devices)], capture_output=True, text=True, check=False)
        sys.stderr.write(run.stderr)
        if run.returncode:
            raise SystemExit(f"the run on {devices} devices failed (exit {run.returncode})")
        rows += json.loads(run.stdout.splitlines()[-1])
    out = Path(__file__).parent / "results" / "gated_products_deviceless.json"
    body = {"machine": machine_info(), "target": "1 to 16 H100s (deviceless XLA:GPU)", "rows": rows}
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
