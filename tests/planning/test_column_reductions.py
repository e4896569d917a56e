"""A BatchNormalization's centred input, written out beside its variance where XLA:GPU sums the variance in one
kernel: between FEWEST_ROWS and RACE_FREE_COLUMNS rows per device."""

import keras
import pytest

from kdist.planning.column_reductions import FEWEST_ROWS, RACE_FREE_COLUMNS
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
