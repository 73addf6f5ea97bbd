"""jax's Threefry hash lowered to fp4lab's CPU kernel (`cpu_kernels.lower_jax_threefry`, on in the
test suite): the published test vectors, a NumPy transcription of the hash, and every jax.random
function of a Threefry key against jax's own lowering, bit for bit."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fp4lab.core import cpu_kernels

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the hash lowers to the CPU kernels, which are not here"
)

# Random123's known answers for Threefry-2x32, 20 rounds (kat_vectors): key, counter, result
KNOWN = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def numpy_threefry(k0, k1, x0, x1):
    """Threefry-2x32 (Salmon et al. 2011, 20 rounds) in NumPy uint32 arithmetic."""
    k0, k1, x0, x1 = np.broadcast_arrays(*(np.asarray(v, np.uint32) for v in (k0, k1, x0, x1)))
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    with np.errstate(over="ignore"):
        x0, x1 = x0 + ks[0], x1 + ks[1]
        for g in range(5):
            for r in rotations[g % 2]:
                x0 = x0 + x1
                x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
            x0 = x0 + ks[(g + 1) % 3]
            x1 = x1 + ks[(g + 2) % 3] + np.uint32(g + 1)
    return x0, x1


def test_the_kernel_gives_the_published_answers_and_the_numpy_hash():
    for key, count, want in KNOWN:
        words = [jnp.uint32(w) for w in (*key, *count)]
        got = cpu_kernels.threefry2x32(*words)
        assert [int(g) for g in got] == list(want)
        assert [int(v) for v in numpy_threefry(*key, *count)] == list(want)
    rng = np.random.default_rng(0)
    for shapes in [((), (), (7,), (7,)), ((3, 1), (1,), (3, 5), ()), ((0, 4),) * 4]:
        words = [rng.integers(0, 2**32, s, dtype=np.uint32) for s in shapes]
        got = jax.jit(cpu_kernels.threefry2x32)(*words)
        for g, w in zip(got, numpy_threefry(*words), strict=True):
            assert g.shape == w.shape and g.dtype == jnp.uint32
            np.testing.assert_array_equal(np.asarray(g), w)
    with pytest.raises(ValueError, match="uint32"):
        cpu_kernels.threefry2x32(jnp.int32(0), jnp.uint32(0), jnp.uint32(0), jnp.uint32(0))


def _draws():
    """Every jax.random function of Threefry keys the suite's code calls, and more: eager, under
    jit and vmap, raw and typed keys, both layouts, an empty draw and flax's initializers."""
    key, raw = jax.random.key(42), jax.random.PRNGKey(7)
    keys = jax.random.split(key, 3)
    out = {
        "split": jax.random.key_data(jax.random.split(key, 5)),
        "fold_in": jax.random.key_data(jax.random.fold_in(key, 2**31 + 3)),
        "bits": jax.random.bits(key, (3, 7), jnp.uint32),
        "bits raw": jax.random.bits(raw, (33,), jnp.uint32),
        "empty": jax.random.bits(key, (0, 3), jnp.uint32),
        "uniform jit": jax.jit(lambda k: jax.random.uniform(k, (4, 5)))(key),
        "normal": jax.random.normal(key, (16,)),
        "gumbel vmap": jax.vmap(lambda k: jax.random.gumbel(k, (6,)))(keys),
        "randint": jax.random.randint(key, (10,), 0, 100),
        "permutation": jax.random.permutation(key, 12),
        "split vmap": jax.random.key_data(jax.vmap(jax.random.split)(keys)),
        "fold_in vmap": jax.random.key_data(
            jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(4, dtype=jnp.uint32))
        ),
    }
    model = nnx.Sequential(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1)))
    out["flax init"] = model.layers[0].kernel[...]
    out["flax dropout"] = model(jnp.ones((2, 8)))
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", not before)
    try:
        out["other layout bits"] = jax.random.bits(key, (5, 3), jnp.uint32)
        out["other layout split"] = jax.random.key_data(jax.random.split(key, 3))
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    return {name: np.asarray(v) for name, v in out.items()}


@pytest.mark.skipif(
    os.environ.get("FP4LAB_TEST_JAX_THREEFRY") == "jax", reason="the kernel's lowering is off"
)
def test_jax_random_gives_jax_s_bits_through_the_kernel(to_jax_threefry):
    hlo = jax.jit(lambda k: jax.random.bits(k, (4,), jnp.uint32)).lower(jax.random.key(0))
    hlo = hlo.compile().as_text()
    assert "fp4lab_threefry2x32" in hlo and " while(" not in hlo  # the suite's lowering is on
    ours = _draws()
    to_jax_threefry()
    hlo = jax.jit(lambda k: jax.random.bits(k, (4,), jnp.uint32)).lower(jax.random.key(0))
    assert "fp4lab_threefry2x32" not in hlo.compile().as_text()
    theirs = _draws()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype, name
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
