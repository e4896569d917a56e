"""What XLA:GPU adds to a convolutional step: a max pool's input is computed again by its gradient unless a ReLU made
it, each convolution kernel has a filter-layout copy from its forward to its input gradient, which fsdp gathers again
there; and what it leaves out: a zero pad a convolution reads."""

import keras

import kdist
from kdist.abstract import dtype_policy_scope
from tests.planning.test_memory_model import _recorded_factors


def _traced(monkeypatch, build, devices=8, batch_size=64, target="h100"):
    """(the traced step, {axes: buffer factors}) of `build` planned on `devices`."""
    seen = _recorded_factors(monkeypatch)
    kdist.plan(kdist.abstract_model(build), devices, batch_size=batch_size, target=target)
    return seen[0][0].traced.step, {tuple(sorted(axes.items())): factors for _, axes, factors in seen}


def _pooled(padded):
    images = keras.Input((32, 32, 8))
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(images)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    if padded:  # ResNet's stem: the pool reads a ZeroPadding2D's output
        x = keras.layers.ZeroPadding2D(1)(x)
    x = keras.layers.MaxPooling2D(3, strides=2)(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(16, 3, padding="same")(x))
    return keras.Model(images, keras.layers.Dense(10)(x))


def _activations(step, shape):
    """The forward buffers of `step` of one example's `shape` that some kernel makes."""
    born = step.lifetimes()[0]
    return [g for g in range(len(step.size)) if step.term[g] == "activations" and step.shape[g][1:] == shape
            if born[g] >= 0]  # fmt: skip


def test_a_max_pools_gradient_computes_its_input_again_a_padded_one_or_a_relus(monkeypatch):
    """XLA:GPU's max-pool gradient is a reduce-window and a scatter, both fusions, which compute the pool's input
    again from the buffers it is made of: a padded normalization's output (ResNet50 keeps no f32[32,114,114,64]) and
    a ReLU's, after a BatchNormalization or a convolution's bias (VGG keeps each convolution's output and no ReLU
    output; docs/plan.md, "Max pools"). What the forward keeps of that shape is the convolution's output and the
    normalization's centred input, which its variance's reduction writes out: no elementwise kernel's output."""
    padded, _ = _traced(monkeypatch, lambda: _pooled(True))
    assert _activations(padded, (34, 34, 16)) == []  # the padded input: no buffer
    relu, _ = _traced(monkeypatch, lambda: _pooled(False))
    born, last = relu.lifetimes()[:2]
    kept = [g for g in _activations(relu, (32, 32, 16)) if last[g] > relu.bwd_start]
    assert sorted(relu.event_kinds[born[g]] for g in kept) == ["kernel", "reduction"]


def _convolved():
    images = keras.Input((16, 16, 4))
    x = keras.layers.Conv2D(8, 3, padding="same", name="first")(images)
    x = keras.layers.Conv2D(32, 3, padding="same", name="second")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(images, keras.layers.Dense(10)(x))


def _kernel_copies(step):
    return {g: step.weight_of[g] for g in step.weight_of if step.term[g] == "activations" and not step.batch[g]}


def test_each_convolution_kernel_has_a_filter_layout_copy_on_a_gpu(monkeypatch):
    """XLA:GPU transposes each HWIO kernel into cuDNN's OHWI layout before its forward convolution and the input
    gradient reads that copy: one kernel-sized buffer per convolution, made by its forward, kept to its input
    gradient (the first convolution has none: its copy dies in the forward). A device holds its shard's; CPU and
    TPU targets have no cuDNN."""
    step, factors = _traced(monkeypatch, _convolved)
    copies = _kernel_copies(step)
    assert sorted(step.size[g] for g in copies) == [3 * 3 * 4 * 8 * 4, 3 * 3 * 8 * 32 * 4]
    born, last = step.lifetimes()[:2]
    first, second = sorted(copies, key=lambda g: step.size[g])
    assert last[first] < step.bwd_start  # read by the forward convolution alone
    assert born[second] < step.bwd_start < last[second]
    assert factors[(("data", 8),)][second] == 1.0
    assert factors[(("data", 4), ("model", 2))][second] == 0.5  # the output channels split over 'model'
    cpu, _ = _traced(monkeypatch, _convolved, target="cpu")
    assert _kernel_copies(cpu) == {}


def _windowed_and_pointwise():
    images = keras.Input((16, 16, 4))
    x = keras.layers.Conv2D(8, 3, padding="same")(images)
    x = keras.layers.Conv2D(16, 3, padding="same")(x)  # 3 x 3: its input gradient reads it flipped
    x = keras.layers.Conv2D(24, 1)(x)  # 1 x 1: a matrix product, forward and backward
    return keras.Model(images, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))


