"""Following the weights' model-axis splits through the traced step, and the lookups FSDP gathers nothing for."""

import jax
import jax.numpy as jnp
import keras
from jax.lax import GatherDimensionNumbers

import kdist
from kdist.planning.facts import ModelFacts
from kdist.planning.propagation import (
    _gathered,
    _reshape,
    _rule,
    _run,
    factors,
    split_axes,
)
from kdist.planning.step import trace_step
from kdist.planning.targets import resolve_target
from kdist.planning.trace import TRACE_BATCH, Flat, flatten

SEQUENCE, HIDDEN, WIDTH, VOCABULARY = 16, 32, 64, 50


def _language_model():
    """Token and position tables summed into a residual stream, a normalized MLP with dropout added, an output head."""
    tokens = keras.Input((SEQUENCE,), dtype="int32")
    positions = keras.Input((SEQUENCE,), dtype="int32")
    h = keras.layers.Embedding(VOCABULARY, HIDDEN, name="token_table")(tokens)
    h = h + keras.layers.Embedding(SEQUENCE, HIDDEN, name="position_table")(positions)
    x = keras.layers.Dense(WIDTH, activation="gelu", name="up")(keras.layers.LayerNormalization(name="norm")(h))
    h = h + keras.layers.Dense(HIDDEN, name="down")(keras.layers.Dropout(0.1)(x))
    return keras.Model([tokens, positions], keras.layers.Dense(VOCABULARY, name="head")(h))


class _TiedTable(keras.layers.Layer):
    """Looks tokens up in its table and multiplies by the same table: an embedding tied to the output head."""

    def build(self, shape):
        self.table = self.add_weight((VOCABULARY, HIDDEN), name="embeddings")

    def call(self, tokens):
        h = keras.ops.take(self.table, tokens, axis=0)
        return keras.ops.matmul(h, keras.ops.transpose(self.table))


def _tied():
    tokens = keras.Input((SEQUENCE,), dtype="int32")
    return keras.Model(tokens, _TiedTable(name="tied")(tokens))


def _traced(build):
    model = kdist.abstract_model(build)
    facts = ModelFacts(model, "adam", None, None, None, resolve_target("gpu"))
    return trace_step(model, facts.inputs)


def _split_axes(traced, layout):
    """`split_axes` with the weights laid out as `layout` says ({"up/kernel": {"model": 1}}; others whole)."""
    return split_axes(traced.step, [layout.get(v.path, {}) for v in traced.variables])


def _splits(traced, layout):
    return _split_axes(traced, layout)[0]


def _buffers(step, shape):
    """The activations and backward temporaries of `shape` some kernel makes."""
    made = {g for m, _, _ in step.events for g in m}
    return [g for g in made if step.shape[g] == shape and step.term[g] in ("activations", "backward")]


def _input_of(step, layer):
    """The buffer the forward call of `layer` reads."""
    for item in step.agenda:
        if item[0] == "run" and item[1][0].name == layer and item[2] == 0:
            p, mapping = item[1]
            return mapping[p.a[0]]
    raise AssertionError(layer)


MEGATRON = {"up/kernel": {"model": 1}, "up/bias": {"model": 0}, "down/kernel": {"model": 0}}


def test_a_column_then_row_parallel_mlp_splits_its_width_and_keeps_the_residual_stream_whole():
    traced = _traced(_language_model)
    splits = _splits(traced, {**MEGATRON, "token_table/embeddings": {"model": 0}})
    wide = _buffers(traced.step, (TRACE_BATCH, SEQUENCE, WIDTH))
    residual = _buffers(traced.step, (TRACE_BATCH, SEQUENCE, HIDDEN))
    assert wide and all(splits[g] == {"model": 2} for g in wide)  # the dropout's mask too: split as its reader
    assert residual and not any(splits[g] for g in residual)  # the lookup drops a vocabulary split


def test_a_position_table_split_on_its_hidden_size_splits_the_residual_stream():
    traced = _traced(_language_model)
    splits, _, before, _ = _split_axes(traced, {**MEGATRON, "position_table/embeddings": {"model": 1}})
    residual = _buffers(traced.step, (TRACE_BATCH, SEQUENCE, HIDDEN))
    assert any(splits[g] == {"model": 2} for g in residual)  # what the normalization saves for the backward
    # The up projection contracts the hidden size while its kernel splits its width: XLA gathers its input whole,
    # from the split it had (kept aside for the meshes where XLA gathers it again, `memory_model.regathered`).
    assert splits[_input_of(traced.step, "up")] == {}
    assert before[_input_of(traced.step, "up")] == {"model": 2}
    assert before[_input_of(traced.step, "head")] == {"model": 2}  # the residual stream, whose head splits words


