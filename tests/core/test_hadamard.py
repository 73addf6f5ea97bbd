"""Hadamard rotations: construction, orthogonality, GEMM invariance, quantization round trip."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import hadamard

SIGNS16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


rot = jax.jit(hadamard.rotate, static_argnums=1)
unrot = jax.jit(hadamard.unrotate, static_argnums=1)


def kron_hadamard(n):
    """Sylvester's H_n = H_2 (x) H_{n/2}, built with np.kron in float64."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_sylvester_equals_kron_construction(n):
    h = hadamard.sylvester(n)
    np.testing.assert_array_equal(h, kron_hadamard(n))
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))


@pytest.mark.parametrize("n", [0, 3, 12, 48])
def test_sylvester_rejects_non_powers_of_two(n):
    with pytest.raises(ValueError, match="power of two"):
        hadamard.sylvester(n)
    with pytest.raises(ValueError, match="power of two"):
        fl.Hadamard(n)


def transforms(n):
    return [
        (fl.Hadamard(n, "none"), None),
        (fl.Hadamard(n, tuple(np.resize(SIGNS16, n))), None),
        (fl.Hadamard(n, "random"), jax.random.key(7)),
    ]


@pytest.mark.parametrize("n", [16, 32])
def test_rotation_is_orthogonal(n):
    for t, key in transforms(n):
        r = np.asarray(t.matrix(key), np.float64)
        np.testing.assert_allclose(r @ r.T, np.eye(n), atol=1e-6)
        np.testing.assert_allclose(r.T @ r, np.eye(n), atol=1e-6)
        signs = np.ones(n) if t.signs == "none" else np.sign(r[:, 0])
        np.testing.assert_allclose(r, np.diag(signs) @ kron_hadamard(n) / np.sqrt(n), atol=1e-7)


def test_random_signs_depend_on_the_key_only():
    t = fl.Hadamard(16, "random")
    a, b = t.matrix(jax.random.key(1)), t.matrix(jax.random.key(1))
    c = t.matrix(jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert np.any(np.asarray(a) != np.asarray(c))
    with pytest.raises(ValueError, match="key"):
        t.matrix(None)
    assert t.needs_key and not fl.Hadamard(16).needs_key


def test_fixed_random_is_reproducible_and_hashable():
    a, b = fl.Hadamard.fixed_random(16, 5), fl.Hadamard.fixed_random(16, 5)
    assert a == b and hash(a) == hash(b)
    assert set(a.signs) <= {1.0, -1.0} and len(a.signs) == 16
    assert a != fl.Hadamard.fixed_random(16, 6)


@pytest.mark.parametrize(
    "signs", ["bogus", (1.0,) * 15, (1.0,) * 15 + (0.5,)], ids=["name", "length", "value"]
)
def test_bad_signs(signs):
    with pytest.raises(ValueError, match="signs"):
        fl.Hadamard(16, signs)


@pytest.mark.parametrize("n", [16, 32])
def test_rotate_is_blockwise_and_unrotate_inverts(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64)).astype(np.float32)  # the GEMM test's shape: one compile
    for t, key in transforms(n):
        r = np.asarray(t.matrix(key), np.float64)
        expected = x.astype(np.float64) @ np.kron(np.eye(64 // n), r)  # block-diagonal R
        y = rot(jnp.asarray(x), t, key)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(unrot(y, t, key), x, rtol=1e-5, atol=1e-5)


def test_rotation_along_an_inner_axis_is_the_moved_rotation_bit_for_bit():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 64, 24)), jnp.float32)
    for t, key in transforms(16):
        moved = jnp.moveaxis(hadamard.rotate(jnp.moveaxis(x, 1, -1), t, key), -1, 1)
        np.testing.assert_array_equal(hadamard.rotate(x, t, key, axis=1), moved)
        back = jnp.moveaxis(hadamard.unrotate(jnp.moveaxis(x, 1, -1), t, key), -1, 1)
        np.testing.assert_array_equal(hadamard.unrotate(x, t, key, axis=-2), back)
        r = np.kron(np.eye(4), np.asarray(t.matrix(key), np.float64))  # block-diagonal R
        expected = np.einsum("bmk,mn->bnk", np.asarray(x, np.float64), r)
        np.testing.assert_allclose(hadamard.rotate(x, t, key, axis=1), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"size 16 does not divide axis 2 of shape \(2, 64, 24\)"):
        hadamard.rotate(x, hadamard.Hadamard(16), axis=2)


