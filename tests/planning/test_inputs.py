"""Bad input to kdist.plan and preset("auto"): a kdist error naming the argument, the value and what would do."""

import keras
import numpy as np
import pytest

import kdist
from kdist.errors import ArgumentError, ArgumentTypeError, ModelError, PlanError, RuleError, SizeError
from kdist.models import mnist_mlp
from kdist.zoo import TINY, tiny_entries
from tests.helpers import raises_clearly

MODEL = kdist.abstract_model(mnist_mlp)


def _frozen():
    inputs = keras.Input((8,))
    return keras.Model(inputs, keras.layers.Dense(4, trainable=False)(inputs))


def _tokens_and_image():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    image = keras.Input((8,), name="image")
    x = keras.layers.Embedding(16, 8)(tokens) + keras.layers.Dense(8)(image)[:, None, :]
    return keras.Model([tokens, image], keras.layers.Dense(16)(x))


TWO_INPUTS = kdist.abstract_model(_tokens_and_image)


class _Subclassed(keras.Model):
    """A model with no layer graph: built by calling it, so it keeps no keras.Input."""

    def __init__(self):
        super().__init__(name="subclassed")
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)


def _subclassed():
    model = _Subclassed()
    model(np.zeros((1, 8), "float32"))
    return model


def _argmax_only():
    inputs = keras.Input((8,))
    return keras.Model(inputs, keras.ops.argmax(keras.layers.Dense(4)(inputs), axis=-1))


def plan(model=MODEL, devices=8, **options):
    """kdist.plan of the MLP on 8 devices with a batch of 8, but for `options`."""
    return lambda: kdist.plan(model, devices, **{"batch_size": 8, **options})


