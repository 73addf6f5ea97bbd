"""Tiny inputs: block maxima and tensor maxima from 2**-149 to 2**-100, against references.

XLA's CPU code flushes float32 subnormals (results below 2**-126 are written as 0, operands
below it read as 0). The scales of these inputs pass through that range (E8M0's 2**-127, an
outer scale 1 / S_enc for S_enc > 2**126), and the quantizer must not lose them there: every
x_hat that is a normal float32 in the reference is returned exactly.

The references are the documented formulas (docs/architecture.md, "Numerics") in float64
NumPy, rounded to float32 at each step the formula computes in float32 (NumPy keeps
subnormals: IEEE gradual underflow), element and scale casts through ml_dtypes after
clamping. What the CPU backend cannot represent is pinned, as the docs state it: an x_hat
below the normal range is 0 (of its sign); an input below the normal range reads as 0, so its
own code is not compared.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import formats
from fp4lab.core.stats import operand_stats

TINY = float(np.finfo(np.float32).tiny)  # 2**-126
FLT_MAX = float(np.finfo(np.float32).max)
ML = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}
EXPONENTS = np.arange(-149, -99)  # the magnitudes swept: 2**k * (1 + f), f in [0, 1)


def f32(v):
    """v (float64) rounded to float32, subnormals kept; back as float64."""
    with np.errstate(over="ignore"):
        return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def cast(v, name):
    """Float32 values v rounded to nearest even on `name`'s grid after clamping to +-max."""
    m = formats.get_format(name).max
    return np.clip(f32(v), -m, m).astype(np.float32).astype(ML[name]).astype(np.float64)


def mantissas(rng, n):
    """n values in [-2, 2), the first one of magnitude in [1, 2) (the block max's binade)."""
    v = rng.uniform(-2.0, 2.0, n)
    v[0] = rng.uniform(1.0, 2.0)
    return v


# ---------------------------------------------------------------------------------------------
# References.


def ref_mx(x, elem, rounding):
    """(shared exponents, q, x_hat) of OCP MX on rows of 32: shared = floor(log2 amax) - emax
    ("floor") or ceil(log2(f32(amax / max))) ("ceil"), clamped to [-127, 127 - emax]."""
    fmt = formats.get_format(elem)
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    if rounding == "floor":
        _, e = np.frexp(amax)
        shared = np.where(amax > 0, e - 1 - fmt.emax, -127)
    else:
        r = f32(amax / fmt.max)
        m, e = np.frexp(r)
        shared = np.where(r > 0, np.where(m == 0.5, e - 1, e), -127)
    shared = np.clip(shared, -127, 127 - fmt.emax)
    q = cast(xb * np.ldexp(1.0, -shared), elem)
    x_hat = f32(q * np.ldexp(1.0, shared))
    return shared[..., 0], q.reshape(x.shape), x_hat.reshape(x.shape)


def ref_nvfp4_te(x):
    """(S_dec, s_b, q, x_hat) of NVFP4 "te" with one tensor scale and 1x16 blocks."""
    xb = x.reshape(x.shape[0], -1, 16)
    amax_b = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        s_enc = min(f32(448.0 * 6.0 / np.abs(x).max()), FLT_MAX)
    s_enc = 1.0 if s_enc == 0 else s_enc
    s_dec = f32(1.0 / s_enc)
    s_b = cast(np.minimum(f32(amax_b * f32(s_enc * f32(1.0 / 6.0))), FLT_MAX), "e4m3")
    with np.errstate(divide="ignore"):
        e_b = np.minimum(f32(1.0 / f32(s_b * s_dec)), FLT_MAX)
    q = cast(xb * e_b, "e2m1")
    x_hat = f32(f32(q * s_b) * s_dec)
    return s_dec, s_b[..., 0], q.reshape(x.shape), x_hat.reshape(x.shape)


def r24(v):
    """v rounded to float32's 24 significant bits, without float32's exponent range."""
    m, e = np.frexp(v)
    return np.ldexp(f32(m), e)


