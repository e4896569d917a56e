"""Tracing the training step: integer indexing (BERT's `x[:, 0, :]`), layers that cannot be traced, and which of the
step's weight-gradient kernels wait for their reduction."""

import keras
import pytest

import kdist
from kdist.planning.facts import ModelFacts
from kdist.planning.step import trace_step
from kdist.planning.targets import resolve_target
from kdist.planning.trace import TRACE_BATCH, sublayer_paths


def _pooled():
    """A functional model that takes the first token of a sequence with `x[:, 0, :]`, as BERT's pooler does."""
    tokens = keras.Input((16,), dtype="int32")
    h = keras.layers.Embedding(100, 32)(tokens)
    h = keras.layers.Dense(32, activation="relu")(h)
    first = h[:, 0, :]
    return keras.Model(tokens, keras.layers.Dense(10)(first))


class _Positions(keras.layers.Layer):
    """Returns its weight as it is (a learned table every example shares): Keras trains it; the trace failed."""

    def build(self, shape):
        self.table = self.add_weight(shape=(1, *shape[1:]), initializer="zeros")

    def call(self, x):
        return self.table

    def compute_output_shape(self, shape):
        return (1, *shape[1:])


def _with_positions():
    images = keras.Input((4, 4, 3))
    x = keras.layers.Dense(8)(images)
    return keras.Model(images, keras.layers.Dense(8)(x + _Positions()(x)))


def test_a_layer_returning_its_own_weight_is_traced_and_verified():
    checked = kdist.plan(_with_positions, 8, batch_size=64, verify=["data=8"]).candidate("data=8")
    assert checked.activations > 0 and checked.compiled and checked.compiled["peak"] > 0


def test_a_model_indexing_a_tensor_with_an_integer_is_planned():
    model = kdist.abstract_model(_pooled)
    for devices in (1, 8):
        result = kdist.plan(model, devices, batch_size=32)
        assert result.recommendation is not None
        for c in result.candidates:
            assert c.activations > 0 and c.peak == c.weights + c.optimizer + c.activations + c.transient + c.other


class _Mean(keras.layers.Layer):
    def call(self, x):
        return keras.ops.mean(x)  # rank 0


class _Scale(keras.layers.Layer):
    def call(self, x, s):
        return x * s


def _scaled_by_a_scalar():
    """One layer's output of rank 0 read by another layer (StableDiffusion3Backbone has one)."""
    x = keras.Input((16,))
    h = keras.layers.Dense(16)(x)
    return keras.Model(x, _Scale()(h, _Mean()(h)))


def test_a_layer_output_of_rank_0_read_by_another_layer_is_traced():
    for devices in (1, 8):
        result = kdist.plan(_scaled_by_a_scalar, devices, batch_size=8)
        assert not any("activations not estimated" in n for n in result.notes)
        assert all(c.transient > 0 for c in result.candidates)


def test_the_slice_of_the_first_token_is_an_alias_of_the_value_it_is_cut_from():
    model = kdist.abstract_model(_pooled)
    facts = ModelFacts(model, "adam", None, None, None, resolve_target("gpu"))
    traced = trace_step(model, facts.inputs)
    step = traced.step
    # The (batch, 32) first token is one value: the Dense reading it reads a buffer of that shape (or its source).
    pooled = [g for g, s in enumerate(step.shape) if s == (TRACE_BATCH, 32)]
    assert pooled, step.shape
    read = {x for _, used, _ in step.events for x in used}
    assert any(g in read or g in step.virtual for g in pooled)


def _square_image_cnn(side, channels):
    """A CNN on `side` x `side` images whose second convolution's kernel is (3, 3, channels, channels)."""
    images = keras.Input((side, side, 3))
    h = keras.layers.Conv2D(channels, 3, padding="same", activation="relu")(images)
    h = keras.layers.Conv2D(channels, 3, padding="same", activation="relu")(h)
    return keras.Model(images, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)))


@pytest.mark.parametrize("channels", [16, 24])
def test_a_cnn_is_a_cnn_when_its_channels_equal_its_image_side(channels):
    """A 16 x 16 image's (3, 3, 16, 16) kernel ends in (length, length), and is no attention (keras-hub's VGG and
    ResNet at 128 x 128 with 128 channels were banded as transformers when scores were found by their shape)."""
    assert _traced(lambda: _square_image_cnn(16, channels)) == ("cnn", "none")


def _traced(build):
    """(family, attention) of the traced step of `build()`."""
    model = kdist.abstract_model(build)
    traced = trace_step(model, ModelFacts(model, "adam", None, None, None, resolve_target("gpu")).inputs)
    return traced.family, traced.attention


