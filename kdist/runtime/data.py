"""Input pipelines for distributed fit: global batch sizes and tf.data datasets that shard across processes.

Under a distribution, `fit` takes the *global* batch (all replicas together).
In a multi-process run under a kdist distribution, every process passes the
same global data (numpy arrays, a batched `tf.data.Dataset`) and kdist feeds
each process's rows of every global batch (`kdist/global_batches.py`); Keras's
own distributions shard only a batched `tf.data.Dataset` and refuse arrays.
These helpers compute the global batch from a per-replica one, build a
dataset of the right shape and check a dataset or batch size up front, with
errors that say what to change.
"""

import math

import keras

from kdist.checks import is_int, non_negative_int, shown
from kdist.errors import ArgumentError, ArgumentTypeError, BatchSizeError, MissingDependencyError
from kdist.presets import build_preset


def num_replicas(distribution=None):
    """Number of model replicas (devices along the batch axes) of `distribution`.

    Defaults to the distribution in force; 1 when there is none.
    """
    distribution = _distribution(distribution)
    if distribution is None:
        return 1
    return int(distribution.num_model_replicas)


def global_batch_size(per_replica_batch_size, distribution=None):
    """The global batch size for `per_replica_batch_size` examples per model replica.

    Like `tf.distribute.Strategy.num_replicas_in_sync * batch size` in
    TensorFlow: pass the result to `fit(batch_size=...)` or `make_dataset`.

    Example:

    ```python
    kdist.global_batch_size(16, kdist.preset("2x4"))   # 32: the "data" axis has 2 replicas
    kdist.global_batch_size(16, kdist.preset("dp"))    # 128 on 8 devices
    ```
    """
    if not is_int(per_replica_batch_size) or per_replica_batch_size < 1:
        raise BatchSizeError(
            f"per_replica_batch_size must be a positive integer; received {shown(per_replica_batch_size)}."
        )
    return int(per_replica_batch_size) * num_replicas(distribution)


def check_batch_size(global_batch_size, distribution=None):
    """Check that `global_batch_size` splits evenly over the replicas and processes.

    Returns the per-replica batch size.

    Example:

    ```python
    dist = kdist.preset("2x4")                    # 2 model replicas
    kdist.check_batch_size(64, dist)              # 32
    kdist.check_batch_size(63, dist)              # BatchSizeError naming 62 and 64
    ```

    Raises:
        BatchSizeError: the batch does not divide by the number of model
            replicas (or of processes, in a multi-process run); the message
            names the nearest sizes that do.
    """
    if not is_int(global_batch_size) or global_batch_size < 1:
        raise BatchSizeError(f"The global batch size must be a positive integer; received {shown(global_batch_size)}.")
    global_batch_size = int(global_batch_size)
    distribution = _distribution(distribution)
    replicas = num_replicas(distribution)
    processes = _processes_passing_rows(distribution)
    step = math.lcm(replicas, processes)
    if global_batch_size % step:
        lower, upper = global_batch_size // step * step, (global_batch_size // step + 1) * step
        nearest = f"{lower} or {upper}" if lower else f"{upper}"
        what = f"{replicas} model replicas" + (f" and {processes} processes" if processes > 1 else "")
        raise BatchSizeError(
            f"Global batch size {global_batch_size} does not divide evenly over the {what} of "
            f"{_describe(distribution)}. Use a multiple of {step} (e.g. {nearest}), or "
            f"kdist.global_batch_size(per_replica_batch_size) to compute one."
        )
    return global_batch_size // replicas