def ref_nvfp4_jax(x, g=None):
    """(g, s_b, q, x_hat) of NVFP4 "jax": g = f32(amax / 2688) (1 where 0) unless given,
    x' = x * (1 / g) (XLA's compiled x / g, 1 / g to 24 bits), s_b = e4m3(amax_b(x') / 6),
    q = e2m1(x' / s_b)."""
    if g is None:
        g = f32(np.abs(x).max() / 2688.0)
        g = 1.0 if g == 0 else g
    xp = f32(x * r24(1.0 / g)).reshape(x.shape[0], -1, 16)
    s_b = cast(np.clip(f32(np.abs(xp).max(axis=-1, keepdims=True) / 6.0), 0, 448), "e4m3")
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(xp == 0, xp, f32(xp / s_b))
    q = cast(v, "e2m1")
    x_hat = f32(f32(q * s_b) * g)
    return g, s_b[..., 0], q.reshape(x.shape), x_hat.reshape(x.shape)


def ref_fp8(x, elem):
    """(outer, q, x_hat) of FP8 per-tensor scaling: enc = min(max / amax, FLT_MAX)."""
    amax = np.abs(x).max()
    with np.errstate(divide="ignore"):
        enc = min(f32(formats.get_format(elem).max / amax), FLT_MAX)
    enc = 1.0 if amax == 0 else enc
    outer = f32(1.0 / enc)
    q = cast(x * enc, elem)
    return outer, q, f32(q * outer)


