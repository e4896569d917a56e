"""The planner's step-time estimate on the shared H100 configs: FLOPs against the textbook count, and every mesh of 8.

Each config of /work/shared/gpu-truth/h100.json is built abstractly as its
measure.py builds it and planned for target "H100": on one device (compute,
FLOPs and memory traffic of the traced step; for the decoder LMs the FLOPs
beside 6 x matrix weights x tokens + 12 x layers x batch x sequence^2 x
hidden), and on 8 devices with the default 100 GB/s and 10 us collectives
(compute, exposed communication and step time of every mesh, ranked).

These are estimates only. step_time_on_gpu.py measures the one-device steps
on a GPU and sets them beside the estimate; the 8-device rows are unmeasured.

Run: python benchmarks/planner_step_time.py [--truth PATH]
Writes benchmarks/results/planner_step_time.json.
"""

import argparse
import json
import math
import time
from pathlib import Path

DECODERS = ("keras_hub.models.LlamaBackbone", "keras_hub.models.GPT2Backbone")


def textbook_flops(model, config):
    """6 x matrix weights (no embeddings) x tokens + 12 x layers x batch x sequence^2 x hidden, or None."""
    if config["builder"] not in DECODERS:
        return None
    matrices = sum(
        math.prod(v.shape) for v in model.trainable_variables if len(v.shape) >= 2 and "embedding" not in v.path
    )
    b, s = config["batch_size"], config["sequence_length"]
    c = config["config"]
    return 6 * b * s * matrices + 12 * c["num_layers"] * b * s * s * c["hidden_dim"]


def main():
    import kdist
    from kdist.machine import machine_info
    from kdist.planning.calibration import build_config, load_configs

    parser = argparse.ArgumentParser()
    parser.add_argument("--truth", default="/work/shared/gpu-truth/h100.json")
    args = parser.parse_args()
    rows = []
    for config in load_configs(args.truth):
        model = build_config(config)
        options = dict(batch_size=config["batch_size"], sequence_length=config["sequence_length"], target="H100")
        start = time.perf_counter()
        one = kdist.plan(model, 1, **options).candidates[0]
        eight = kdist.plan(model, 8, **options)
        seconds = time.perf_counter() - start
        textbook = textbook_flops(model, config)
        row = {
            "config": config["name"],
            "one_device": {
                "flops": one.flops,
                "textbook_flops": textbook,
                "flops_over_textbook": round(one.flops / textbook, 4) if textbook else None,
                "hbm_bytes": one.hbm_bytes,
                "compute_seconds": one.compute_seconds,
                "arithmetic_intensity": round(one.flops / one.hbm_bytes, 1),
            },
            "eight_devices": [
                {
                    "rank": c.rank,
                    "mesh": c.spec,
                    "valid": c.valid,
                    "fits": c.fits,
                    "compute_seconds": c.compute_seconds,
                    "exposed_comm_seconds": c.exposed_comm_seconds,
                    "step_seconds": c.step_seconds,
                    "comm_seconds_before_overlap": c.comm_seconds,
                }
                for c in eight.candidates
            ],
            "recommendation": eight.recommendation.spec if eight.recommendation else None,
            "planning_seconds": round(seconds, 2),
        }
        rows.append(row)
        best = eight.recommendation
        step = f"{best.step_seconds * 1e3:.1f} ms" if best else "-"
        ratio = row["one_device"]["flops_over_textbook"]
        print(
            f"{config['name']:28s} 1 device: {one.flops / 1e12:7.2f} TFLOP"
            f" ({'x%.4f of textbook' % ratio if ratio else 'no textbook count'}), compute "
            f"{one.compute_seconds * 1e3:7.1f} ms; 8 devices: {row['recommendation']} {step}"
        )
    out = Path(__file__).parent / "results" / "planner_step_time.json"
    out.write_text(
        json.dumps(
            {
                "machine": machine_info(),
                "target": "H100 (estimates only: nothing measured)",
                "bandwidth": "100 GB/s per device, 10 us per collective step (kdist.plan's defaults)",
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