def _tagger(width=16):
    """A recurrent tagger whose width equals its 16 tokens: a Dense's weight gradient is (16, 16), no attention."""
    tokens = keras.Input((16,), dtype="int32")
    h = keras.layers.LSTM(width, return_sequences=True)(keras.layers.Embedding(50, width)(tokens))
    return keras.Model(tokens, keras.layers.Dense(5)(keras.layers.Dense(width)(h)))


class _WindowAttention(keras.layers.Layer):
    """Attention within windows of 4 of the 16 tokens: its scores are (windows, 4, 4), not (16, 16) (Swin's shape)."""

    def build(self, shape):
        self.q, self.k = keras.layers.Dense(8), keras.layers.Dense(8)

    def call(self, x):
        windows = keras.ops.reshape(x, (-1, 4, x.shape[-1]))
        scores = keras.ops.softmax(keras.ops.einsum("bqd,bkd->bqk", self.q(windows), self.k(windows)))
        return keras.ops.reshape(keras.ops.einsum("bqk,bkd->bqd", scores, windows), (-1, 16, x.shape[-1]))


def _windowed(nested=False):
    images = keras.Input((16, 8))
    if nested:  # a backbone inside the model, its attention reading the model's own input
        return keras.Model(images, keras.layers.Dense(4)(keras.Model(images, _WindowAttention()(images))(images)))
    return keras.Model(images, keras.layers.Dense(4)(_WindowAttention()(keras.layers.Dense(8)(images))))


class _LinearAttention(keras.layers.Layer):
    """A state updated by each token's outer product k v^T, in a loop (RWKV's and a gated delta net's shape)."""

    def build(self, shape):
        self.k, self.v = keras.layers.Dense(4), keras.layers.Dense(4)

    def call(self, x):
        def step(state, kv):
            state = state + keras.ops.einsum("bi,bj->bij", *kv)
            return state, keras.ops.einsum("bij,bj->bi", state, kv[1])

        kv = [keras.ops.transpose(f(x), (1, 0, 2)) for f in (self.k, self.v)]
        _, out = keras.ops.scan(step, keras.ops.zeros((keras.ops.shape(x)[0], 4, 4)), kv)
        return keras.ops.transpose(out, (1, 0, 2))


def _linear_attention():
    tokens = keras.Input((16,), dtype="int32")
    return keras.Model(tokens, keras.layers.Dense(5)(_LinearAttention()(keras.layers.Embedding(50, 8)(tokens))))


@pytest.mark.parametrize(
    "build, expected",
    [(_tagger, ("other", "none")), (_windowed, ("transformer", "materialized"))]
    + [(lambda: _windowed(nested=True), ("transformer", "materialized"))]
    + [(_linear_attention, ("transformer", "materialized"))],
    ids=["tagger", "windows", "nested windows", "linear attention"],
)
def test_attention_a_layer_computes_is_a_batched_product_of_two_activations(build, expected):
    """Not a (length, length) shape: an LSTM tagger whose width is its length was banded a transformer, and windowed
    attention (Swin) was found only through such an accidental product."""
    assert _traced(build) == expected


def test_a_tiny_bert_backbone_is_planned():
    pytest.importorskip("keras_hub")
    from kdist import zoo

    model = zoo.load_model("tiny-bert")
    result = kdist.plan(model, 8, batch_size=8, sequence_length=16)
    assert len(result.candidates) == 10 and result.recommendation is not None
    assert all(c.activations > 0 for c in result.candidates if c.valid)


class _Untraceable(keras.layers.Layer):
    """Works symbolically (its output spec is declared), fails on the tensors of a trace."""

    def call(self, x):
        raise RuntimeError("this layer cannot run on tracers")

    def compute_output_spec(self, x):
        return keras.KerasTensor(x.shape, x.dtype)


def test_a_layer_that_cannot_be_traced_is_a_plan_error_naming_it():
    def build():
        x = keras.Input((8,))
        h = keras.layers.Dense(8)(x)
        return keras.Model(x, keras.layers.Dense(4)(_Untraceable(name="odd_layer")(h)))

    model = kdist.abstract_model(build)
    with pytest.raises(kdist.PlanError, match=r"could not trace layer 'odd_layer' \(_Untraceable\).*RuntimeError") as e:
        kdist.plan(model, 2, batch_size=8)
    assert "\x1b" not in str(e.value)  # Keras's terminal colour codes are not part of kdist's message


