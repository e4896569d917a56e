"""The rules for Keras core layers' variable names (`kdist.rules.keras_core`)."""

from kdist.rules import KERAS_CORE


def test_an_output_projection_of_heads_named_output_is_row_parallel_over_heads():
    """keras-hub's VideoPrism names its attention's output projection "output" (Keras's MultiHeadAttention:
    "attention_output"): split over heads, the heads' split values need no gather before it."""
    assert KERAS_CORE.place("mha/output/kernel", (8, 32, 256), "model=8").axes == ("model", None, None)
    assert KERAS_CORE.place("mha/output/kernel", (6, 32, 256), "model=4").axes == (None, "model", None)  # head size
    assert KERAS_CORE.place("mha/attention_output/kernel", (8, 32, 256), "model=8").axes == ("model", None, None)


def test_a_2d_kernel_named_output_keeps_its_output_features_split():
    assert KERAS_CORE.place("classifier/output/kernel", (256, 10), "model=2").axes == (None, "model")
    assert KERAS_CORE.place("classifier/dense/kernel", (256, 10), "model=2").axes == (None, "model")