def test_rotation_bits_are_the_same_eagerly_and_under_jit():
    # (the rotation used to be a dot, whose jitted transpose summed in another order)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32))
    t = fl.Hadamard(32)
    for f, jf in ((hadamard.rotate, rot), (hadamard.unrotate, unrot)):
        np.testing.assert_array_equal(jf(x, t, None), f(x, t))


def _flushed(v):
    """float32 v with values below 2**-126 set to a zero of their sign (XLA's CPU code runs
    with flush-to-zero and denormals-are-zero)."""
    v = np.asarray(v, np.float32)
    return np.where(np.abs(v) < 2.0**-126, np.copysign(np.float32(0.0), v), v).astype(np.float32)


def _rotation_formula(x, n, signs=None):
    """x diag(signs) H_n / sqrt(n) blockwise along the last axis, as the module writes it, in
    numpy float32 with every input and result flushed: times 2**-k (k = floor(log2(n) / 2)),
    the butterflies h = 1, 2, ..., n / 2 ((a, b) -> (a + b, a - b)), times 2**k / sqrt(n)."""
    k = (n.bit_length() - 1) // 2
    rows = _flushed(x).reshape(-1, n)
    if signs is not None:
        rows = _flushed(rows * np.asarray(signs, np.float32))
    v = [_flushed(rows[:, i] * np.float32(2.0**-k)) for i in range(n)]
    h = 1
    while h < n:
        v = [
            _flushed(v[i] + v[i + h]) if not i & h else _flushed(v[i - h] - v[i]) for i in range(n)
        ]
        h *= 2
    out = np.stack(v, 1)
    rest = np.float32(2.0**k / np.sqrt(n))
    return (out if rest == 1 else _flushed(out * rest)).reshape(x.shape)


def _near_the_flush(shape, seed):
    """Signed values from 2**-140 to 2**-110 (subnormal to small normal), log-uniform, with
    some blocks of ordinary size and some zeros of either sign."""
    rng = np.random.default_rng(seed)
    x = np.exp2(rng.uniform(-140, -110, shape)) * rng.choice([-1.0, 1.0], shape)
    x[::7] *= 2.0**100
    x.flat[::13] = 0.0
    x.flat[::29] = -0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_rotation_bits_near_2_pow_minus_126_are_the_flushed_formula(n):
    # the power of two goes in through the bits, so no multiply can be contracted with the
    # first additions into a fused multiply-add (whose bits here were LLVM's choice)
    x = _near_the_flush((64, 2 * n), seed=n)
    with np.errstate(all="ignore"):
        expected = _rotation_formula(x, n)
        with_signs = _rotation_formula(x, n, SIGNS16[:n] if n <= 16 else None)
    got = np.asarray(rot(jnp.asarray(x), fl.Hadamard(n), None))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    if n <= 16:
        t = fl.Hadamard(n, SIGNS16[:n])
        got = np.asarray(rot(jnp.asarray(x), t, None))
        np.testing.assert_array_equal(got.view(np.uint32), with_signs.view(np.uint32))


_AT_DEFAULT_OPT = """
import sys, numpy as np, jax, jax.numpy as jnp
from fp4lab.core import hadamard
x = np.load(sys.argv[1])
out = [jax.jit(f, static_argnums=1)(jnp.asarray(x), hadamard.Hadamard(n, s), key)
       for f in (hadamard.rotate, hadamard.unrotate)
       for n, s, key in ((16, "random", jax.random.key(7)), (32, "none", None))]
np.save(sys.argv[2], np.stack([np.asarray(o) for o in out]))
"""


