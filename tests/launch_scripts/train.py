"""The script the launcher tests run in every process: `kdist.initialize()` + presets.

    train.py --presets dp [--resume 2x4 BACKUP_DIR OUT_DIR] [--kill RANK EPOCH BATCH]

- each of `--presets` trains the tiny model one epoch and prints `RESULT {json}`, then
  the data helpers print what they make of the 2-process distribution;
- `--resume SPEC DIR OUT` trains two epochs under SPEC with kdist.BackupAndRestore(DIR),
  prints `STEP epoch batch loss` after each step, and writes the final model
  and optimizer state to OUT (kdist.save_sharded: every process writes its shards);
- `--kill RANK EPOCH BATCH` makes process RANK SIGKILL itself when that batch begins.
"""

import argparse
import json
import os
import signal
import time

import kdist

kdist.initialize()

import jax  # noqa: E402
import keras  # noqa: E402
from common import data, train  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--presets", default="")
parser.add_argument("--resume", nargs=3, metavar=("SPEC", "DIR", "OUT"))
parser.add_argument("--kill", nargs=3, type=int, metavar=("RANK", "EPOCH", "BATCH"))
args = parser.parse_args()


class Steps(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if args.kill and jax.process_index() == args.kill[0] and [self.epoch, batch] == args.kill[1:]:
            print(
                f"KILLING process {args.kill[0]} at epoch {self.epoch} batch {batch}, time {time.time()!r}", flush=True
            )
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        if logs and "loss" in logs:
            print(f"STEP {self.epoch} {batch} {float(logs['loss'])!r}", flush=True)


for spec in filter(None, args.presets.split(",")):
    losses, _ = train(spec)
    print(
        "RESULT "
        + json.dumps(
            {"spec": spec, "process": jax.process_index(), "processes": jax.process_count(), "losses": losses}
        ),
        flush=True,
    )

if args.presets:  # the data helpers see the real 2-process distribution
    dp = kdist.preset("dp")
    try:
        print(f"CHECK_FIT accepted {type(kdist.check_fit_inputs(data()[0], dp)).__name__}", flush=True)
    except kdist.BatchSizeError as e:
        print(f"CHECK_FIT {type(e).__name__}: {e}", flush=True)
    print(
        f"GLOBAL_BATCH {kdist.global_batch_size(4, dp)} {kdist.global_batch_size(4, kdist.preset('2x4'))}", flush=True
    )

if args.resume:
    spec, backup_dir, out = args.resume
    losses, model = train(spec, epochs=2, callbacks=[kdist.BackupAndRestore(backup_dir, save_freq=3), Steps()])
    kdist.save_sharded(model, out)
    print(f"DONE {len(losses)} steps", flush=True)