class _TransposedProjection(keras.layers.Layer):
    """A projection that returns its output transposed, (batch, width, sequence): a view of the product's buffer."""

    def build(self, shape):
        self.kernel = self.add_weight((HIDDEN, WIDTH), name="kernel")

    def call(self, x):
        return keras.ops.transpose(keras.ops.matmul(x, self.kernel), (0, 2, 1))


def _transposed_output():
    tokens = keras.Input((SEQUENCE,), dtype="int32")
    h = keras.layers.Embedding(VOCABULARY, HIDDEN, name="token_table")(tokens)
    return keras.Model(tokens, _TransposedProjection(name="up")(h))


def test_a_transposed_view_keeps_the_split_of_the_buffer_it_views():
    """The view's dimensions are the buffer's in another order: it does not undo the buffer's own split (before,
    the view's split was fitted to the buffer's shape as a reshape's is, and came out whole: DeepLabV3's logits)."""
    traced = _traced(_transposed_output)
    splits = _splits(traced, {"up/kernel": {"model": 1}})
    wide = _buffers(traced.step, (TRACE_BATCH, SEQUENCE, WIDTH))
    assert wide and all(splits[g] == {"model": 2} for g in wide)


def _transposed_output_read_by_a_layer():
    tokens = keras.Input((SEQUENCE,), dtype="int32")
    h = keras.layers.Embedding(VOCABULARY, HIDDEN, name="token_table")(tokens)
    return keras.Model(tokens, keras.layers.Activation("tanh", name="reader")(_TransposedProjection(name="up")(h)))


def test_a_layer_reading_a_transposed_view_takes_the_views_split_not_one_fitted_from_the_buffers_shape():
    """The next layer reads the view, (batch, width, sequence), whose width the kernel splits; its buffer lies as
    the product wrote it, (batch, sequence, width). Fitted from the buffer's shape as a reshape's, the split landed
    on the sequence (SegFormer's upsampled features, concatenated on their split channels, were counted split on
    their width and not gathered by the convolution reading them)."""
    traced = _traced(_transposed_output_read_by_a_layer)
    splits = _splits(traced, {"up/kernel": {"model": 1}})
    read = _buffers(traced.step, (TRACE_BATCH, WIDTH, SEQUENCE))
    assert read and all(splits[g] == {"model": 1} for g in read)


def test_weights_split_on_no_axis_split_nothing():
    traced = _traced(_language_model)
    assert not any(_splits(traced, {}))


def test_a_matrix_product_keeps_the_splits_of_free_and_batch_dimensions_and_drops_contracted_ones():
    numbers = (((2,), (0,)), ((), ()))  # (batch, sequence, hidden) x (hidden, width)
    shapes = [(4, 8, 16), (16, 32)]
    assert _rule("dot_general", numbers, [{}, {"model": 1}], shapes, [(4, 8, 32)]) == [{"model": 2}]
    assert _rule("dot_general", numbers, [{"model": 2}, {"model": 0}], shapes, [(4, 8, 32)]) == [{}]
    scores = (((3,), (3,)), ((0, 2), (0, 2)))  # (b, s, heads, d) x (b, s, heads, d) -> (b, heads, s, s)
    assert _rule("dot_general", scores, [{"model": 2}, {"model": 2}], [(4, 8, 2, 16)] * 2, [(4, 2, 8, 8)]) == [
        {"model": 1}
    ]