def test_rotation_bits_do_not_depend_on_xlas_optimization_level(tmp_path):
    # the tests compile at XLA's -O0 (conftest), the committed runs at its default, where
    # LLVM contracts multiplies with additions when the program lets it
    x = _near_the_flush((256, 64), seed=3)
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "")
    cmd = [sys.executable, "-c", _AT_DEFAULT_OPT, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    here = [
        np.asarray(jax.jit(f, static_argnums=1)(jnp.asarray(x), hadamard.Hadamard(n, s), key))
        for f in (hadamard.rotate, hadamard.unrotate)
        for n, s, key in ((16, "random", jax.random.key(7)), (32, "none", None))
    ]
    there = np.load(tmp_path / "y.npy")
    np.testing.assert_array_equal(np.stack(here).view(np.uint32), there.view(np.uint32))


def test_rotation_of_small_integers_is_exact():
    x = np.random.default_rng(5).integers(-8, 9, (8, 64)).astype(np.float32)
    y = np.asarray(rot(jnp.asarray(x), fl.Hadamard(16), None))
    expected = x.reshape(8, 4, 16).astype(np.float64) @ kron_hadamard(16) / 4.0
    np.testing.assert_array_equal(y, expected.reshape(8, 64))
    np.testing.assert_array_equal(unrot(jnp.asarray(y), fl.Hadamard(16), None), x)


def test_rotate_rejects_an_axis_the_size_does_not_divide():
    with pytest.raises(ValueError, match=r"size 16 does not divide.*\(2, 24\)"):
        hadamard.rotate(jnp.ones((2, 24)), fl.Hadamard(16))


@pytest.mark.parametrize("n", [16, 32])
def test_rotating_both_gemm_operands_leaves_the_product(n):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    for t, key in transforms(n):
        xr, wr = rot(jnp.asarray(x), t, key), rot(jnp.asarray(w), t, key)
        prod = np.asarray(xr, np.float64) @ np.asarray(wr, np.float64).T
        np.testing.assert_allclose(prod, exact, rtol=1e-5, atol=1e-4)
    # different random signs on the two operands do not cancel
    t = fl.Hadamard(n, "random")
    xr = rot(jnp.asarray(x), t, jax.random.key(1))
    wr = rot(jnp.asarray(w), t, jax.random.key(2))
    assert not np.allclose(np.asarray(xr) @ np.asarray(wr).T, exact, atol=1e-2)


def test_rotation_spreads_an_outlier():
    x = np.zeros((8, 64), np.float32)
    x[0, 3] = 8.0
    y = np.asarray(rot(jnp.asarray(x), fl.Hadamard(16), None))
    np.testing.assert_array_equal(np.abs(y[0, :16]), np.full(16, 2.0))  # 8 / sqrt(16)
    np.testing.assert_array_equal(y[:, 16:], 0.0)


QZ = jax.jit(fl.quantize, static_argnums=1)
DEQ = jax.jit(lambda q, rotated: q.dequantize(rotated=rotated), static_argnums=1)
FQ = jax.jit(fl.fake_quant, static_argnums=1, static_argnames="rotated")


@pytest.mark.parametrize(
    "spec",
    [
        fl.cast_spec("bf16").replace(transform=fl.Hadamard(32)),
        fl.nvfp4(tile=(16, 16)).replace(transform=fl.Hadamard(16, "random")),
    ],
    ids=["bf16", "nvfp4-2d"],
)
def test_quantize_with_hadamard_dequantizes_to_the_original_domain(spec):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    x[3, 5] = 30.0  # an outlier
    key = jax.random.key(0)
    q = QZ(jnp.asarray(x), spec, key=key)
    x_hat = np.asarray(DEQ(q, False))
    x_rot = np.asarray(DEQ(q, True))
    rel = np.linalg.norm(x_hat - x) / np.linalg.norm(x)
    tol = {"e2m1": 0.2, "e4m3": 0.05, "bf16": 0.01}[spec.elem]
    assert rel < tol
    # the rotated-domain values are the quantized rotation of x; unrotating them gives x_hat
    rot_x = np.asarray(rot(jnp.asarray(x), spec.transform, q.transform_key))
    assert np.linalg.norm(x_rot - rot_x) / np.linalg.norm(rot_x) < tol
    assert np.linalg.norm(x_rot - x) / np.linalg.norm(x) > 0.5  # not the original domain
    np.testing.assert_allclose(
        np.asarray(unrot(jnp.asarray(x_rot), spec.transform, q.transform_key)),
        x_hat,
        rtol=1e-5,
        atol=1e-5,
    )
    # fake_quant with the same key gives the same values
    np.testing.assert_array_equal(FQ(jnp.asarray(x), spec, key=key), x_hat)


def test_random_hadamard_needs_a_key():
    spec = fl.nvfp4().replace(transform=fl.Hadamard(16, "random"))
    with pytest.raises(ValueError, match="key"):
        fl.quantize(jnp.ones((2, 32)), spec)
    with pytest.raises(ValueError, match="key"):
        fl.fake_quant(jnp.ones((2, 32)), spec)
    # a transform key alone is enough for the signs; stochastic rounding still needs `key`
    q = QZ(jnp.ones((2, 32)), spec, transform_key=jax.random.key(1))
    assert q.codes.shape == (2, 32)
    with pytest.raises(ValueError, match="key"):
        fl.fake_quant(
            jnp.ones((2, 32)), spec.replace(rounding="stochastic"), transform_key=jax.random.key(1)
        )


def test_transform_key_makes_two_operands_cancel():
    """Two operands quantized with one transform key contract in the rotated domain."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    w = rng.standard_normal((6, 32)).astype(np.float32)
    spec = fl.cast_spec("fp32").replace(transform=fl.Hadamard(16, "random"))
    tk = jax.random.key(9)
    xr = FQ(jnp.asarray(x), spec, transform_key=tk, rotated=True)
    wr = FQ(jnp.asarray(w), spec, transform_key=tk, rotated=True)
    np.testing.assert_allclose(np.asarray(xr) @ np.asarray(wr).T, x @ w.T, rtol=1e-5, atol=1e-5)


def test_rotated_dequantize_of_a_padded_axis_raises():
    spec = fl.cast_spec("fp32").replace(transform=fl.Hadamard(16), pad=True)
    q = fl.quantize(jnp.ones((2, 24)), spec)
    assert q.dequantize().shape == (2, 24)
    np.testing.assert_allclose(q.dequantize(), np.ones((2, 24)), rtol=1e-6)
    with pytest.raises(ValueError, match="padded"):
        q.dequantize(rotated=True)
    # padding by whole Hadamard blocks (here for 32-wide tiles) rotates zeros into zeros: fine
    spec = fl.mxfp8(pad=True).replace(transform=fl.Hadamard(16))
    x = jnp.asarray(np.random.default_rng(6).standard_normal((2, 16)).astype(np.float32))
    q = QZ(x, spec)
    assert q.codes.shape == (2, 32)
    x_rot = DEQ(q, True)
    assert x_rot.shape == (2, 16)
    np.testing.assert_allclose(x_rot, rot(x, fl.Hadamard(16), None), rtol=0.07, atol=0.01)


def test_hadamard_and_tile_sizes_combine_by_lcm():
    # a 24-wide axis, 24-wide tiles and a Hadamard of 16: both must divide the padded length
    spec = fl.QuantSpec(elem="e4m3", tile=(1, 24), block_scale="e8m0", outer="none", pad=True)
    spec = spec.replace(transform=fl.Hadamard(16))
    q = QZ(jnp.ones((2, 24)), spec)
    assert q.codes.shape == (2, 48)
    np.testing.assert_allclose(DEQ(q, False), np.ones((2, 24)), rtol=0.1)
