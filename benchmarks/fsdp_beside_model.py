"""Where fsdp goes on a weight the model axis splits: XLA:GPU's peak with fsdp on the other dimension, and joined.

kdist's placer used to put fsdp on the largest free dimension of a weight:
for an MLP kernel (hidden, width) whose width the model axis splits, the
hidden dimension, `('fsdp', 'model')`, and XLA:GPU then gathers activations
over fsdp instead of the weight (issue 21). It now puts fsdp on the
dimension model already splits, jointly (`(None, ('model', 'fsdp'))`), where
that divides by model x fsdp. This compiles the small Llama of
`planner_vs_deviceless_sharded.py` on two fsdp x model meshes of 8
deviceless H100s both ways (the old way by switching the join off in this
process); the planner's estimate is the same for both layouts.

Run: JAX_PLATFORMS=cpu python benchmarks/fsdp_beside_model.py   (needs jax-cuda13-pjrt)
Writes benchmarks/results/fsdp_beside_model.json.
"""

import importlib
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

MESHES = ["data=2,fsdp=2,model=2", "fsdp=4,model=2"]
CONFIG = dict(
    vocabulary_size=8192, num_layers=4, num_query_heads=8, num_key_value_heads=2, hidden_dim=512, intermediate_dim=1536
)


def main():
    import kdist  # before keras_hub: selects the JAX backend
    from kdist.machine import machine_info
    from kdist.rules.placer import Placer

    keras_hub = importlib.import_module("keras_hub")
    kdist.fake_devices(8)
    original, rows = Placer._beside_model, []
    for placement in ("fsdp on the other dimension (before)", "fsdp joined to model (now)"):
        if placement.endswith("(before)"):
            Placer._beside_model = lambda *args: None
        try:
            result = kdist.plan(
                lambda: keras_hub.models.LlamaBackbone(**CONFIG),
                8,
                batch_size=32,
                sequence_length=512,
                target="H100",
                attention="materialized",
                verify=MESHES,
                verify_target="H100",
            )
        finally:
            Placer._beside_model = original
        for c in result.candidates:
            if c.compiled:
                rows.append(
                    {
                        "placement": placement,
                        "mesh": c.spec,
                        "estimate": c.peak,
                        "xla_gpu_deviceless": c.compiled["peak"],
                        "ratio": round(c.ratio, 3),
                    }
                )
                print(
                    f"{placement:44} {c.spec:22} {c.peak / 1e9:6.3f} GB {c.compiled['peak'] / 1e9:6.3f} GB", flush=True
                )
    out = Path(__file__).parent / "results" / "fsdp_beside_model.json"
    body = {"machine": machine_info(), "target": "8 H100s (deviceless XLA:GPU)", "config": CONFIG, "rows": rows}
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
