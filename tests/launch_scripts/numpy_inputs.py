"""What `tests/test_global_batches.py` runs in every launched process: numpy inputs to fit/evaluate/predict.

Prints `RESULT {json}`: `global_results()` (every process passes the whole
arrays), the losses of the same training with each process passing only its
own rows (`auto_shard_dataset=False`), and the error raised when process 1
passes other data than process 0.
"""

import json
import os

import kdist

kdist.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

try:  # run as a script: its directory is on sys.path
    from common import GLOBAL_BATCH, build, data
except ImportError:  # imported by the test, for the one-process reference
    from tests.launch_scripts.common import GLOBAL_BATCH, build, data


def global_results():
    """fit (in order, then shuffled), evaluate, predict and predict_on_batch on the whole arrays, under "2x4"."""
    x, y = data()
    with kdist.preset("2x4").scope():
        model = build()  # seeds numpy too: every process shuffles alike
        in_order = model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=False, verbose=0).history["loss"]
        shuffled = model.fit(x, y, batch_size=GLOBAL_BATCH, verbose=0).history["loss"]
        return {
            "in_order": in_order,
            "shuffled": shuffled,
            "evaluate": model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0),
            "predict": model.predict(x, batch_size=GLOBAL_BATCH, verbose=0).tolist(),
            "predict_on_batch": np.asarray(model.predict_on_batch(x[:GLOBAL_BATCH])).tolist(),
        }


def own_rows_losses(process, processes):
    """The first fit of `global_results`, each process passing only its rows of every global batch (in order)."""
    x, y = data()
    per_process = GLOBAL_BATCH // processes
    rows = np.concatenate(
        [
            np.arange(start + process * per_process, start + (process + 1) * per_process)
            for start in range(0, len(x), GLOBAL_BATCH)
        ]
    )
    dist = kdist.preset("2x4")
    dist.auto_shard_dataset = False
    with dist.scope():
        model = build()
        return model.fit(x[rows], y[rows], batch_size=per_process, shuffle=False, verbose=0).history["loss"]


def mismatch_error(process):
    """The error when process 1 passes other data than process 0."""
    x, y = data()
    with kdist.preset("2x4").scope():
        model = build()
        try:
            model.fit(x + process, y, batch_size=GLOBAL_BATCH, verbose=0)
        except kdist.ArgumentError as e:
            return f"{type(e).__name__}: {e}"
    return None


if __name__ == "__main__":
    process, processes = jax.process_index(), jax.process_count()
    result = {
        "process": process,
        "processes": processes,
        **global_results(),
        "own_rows": own_rows_losses(process, processes),
        "mismatch": mismatch_error(process),
    }
    print("RESULT " + json.dumps(result), flush=True)
    # The refused fit above leaves Keras's input threads behind; tearing them down at interpreter exit aborted a
    # process once in five suite runs ("terminate called ... exception not rethrown", after RESULT). This test is
    # about the results: once every process has printed them, end without that teardown.
    multihost_utils.sync_global_devices("kdist-test-results-printed")
    os._exit(0)
