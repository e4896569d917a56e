"""Checksums of (sharded) arrays that do not depend on the mesh: a checkpoint saved on one mesh is checked on another.

Each array's checksum is two 32-bit sums over its elements' bits, each bit
pattern weighted by a function of the element's position in the whole
array, so the value is the same whatever the sharding, and changing any one
element changes it. The sums run on the devices that hold the array (one
jitted computation per mesh); in a multi-process run every process must
call `checksums` with the same arrays, as for any collective.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_MULTIPLIERS = ((0x9E3779B1, 0x7F4A7C15), (0x85EBCA77, 0xC2B2AE3D))


def checksums(arrays):
    """{key: [sum1, sum2]} (Python ints) for a dict of `jax.Array`s, computed where they live.

    Example:

    ```python
    checksums({"w": jnp.ones((4, 4))})   # {'w': [..., ...]}, the same on any sharding of the array
    ```
    """
    groups = {}
    for key, array in arrays.items():
        groups.setdefault(_placement(array), []).append(key)
    out = {}
    for placement, keys in groups.items():
        sums = _summer(placement)([arrays[k] for k in keys])
        values = np.asarray(sums.addressable_data(0))
        out.update({k: [int(a), int(b)] for k, (a, b) in zip(keys, values)})
    return out


def _placement(array):
    sharding = getattr(array, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return sharding.mesh
    if sharding is not None:
        return tuple(sorted(d.id for d in sharding.device_set))
    return None


@functools.lru_cache(maxsize=64)
def _summer(placement):
    # One jitted function per mesh: jit caches the compiled sums for each tree of shapes and shardings.
    if isinstance(placement, jax.sharding.Mesh):
        replicated = jax.sharding.NamedSharding(placement, jax.sharding.PartitionSpec())
        return jax.jit(_sums, out_shardings=replicated)
    return jax.jit(_sums)


def _sums(arrays):
    return jnp.stack([_array_sums(a) for a in arrays]) if arrays else jnp.zeros((0, 2), jnp.uint32)


def _array_sums(array):
    words = _words(jnp.asarray(array))
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= words.shape[axis]
    sums = []
    for multiplier, offset in _MULTIPLIERS:
        weight = (index * jnp.uint32(multiplier) + jnp.uint32(offset)) | jnp.uint32(1)  # odd: no change is lost
        mixed = words ^ (words >> 15) if sums else words
        sums.append(jnp.sum(mixed * weight, dtype=jnp.uint32))
    return jnp.stack(sums)


def _words(array):
    """The array's bits as uint32 words (a trailing axis for 8-byte and complex elements)."""
    dtype = array.dtype
    if dtype == jnp.bool_:
        return array.astype(jnp.uint32)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return _words(jnp.stack([jnp.real(array), jnp.imag(array)], axis=-1))
    size = dtype.itemsize
    if size == 4 or size == 8:
        return lax.bitcast_convert_type(array, jnp.uint32)
    small = {1: jnp.uint8, 2: jnp.uint16}.get(size)
    if small is None:  # sub-byte types (int4): their values, as 32-bit floats
        return lax.bitcast_convert_type(array.astype(jnp.float32), jnp.uint32)
    return lax.bitcast_convert_type(array, small).astype(jnp.uint32)