def _gathered_spans(step):
    """{kernel shape: [(born, last) of each gathered copy]} of `step`'s convolution kernels."""
    born, last = step.lifetimes()[:2]
    spans = {}
    for g in step.weight_of:
        if step.term[g] == "gathered" and len(step.shape[g]) == 4:
            spans.setdefault(step.shape[g], []).append((int(born[g]), int(last[g])))
    return spans


def test_a_windowed_kernel_is_gathered_again_for_its_input_gradient(monkeypatch):
    """Under fsdp XLA:GPU gathers a kernel wider than 1 x 1 once for its forward convolution and again, from its
    filter-layout copy, for its input gradient (VGG16 on fsdp=8, ResNet50 on fsdp=16: every 3 x 3 kernel); a 1 x 1
    kernel keeps its forward's gathered copy for the backward, as a dense kernel does. On a CPU target one copy."""
    step, _ = _traced(monkeypatch, _windowed_and_pointwise)
    spans = _gathered_spans(step)
    (forward, backward) = sorted(spans[(3, 3, 8, 16)])
    assert forward[1] < step.bwd_start <= backward[0]
    (kept,) = spans[(1, 1, 16, 24)]
    assert kept[0] < step.bwd_start < kept[1]
    (first,) = spans[(3, 3, 4, 8)]  # the first layer's input has no gradient: no backward read, no second copy
    assert first[1] < step.bwd_start
    cpu, _ = _traced(monkeypatch, _windowed_and_pointwise, target="cpu")
    (whole,) = _gathered_spans(cpu)[(3, 3, 8, 16)]
    assert whole[0] < cpu.bwd_start < whole[1]


def test_a_mixed_precision_kernels_cast_is_its_copy(monkeypatch):
    """Under mixed_bfloat16 the convolution reads the kernel's bfloat16 cast, which the backward reads again: that
    cast is the copy, none is added."""
    with dtype_policy_scope("mixed_bfloat16"):
        step, _ = _traced(monkeypatch, _convolved)
    copies = [g for g in _kernel_copies(step) if len(step.shape[g]) == 4]  # the Dense kernel's cast aside
    assert len(copies) == 2 and all(step.dtype[g] == "bfloat16" for g in copies)


class _PaddedConvolution(keras.layers.Layer):
    """A layer that pads its input with zeros and convolves it "valid" in one call."""

    def build(self, shape):
        self.kernel = self.add_weight((3, 3, shape[-1], 16))

    def call(self, x):
        return keras.ops.conv(keras.ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))), self.kernel)


def _padded(pad):
    """A ReLU's output convolved with a 3 x 3 window over a border of one pixel: the convolution's own ("same"),
    a ZeroPadding2D's ("layer"), a pad inside the convolution's layer ("call") or a border of ones ("ones")."""
    images = keras.Input((32, 32, 8))
    x = keras.layers.ReLU()(keras.layers.Conv2D(16, 3, padding="same")(images))
    if pad == "same":
        x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    elif pad == "layer":
        x = keras.layers.Conv2D(16, 3, use_bias=False)(keras.layers.ZeroPadding2D(1)(x))
    elif pad == "call":
        x = _PaddedConvolution()(x)
    else:
        border = ((0, 0), (1, 1), (1, 1), (0, 0))
        x = keras.layers.Lambda(lambda t: keras.ops.pad(t, border, constant_values=1.0))(x)
        x = keras.layers.Conv2D(16, 3, use_bias=False)(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    return keras.Model(images, keras.layers.Dense(10)(x))


def test_a_zero_pad_a_convolution_reads_is_its_padding_not_a_buffer(monkeypatch):
    """XLA's algebraic simplifier folds a zero pad into the window of the convolutions that read it, forward and
    weight gradient, which then read the unpadded value (`FoldConvInputPad`). Compiled for 8 deviceless H100s the
    ZeroPadding2D model's data=8 step is the same-padded one's, 6.09 MB, and the border of ones' 6.16 MB. Where the
    convolution gathers its input over a model axis XLA pads before it gathers: the zero pad costs what the ones do
    (model=8: 17.42 and 17.37 MB)."""
    peaks = {}
    for pad in ("same", "layer", "call", "ones"):
        plan = kdist.plan(kdist.abstract_model(lambda pad=pad: _padded(pad)), 8, batch_size=64, target="h100")
        peaks[pad] = {c.spec: c.peak for c in plan.candidates}
    assert peaks["same"]["data=8"] == peaks["layer"]["data=8"]
    assert 0 <= peaks["call"]["data=8"] - peaks["same"]["data=8"] <= 4  # the pad's value, a float32 scalar
    assert peaks["ones"]["data=8"] > peaks["layer"]["data=8"]
    assert peaks["layer"]["model=8"] == peaks["ones"]["model=8"] > peaks["same"]["model=8"]
    folded, _ = _traced(monkeypatch, lambda: _padded("layer"))
    kept, _ = _traced(monkeypatch, lambda: _padded("ones"))
    assert _activations(folded, (34, 34, 16)) == [] and len(_activations(kept, (34, 34, 16))) == 1