def make_dataset(
    x,
    y=None,
    sample_weight=None,
    *,
    global_batch_size=None,
    per_replica_batch_size=None,
    distribution=None,
    shuffle=False,
    seed=None,
    drop_remainder=True,
    repeat=False,
):
    """A batched `tf.data.Dataset` of the global data, ready for a (multi-process) `fit`.

    Give the same full arrays in every process: the dataset yields global
    batches, and each process feeds its rows of each batch (kdist presets;
    Keras's own distributions shard the dataset per process). Partial last batches are
    dropped by default, since every batch must split over the replicas.

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("2x4"))
    ds = kdist.make_dataset(x, y, per_replica_batch_size=16)   # batches of 32
    model.fit(ds, epochs=2)
    ```

    Args:
        x, y, sample_weight: arrays (or nested structures of arrays) with the same first dimension.
        global_batch_size / per_replica_batch_size: one of the two.
        distribution: defaults to the distribution in force.
        shuffle: False; True to reshuffle every epoch (the same order in every
            process, from `seed`); or "once" to shuffle once and keep that order
            every epoch. tf.data counts reshuffles per process, so a run resumed
            by `kdist.BackupAndRestore` in a later epoch sees other orders than
            the uninterrupted run would; with "once" (or False) it sees the same.
        seed: shuffle seed (default 0).
        drop_remainder: drop a last partial batch (default True). With False,
            the last batch must still divide over the replicas.
        repeat: repeat forever (use `steps_per_epoch` in fit).
    """
    tf = tensorflow()
    distribution = _distribution(distribution)
    batch = _resolve_batch(global_batch_size, per_replica_batch_size, distribution)
    check_batch_size(batch, distribution)
    for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        if value is not None and not keras.tree.flatten(value):
            raise ArgumentTypeError(
                f"{name} holds no arrays; received {name}={shown(value)}. Pass an array or a structure of arrays."
            )
    data = tuple(a for a in (x, y, sample_weight) if a is not None)
    data = data[0] if len(data) == 1 else data
    count = _num_examples(data)
    if count < batch and drop_remainder:
        raise BatchSizeError(
            f"The data has {count} examples, fewer than one global batch of {batch}; nothing would be trained."
        )
    if not drop_remainder and count % batch:
        try:
            check_batch_size(count % batch, distribution)
        except BatchSizeError as e:
            raise BatchSizeError(
                f"With drop_remainder=False the last batch has {count % batch} examples. {e}"
            ) from None
    if not (shuffle is True or shuffle is False or (isinstance(shuffle, str) and shuffle == "once")):
        raise ArgumentError(f'shuffle must be False, True or "once"; received {shown(shuffle)}.')
    for name, value in (("drop_remainder", drop_remainder), ("repeat", repeat)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"{name} must be True or False; received {shown(value)}.")
    if seed is not None:
        non_negative_int(seed, "seed")
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        seed = 0 if seed is None else seed  # every process must draw the same order
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=shuffle is True)
    dataset = dataset.batch(batch, drop_remainder=drop_remainder)
    if repeat:
        dataset = dataset.repeat()
    return dataset.prefetch(tf.data.AUTOTUNE)


def check_dataset(dataset, distribution=None, *, allow_partial_batches=False):
    """Check that a `tf.data.Dataset` is batched with a global batch that the distribution can split.

    Returns the global batch size.

    Example:

    ```python
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)
    kdist.check_dataset(dataset, kdist.preset("2x4"))   # 64
    ```

    Args:
        dataset: a batched `tf.data.Dataset`.
        distribution: defaults to the distribution in force.
        allow_partial_batches: accept a dataset batched without
            `drop_remainder=True` (its last batch may not split over the replicas).

    Raises:
        BatchSizeError: the dataset is not batched, its batch size is unknown,
            it may end with a partial batch, or its batch does not divide over
            the replicas / processes.
    """
    tf = tensorflow()
    from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute  # optional, as above

    if not isinstance(dataset, tf.data.Dataset):
        raise BatchSizeError(f"check_dataset needs a tf.data.Dataset; received {type(dataset).__name__}.")
    specs = tf.nest.flatten(dataset.element_spec)
    if not all(getattr(s, "shape", None) is not None and s.shape.rank and s.shape.rank > 0 for s in specs):
        raise BatchSizeError(
            f"The dataset is not batched (element_spec={dataset.element_spec}). Batch it with the global "
            "batch size: dataset.batch(kdist.global_batch_size(per_replica_batch_size), drop_remainder=True)."
        )
    batch = int(tf_data_distribute.compute_batch_size(dataset).numpy())
    if batch < 0:
        raise BatchSizeError(
            "The dataset's batch size cannot be determined statically, so it cannot be sharded across "
            "processes. Batch it last, with dataset.batch(global_batch_size, drop_remainder=True)."
        )
    check_batch_size(batch, distribution)
    if not allow_partial_batches and any(s.shape[0] is None for s in specs):
        raise BatchSizeError(
            f"The dataset is batched by {batch} without drop_remainder=True, so its last batch may be "
            f"partial and not split over the {num_replicas(distribution)} replicas. Batch it with "
            "dataset.batch(global_batch_size, drop_remainder=True), or pass allow_partial_batches=True."
        )
    return batch


