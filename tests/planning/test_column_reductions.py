"""A BatchNormalization's centred input, written out beside its variance where XLA:GPU sums the variance in one
kernel: between FEWEST_ROWS and RACE_FREE_COLUMNS rows per device."""

import keras
import numpy as np
import pytest

import kdist
from kdist.jax_internals import cuda_plugin_installed
from kdist.planning.column_reductions import FEWEST_ROWS, RACE_FREE_COLUMNS
from kdist.planning.gradient_waits import reduction_groups, reduction_order
from tests.planning.test_convolutions import _traced


def _normalized(side):
    """A convolution and a BatchNormalization over `side` x `side` maps: it sums side**2 rows per image."""
    images = keras.Input((side, side, 3))
    x = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)(images)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(16, 3, padding="same")(x))
    return keras.Model(images, keras.layers.Dense(10)(x))


@pytest.mark.parametrize(
    "batch_size,written", [(16, False), (64, True), (512, True), (1024, False)]
)  # fmt: skip
def test_the_centred_input_is_written_where_the_variance_is_one_kernel(monkeypatch, batch_size, written):
    """8 x 8 maps on data=8: 64 rows per image, 2 to 128 images per device, 128 to 8192 rows. ResNet50 writes the
    centred input of its 7 x 7 stage at 32 images (1568 rows) and not of its 14 x 14 one (6272), keras-hub's ResNet
    its 16 x 16 stage's at 8 images (2048), MobileNetV3 none of its 4 x 4 maps' at 8 images (128; docs/plan.md,
    "Convolutional steps")."""
    step, factors = _traced(monkeypatch, lambda: _normalized(8), batch_size=batch_size)
    (centred,) = step.column_rows  # jnp.var's x - mean; not the mean's or the float32 cast's
    rows = step.column_rows[centred] * batch_size // 8
    assert step.column_rows[centred] == 64 and step.shape[centred][1:] == (8, 8, 32)
    assert (FEWEST_ROWS <= rows <= RACE_FREE_COLUMNS) == written
    assert (factors[(("data", 8),)][centred] > 0) == written
    born, last = step.lifetimes()[:2]
    assert born[centred] < step.bwd_start < last[centred]  # from the variance to the variance's gradient
    split = factors[(("data", 4), ("model", 2))][centred]  # twice the images a device, half the channels
    assert (split > 0) == (FEWEST_ROWS <= 2 * rows <= RACE_FREE_COLUMNS)
    if split and written:
        assert split == pytest.approx(factors[(("data", 8),)][centred])


def test_no_centred_input_on_a_cpu_target_or_for_a_row_reduction(monkeypatch):
    """Only XLA:GPU's reduction emitter does it; a LayerNorm reduces the last axis (a row reduction)."""
    cpu, _ = _traced(monkeypatch, lambda: _normalized(8), batch_size=64, target="cpu")
    assert cpu.column_rows == {}
    step, _ = _traced(monkeypatch, _layer_normalized, batch_size=64)
    assert step.column_rows == {}


def _layer_normalized():
    tokens = keras.Input((16, 32))
    return keras.Model(tokens, keras.layers.Dense(4)(keras.layers.LayerNormalization()(tokens)))


def _normed_tokens(dtype, tokens=64, hidden=32, blocks=2):
    """Residual MLP blocks, each ending in a LayerNormalization, in `dtype`: Keras normalizes in float32."""
    inputs = keras.Input((tokens, hidden), dtype=dtype)
    x = inputs
    for _ in range(blocks):
        h = keras.layers.Dense(4 * hidden, activation="relu", dtype=dtype)(x)
        x = keras.layers.add([x, keras.layers.Dense(hidden, dtype=dtype)(h)])
        x = keras.layers.LayerNormalization(dtype=dtype)(x)
    return keras.Model(inputs, keras.layers.Dense(4, dtype=dtype)(x))