def test_where_both_operands_split_one_axis_differently_the_larger_operands_split_wins():
    """XLA's sharding propagation gives a matrix product the larger operand's split, the left one's if they are
    alike (`InferDotShardingFromOperands`): a grouped-query attention's query gradient keeps the score gradient's
    split of the heads, not the split of the keys' head size (Llama 3's keys on model=8: 2 heads, each head's size
    split 4 ways), which XLA gathers (docs/plan.md, "Following the model axis through the step")."""
    numbers = (((3,), (1,)), ((0, 1), (0, 2)))  # (b, heads, t, s) x (b, s, heads, h) -> (b, heads, t, h)
    score_gradient, keys = {"model": 1}, {"model": 3}
    operands = [score_gradient, keys]
    assert _rule("dot_general", numbers, operands, [(4, 8, 64, 64), (4, 64, 8, 32)], [(4, 8, 64, 32)]) == [{"model": 1}]
    # fewer queries: the keys are larger, their split wins; as large: the left operand's
    assert _rule("dot_general", numbers, operands, [(4, 8, 4, 64), (4, 64, 8, 32)], [(4, 8, 4, 32)]) == [{"model": 3}]
    assert _rule("dot_general", numbers, operands, [(4, 8, 32, 64), (4, 64, 8, 32)], [(4, 8, 32, 32)]) == [{"model": 1}]


def test_an_operand_split_on_a_dimension_only_it_contracts_is_gathered():
    numbers = (((2,), (0,)), ((), ()))
    assert _gathered(numbers, [{"model": 2}, {"model": 1}]) == [{"model"}, set()]
    assert _gathered(numbers, [{"model": 2}, {"model": 0}]) == [set(), set()]  # both contract it: a partial sum


def test_a_split_moves_with_transposes_broadcasts_reshapes_and_reductions():
    assert _rule("transpose", (0, 2, 1, 3), [{"model": 1}], [(4, 8, 2, 16)], [(4, 2, 8, 16)]) == [{"model": 2}]
    assert _rule("broadcast_in_dim", (0, 2), [{"model": 1}], [(4, 16)], [(4, 1, 16)]) == [{"model": 2}]
    assert _rule("reduce_sum", (1,), [{"model": 2}], [(4, 8, 16)], [(4, 16)]) == [{"model": 1}]
    assert _rule("reduce_sum", (2,), [{"model": 2}], [(4, 8, 16)], [(4, 8)]) == [{}]  # an all-reduce
    assert _reshape({"model": 2}, (4, 8, 2, 16), (4, 8, 32)) == {"model": 2}  # heads x head size merged: heads lead
    assert _reshape({"model": 3}, (4, 8, 2, 16), (4, 8, 32)) == {}  # the head size is not leading: whole
    assert _rule("unknown_primitive", None, [{"model": 0}], [(4,)], [(4,)]) == [{}]  # not followed: whole


def test_a_split_dimension_taken_apart_splits_its_next_part_where_the_axis_outnumbers_the_leading_one():
    """8 query heads split over 'model', grouped as 2 key/value heads x 4 (Gemma's grouped-query scores): on 4
    devices GSPMD splits the 2 heads and each head's 4 queries 2 ways, a quarter of the scores per device (XLA's
    figure for Gemma 3 on model=8 was 2.8 times under the estimate that left the queries whole, docs/plan.md)."""
    queries = {"model": 2}  # (batch, sequence, 8 heads, head size)
    grouped = _reshape(queries, (4, 16, 8, 32), (4, 16, 2, 4, 32))
    assert grouped == {"model": 2, ("model", 2): 3}
    scores = (((4,), (3,)), ((0, 2), (0, 2)))  # (b, t, k, g, h) x (b, s, k, h) -> (b, k, t, g, s)
    (split,) = _rule("dot_general", scores, [grouped, {}], [(4, 16, 2, 4, 32), (4, 16, 2, 32)], [(4, 2, 16, 4, 16)])
    assert split == {"model": 1, ("model", 2): 3}
    shape = [(4, 2, 16, 4, 16)]
    assert [factors([split], shape, {"model": m})[0] for m in (1, 2, 4, 8)] == [1.0, 1 / 2, 1 / 4, 1 / 8]
    assert factors([split], shape, {"model": 16})[0] == 1 / 8  # 4 queries split 8 ways: padded, one each
    # The head size takes the rest instead (a projection's 8 x 32 outputs split 16 ways): contracted with it.
    heads = _reshape({"model": 1}, (4, 256), (4, 8, 32))
    assert heads == {"model": 1, ("model", 8): 2}
    per_head = (((2,), (2,)), ((0, 1), (0, 1)))  # (b, 8, 32) x (b, 8, 32) -> (b, 8)
    (split,) = _rule("dot_general", per_head, [heads, heads], [(4, 8, 32)] * 2, [(4, 8)])
    assert split == {"model": 1} and factors([split], [(4, 8)], {"model": 16})[0] == 1 / 8


