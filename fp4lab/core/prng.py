"""Threefry-2x32 random bits, fold_in and split, bit for bit as jax.random's, without its loops.

    from fp4lab.core import prng
    bits = prng.random_bits(key, (128, 64))   # = jax.random.bits(key, (128, 64), jnp.uint32)
    k = prng.fold_in(key, 3)                  # = jax.random.fold_in(key, 3)
    ks = prng.fold_in(key, jnp.arange(9, dtype=jnp.uint32))  # nine fold_ins in one hash
    k_a, k_b = prng.split(key)                # = jax.random.split(key)

jax lowers its Threefry hash on the CPU as a while loop of five iterations. Every call is then
a loop of its own in the program, with a body and a condition that XLA compiles separately and
cannot fuse with anything: a quantized training step that derives a key for each call and
each operand holds dozens of them. Here the random bits are the twenty rounds of elementwise
integer ops written out (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"),
which XLA fuses into the stochastic rounding that consumes them. The keys (fold_in, split)
are, on the CPU backend, one call of the C++ kernel of `fp4lab.core.cpu_kernels`
(threefry.cc): one instruction of the program instead of twenty rounds for XLA to compile at
every key; elsewhere, or where the kernel cannot be built, the same rounds written out. All
of it is integer arithmetic, so every path gives the same bits. (The bits as a kernel call
too compiled faster still, but the kernel runs on one thread and writes the bits out for the
rounding to read back: a slower step, docs/performance.md, "Measurements behind the code".)

What jax computes, with its default "partitionable" Threefry (`jax_threefry_partitionable`):

    threefry2x32(key, (hi, lo))   the 2x32 block cipher of the counter (hi, lo) under key
    random_bits(key, shape)[i]    y0 ^ y1 of threefry2x32(key, (0, i)), i the row-major index
    split(key, n)[i]              the key (y0, y1) of threefry2x32(key, (0, i))
    fold_in(key, d)               the key (y0, y1) of threefry2x32(key, (0, d))

`fold_in` is the same in jax's older, non-partitionable layout; `random_bits` and `split` are
not, and with that layout (or a key of another implementation) they call jax.random instead.
The tests hold every function against jax.random bit for bit. `cpu_kernels.lower_jax_threefry`
goes further, for the rest of a process: jax's own Threefry primitive lowers on the CPU to the
same C++ kernel, so that flax's initializers and any other jax.random call compile faster too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fp4lab.core import cpu_kernels

__all__ = ["threefry2x32", "random_bits", "stream_words", "fold_in", "split"]

_U32 = np.uint32
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = _U32(0x1BD11BDA)  # Threefish's key-schedule constant


def threefry2x32(k0, k1, x0, x1) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds) of the counters (x0, x1) under the key (k0, k1):
    uint32 scalars for the key, uint32 arrays of one shape for the counters."""
    ks = (k0, k1, lax.bitwise_xor(lax.bitwise_xor(k0, k1), _PARITY))
    x0 = lax.add(x0, ks[0])
    x1 = lax.add(x1, ks[1])
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = lax.add(x0, x1)
            rotated = lax.bitwise_or(
                lax.shift_left(x1, _U32(r)), lax.shift_right_logical(x1, _U32(32 - r))
            )
            x1 = lax.bitwise_xor(x0, rotated)
        x0 = lax.add(x0, ks[(group + 1) % 3])
        x1 = lax.add(lax.add(x1, ks[(group + 2) % 3]), _U32(group + 1))
    return x0, x1


def _key_words(key: jax.Array):
    """(k0, k1, typed, impl) of a Threefry key, typed (jax.random.key) or raw uint32[2]
    (jax.random.PRNGKey); None where the key is of another implementation or shape."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    impl = jax.random.key_impl(key) if typed else jax.config.jax_default_prng_impl
    data = jax.random.key_data(key) if typed else key
    if str(impl) != "threefry2x32" or data.shape != (2,) or data.dtype != jnp.uint32:
        return None
    return data[0], data[1], typed, impl


def _kernel_here() -> bool:
    """Whether the keys' hash runs as the C++ kernel: on the CPU backend, once it is built."""
    return jax.default_backend() == "cpu" and cpu_kernels.available()


def _key_hash(k0, k1, counts: jax.Array) -> jax.Array:
    """The keys threefry2x32((k0, k1), (0, c)) for c in `counts` (uint32): the pairs (y0, y1)
    on a last axis of 2."""
    if _kernel_here():
        return cpu_kernels.threefry(jnp.stack([k0, k1]), counts)
    y0, y1 = threefry2x32(k0, k1, lax.full(counts.shape, 0, jnp.uint32), counts)
    # Behind an optimization barrier: XLA would otherwise fuse the whole hash into every
    # consumer of every key (each operand's rounding, each slice of a batch of keys), so that
    # a quantized step compiled the same twenty rounds many times over.
    return lax.optimization_barrier(jnp.stack([y0, y1], axis=-1))


def _as_keys(data, typed: bool, impl):
    """Key words (..., 2) as keys of the input key's kind: typed keys of its implementation,
    or the raw uint32 array."""
    return jax.random.wrap_key_data(data, impl=impl) if typed else data


def _partitionable() -> bool:
    return bool(jax.config.jax_threefry_partitionable)


def random_bits(key: jax.Array, shape: tuple, index: jax.Array | None = None) -> jax.Array:
    """`jax.random.bits(key, shape, jnp.uint32)`, bit for bit; with `index` (uint32, `shape`),
    the bits of those flat positions of the same stream (the bits of a tensor laid out
    otherwise than the stream, without drawing them in the stream's order first)."""
    shape = tuple(shape)
    n = math.prod(shape)
    words = _key_words(key)
    if words is None or not _partitionable() or n >= 2**32:
        bits = jax.random.bits(key, shape, jnp.uint32)
        return bits if index is None else bits.reshape(-1)[index]
    k0, k1, _, _ = words
    i = lax.iota(jnp.uint32, n).reshape(shape) if index is None else index
    y0, y1 = threefry2x32(k0, k1, lax.full(shape, 0, jnp.uint32), i)
    return lax.bitwise_xor(y0, y1)


def stream_words(key) -> jax.Array | None:
    """The key words (uint32 (2,)) whose Threefry stream `random_bits(key, ...)` draws, or None
    where it calls jax.random instead (no key, another implementation, the older layout)."""
    if key is None:
        return None
    words = _key_words(key)
    if words is None or not _partitionable():
        return None
    return jnp.stack(words[:2])


def fold_in(key: jax.Array, data) -> jax.Array:
    """`jax.random.fold_in(key, d)` for every d of `data` (an int or a uint32 array): keys of
    data's shape, of the input key's kind, from one hash."""
    data = jnp.asarray(data, jnp.uint32)
    words = _key_words(key)
    if words is None:
        fold = jax.random.fold_in
        for _ in range(data.ndim):
            fold = jax.vmap(fold, in_axes=(None, 0))
        return fold(key, data)
    k0, k1, typed, impl = words
    return _as_keys(_key_hash(k0, k1, data), typed, impl)


def split(key: jax.Array, num: int = 2) -> jax.Array:
    """`jax.random.split(key, num)`, bit for bit: `num` keys of the input key's kind."""
    words = _key_words(key)
    if words is None or not _partitionable():
        return jax.random.split(key, num)
    k0, k1, typed, impl = words
    return _as_keys(_key_hash(k0, k1, lax.iota(jnp.uint32, num)), typed, impl)
