"""Input batches and predictions of a multi-process run under a kdist distribution.

The contract (`ShardedDistribution.shard_inputs`, Keras's `auto_shard_dataset`):

- True (the default): every process passes the same *global* data to
  fit/evaluate/predict (numpy arrays, a tf.data dataset of global batches,
  `kdist.make_dataset`, a PyDataset, a generator), exactly as a one-process
  script does. Each batch is made into one global array of which every process
  supplies the rows its devices hold (`jax.make_array_from_process_local_data`
  with the global shape): the same batches, so the same losses, as one process
  on all the devices. The first batch of every epoch is checked to be the same
  in every process (a checksum, gathered); a difference raises ArgumentError.
- False: every process passes only its own rows of each global batch (Keras's
  meaning of `auto_shard_dataset=False`: data sharded by the user); the global
  batch is the processes' batches in process order.

`predict` and `predict_on_batch` return every process the whole output.
"""

import hashlib

import jax
import numpy as np
from jax.experimental import multihost_utils
from keras.distribution import TensorLayout

from kdist.errors import ArgumentError, ArgumentTypeError


def lay_out_global_batch(batch, layout, verify):
    """The global array of `batch` (the whole global batch, the same in every process) on `layout`.

    Every process contributes the rows its devices hold. With `verify`, first
    check that every process passed the same batch (a collective: every process
    must verify the same batches).
    """
    if isinstance(batch, jax.Array):
        batch = np.asarray(batch)
    if not isinstance(batch, np.ndarray):
        raise ArgumentTypeError(
            f"In a multi-process run kdist lays out numpy (or jax) input batches; received {type(batch).__name__}. "
            "Convert the inputs to dense arrays, or pass each process's own rows with the distribution's "
            "auto_shard_dataset=False."
        )
    if verify:
        check_same_in_every_process(batch)
    sharding = layout.backend_layout if isinstance(layout, TensorLayout) else layout
    return jax.make_array_from_process_local_data(sharding, batch, batch.shape)


def check_same_in_every_process(batch):
    """Raise ArgumentError unless every process holds the same `batch` (same shape, dtype and bytes)."""
    digest = hashlib.blake2b(f"{batch.shape}{batch.dtype}".encode(), digest_size=8)
    digest.update(np.ascontiguousarray(batch).data)
    mine = np.frombuffer(digest.digest(), np.uint32)
    every = np.asarray(multihost_utils.process_allgather(mine))
    differ = [p for p in range(len(every)) if not np.array_equal(every[p], every[0])]
    if differ:
        raise ArgumentError(
            f"The processes of this run passed different input data: the first batch of this epoch (shape "
            f"{batch.shape} in process {jax.process_index()}) differs between process 0 and process(es) {differ}. "
            "Under a kdist distribution every process passes the same global data (the same arrays, the same "
            "shuffling: seed with keras.utils.set_random_seed(...) before making or shuffling data), and each "
            "process feeds its own rows of every batch. If each process loads only its own part of the data, "
            "build the distribution with auto_shard_dataset=False (or set dist.auto_shard_dataset = False)."
        )


def gather_outputs(outputs):
    """Predictions with every array spread over several processes gathered whole, as numpy, in every process."""
    return jax.tree_util.tree_map(_gather, outputs)


def _gather(value):
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return multihost_utils.process_allgather(value, tiled=True)
    return value
