import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import kdist


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    return rng.random((100, 16), dtype=np.float32), rng.integers(0, 4, size=(100,))


def _two_processes(replicas):
    """A stand-in for a distribution in a 2-process run (one process cannot host a real one)."""
    mesh = types.SimpleNamespace(axis_names=["data"], shape=[replicas])
    return types.SimpleNamespace(
        num_model_replicas=replicas, num_processes=2, auto_shard_dataset=True, device_mesh=mesh
    )


def test_global_batch_size_counts_the_replicas_of_the_distribution():
    assert kdist.global_batch_size(16, kdist.preset("2x4")) == 32
    assert kdist.global_batch_size(16, kdist.preset("dp")) == 128
    assert kdist.global_batch_size(16, kdist.preset("tp")) == 16
    assert kdist.global_batch_size(16) == 16  # no distribution: one replica
    keras.distribution.set_distribution(kdist.preset("2x2x2"))
    assert kdist.global_batch_size(3) == 12  # data x fsdp replicas, from the distribution in force
    with pytest.raises(kdist.BatchSizeError, match="positive integer; received 0"):
        kdist.global_batch_size(0)


def test_batch_size_that_does_not_divide_gives_a_clear_error():
    assert kdist.check_batch_size(32, kdist.preset("dp")) == 4
    with pytest.raises(
        kdist.BatchSizeError,
        match=r"Global batch size 30 does not divide evenly over the 8 model replicas of "
        r"ShardedDistribution\('dp', mesh \{'data': 8\}\)\. Use a multiple of 8 \(e.g\. 24 or 32\)",
    ):
        kdist.check_batch_size(30, kdist.preset("dp"))
    with pytest.raises(
        kdist.BatchSizeError, match=r"over the 1 model replicas and 2 processes .* multiple of 2 \(e\.g\. 2\)"
    ):
        kdist.check_batch_size(1, _two_processes(1))


def test_make_dataset_yields_global_batches(arrays):
    x, y = arrays
    dist = kdist.preset("2x4")
    ds = kdist.make_dataset(x, y, per_replica_batch_size=16, distribution=dist)
    assert kdist.check_dataset(ds, dist) == 32
    batches = list(ds.as_numpy_iterator())
    assert [b[0].shape for b in batches] == [(32, 16)] * 3  # the last 4 examples are dropped
    np.testing.assert_array_equal(batches[1][0], x[32:64])
    once = [b[1] for b in kdist.make_dataset(x, y, global_batch_size=32, shuffle="once", distribution=dist)]
    again = [b[1] for b in kdist.make_dataset(x, y, global_batch_size=32, shuffle="once", distribution=dist)]
    np.testing.assert_array_equal(np.concatenate(once), np.concatenate(again))  # same order in every process
    assert not np.array_equal(np.concatenate(once), y[:96])
    with pytest.raises(
        kdist.BatchSizeError, match="the last batch has 4 examples. Global batch size 4 does not divide"
    ):
        kdist.make_dataset(x, y, global_batch_size=32, drop_remainder=False, distribution=kdist.preset("dp"))
    with pytest.raises(kdist.BatchSizeError, match="exactly one of global_batch_size and per_replica_batch_size"):
        kdist.make_dataset(x, y, distribution=dist)


def test_make_dataset_trains_under_a_preset(arrays):
    x, y = arrays
    dist = kdist.preset("2x4")
    with dist.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8), keras.layers.Dense(4)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(kdist.make_dataset(x, y, per_replica_batch_size=8), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_check_dataset_rejects_unbatched_and_unknown_batch_sizes(arrays):
    x, y = arrays
    dist = kdist.preset("dp")
    unbatched = tf.data.Dataset.from_tensor_slices((x, y))
    with pytest.raises(kdist.BatchSizeError, match="not batched"):
        kdist.check_dataset(unbatched, dist)
    with pytest.raises(kdist.BatchSizeError, match="cannot be determined statically"):
        batches = (np.zeros((8, 16), "float32") for _ in range(2))
        kdist.check_dataset(
            tf.data.Dataset.from_generator(lambda: batches, output_signature=tf.TensorSpec((None, 16))), dist
        )
    with pytest.raises(kdist.BatchSizeError, match="without drop_remainder=True, so its last batch may be partial"):
        kdist.check_dataset(unbatched.batch(32), dist)
    assert kdist.check_dataset(unbatched.batch(32), dist, allow_partial_batches=True) == 32
    with pytest.raises(kdist.BatchSizeError, match="Global batch size 12 does not divide"):
        kdist.check_dataset(unbatched.batch(12, drop_remainder=True), dist)


def test_arrays_for_a_multi_process_fit_are_refused_by_keras_distributions_only(arrays):
    x, y = arrays
    with pytest.raises(
        kdist.BatchSizeError,
        match=r"2 processes, and fit\(\) under SimpleNamespace then needs a batched tf.data.Dataset .* ndarray",
    ):
        kdist.check_fit_inputs(x, _two_processes(2))
    assert kdist.check_fit_inputs(x, kdist.preset("dp")) is x  # one process: arrays are fine
    tp = kdist.preset("tp")
    tp._num_processes, tp._is_multi_process = 2, True  # as a process of 2 sees it: kdist feeds each its rows
    assert kdist.check_fit_inputs(x, tp) is x
    assert kdist.check_batch_size(1, tp) == 1  # every process passes the whole batch: no process count to divide
    ds = kdist.make_dataset(x, y, global_batch_size=32, distribution=_two_processes(2))
    assert kdist.check_fit_inputs(ds, _two_processes(2)) is ds
