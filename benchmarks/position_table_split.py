"""GPT-2's learned position table, hidden size on 'model' (kdist's rule) or replicated (Megatron's): XLA:GPU's peak.

kdist's rules put the hidden size of a position table on 'model'. XLA
carries that split through the residual stream (the embedding sum and every
residual add stay split over the hidden size, the layer norms all-reduce
their statistics), which the planner's estimate counts whole: on GPT-2's
model-axis meshes the estimate is up to 1.3x XLA's figure on 8 devices
(`planner_vs_deviceless_sharded.py`). This experiment compiles the small
GPT-2 of that script on its model-axis meshes of 8 deviceless H100s twice:
with kdist's rules, and with a rule put first that replicates the table.
Nothing in kdist is changed by it.

Run: JAX_PLATFORMS=cpu python benchmarks/position_table_split.py   (needs jax-cuda13-pjrt)
Writes benchmarks/results/position_table_split.json.
"""

import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

from planner_vs_deviceless_sharded import (  # noqa: E402
    PLAN_OPTIONS,
    VERIFY_TARGET,
    compiled_rows,
    config_named,
    hub_builder,
)

MESHES = ["data=4,model=2", "data=2,model=4", "fsdp=2,model=4", "model=8"]


def main():
    import kdist
    from kdist.machine import machine_info
    from kdist.rules.compose import AUTO
    from kdist.rules.hub import ANY, REPLICATED
    from kdist.rules.rule import Rule, RuleSet

    kdist.fake_devices(8)
    label, cls, config, batch, sequence = config_named("gpt2")
    replicated = RuleSet([Rule(ANY + "position_embedding/embeddings", REPLICATED, "replicated"), *AUTO], "replicated")
    rows = []
    for table, rules in (("hidden on 'model' (kdist)", None), ("replicated", replicated)):
        result = kdist.plan(
            hub_builder(cls, config),
            8,
            batch_size=batch,
            sequence_length=sequence,
            rules=rules,
            **PLAN_OPTIONS,
            verify=MESHES,
            verify_target=VERIFY_TARGET,
        )
        for row in compiled_rows(result, position_table=table):
            rows.append(row)
            print(
                f"{table:26} {row['mesh']:16} {row['estimate'] / 1e9:6.3f} GB "
                f"{row['xla_gpu_deviceless'] / 1e9:6.3f} GB",
                flush=True,
            )
    out = Path(__file__).parent / "results" / "position_table_split.json"
    body = {"machine": machine_info(), "target": "8 H100s (deviceless XLA:GPU)", "config": label, "rows": rows}
    out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