CASES = [
    (plan(model="mlp"), ModelError, "needs a Keras model", "received str"),
    (plan(model=keras.Sequential([keras.layers.Dense(4)])), ModelError, "has no variables: build it", "keras.Input"),
    (plan(model=kdist.abstract_model(_frozen)), ModelError, "2 variables and none is trainable", "trainable = True"),
    (plan(model=_argmax_only), ModelError, "has no floating-point output", "['int32']", "before the argmax"),
    (plan(devices=0), PlanError, "devices must be a positive integer; received 0"),
    (plan(devices="8"), PlanError, "devices must be a positive integer; received '8'"),
    (plan(devices=10**9), PlanError, "devices=1000000000", "typo"),
    (plan(batch_size=-1), PlanError, "batch_size must be a positive integer; received -1"),
    (plan(batch_size=8.5), PlanError, "batch_size", "8.5"),
    (plan(sequence_length=0), PlanError, "sequence_length must be a positive integer", "a dict", "received 0"),
    (plan(sequence_length="long"), PlanError, "sequence_length must be a positive integer", "received 'long'"),
    (plan(sequence_length=64), PlanError, "sequence_length=64 has nothing to set", "fixed shape", "(None, 28, 28, 1)"),
    (plan(TWO_INPUTS), PlanError, "Input 'tokens'", "(None, None)", "pass sequence_length= (--seq-len)"),
    (plan(TWO_INPUTS, sequence_length={"token": 4}), PlanError, "names ['token']", "inputs are ['tokens', 'image']"),
    (plan(TWO_INPUTS, sequence_length={}), PlanError, "gives no length to input(s) ['tokens']", "add each name"),
    (plan(TWO_INPUTS, sequence_length={"tokens": 4, "image": 2}), PlanError, "input 'image'", "leave it out"),
    (plan(TWO_INPUTS, sequence_length={"tokens": (4, 2)}), PlanError, "=(4, 2) has 2 lengths", "1 unknown dim"),
    (plan(TWO_INPUTS, sequence_length={"tokens": -1}), PlanError, "an int >= 0", "received 'tokens': -1"),
    (plan(TWO_INPUTS, sequence_length={"tokens": 1.5}), PlanError, "a tuple with one per dimension", "1.5"),
    (plan(TWO_INPUTS, sequence_length={3: 4}), PlanError, "maps an input's name to its length", "received 3: 4"),
    (plan(optimizer="adamz"), ArgumentError, "Unknown optimizer 'adamz'", "adamw"),
    (plan(optimizer=3), ArgumentTypeError, "optimizer must be a name", "received int"),
    (plan(optimizer={"a": 1}), ArgumentError, "optimizer config {'a': 1} has no 'class_name'", "serialize"),
    (plan(model=[1, 2]), ArgumentTypeError, "list of Keras variables", "received a list holding int 1"),
    (plan(dtype="float7"), ArgumentError, "dtype must be a floating-point dtype", "'float7'"),
    (plan(dtype="data=8,data=1"), ArgumentError, "dtype must be a floating-point dtype", "'data=8,data=1'"),
    (plan(dtype="mixed_float16"), ArgumentError, "is a Keras dtype policy", "set_dtype_policy('mixed_float16')"),
    (plan(memory_per_device="eighty"), SizeError, "memory_per_device='eighty' is not a size", '"80GB"'),
    (plan(memory_per_device=-5), SizeError, "memory_per_device=-5 must be a positive, finite size"),
    (plan(memory_per_device="inf"), SizeError, "memory_per_device='inf' is not a size", '"80GB"'),
    (plan(memory_per_device=float("inf")), SizeError, "memory_per_device=inf must be a positive, finite size"),
    (plan(memory_per_device=float("nan")), SizeError, "memory_per_device=nan", "finite"),
    (plan(memory_per_device="1e999999999"), SizeError, "'1e999999999' must be a positive, finite size"),
    (plan(memory_per_device="0.4B"), SizeError, "is 0.4 bytes, less than one byte", '"80GB"'),
    (plan(memory_per_device=[[[[1]]]]), SizeError, "memory_per_device must be a number", "list"),
    (plan(bandwidth="fast"), SizeError, "bandwidth='fast' is not a size"),
    (plan(latency=-1), PlanError, "latency must be a number >= 0", "latency=-1"),
    (plan(latency=1e308), PlanError, "latency=1e+308 is more than the 60 seconds", "check the unit"),
    (plan(batch_size=2**64), PlanError, f"batch_size={2**64} is more than", "check for a typo"),
    (lambda: kdist.plan(lambda: 1 / 0, 8, batch_size=8), ModelError, "('<lambda>') failed", "ZeroDivisionError"),
    (lambda: kdist.plan(MODEL, 8, batch_size=8).candidate("bogus"), PlanError, "no candidate 'bogus'", "'data=8'"),
    (plan(rules="nosuchfamily"), RuleError, "Unknown rule set 'nosuchfamily'", "llama"),
    (plan(rules=3), ArgumentTypeError, "rules must be", "received int"),
    (plan(verify="yes"), PlanError, "verify must be True, False or a list of candidate specs", "'yes'"),
    (plan(model=MODEL.weights, verify=True), PlanError, "verify=True compiles the model's training", "pass the model"),
    (plan(model=_subclassed(), verify=["data=8"]), PlanError, "model 'subclassed' has none", "from keras.Input"),
    (plan(target="H900"), ArgumentError, "target='H900'", "'H100'"),
    (plan(target=3), ArgumentError, "target must be", "target=3"),
    (plan(attention="fastest"), PlanError, "attention must be one of 'fused', 'materialized'", "'fastest'"),
    (plan(remat="yes"), PlanError, "remat must be True or False", "'yes'"),
    (plan(margin=2), ArgumentError, "margin must be a fraction of the memory in [0, 1)", "margin=2"),
    (plan(margin="10%"), ArgumentError, "margin must be a fraction", "'10%'"),
    (plan(verify_target="H100"), PlanError, "verify_target='H100'", "verify=True"),
    (lambda: plan(memory_per_device="1KB")().preset(), PlanError, "no recommendation", "No candidate fits 1000 B"),
    (lambda: kdist.preset("auto"), kdist.SpecError, "needs the model and the batch size", "batch_size=64"),
    (lambda: kdist.preset("auto", model=MODEL, batch_size=0), PlanError, "batch_size", "received 0"),
]


def test_a_length_the_inputs_fix_is_taken_and_another_refused():
    model = kdist.abstract_model(kdist.models.tiny_transformer)  # token ids of a fixed 32
    assert kdist.plan(model, 2, batch_size=8, sequence_length=32).sequence_length == 32
    raises_clearly(lambda: kdist.plan(model, 2, batch_size=8, sequence_length=64), PlanError, "nothing to set")


def test_a_sequence_longer_than_a_learned_position_table_is_refused():
    keras_hub = pytest.importorskip("keras_hub")
    model = kdist.abstract_model(
        lambda: keras_hub.models.GPT2Backbone(
            vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=32
        )
    )
    raises_clearly(
        lambda: kdist.plan(model, 2, batch_size=8, sequence_length=64),
        ArgumentError,
        "sequence_length=64 is longer than model 'gpt2_backbone' takes",
        "layer 'position_embedding' (PositionEmbedding) holds positions for 32 tokens",
        "sequence_length <= 32",
    )
    assert kdist.plan(model, 2, batch_size=8, sequence_length=32).candidates