def test_a_dimension_taken_apart_is_split_only_as_far_as_its_leading_part_and_the_axis_both_divide():
    """A flat projection of 8 heads x 48 split over 'model', reshaped to (heads, head size) as T5 does: on 3
    devices GSPMD cannot split 8 heads and gathers the queries and their scores whole, on 6 it splits the heads
    2 ways (XLA's figure for T5 at hidden 384 on data=4,model=3 of 12 H100s was 1.6 times the estimate that put
    3 of 8 heads on each device, docs/plan.md)."""
    flat, split = (4, 16, 384), {"model": 2}
    for devices, share in ((2, 1 / 2), (4, 1 / 4), (8, 1 / 8), (3, 1.0), (6, 1 / 2), (12, 1 / 4)):
        heads = _reshape(split, flat, (4, 16, 8, 48), {"model": devices})
        assert factors([heads], [(4, 16, 8, 48)], {"model": devices})[0] == share, devices
        scores = (((3,), (3,)), ((0, 2), (0, 2)))  # (b, t, n, h) x (b, s, n, h) -> (b, n, t, s)
        (made,) = _rule("dot_general", scores, [heads, heads], [(4, 16, 8, 48)] * 2, [(4, 8, 16, 16)])
        assert factors([made], [(4, 8, 16, 16)], {"model": devices})[0] == share, devices
    assert _reshape(split, flat, (4, 16, 8, 48), {"model": 16}) == {"model": 2, ("model", 8): 3}  # 8 heads, 2 ways


def test_a_slice_that_cuts_the_devices_shares_moves_the_split_to_the_heads_as_far_as_both_divide():
    """GPT-NeoX's queries are the first 32 of each head's 3 x 32 fused outputs. Where the heads do not divide the
    model axis the rules split those 96 (6 a device on model=16), and the slice cuts the shares: GSPMD splits the 8
    heads instead, 8 ways (XLA's figure for GPT-NeoX in bfloat16 at 512 tokens on model=16 was 0.23 of the
    estimate that kept the scores whole, docs/plan.md)."""
    fused, queries = (4, 16, 8, 96), (4, 16, 8, 32)
    for devices, share in ((16, 1 / 8), (4, 1 / 4), (32, 1 / 8)):
        (split,) = _rule("slice", None, [{"model": 3}], [fused], [queries], {"model": devices})
        assert split == {("model", "of", 8): 2}, devices
        scores = (((3,), (3,)), ((0, 2), (0, 2)))  # (b, t, n, h) x (b, s, n, h) -> (b, n, t, s)
        (made,) = _rule("dot_general", scores, [split, split], [queries] * 2, [(4, 8, 16, 16)])
        assert factors([made], [(4, 8, 16, 16)], {"model": devices})[0] == share, devices
    # A slice that takes whole shares keeps the split where it is (96 split 3 ways: 32 a device), and so does one
    # of another dimension.
    assert _rule("slice", None, [{"model": 3}], [fused], [queries], {"model": 3}) == [{"model": 3}]
    assert _rule("slice", None, [{"model": 3}], [fused], [(4, 8, 8, 96)], {"model": 16}) == [{"model": 3}]
    assert _rule("split", None, [{"model": 2}], [fused], [(4, 16, 8, 48)] * 2, {"model": 4}) == [{"model": 2}] * 2


def test_a_table_lookup_keeps_the_split_of_the_looked_up_rows_and_drops_the_one_it_indexes():
    lookup = GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,))
    shapes = [(50, 32), (4, 8, 1)]
    assert _rule("gather", lookup, [{"model": 1}, {}], shapes, [(4, 8, 32)]) == [{"model": 2}]
    assert _rule("gather", lookup, [{"model": 0}, {}], shapes, [(4, 8, 32)]) == [{}]


def test_a_table_only_looked_up_is_not_gathered_by_fsdp_a_tied_one_is():
    step = _traced(_language_model).step
    table = next(g for g, s in enumerate(step.shape) if s == (VOCABULARY, HIDDEN) and step.term[g] == "external")
    head = next(g for g, s in enumerate(step.shape) if s == (HIDDEN, VOCABULARY) and step.term[g] == "external")
    assert step.looked_up[table] and not step.looked_up.get(head)
    assert step.weight_of[table] not in step.weight_uses and step.weight_of[head] in step.weight_uses
    tied = _traced(_tied).step
    table = next(g for g, s in enumerate(tied.shape) if s == (VOCABULARY, HIDDEN) and tied.term[g] == "external")
    assert not tied.looked_up[table] and tied.weight_of[table] in tied.weight_uses


