"""fp4lab.core.prng against jax.random, bit for bit: random bits, fold_in and split, through the
C++ kernel and through the written-out rounds, under jit and vmap. jax.random here is jax's own
lowering of its hash (the `jax_threefry` fixture; the suite's other tests lower it to the
kernel, tests/core/test_jax_threefry.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import cpu_kernels, prng
from fp4lab.core.quantize import quantize_dequantize

KEYS = {
    "typed 0": jax.random.key(0),
    "typed 12345": jax.random.key(12345),
    "raw 7": jax.random.PRNGKey(7),
    "folded": jax.random.fold_in(jax.random.key(3), 2**31 + 5),
}
DATA = np.array([0, 1, 5, 2**31, 2**32 - 1, 123456789], np.uint32)
pytestmark = pytest.mark.usefixtures("jax_threefry")


def _words(k):
    return np.asarray(jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k)


@pytest.fixture(params=["kernel", "written out"])
def path(request, monkeypatch):
    """Each test runs through the C++ kernel and through the rounds XLA compiles."""
    if request.param == "kernel":
        if not cpu_kernels.available():
            pytest.skip(f"no CPU kernels here: {cpu_kernels.build_error()}")
        yield request.param
        return
    # nothing traced under the other path is reused, here or after (which the kernel's tests,
    # and every later test of the process, rely on)
    monkeypatch.setattr(prng, "_kernel_here", lambda: False)
    jax.clear_caches()
    yield request.param
    jax.clear_caches()


@pytest.mark.parametrize("name", KEYS)
def test_fold_in_split_and_bits_are_jax_random(name, path):
    key = KEYS[name]
    many = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, DATA)
    got = prng.fold_in(key, DATA)
    assert got.dtype == key.dtype and got.shape == many.shape
    np.testing.assert_array_equal(_words(got), _words(many))
    for d in (0, 9, 2**32 - 1):
        np.testing.assert_array_equal(
            _words(prng.fold_in(key, d)), _words(jax.random.fold_in(key, d))
        )
    for num in (1, 2, 5):
        np.testing.assert_array_equal(
            _words(prng.split(key, num)), _words(jax.random.split(key, num))
        )
    for shape in ((1,), (3, 7), (2, 16, 17)):
        want = jax.random.bits(key, shape, jnp.uint32)
        np.testing.assert_array_equal(prng.random_bits(key, shape), want)
        np.testing.assert_array_equal(jax.jit(prng.random_bits, static_argnums=1)(key, shape), want)


def test_bits_at_given_positions_are_those_of_the_stream(path):
    key = jax.random.key(11)
    stream = jax.random.bits(key, (6 * 10,), jnp.uint32)
    index = jnp.asarray(np.random.default_rng(0).permutation(60).reshape(6, 10), jnp.uint32)
    np.testing.assert_array_equal(prng.random_bits(key, (6, 10), index), stream[index])


def test_vmapped_keys_counters_and_both_give_each_members_bits(path):
    keys = jax.random.split(jax.random.key(5), 3)
    index = jnp.stack([jnp.arange(20, dtype=jnp.uint32)[::-1], jnp.arange(20, dtype=jnp.uint32)])
    index = index.reshape(2, 4, 5)

    def ref(k, i):
        return jax.random.bits(k, (20,), jnp.uint32)[i]

    def ours(k, i):
        return prng.random_bits(k, (4, 5), i)

    for axes in ((0, None), (None, 0)):  # keys batched, counters batched
        k = keys if axes[0] == 0 else keys[0]
        i = index if axes[1] == 0 else index[0]
        np.testing.assert_array_equal(jax.vmap(ours, axes)(k, i), jax.vmap(ref, axes)(k, i))
    nested = jax.vmap(jax.vmap(ours, (None, 0)), (0, None))  # both, one vmap each
    np.testing.assert_array_equal(
        nested(keys, index), jax.vmap(jax.vmap(ref, (None, 0)), (0, None))(keys, index)
    )
    folded = jax.vmap(lambda k: prng.fold_in(k, DATA))
    want = jax.vmap(lambda k: jax.vmap(jax.random.fold_in, (None, 0))(k, DATA))(keys)
    np.testing.assert_array_equal(_words(folded(keys)), _words(want))
    np.testing.assert_array_equal(
        _words(jax.vmap(prng.split)(keys)), _words(jax.vmap(jax.random.split)(keys))
    )


def test_other_implementations_and_layouts_go_to_jax_random():
    key = jax.random.key(4, impl="rbg")
    np.testing.assert_array_equal(
        prng.random_bits(key, (3, 5)), jax.random.bits(key, (3, 5), jnp.uint32)
    )
    np.testing.assert_array_equal(_words(prng.split(key)), _words(jax.random.split(key)))
    np.testing.assert_array_equal(
        _words(prng.fold_in(key, DATA)),
        _words(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, DATA)),
    )
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:  # jax's older layout of bits and splits (fold_in is the same in both)
        key = jax.random.key(4)
        np.testing.assert_array_equal(
            prng.random_bits(key, (3, 5)), jax.random.bits(key, (3, 5), jnp.uint32)
        )
        np.testing.assert_array_equal(_words(prng.split(key)), _words(jax.random.split(key)))
        np.testing.assert_array_equal(
            _words(prng.fold_in(key, 6)), _words(jax.random.fold_in(key, 6))
        )
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_a_stochastic_quantizer_compiles_no_while_loop(path):
    # jax's own hash is a while loop in the program; the keys here are the kernel's call or
    # fused rounds, the bits fused rounds
    spec = fl.nvfp4().replace(rounding="stochastic")
    x = jax.random.normal(jax.random.key(0), (32, 64))
    f = jax.jit(lambda x, k: quantize_dequantize(x, spec, key=prng.fold_in(k, 3)))
    hlo = f.lower(x, jax.random.key(1)).compile().as_text()
    assert " while(" not in hlo
    assert ("fp4lab_threefry" in hlo) == (path == "kernel")


def test_the_kernel_rejects_what_it_cannot_hash():
    if not cpu_kernels.available():
        pytest.skip(f"no CPU kernels here: {cpu_kernels.build_error()}")
    with pytest.raises(ValueError, match="uint32"):
        cpu_kernels.threefry(jnp.zeros((3,), jnp.uint32), jnp.zeros((4,), jnp.uint32))
    with pytest.raises(ValueError, match="uint32"):
        cpu_kernels.threefry(jnp.zeros((2,), jnp.uint32), jnp.zeros((4,), jnp.int32))
