"""The step-time estimate's FLOPs per device against XLA's, on every mesh.

The planner's compute time starts from the FLOPs of each kernel of the traced
step, split per device as the batch shard and the model/expert split say
(`kdist.planning.timing`). This checks that split against XLA: the configs
of `planner_vs_deviceless_sharded.py --families`, `--families-held-out` and
`--moe` (twenty keras-hub families, three MoE configs) are planned for
target "H100", and every mesh of each is compiled by XLA:CPU on fake CPU
devices (`verify=[mesh]`), whose SPMD partitioner splits the step as
XLA:GPU's does. A deviceless XLA:GPU compile has no cost analysis (jax
returns None), so XLA:CPU's is the reference. Per device and mesh each row
holds:

- `flops`: the estimate's (products and convolutions, `kdist.planning.trace.eqn_flops`);
- `xla_flops`: XLA's cost analysis of the compiled step (products and every
  elementwise operation, the loss and the optimizer's too);
- `xla_product_flops`: the products alone, counted from XLA's optimized module
  (2 x output elements x contracted size of each `dot`, x the right operand's
  elements per output feature of each `convolution`: a ViT's patches).

Run: python benchmarks/step_flops_vs_xla.py [--devices 8] [--models llama3,t5]
Writes benchmarks/results/step_flops_vs_xla.json (with the machine).
"""

import argparse
import json
import math
import re
import time
from pathlib import Path

import planner_vs_deviceless_sharded as sharded

SHAPE = re.compile(r"%([\w.-]+) = \w+\[([\d,]*)\]")
DOT = re.compile(r"= \w+\[([\d,]*)\][^ ]* dot\(%([\w.-]+),.*lhs_contracting_dims=\{([\d,]*)\}")
CONVOLUTION = re.compile(r"= \w+\[([\d,]*)\][^ ]* convolution\(%[\w.-]+, %([\w.-]+)\).*dim_labels=\w+_(\w+)->")


def product_flops(hlo_text):
    """2 x output elements x what each sums over, over the `dot`s (their contracted size) and `convolution`s (their
    right operand's elements per output feature) of an HLO module's text; names are unique in a module, and an
    operand's shape is where it is defined."""
    dims = {name: [int(d) for d in shape.split(",") if d] for name, shape in SHAPE.findall(hlo_text)}
    total = 0
    for out, lhs, contracting in DOT.findall(hlo_text):
        summed = math.prod(dims[lhs][int(i)] for i in contracting.split(",") if i)
        total += 2 * math.prod(int(d) for d in out.split(",") if d) * summed
    for out, rhs, rhs_labels in CONVOLUTION.findall(hlo_text):
        summed = math.prod(dims[rhs]) // dims[rhs][rhs_labels.index("o")]
        total += 2 * math.prod(int(d) for d in out.split(",") if d) * summed
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--models", help="comma-separated label prefixes (default: all)")
    args = parser.parse_args()

    import kdist
    from kdist.machine import machine_info
    from kdist.planning import verify

    kdist.fake_devices(args.devices)
    texts = {}

    def keeping_text(compile_step):  # verify's compile, keeping the compiled module's text for its products
        def compile_and_keep(*a, **k):
            compiled = compile_step(*a, **k)
            texts["last"] = compiled.as_text()
            return compiled

        return compile_and_keep

    verify.compile_train_step = keeping_text(verify.compile_train_step)
    verify.compile_train_step_with_options = keeping_text(verify.compile_train_step_with_options)
    wanted = args.models.split(",") if args.models else None
    out = Path(__file__).parent / "results" / "step_flops_vs_xla.json"
    run = {"machine": machine_info(), "target": f"{args.devices} fake CPU devices (XLA:CPU's cost analysis)"}
    rows = []
    for label, cls, config, batch, sequence in sharded.FAMILIES + sharded.FAMILIES_HELD_OUT + sharded.MOE:
        if wanted and not any(label.startswith(w) for w in wanted):
            continue
        start = time.perf_counter()
        build, options = sharded.hub_builder(cls, config), dict(batch_size=batch, sequence_length=sequence)
        options |= sharded.PLAN_OPTIONS
        for mesh in [c.spec for c in kdist.plan(build, args.devices, **options).candidates]:
            plan = kdist.plan(build, args.devices, **options, verify=[mesh])  # one at a time: each compile's text
            c = plan.candidate(mesh)
            if not c.compiled or "flops" not in c.compiled:
                print(f"{label:44} {mesh:22} not compared: XLA gave no cost analysis", flush=True)
                continue
            row = dict(config=label, mesh=mesh, flops=c.flops, xla_flops=c.compiled["flops"])
            row["xla_product_flops"] = product_flops(texts["last"])
            rows.append(row)
            products, everything = c.flops / row["xla_product_flops"], c.flops / row["xla_flops"]
            print(f"{label:44} {mesh:22} {products:6.3f} of XLA's products, {everything:6.3f} of its FLOPs", flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
        out.write_text(json.dumps({**run, "rows": rows}, indent=1) + "\n")  # after each config
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
