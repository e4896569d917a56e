"""ShardedDistribution at the edges of the batch: sizes that do not divide the batch axes get a kdist error."""

import numpy as np
import pytest

import kdist
from kdist.models import mnist_mlp


def _compiled(spec):
    dist = kdist.preset(spec)
    with dist.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return dist, model


@pytest.mark.parametrize("spec, examples, shards", [("2x4", 1, 2), ("fsdp", 1, 8), ("fsdp", 2, 8), ("dp", 3, 8)])
def test_predict_with_fewer_examples_than_the_batch_axes_names_the_fix(spec, examples, shards):
    dist, model = _compiled(spec)
    with dist.scope(), pytest.raises(kdist.BatchSizeError) as error:
        model.predict(np.zeros((examples, 28, 28, 1), np.float32), verbose=0)
    message = str(error.value)
    assert (
        f"A batch of {examples} example(s) does not divide over the {shards} batch shards of kdist.preset({spec!r})"
        in message
    )
    assert f"multiples of {shards}" in message and "pad the inputs" in message


def test_fit_and_evaluate_with_an_indivisible_batch_name_the_fix():
    dist, model = _compiled("dp")
    x, y = np.zeros((12, 28, 28, 1), np.float32), np.zeros(12, np.int32)
    with dist.scope():
        with pytest.raises(kdist.BatchSizeError, match=r"batch of 12 example\(s\) does not divide over the 8"):
            model.fit(x, y, batch_size=12, verbose=0)
        with pytest.raises(kdist.BatchSizeError, match=r"batch of 4 example\(s\)"):  # the last, partial batch
            model.evaluate(x, y, batch_size=8, verbose=0)


def test_a_model_parallel_mesh_takes_any_batch():
    dist, model = _compiled("tp")
    with dist.scope():
        assert model.predict(np.zeros((1, 28, 28, 1), np.float32), verbose=0).shape == (1, 10)


def test_generate_with_one_prompt_on_a_data_axis_names_the_fix():
    keras_hub = pytest.importorskip("keras_hub")
    dist = kdist.preset("2x4")
    with dist.scope():
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=64, num_layers=1, num_heads=4, hidden_dim=32, intermediate_dim=64, max_sequence_length=16
        )
        lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        prompt = {"token_ids": np.ones((1, 8), "int32"), "padding_mask": np.ones((1, 8), "bool")}
        with pytest.raises(
            kdist.BatchSizeError, match=r"batch of 1 example\(s\) does not divide over the 2 batch shards"
        ):
            lm.generate(prompt, stop_token_ids=None)
        two = {k: np.repeat(v, 2, axis=0) for k, v in prompt.items()}
        assert lm.generate(two, stop_token_ids=None)["token_ids"].shape == (2, 8)


def test_keras_shards_no_inputs_of_a_kdist_distribution_and_the_users_choice_stays_visible():
    pytest.importorskip("tensorflow")
    from keras.src.trainers.data_adapters import get_data_adapter  # what fit() calls first

    dist = kdist.preset("2x4")
    assert (dist.shard_inputs, dist.auto_shard_dataset) == (True, False)  # kdist gives each process its rows
    dist._num_processes, dist._process_id, dist._is_multi_process = 2, 1, True  # as process 1 of 2 sees it
    dataset = kdist.make_dataset(
        np.zeros((96, 3), np.float32), np.zeros(96, np.int32), global_batch_size=32, distribution=dist
    )
    assert dist.distribute_dataset(dataset) is dataset  # global batches, a known number of them
    with dist.scope():  # Keras's own distributions refuse arrays here ("must be a tf.data.Dataset")
        assert get_data_adapter(np.zeros((96, 3)), np.zeros(96), batch_size=32).num_batches == 3
    dist.auto_shard_dataset = False  # Keras's spelling of "each process passes its own rows"
    assert (dist.shard_inputs, dist.auto_shard_dataset) == (False, False)
    assert "auto_shard_dataset=False" in repr(dist)
    with pytest.raises(kdist.ArgumentTypeError, match="auto_shard_dataset must be True or False; received 'no'"):
        dist.auto_shard_dataset = "no"
    with pytest.raises(kdist.ArgumentTypeError, match="auto_shard_dataset must be True or False; received 1"):
        kdist.ShardedDistribution(kdist.mesh("2x4"), auto_shard_dataset=1)


def test_the_data_helpers_without_tensorflow_name_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    with pytest.raises(kdist.MissingDependencyError, match=r"pip install 'kdist\[data\]'"):
        kdist.make_dataset(np.zeros((8, 3)), global_batch_size=8, distribution=kdist.preset("dp"))