def assert_x_hat(got, ref, x):
    """Exact where the reference is a normal float32 (or 0); below the normal range, and for
    inputs below it (read as 0), the CPU backend gives a zero of the reference's sign, other
    backends the reference itself."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    below = (ref != 0) & ((np.abs(ref) < TINY) | (np.abs(x) < TINY))
    np.testing.assert_array_equal(got[~below], ref[~below])
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(got[below], 0.0)
        np.testing.assert_array_equal(np.signbit(got[below]), np.signbit(ref[below]))
    else:
        np.testing.assert_array_equal(got[below], ref[below])


def assert_codes(values, ref_q, x):
    """Grid values equal where the input is a normal float32 (the CPU reads the rest as 0)."""
    read = np.abs(x) >= TINY
    np.testing.assert_array_equal(np.asarray(values, np.float64)[read], ref_q[read])


def run(x, spec):
    q = fl.quantize(x, spec)
    return q.scale, q.outer, q.values(), q.dequantize(), fl.fake_quant(x, spec)


run_jit = jax.jit(run, static_argnums=1)


def quantized(x, spec, jit):
    """(scale, outer, values, x_hat of the QTensor, x_hat of fake_quant)."""
    return [np.asarray(a, np.float64) for a in (run_jit if jit else run)(jnp.asarray(x), spec)]


# ---------------------------------------------------------------------------------------------
# MX: one block per magnitude.


def mx_data(seed=0):
    """One row of 32 per magnitude 2**k, k in EXPONENTS; row max in [2**k, 2**(k+1))."""
    rng = np.random.default_rng(seed)
    x = np.stack([np.ldexp(mantissas(rng, 32), k) for k in EXPONENTS])
    return x.astype(np.float32)


MX = [
    ("e2m1", "floor", fl.mxfp4()),
    ("e2m1", "ceil", fl.mxfp4(scale_rounding="ceil")),
    ("e4m3", "floor", fl.mxfp8()),
    ("e4m3", "ceil", fl.mxfp8(scale_rounding="ceil")),
    ("e5m2", "floor", fl.mxfp8(elem="e5m2")),
]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("elem,rounding,spec", MX, ids=[f"{e}-{r}" for e, r, _ in MX])
def test_mx_tiny_blocks_match_the_reference(elem, rounding, spec, jit):
    x = mx_data()
    shared, q_ref, x_hat_ref = ref_mx(x.astype(np.float64), elem, rounding)
    scale, _, values, x_hat, fake = quantized(x, spec, jit)
    np.testing.assert_array_equal(scale.reshape(shared.shape), np.ldexp(1.0, shared))
    assert_codes(values, q_ref, x)
    assert_x_hat(x_hat, x_hat_ref, x)
    assert_x_hat(fake, x_hat_ref, x)
    assert np.any((x_hat_ref != 0) & (np.abs(x_hat_ref) < 2.0**-119))  # the range is covered


def test_mx_ceil_at_the_subnormal_ratio_boundary():
    # amax / 6 just above and at 2**-127 + 2**-150 (the midpoint to the next subnormal): the
    # float32 ratio rounds to 2**-127 + 2**-149 (shared -126) or to 2**-127 (shared -127)
    x = np.zeros((3, 32), np.float32)
    x[0, 0] = np.nextafter(np.float32(6.0 * (2.0**-127 + 2.0**-150)), np.float32(1))
    x[1, 0] = np.nextafter(np.float32(6.0 * (2.0**-127 + 2.0**-150)), np.float32(0))
    x[2, 0] = np.float32(6.0 * 2.0**-127) * np.float32(1.5)
    shared, _, x_hat_ref = ref_mx(x.astype(np.float64), "e2m1", "ceil")
    assert list(shared.ravel()) == [-126, -127, -126]
    scale, _, _, x_hat, _ = quantized(x, fl.mxfp4(scale_rounding="ceil"), True)
    np.testing.assert_array_equal(scale.reshape(shared.shape), np.ldexp(1.0, shared))
    assert_x_hat(x_hat, x_hat_ref, x)


# ---------------------------------------------------------------------------------------------
# Per-tensor outer scales: one tensor per magnitude.


def tensor_data(k, seed=0):
    """A (4, 32) tensor with max in [2**k, 2**(k+1)) and blocks spread down to 2**(k-12)."""
    rng = np.random.default_rng(seed + int(k) + 200)
    rows = [np.ldexp(mantissas(rng, 32), k - j) for j in (0, 3, 7, 12)]
    return np.stack(rows).astype(np.float32)


def magnitudes(jit):
    """Every magnitude under jit; every fifth one eagerly (op by op is slower)."""
    return EXPONENTS if jit else EXPONENTS[::5]


def unread_scope(x, outer, *x_hats):
    """On the CPU a tensor whose amax is below 2**-126 reads as 0: quantized as an all-zero
    tensor (outer scale 1, x_hat 0; the reference's x_hat lies below the normal range too).
    Whether x is such a case, after checking that."""
    if jax.default_backend() != "cpu" or np.abs(x).max() >= TINY:
        return False
    assert outer.ravel()[0] == 1.0
    for x_hat in x_hats:
        np.testing.assert_array_equal(x_hat, 0.0)
    return True


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nvfp4_te_tiny_tensors_match_the_reference(jit):
    spec = fl.nvfp4()
    covered = False
    for k in magnitudes(jit):
        x = tensor_data(k)
        s_dec, s_b, q_ref, x_hat_ref = ref_nvfp4_te(x.astype(np.float64))
        scale, outer, values, x_hat, fake = quantized(x, spec, jit)
        assert outer.ravel()[0] == s_dec, k
        live = s_b.ravel() > 0
        block_read = np.abs(x).reshape(-1, 16).max(axis=-1) >= TINY
        sel = live & block_read
        np.testing.assert_array_equal(scale.ravel()[sel], s_b.ravel()[sel], err_msg=str(k))
        assert_codes(values, q_ref, x)
        assert_x_hat(x_hat, x_hat_ref, x)
        assert_x_hat(fake, x_hat_ref, x)
        covered |= bool(np.any(np.abs(x_hat_ref) >= TINY) and s_dec < TINY)
    assert covered  # a subnormal S_dec with normal x_hat values was among the cases


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nvfp4_jax_tiny_tensors_match_the_reference(jit):
    spec = fl.nvfp4(convention="jax")
    for k in magnitudes(jit):
        x = tensor_data(k)
        scale, outer, values, x_hat, fake = quantized(x, spec, jit)
        if unread_scope(x, outer, x_hat, fake):
            continue
        g, s_b, q_ref, x_hat_ref = ref_nvfp4_jax(x.astype(np.float64))
        amax = float(np.abs(x).max())
        fake_ref = x_hat_ref
        if amax >= 2688 * TINY:  # g is normal: XLA may compile amax / 2688 as amax * (1 / 2688)
            by_inverse = ref_nvfp4_jax(x.astype(np.float64), f32(amax * f32(1 / 2688)))
            assert outer.ravel()[0] in (g, by_inverse[0]), k
            if not np.array_equal(fake, x_hat_ref):  # fake_quant is compiled, quantize eager
                fake_ref = by_inverse[3]
            if outer.ravel()[0] != g:
                g, s_b, q_ref, x_hat_ref = by_inverse
        assert outer.ravel()[0] == g, k
        sel = (s_b.ravel() > 0) & (np.abs(x).reshape(-1, 16).max(axis=-1) >= TINY)
        np.testing.assert_array_equal(scale.ravel()[sel], s_b.ravel()[sel], err_msg=str(k))
        read = np.repeat(sel, 16).reshape(x.shape) & (np.abs(x) >= TINY)
        np.testing.assert_array_equal(values[read], q_ref[read], err_msg=str(k))
        assert_x_hat(x_hat, x_hat_ref, x)
        assert_x_hat(fake, fake_ref, x)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_fp8_per_tensor_tiny_tensors_match_the_reference(elem, jit):
    spec = fl.fp8(elem)
    for k in magnitudes(jit):
        x = tensor_data(k)
        outer_ref, q_ref, x_hat_ref = ref_fp8(x.astype(np.float64), elem)
        _, outer, values, x_hat, fake = quantized(x, spec, jit)
        if unread_scope(x, outer, x_hat, fake):
            continue
        assert outer.ravel()[0] == outer_ref, k
        assert_codes(values, q_ref, x)
        assert_x_hat(x_hat, x_hat_ref, x)
        assert_x_hat(fake, x_hat_ref, x)


# ---------------------------------------------------------------------------------------------
# The example of the report, a GEMM, and the telemetry of such operands.


def test_mxfp8_block_near_1e_36_dequantizes_and_multiplies():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [1.13e-36, -1.13e-36, -1.04e-36, -0.94e-36]
    q = fl.quantize(jnp.asarray(x), fl.mxfp8())
    np.testing.assert_array_equal(np.asarray(q.codes)[0, :4], [116, 244, 243, 242])
    assert float(q.scale.ravel()[0]) == 2.0**-127
    x_hat = np.asarray(q.dequantize(), np.float64)
    np.testing.assert_array_equal(x_hat[0, :4], np.array([192, -192, -176, -160]) * 2.0**-127)
    w = np.zeros((32, 1), np.float32)
    w[0, 0] = 1.0
    for recipe in ("mxfp8", fl.GemmRecipe(fprop_x=fl.mxfp8(), fprop_w=fl.mxfp8())):

        def gemm(a, b, recipe=recipe):
            dn = (((1,), (0,)), ((), ()))
            return fl.qdot_general(a, b, dn, recipe)

        for f in (gemm, jax.jit(gemm)):
            y = float(f(jnp.asarray(x), jnp.asarray(w))[0, 0])
            assert y == 192 * 2.0**-127, (recipe, y)  # 1.128e-36, not 0


TELEMETRY = {
    "mxfp8": fl.mxfp8(),
    "mxfp4-ceil": fl.mxfp4(scale_rounding="ceil"),
    "nvfp4": fl.nvfp4(),
    "fp8": fl.fp8(),
}


@pytest.mark.parametrize("spec", list(TELEMETRY.values()), ids=list(TELEMETRY))
@pytest.mark.parametrize("method", ["fused", "reference"])
def test_telemetry_measures_the_x_hat_the_quantizer_returns(spec, method):
    x = np.concatenate([tensor_data(-120), tensor_data(-125)], axis=1)  # (4, 64)
    x_hat, stats = operand_stats(jnp.asarray(x), spec, method=method)
    direct = np.asarray(fl.quantize(jnp.asarray(x), spec).dequantize())
    np.testing.assert_array_equal(np.asarray(x_hat), direct)
    assert np.any(direct != 0)
    xd, hd = x.astype(np.float64), direct.astype(np.float64)
    read = np.abs(xd) >= TINY  # inputs below the normal range read as 0 here, also for stats
    flush = np.sum(read & (hd == 0)) / np.sum(read)
    xd = np.where(read, xd, 0.0)
    rel = np.linalg.norm(hd - xd) / np.linalg.norm(xd)
    assert float(stats[2]) == np.float32(flush)  # flush, as fp4lab.schema.STATS orders them
    if method == "fused":  # the reference's float32 sums of squares underflow at this size
        np.testing.assert_allclose(float(stats[0]), rel, rtol=1e-5)
