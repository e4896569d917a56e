"""Where fsdp goes on a weight the model axis splits: XLA:GPU's peak with kdist's rule, and with fsdp joined to model.

kdist's placer puts fsdp on the largest free dimension of a weight: for an
MLP kernel (hidden, width) whose width the model axis splits, that is the
hidden dimension, `('fsdp', 'model')`, and XLA:GPU then gathers activations
over fsdp instead of the weight (issue 21). This experiment compiles the
small Llama, GPT-2 and BERT of `planner_vs_deviceless_sharded.py` on three
fsdp x model meshes of 8 deviceless H100s twice: with kdist's placer, and
with the placer patched in this process to put fsdp on the dimension model
already splits, jointly (`(None, ('model', 'fsdp'))`) where it divides by
model x fsdp. Nothing in kdist is changed by it; the planner's estimate is
the same for both layouts.

Run: JAX_PLATFORMS=cpu python benchmarks/fsdp_beside_model.py   (needs jax-cuda13-pjrt)
Writes benchmarks/results/fsdp_beside_model.json.
"""

import dataclasses
import itertools
import json
import math
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

from planner_vs_deviceless_sharded import CONFIGS, PLAN_OPTIONS, VERIFY_TARGET, compiled_rows, hub_builder  # noqa: E402

MESHES = ["data=2,fsdp=2,model=2", "fsdp=4,model=2", "fsdp=2,model=4"]
# The Llama, GPT-2 and BERT of planner_vs_deviceless_sharded.py (this folder is the script's sys.path[0]).
MODELS = {
    label.split()[0]: (cls, config)
    for label, cls, config, _, _ in CONFIGS
    if label.split()[0] in ("llama", "gpt2", "bert")
}


def joint_fsdp(original):
    """Placer._fsdp, but fsdp joins model on a dimension model splits when that dimension divides by both."""
    from kdist.meshes.spec import Role

    def _fsdp(self, placement):
        dims = self.dims
        if not dims.fsdp_enabled or dims.size_of(Role.MODEL) == 1:
            return original(self, placement)
        fsdp, model = dims.name_of(Role.FSDP), dims.name_of(Role.MODEL)
        shape, axes = placement.shape, placement.axes
        if model in axes and fsdp not in axes and math.prod(shape) >= self.fsdp_min_size:
            d = axes.index(model)
            if shape[d] % (dims.size_of(Role.MODEL) * dims.size_of(Role.FSDP)) == 0:
                joined = tuple((model, fsdp) if i == d else a for i, a in enumerate(axes))
                return dataclasses.replace(placement, axes=joined, source="fsdp")
        return original(self, placement)

    return _fsdp


def main():
    import kdist
    from kdist.machine import machine_info
    from kdist.rules.placer import Placer

    kdist.fake_devices(8)
    original, rows = Placer._fsdp, []
    for (name, (cls, config)), placement in itertools.product(
        MODELS.items(), ("kdist: fsdp on the largest free dimension", "fsdp joined to model")
    ):
        Placer._fsdp = original if placement.startswith("kdist") else joint_fsdp(original)
        try:
            result = kdist.plan(
                hub_builder(cls, config),
                8,
                batch_size=32,
                sequence_length=512,
                **PLAN_OPTIONS,
                verify=MESHES,
                verify_target=VERIFY_TARGET,
            )
        finally:
            Placer._fsdp = original
        for row in compiled_rows(result, model=name, placement=placement):
            rows.append(row)
            print(
                f"{name:6} {placement:44} {row['mesh']:22} {row['estimate'] / 1e9:6.3f} GB "
                f"{row['xla_gpu_deviceless'] / 1e9:6.3f} GB",
                flush=True,
            )
    out = Path(__file__).parent / "results" / "fsdp_beside_model.json"
    body = {"machine": machine_info(), "target": "8 H100s (deviceless XLA:GPU)", "models": MODELS, "rows": rows}
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