def test_a_position_table_inside_a_layer_not_named_position_is_found():
    pytest.importorskip("keras_hub")
    model = kdist.abstract_model(tiny_entries()["siglip"])  # SigLIP's text embedding: token + position tables
    raises_clearly(
        lambda: kdist.plan(model, 2, batch_size=8, sequence_length=32),
        ArgumentError,
        "sequence_length=32 is longer than model 'sig_lip_backbone' takes",
        "layer 'embedding' (SigLIPTextEmbedding) holds positions for 16 tokens",
    )
    assert kdist.plan(model, 2, batch_size=8, sequence_length=16).candidates


def test_a_table_a_strided_layer_fits_the_sequence_to_is_planned_with_a_note():
    """Whisper's encoder halves its frames before its 16 positions: 24 frames fit (it was refused before the trace)."""
    keras_hub = pytest.importorskip("keras_hub")
    model = kdist.abstract_model(
        lambda: keras_hub.models.WhisperBackbone(**{**TINY["whisper"], "max_decoder_sequence_length": 32})
    )
    result = kdist.plan(model, 2, batch_size=8, sequence_length=24)
    assert result.candidates and any(
        "sequence_length=24 is longer than model 'whisper_backbone' takes" in note and "The step traced" in note
        for note in result.notes
    )
    raises_clearly(
        lambda: kdist.plan(model, 2, batch_size=8, sequence_length=40),  # 40 tokens overrun the decoder's 32
        ArgumentError,
        "holds positions for 16 tokens; layer 'decoder_token_and_position_embedding'",
        "Pass sequence_length <= 16",
    )


def test_a_sequence_shorter_than_a_table_its_layer_adds_whole_names_the_table():
    pytest.importorskip("keras_hub")
    model = kdist.abstract_model(tiny_entries()["siglip"])  # its text embedding adds all 16 positions
    raises_clearly(
        lambda: kdist.plan(model, 2, batch_size=8, sequence_length=8),
        PlanError,
        "could not trace layer",
        "(a batch of 7919 is the planner's: it traces at that batch)",
        "Layer 'embedding' (SigLIPTextEmbedding) holds positions for 16 tokens",
        "sequence_length=8",
        "pass sequence_length=16",
    )


class _ReadsAValue(keras.layers.Layer):
    """A layer whose code needs a tensor's value (as keras-hub's schedulers do): it cannot be traced abstractly."""

    def call(self, x):
        return x * float(keras.ops.sum(x))

    def compute_output_spec(self, x):
        return keras.KerasTensor(x.shape, x.dtype)


def test_a_margin_of_any_real_number_type_is_taken():
    assert kdist.plan(MODEL, 8, batch_size=8, margin=np.float32(0.25)).margin == 0.25


def _fixed_batch(batch):
    def build():
        inputs = keras.Input((16,), batch_size=batch)
        return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Dense(256)(inputs)))

    return build


def test_an_input_with_a_fixed_batch_is_planned_at_the_batch_given_and_the_plan_says_so():
    fixed = kdist.plan(kdist.abstract_model(_fixed_batch(4)), 2, batch_size=512)
    free = kdist.plan(kdist.abstract_model(_fixed_batch(None)), 2, batch_size=512)
    assert [c.peak for c in fixed.candidates] == [c.peak for c in free.candidates]
    assert any("fixes its batch at 4" in note for note in fixed.notes)
    assert not any("fixes its batch" in note for note in free.notes)


def test_a_failed_layer_that_reads_no_position_table_gets_no_table_hint():
    keras_hub = pytest.importorskip("keras_hub")

    def build():
        tokens = keras.Input((None,), dtype="int32")
        x = keras.layers.Embedding(64, 8)(tokens)
        x = x + keras_hub.layers.PositionEmbedding(32)(x)
        return keras.Model(tokens, keras.layers.Dense(64)(_ReadsAValue(name="reads_a_value")(x)))

    with pytest.raises(PlanError) as caught:
        kdist.plan(kdist.abstract_model(build), 2, batch_size=8, sequence_length=16)
    assert "could not trace layer 'reads_a_value'" in str(caught.value)
    assert "position" not in str(caught.value)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_input_is_refused_clearly(case):
    call, error, *words = case
    raises_clearly(call, error, *words)


def test_lengths_by_name_that_overrun_a_position_table_name_the_tables():
    pytest.importorskip("keras_hub")
    model = kdist.abstract_model(tiny_entries()["whisper"])  # 32 frames fill its 16 encoder positions (stride 2)
    lengths = {"encoder_features": 64, "decoder_token_ids": 16, "decoder_padding_mask": 16}
    raises_clearly(
        lambda: kdist.plan(model, 2, batch_size=8, sequence_length=lengths),
        PlanError,
        "could not trace layer 'encoder_position_embedding'",
        "'encoder_position_embedding' (PositionEmbedding) 16",
        "check sequence_length=",
    )
    assert kdist.plan(model, 2, batch_size=8, sequence_length={**lengths, "encoder_features": 32}).candidates
