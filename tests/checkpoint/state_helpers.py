"""Tiny models, their state as bytes, and ways to damage files, for the checkpoint and backup fault tests."""

import os

import keras
import numpy as np

import kdist


def model(out=4, *, seed=0, spec="2x4", dtype=None, width=256):
    """A compiled MLP (64 -> width -> out) with its optimizer built, under `kdist.preset(spec)`.

    The first kernel (64 x 256 floats, 64 KiB) is large enough that Orbax stores it
    outside its checksummed index, so damaging its data exercises kdist's checksums.
    """
    keras.distribution.set_distribution(kdist.preset(spec))
    keras.utils.set_random_seed(seed)
    built = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(width, name="d1", dtype=dtype), keras.layers.Dense(out, name="d2")],
        name="mlp",
    )
    built.compile(optimizer=keras.optimizers.Adam(name="adam"), loss="mse")
    built.optimizer.build(built.trainable_variables)
    return built


def snapshot(m):
    """Every variable of `m` (weights, optimizer, metrics): path -> (bytes, dtype, shape, sharding)."""
    variables = [*m.variables, *m.optimizer.variables, *m.metrics_variables]
    out = {}
    for v in variables:
        value = v.value
        out[f"{v.path}#{id(v)}"] = (np.asarray(value).tobytes(), str(value.dtype), tuple(value.shape), value.sharding)
    return out


def assert_unchanged(m, before):
    """Every variable of `m` is bitwise what `snapshot` recorded, on the same sharding."""
    after = snapshot(m)
    assert list(after) == list(before)
    changed = [k.split("#")[0] for k in before if after[k][:3] != before[k][:3] or after[k][3] != before[k][3]]
    assert not changed, f"changed by a failed load: {changed}"


def largest_file(directory):
    """The largest file under `directory` (an Orbax checkpoint's array data)."""
    files = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]
    return max(files, key=os.path.getsize)


def flip_byte(path, where=0.5):
    """Invert the byte at fraction `where` of the file."""
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * where)] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)


def truncate(path, keep=0.5):
    """Cut the file to a fraction of its length."""
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))
