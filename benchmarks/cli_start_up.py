"""Wall time of whole `kdist` commands on keras-hub models, keras-hub imported with and without TensorFlow.

keras-hub imports TensorFlow at import time for its tokenizers; kdist's
command line builds models only and has the zoo import keras-hub without it
(`kdist.zoo.hub_models_only`). Each command runs in a fresh process, both
ways interleaved, `--repeats` times: "with TensorFlow" is the same command
with `hub_models_only` turned into a null context. The times include Python, JAX and
Keras start-up: what a user waits for.

Run: python benchmarks/cli_start_up.py [--repeats 5]
Writes benchmarks/results/cli_start_up.json.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kdist.machine import machine_info

COMMANDS = (
    ["lint", "llama3-70b", "--mesh", "8x16"],
    ["inspect", "llama3-8b", "--mesh", "2x4", "--optimizer", "adam"],
    ["plan", "llama3-8b", "--devices", "8", "--batch-size", "8", "--seq-len", "2048", "--memory", "80GB"],
)
RUN = "import importlib; main = importlib.import_module('kdist.cli.main'){patch}; print('exit', main.main({argv!r}))"
WITH_TENSORFLOW = "; import contextlib; main.hub_models_only = contextlib.nullcontext"
RESULTS = Path(__file__).parent / "results" / "cli_start_up.json"


def seconds(argv, patch):
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", RUN.format(patch=patch, argv=argv)], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0 or result.stdout.splitlines()[-1:] not in (["exit 0"], ["exit 1"]):
        raise SystemExit(f"kdist {' '.join(argv)} failed:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for argv in COMMANDS:
        times = {"without_tensorflow": [], "with_tensorflow": []}
        for _ in range(args.repeats):
            times["without_tensorflow"].append(seconds(argv, ""))
            times["with_tensorflow"].append(seconds(argv, WITH_TENSORFLOW))
        row = {"command": "kdist " + " ".join(argv), **{k: round(statistics.median(v), 2) for k, v in times.items()}}
        row["ratio"] = round(row["without_tensorflow"] / row["with_tensorflow"], 3)
        rows.append(row)
        without, with_tf = row["without_tensorflow"], row["with_tensorflow"]
        print(f"{row['command']:80} {without:6.2f} s (with TensorFlow: {with_tf:.2f} s)")
    RESULTS.write_text(json.dumps({"machine": machine_info(), "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