def test_a_16_bit_norms_scale_gradient_sums_a_float32_product_that_waits_for_the_gradients_reduction(monkeypatch):
    """Qwen3 in bfloat16 (XLA:GPU's buffers): each norm's f32[b,s,h] product of cotangent and normalised input,
    written in the backward where a device sums 1024 (data=8) or 4096 rows (fsdp=2,model=4) and summed with the
    weight gradients' reductions; not where the reduction is split (8192 rows on model=8). In float32 and off a GPU,
    none (docs/plan.md, "Which values are buffers")."""
    step, factors = _traced(monkeypatch, lambda: _normed_tokens("bfloat16"), batch_size=512)
    assert len(step.widened) == 2  # one per LayerNormalization: its gamma's gradient (beta's sums the cotangent)
    born, last = step.lifetimes()[:2]
    data, model = factors[(("data", 8),)], factors[(("model", 8),)]
    for product in step.widened:
        assert step.dtype[product] == "float32" and step.shape[product][1:] == (64, 32)
        assert step.term[product] == "backward" and born[product] > step.bwd_start
        assert step.column_rows[product] == 64
        assert data[product] > 0 and model[product] == 0  # 64 x 64 rows a device, and 512 x 64
    ((group_end, _),) = reduction_groups(step, np.asarray(step.size, dtype=np.float64) * data)
    lasts = reduction_order(step, data, {"data": 8})[1]
    assert all(last[p] < group_end == lasts[p] for p in step.widened)  # held from its reduction to the group's
    assert _traced(monkeypatch, lambda: _normed_tokens("float32"))[0].widened == set()
    assert _traced(monkeypatch, lambda: _normed_tokens("bfloat16"), target="cpu")[0].widened == set()


@pytest.mark.skipif(not cuda_plugin_installed(), reason="jax's CUDA PJRT plugin is not installed")
def test_the_float32_products_are_what_xla_keeps_for_four_h100s():
    """Four such blocks at 256 tokens of 256 in bfloat16, batch 64 on data=4 (4096 rows a device) for deviceless
    H100s: the estimate was 0.899 of XLA's figure without the products (compiled 2026-12-05)."""
    build = lambda: _normed_tokens("bfloat16", tokens=256, hidden=256, blocks=4)  # noqa: E731
    result = kdist.plan(build, 4, batch_size=64, target="H100", verify=["data=4"], verify_target="H100")
    (candidate,) = [c for c in result.candidates if c.compiled]
    assert 0.95 <= candidate.ratio <= 1.05, (candidate.peak, candidate.compiled["peak"])


@pytest.mark.parametrize(
    "groups_first,dtype,written",
    [(True, "float32", True), (False, "float32", False), (True, "bfloat16", True)],
)
def test_a_softmax_over_keys_that_do_not_lie_innermost_keeps_a_float32_value_of_its_input(
    monkeypatch, groups_first, dtype, written
):
    """Gemma 2's soft-capped, masked attention. Its scores `(b, k, g, t, s)` lie with the groups innermost (jax
    makes them (b, k, s, t, g)): the maximum and the sum over the keys are column reductions, and XLA:GPU writes a
    value of their input out and keeps it to the backward (the masked capped scores in float32, the exponentials in
    bfloat16, both float32). With the queries before the groups they lie keys innermost (the causal mask, over the
    last two dimensions, left out): one normalization kernel, nothing written. On every mesh and at any size: where
    XLA computes it again the band's low end reaches that (`test_calibration`)."""
    from tests.planning.test_deviceless import GroupedAttention  # the layer the deviceless checks compile

    def model():
        x = keras.Input((64, 64), dtype=dtype)
        attention = GroupedAttention(groups_first, soft_cap=50.0, causal=groups_first, dtype=dtype)  # (t, s) masks
        return keras.Model(x, attention(x))

    step, factors = _traced(monkeypatch, model, batch_size=16)
    assert list(step.column_rows.values()) == [None] * written  # on every mesh
    if written:
        (g,) = step.column_rows
        born, last = step.lifetimes()[:2]
        assert step.shape[g][1:] == (2, 4, 64, 64) and step.dtype[g] == "float32"
        assert born[g] < step.bwd_start < last[g] and all(f[g] > 0 for f in factors.values())
        cpu, _ = _traced(monkeypatch, model, batch_size=16, target="cpu")
        assert cpu.column_rows == {}