def check_fit_inputs(x, distribution=None):
    """Check that `x` can be passed to `fit` under `distribution`; returns `x`.

    Under a kdist distribution arrays and datasets both work in a
    multi-process run (the same global data in every process). Keras's own
    distributions with auto-sharding need a batched `tf.data.Dataset` there
    (Keras shards it across processes) and refuse arrays.

    Example:

    ```python
    model.fit(kdist.check_fit_inputs(dataset), epochs=3)
    ```

    Raises:
        BatchSizeError: arrays were given to a multi-process distribution, or
            the dataset is not batched in a way the distribution can split.
    """
    tf = tensorflow()
    distribution = _distribution(distribution)
    if isinstance(x, tf.data.Dataset):
        check_dataset(x, distribution, allow_partial_batches=True)
        return x
    processes = _num_processes(distribution)
    if processes > 1 and getattr(distribution, "auto_shard_dataset", False):  # never a kdist distribution's
        raise BatchSizeError(
            f"This run has {processes} processes, and fit() under {type(distribution).__name__} then needs a "
            f"batched tf.data.Dataset that Keras can shard across them; received {type(x).__name__}. Build one "
            "with kdist.make_dataset(x, y, global_batch_size=...) from the full arrays in every process, or use "
            "a kdist preset, under which arrays work."
        )
    return x


def _resolve_batch(global_batch, per_replica, distribution):
    if (global_batch is None) == (per_replica is None):
        raise BatchSizeError(
            "Give exactly one of global_batch_size and per_replica_batch_size; received "
            f"global_batch_size={global_batch!r}, per_replica_batch_size={per_replica!r}."
        )
    return global_batch if global_batch is not None else global_batch_size(per_replica, distribution)


def _num_examples(data):
    leaves = keras.tree.flatten(data)
    if not leaves or not all(hasattr(a, "__len__") and hasattr(a, "shape") for a in leaves):
        raise ArgumentTypeError(
            f"x, y and sample_weight must be arrays (or nested structures of arrays); received {type(data).__name__}."
        )
    sizes = {len(a) for a in leaves}
    if len(sizes) != 1:
        raise BatchSizeError(
            f"x, y and sample_weight must have the same number of examples; received sizes {sorted(sizes)}."
        )
    return sizes.pop()


def _distribution(distribution):
    """The distribution: the one given (a spec string builds its preset), else the one in force (or None)."""
    if distribution is None:
        return keras.distribution.distribution()
    if isinstance(distribution, str):
        return build_preset(distribution)
    if not hasattr(distribution, "device_mesh"):
        raise ArgumentTypeError(
            "distribution must be a keras.distribution.Distribution, a kdist spec such as '2x4', or None for "
            f"the one in force; received {type(distribution).__name__} {shown(distribution)}."
        )
    return distribution


def _processes_passing_rows(distribution):
    """How many processes each pass their own rows of a global batch (1 when each passes the whole batch)."""
    if getattr(distribution, "shard_inputs", False):  # a kdist distribution: every process passes the global batch
        return 1
    return _num_processes(distribution)


def _num_processes(distribution):
    if distribution is None:
        return 1
    return int(getattr(distribution, "num_processes", 1) or 1)


def _describe(distribution):
    if distribution is None:
        return "a single device"
    shape = dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))
    spec = getattr(distribution, "spec", None)
    return f"{type(distribution).__name__}({f'{spec!r}, ' if spec else ''}mesh {shape})"


def tensorflow():
    """Import TensorFlow for tf.data (an optional dependency), or say how to install it."""
    try:
        import tensorflow as tf  # optional: only the tf.data helpers need it
    except ImportError as e:
        raise MissingDependencyError(
            f"kdist's tf.data helpers need TensorFlow: pip install 'kdist[data]' (tensorflow-cpu) ({e})"
        ) from None
    return tf
