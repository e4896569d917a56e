"""ModelFacts: inputs of different lengths by name, and labels at the traced outputs' shapes."""

import keras

import kdist
from kdist.planning.facts import ModelFacts
from kdist.planning.targets import resolve_target
from kdist.planning.trace import TRACE_BATCH


def _seq2seq():
    """A source and a target of their own lengths; the target attends to the source (a seq2seq model's shape)."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    memory = keras.layers.Embedding(64, 16)(source)
    x = keras.layers.Embedding(64, 16)(target)
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, memory)
    return keras.Model([source, target], [keras.layers.Dense(64)(memory), keras.layers.Dense(64)(x)])


MODEL = kdist.abstract_model(_seq2seq)


def _plan(sequence_length, **options):
    return kdist.plan(MODEL, 8, batch_size=64, sequence_length=sequence_length, target="H100", **options)


def test_each_input_takes_its_own_length_and_each_output_its_labels():
    facts = ModelFacts(MODEL, "adam", None, {"source": 32, "target": 8}, None, resolve_target("H100"))
    assert [s.shape for s in facts.inputs] == [(TRACE_BATCH, 32), (TRACE_BATCH, 8)]
    assert facts.traced.labels == ((TRACE_BATCH, 32), (TRACE_BATCH, 8))
    assert facts.tokens_per_example == 32  # the first token input's


def test_one_length_for_every_input_plans_as_the_same_length_by_name():
    by_name = _plan({"source": 16, "target": 16})
    one = _plan(16)
    assert [(c.spec, c.peak) for c in by_name.candidates] == [(c.spec, c.peak) for c in one.candidates]
    assert "sequences source 16, target 16" in str(by_name) and "sequence 16" in str(one)


def test_a_longer_target_costs_more_memory_on_every_mesh():
    short, long = _plan({"source": 32, "target": 8}), _plan({"source": 32, "target": 32})
    for s in short.candidates:
        assert s.peak < long.candidate(s.spec).peak, s.spec


def test_verify_compiles_inputs_of_different_lengths():
    checked = kdist.plan(
        _seq2seq, 8, batch_size=64, sequence_length={"source": 32, "target": 8}, verify=["data=8"]
    ).candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


class _SharedGrid(keras.layers.Layer):
    """A grid every example shares, batch 1, whose spec says batch None (SAM's dense positional embeddings)."""

    def build(self, shape):
        self.grid = self.add_weight(shape=(1, 4, 4, 8), initializer="zeros")

    def call(self, x):
        return keras.ops.tanh(self.grid)

    def compute_output_shape(self, shape):
        return (None, 4, 4, 8)


def _shared_output():
    images = keras.Input((4, 4, 3))
    return keras.Model(images, [keras.layers.Dense(8)(images), _SharedGrid()(images)])


def test_an_output_the_batch_shares_is_labelled_once():
    """Its labels have batch 1, as the traced output has (verify took the inputs' batch and Keras refused the pair)."""
    result = kdist.plan(_shared_output, 8, batch_size=64, verify=["data=8"])
    assert result.candidate("data=8").compiled["peak"] > 0