def test_each_operation_belongs_to_the_innermost_layer_with_sublayers_that_ran_it():
    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="block")
            self.attention = keras.layers.MultiHeadAttention(2, 4, name="attention")
            self.dense = keras.layers.Dense(8, name="dense")

    block = Block()
    block.attention.build((2, 3, 8), (2, 3, 8))
    scopes = [
        "transpose(jvp(block))/attention/softmax",  # a leaf layer inside the attention
        "jvp(block)/attention/query/abc,cde->abde",  # an einsum of the attention's query projection
        "jvp(block)/attention/jit(_where)",  # the attention's own operation
        "jvp(block)/dense",  # a leaf layer of the block
        "transpose(jvp(block))",  # the block's own operation
        "",
    ]
    assert sublayer_paths(block, scopes) == ["attention", "attention", "attention", "", "", ""]


def test_under_remat_operations_keep_their_sublayer():
    """`jax.checkpoint` puts its own names before the layer's on the name stack ("" and, for the recomputed forward,
    "rematted_computation"). Read as the layer's sublayers they matched none, so a layer's whole backward under
    `remat=True` was one run kept to its end: the Llama 3 at hidden 256 on data=8 was 1.46x XLA's figure (1.18)."""
    block = keras.layers.Layer(name="block")
    block.attention = keras.layers.MultiHeadAttention(2, 4, name="attention")
    block.attention.build((2, 3, 8), (2, 3, 8))
    scopes = [
        "transpose(jvp(jvp()))/rematted_computation/block/attention/softmax",  # the recomputed forward
        "transpose(jvp(jvp()))/block/attention/query/abc,cde->abde",  # the backward
        "transpose(jvp(jvp()))/block",
        "jvp(block)/attention/jit(_where)",  # the forward
    ]
    assert sublayer_paths(block, scopes) == ["attention", "attention", "", "attention"]


def test_a_leaf_layer_of_a_nested_functional_model_is_a_sublayer_of_its_own():
    """A backbone nested in a task or a segmenter (RetinaNet's ResNet) is one node of the outer graph: its layers are
    nodes of its own graph, each its own sublayer, as the outer model's layers are (before, the whole backbone's
    backward was one run, every value kept to its end: RetinaNet's data=8 1.47x XLA's figure, now 1.13x)."""
    images = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, name="conv")(images)
    backbone = keras.Model(images, keras.layers.BatchNormalization(name="norm")(h), name="backbone")
    scopes = ["jvp(backbone)/conv/conv_general_dilated", "transpose(jvp(backbone))/norm/mul", "jvp(backbone)"]
    assert sublayer_paths(backbone, scopes) == ["conv", "norm", ""]


def _conv_batch_norm():
    images = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(24, 3, use_bias=False)(images)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
    return keras.Model(images, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(h)))


def _gradient_kernels(build):
    """(the backward's weight-gradient kernels that wait for their reduction, every gradient it makes), by shape."""
    model = kdist.abstract_model(build)
    step = trace_step(model, ModelFacts(model, "adam", None, None, None, resolve_target("gpu")).inputs).step
    waiting = [({step.shape[g] for g in grads}, {step.shape[r] for r in reads}) for _, grads, reads in
               step.gradient_kernels()]  # fmt: skip
    every = {step.shape[g] for t, (out, _, _) in enumerate(step.events) if t >= step.bwd_start for g in out
             if g in step.weight_of}  # fmt: skip
    return waiting, every


def test_batch_norm_scale_and_offset_gradients_do_not_wait_for_a_reduction_but_kernels_and_layer_norms_do():
    """XLA fuses BatchNormalization's scale and offset sums with the same sums of its input gradient: they run where
    the backward needs them, holding nothing batch-sized (MobileNetV2 on data=8, docs/plan.md "Three CNNs on every
    mesh of 8"); a convolution's and a LayerNorm's weight gradients wait."""
    waiting, every = _gradient_kernels(_conv_batch_norm)
    assert (24,) in every and (24,) not in {shape for grads, _ in waiting for shape in grads}
    per_channel = [reads for grads, reads in waiting if grads <= {(24,), (1, 1, 1, 24)}]
    assert all(TRACE_BATCH not in shape for reads in per_channel for shape in reads)
    assert any((3, 3, 3, 24) in grads and (TRACE_BATCH, 14, 14, 24) in reads for grads, reads in waiting)
    waiting, every = _gradient_kernels(kdist.models.tiny_transformer)
    assert {shape for grads, _ in waiting for shape in grads} == every  # a LayerNorm sums over other axes