def _squeeze_excite():
    """A convolution whose channels a global average (kept as 1 x 1) rescales: the pooled value's reshape is a view."""
    images = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", name="conv")(images)
    scale = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    scale = keras.layers.Conv2D(16, 1, activation="sigmoid", name="excite")(scale)
    return keras.Model(images, keras.layers.Dense(10, name="head")(keras.layers.Flatten()(x * scale)))


def test_a_split_given_to_a_view_of_another_rank_fits_the_buffer_it_aliases():
    """A rank-4 value's split on the rank-2 buffer it is a view of (EfficientNet's squeeze-excite raised IndexError)."""
    traced = _traced(_squeeze_excite)
    splits = _splits(traced, {"conv/kernel": {"model": 3}, "excite/kernel": {"model": 3}})
    assert all(d < len(traced.step.shape[g]) for g, s in enumerate(splits) for d in s.values())
    assert any(s == {"model": 3} for s in splits)  # the convolution's output channels stay split
    assert kdist.plan(_squeeze_excite, 8, batch_size=16).candidate("model=8").peak > 0


class _Flattened(keras.layers.Layer):
    """Reads a (B, 4, 4, C) tensor as (B, 16, C), through a reshape."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], shape[-1]), name="w")

    def call(self, x):
        return keras.ops.matmul(keras.ops.reshape(x, (-1, 16, x.shape[-1])), self.w)


def _three_readers():
    """A tensor three layers read, one through a reshape (D-FINE's source flattener): its cotangent's parts differ in
    shape, and the second sum adds the first's."""
    x = keras.Input((4, 4, 8))
    h = keras.layers.Dense(16, name="split")(x)
    first = keras.layers.Dense(16)(keras.layers.Dense(16)(h))
    middle = keras.layers.Dense(16)(_Flattened()(h))
    return keras.Model(x, [first, middle, keras.layers.Activation("gelu")(h)])


def test_a_cotangent_summed_from_parts_of_different_shapes_keeps_its_split_on_the_sums_shape():
    traced = _traced(_three_readers)
    splits = _splits(traced, {"split/kernel": {"model": 1}, "split/bias": {"model": 0}})
    sums = [item[1] for item in traced.step.agenda if item[0] == "acc"]
    assert len(sums) == 2 and all(splits[g] for g in sums)  # the features stay split in both sums
    assert all(d < len(traced.step.shape[g]) for g, s in enumerate(splits) for d in s.values())
    assert kdist.plan(_three_readers, 8, batch_size=16).candidate("model=8").peak > 0


def _convolutions(depthwise=False):
    """Two convolutions whose kernels split their output channels, a depthwise one between them when asked."""
    images = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(16, 3, padding="same", name="first")(images)
    if depthwise:
        x = keras.layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = keras.layers.Conv2D(16, 3, padding="same", name="second")(keras.layers.ReLU()(x))
    return keras.Model(images, keras.layers.Dense(10, name="head")(keras.layers.GlobalAveragePooling2D()(x)))


CHANNELS = {"first/kernel": {"model": 3}, "second/kernel": {"model": 3}, "depthwise/kernel": {"model": 2}}


def _cotangents(step, shape):
    """The backward buffers of `shape` a convolution's input gradient makes (the layer's cotangent)."""
    return [g for g, s in enumerate(step.shape) if s == shape and step.term[g] == "backward"]


def test_a_convolution_gathers_an_input_split_on_the_channels_it_reads_whole():
    """XLA:GPU all-gathers the second convolution's input and keeps the whole copy for the weight gradient, on
    every mesh (nothing kept aside to be gathered again, as a matrix product's operand is)."""
    traced = _traced(_convolutions)
    splits, twice, before, reduced = _split_axes(traced, CHANNELS)
    relu_input = _input_of(traced.step, "re_lu")
    assert splits[relu_input] == {"model": 3}  # the first convolution's output channels
    second_input = _input_of(traced.step, "second")
    assert splits[second_input] == {} and second_input not in before  # gathered whole
    # The second convolution's input gradient is a partial sum over its split channels: whole, and reduce-scattered
    # at once to the split of the input it is the gradient of, from a copy with the channels leading.
    partial = [g for g in twice if traced.step.shape[g] == (TRACE_BATCH, 8, 8, 16)]
    assert len(partial) == 1 and splits[partial[0]] == {} and twice[partial[0]] == {"model": 2.0}
    assert reduced == {partial[0]: {"model": 3}}
    shares = factors(splits, traced.step.shape, {"model": 4}, twice)
    assert shares[partial[0]] == 2.0 and shares[relu_input] == 0.25
    assert factors(splits, traced.step.shape, {"model": 1}, twice)[partial[0]] == 1.0


def _padded_convolutions():
    """Two convolutions whose kernels split their output channels, a zero pad between them (a ResNet's)."""
    images = keras.Input((8, 8, 4))
    x = keras.layers.ReLU()(keras.layers.Conv2D(16, 3, padding="same", name="first")(images))
    x = keras.layers.Conv2D(16, 3, name="second")(keras.layers.ZeroPadding2D(1, name="pad")(x))
    return keras.Model(images, keras.layers.Dense(10, name="head")(keras.layers.GlobalAveragePooling2D()(x)))


def test_a_convolutions_partial_sum_is_read_as_the_reduce_scatter_leaves_it():
    """XLA reduce-scatters the second convolution's input gradient (the padded value's, a partial sum) before the
    pad's backward slices it: the slice's output, the ReLU output's gradient, is split over the model axis as the
    ReLU's output is, not whole (keras-hub's ResNet on model=8 of 8 deviceless H100s: the padded f32[64,64,34,34]
    sum, then f32[64,32,32,8] only)."""
    traced = _traced(_padded_convolutions)
    splits, twice, _, reduced = _split_axes(traced, CHANNELS)
    partial = [g for g in twice if traced.step.shape[g] == (TRACE_BATCH, 10, 10, 16)]
    assert len(partial) == 1 and splits[partial[0]] == {} and reduced == {partial[0]: {"model": 3}}
    born = traced.step.lifetimes()[0]
    sliced = [g for g in _cotangents(traced.step, (TRACE_BATCH, 8, 8, 16)) if born[g] == born[partial[0]] + 1]
    assert len(sliced) == 1 and splits[sliced[0]] == {"model": 3}


def test_a_depthwise_convolution_keeps_its_input_split_on_the_channels_its_kernel_splits():
    traced = _traced(lambda: _convolutions(depthwise=True))
    splits = _splits(traced, CHANNELS)
    assert splits[_input_of(traced.step, "depthwise")] == {"model": 3}  # each device convolves its own channels
    assert splits[_input_of(traced.step, "second")] == {}


def _two_readers_of_a_split_input():
    """A ResNet block's start: a shortcut and a branch convolution both read one channel-split value."""
    images = keras.Input((8, 8, 4))
    x = keras.layers.ReLU()(keras.layers.Conv2D(16, 3, padding="same", name="first")(images))
    shortcut = keras.layers.Conv2D(16, 1, name="shortcut")(x)
    x = keras.layers.Add()([shortcut, keras.layers.Conv2D(16, 3, padding="same", name="branch")(x)])
    return keras.Model(images, keras.layers.Dense(10, name="head")(keras.layers.GlobalAveragePooling2D()(x)))


def test_two_partial_sums_of_one_inputs_gradient_are_added_whole_and_reduce_scattered_once():
    """XLA reassociates the reduce-scatters of two partial sums that are added (ReduceScatterReassociate): both
    stay whole, in one layout, until the sum, which is reduce-scattered once (ResNet50 on model=8 of 8 deviceless
    H100s: two f32[256,56,56,256] input gradients and their sum, channels first, alive together at its peak)."""
    layout = {"first/kernel": {"model": 3}, "shortcut/kernel": {"model": 3}, "branch/kernel": {"model": 3}}
    traced = _traced(_two_readers_of_a_split_input)
    splits, twice, _, reduced = _split_axes(traced, layout)
    acc = [item for item in traced.step.agenda if item[0] == "acc" and item[1] in reduced]
    assert len(acc) == 1 and reduced == {acc[0][1]: {"model": 3}} and splits[acc[0][1]] == {}
    parts = acc[0][2]
    assert len(parts) == 2 and all(splits[x] == {} and x not in twice for x in parts)  # whole, one layout


class _RunningSum(keras.layers.Layer):
    """A recurrence in a loop (`keras.ops.scan`): each step adds its input to a state that starts as zeros."""

    def call(self, x):
        def add(state, x_t):
            state = state + x_t
            return state, state

        _, states = keras.ops.scan(add, keras.ops.zeros_like(x[:, 0]), keras.ops.transpose(x, (1, 0, 2)))
        return keras.ops.transpose(states, (1, 0, 2))


def _recurrent():
    tokens = keras.Input((SEQUENCE,), dtype="int32")
    h = keras.layers.Embedding(VOCABULARY, HIDDEN, name="token_table")(tokens)
    x = _RunningSum(name="running_sum")(keras.layers.Dense(WIDTH, name="up")(h))
    return keras.Model(tokens, keras.layers.Dense(VOCABULARY, name="head")(keras.layers.Dense(HIDDEN, name="down")(x)))


def _made_by_scans(step):
    out = set()
    for item in step.agenda:
        if item[0] == "run":
            (p, mapping), lo, hi = item[1:]
            out |= {mapping.get(o) for name, _, outs in p.flat.eqns[lo:hi] if name == "scan" for o in outs}
    return out


def test_a_scan_carries_its_inputs_split_through_its_body_to_its_state_and_stacked_results():
    traced = _traced(_recurrent)
    splits = _splits(traced, MEGATRON)
    step = traced.step
    stacked = _buffers(step, (SEQUENCE, TRACE_BATCH, WIDTH))  # the scan's inputs, results and their cotangents
    assert set(stacked) & _made_by_scans(step)
    assert stacked and all(splits[g] == {"model": 2} for g in stacked), [splits[g] for g in stacked]
    assert all(splits[g] == {"model": 2} for g in _buffers(step, (TRACE_BATCH, SEQUENCE, WIDTH)))


def _looped(x, limit):
    """x added to a state of zeros while a counter is under `limit` (a condition const): a while loop."""

    def body(carry):
        i, state = carry
        return i + 1, state + x

    return jax.lax.while_loop(lambda carry: carry[0] < limit, body, (0, jnp.zeros_like(x)))[1]


def test_a_while_loops_state_takes_the_split_its_body_gives_it_and_so_does_its_initial_value():
    closed = jax.make_jaxpr(_looped)(jnp.zeros((4, 8)), 3)
    flat = Flat()
    ins = [flat.new(v.aval) for v in closed.jaxpr.invars]
    (out,) = flatten(closed, ins, flat)
    env = _run(flat, 0, len(flat.eqns), {}, {ins[0]: {"model": 1}}, frozenset(), {})[0]
    assert env[out] == {"model": 1}
    (loop,) = [i for i, (name, _, _) in enumerate(flat.eqns) if name == "while"]
    initial_state = flat.eqns[loop][1][-1]
    assert flat.shape[initial_state] == (4, 8) and env[initial_state] == {"model": 1}


def _sampled(maps, rows, columns):
    """Each map's channels read at given rows and columns (keras-hub's SAM 3 ROI align): the channel's index is an
    iota over the indices' last dimension."""
    channels = keras.ops.arange(maps.shape[-1])[None, None, :]
    return maps[jnp.arange(maps.shape[0])[:, None, None], rows[:, :, None], columns[:, :, None], channels]


def test_a_gathers_indices_take_the_operands_split_where_an_iota_indexes_its_split_dimension():
    """XLA partitions such a gather along the channels (a parallel dimension): the indices are split as the maps."""
    closed = jax.make_jaxpr(_sampled)(jnp.zeros((2, 8, 8, 32)), jnp.zeros((2, 5), "int32"), jnp.zeros((2, 5), "int32"))
    flat = Flat()
    ins = [flat.new(v.aval) for v in closed.jaxpr.invars]
    (out,) = flatten(closed, ins, flat)
    (gather,) = [i for i, (name, _, _) in enumerate(flat.eqns) if name == "gather"]
    indices = flat.eqns[gather][1][1]
    assert flat.shape[indices] == (2, 5, 32, 4)
    env = _run(flat, 0, len(flat.eqns), {}, {ins[0]: {"model": 3}}, frozenset(), {})[0]
    assert env[indices] == {"model": 2} and env[out] == {}  # the output: as the lookup rule has it
    rows_split = _run(flat, 0, len(flat.eqns), {}, {ins[0]: {"model": 1}}, frozenset(), {})[0]
    assert rows_split[indices] == {}  # the rows are indexed by values, not an iota: nothing to partition along
