"""Scale rules against independent references.

NVFP4 "te": a NumPy transcription of docs/architecture.md §2, following TransformerEngine's
reference quantizer (reference_nvfp4.py) for the order of operations. NVFP4 "jax": jax's own
quantizer. MX: a NumPy reference reading exponents with np.frexp, and jax's RCEIL cast. Element
and scale casts in the references go through ml_dtypes after clamping (ml_dtypes does not
saturate).

Data avoid float32-subnormal intermediates where bit identity is claimed: XLA on CPU flushes
float32 subnormals to zero, NumPy does not (tests of such inputs are in test_quantize.py).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax._src.cudnn.scaled_matmul_stablehlo import (
    BlockScaleConfig,
    cast_to_e8m0_with_rounding_up,
)
from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jax_quantize

import fp4lab as fl
from fp4lab.core import formats, scaling

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
ML = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}

SHAPE = (32, 64)  # every case is embedded in this shape: one compilation per spec


class Q(NamedTuple):
    codes: jax.Array
    scale: jax.Array
    outer: jax.Array
    values: jax.Array
    x_hat: jax.Array
    e8m0: jax.Array | None  # E8M0 codes of the block scales (MX specs)


@functools.partial(jax.jit, static_argnums=1)
def run(x, spec):
    q = fl.quantize(x, spec)
    e8m0 = formats.encode(q.scale, "e8m0") if spec.block_scale == "e8m0" else None
    return Q(q.codes, q.scale, q.outer, q.values(), q.dequantize(), e8m0)


def embed(x):
    out = np.zeros(SHAPE, np.float32)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def cast(v, name):
    """RNE to `name` after clamping to +-max, as float32."""
    m = F32(formats.get_format(name).max)
    return np.clip(v, -m, m).astype(ML[name]).astype(np.float32)


def blocks(a, tile):
    r, k = a.shape
    return a.reshape(r // tile[0], tile[0], k // tile[1], tile[1])


def unblocks(a):
    rb, ty, kb, tx = a.shape
    return a.reshape(rb * ty, kb * tx)


# ---------------------------------------------------------------------------------------------
# Data.


def datasets():
    rng = np.random.default_rng(0)
    out = {
        "normal": rng.standard_normal((32, 64)),
        "student_t": rng.standard_t(1.5, (32, 64)),
        "lognormal": rng.lognormal(0.0, 2.5, (32, 64)) * rng.choice([-1, 1], (32, 64)),
    }
    edge = rng.standard_normal((32, 64))
    edge[0, 0] = 2688.0  # tensor amax 6 * 448: S_enc = 1 (te) and g = 1 (jax)
    edge[1, 16:32] = 1e-9 * (1 + rng.random(16))  # block scale underflows to 0 in E4M3
    edge[2, 0:16] = 2.0 ** rng.integers(-6, 6, 16)  # exact powers of two
    # block amax 3 -> s_b = 0.5, e_b = 2: every E2M1 midpoint is an exact tie
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]) * 0.5
    edge[3, 0:16] = np.r_[mids, -mids]
    edge[3, 16:32] = -edge[3, 0:16]
    edge[4, 32:48] = 2.0**-20  # tiny but normal E4M3 scale range after scaling
    out["edge"] = edge
    return {k: v.astype(np.float32) for k, v in out.items()}


DATA = datasets()


def with_zero_blocks(x, tile=(1, 16)):
    x = x.copy()
    x[: tile[0], : tile[1]] = 0.0
    x[-tile[0] :, -tile[1] :] = 0.0
    return x


# ---------------------------------------------------------------------------------------------
# NVFP4, convention "te".


def ref_nvfp4_te(x, tile, scope, four_over_six=None):
    """(q, s_b, S_dec, x_hat) as TransformerEngine's reference quantizer computes them."""
    ty, tx = tile
    xb = blocks(x, tile)
    amax_b = np.abs(xb).max(axis=(1, 3), keepdims=True)  # (Rb, 1, Kb, 1)
    if scope == "tensor":
        amax_s = np.abs(x).max().reshape(1, 1, 1, 1)
    else:
        amax_s = np.abs(x).max(axis=1).reshape(-1, 1, 1, 1)
    emax = F32(256.0 if four_over_six else 448.0)
    six = F32(6.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.minimum(emax * six / amax_s, FLT_MAX)
        s_enc = np.where(s_enc == 0, F32(1.0), s_enc).astype(F32)
        s_dec = (F32(1.0) / s_enc).astype(F32)
        if four_over_six is None:
            s_b = cast(np.minimum(amax_b * (s_enc * (F32(1.0) / six)), FLT_MAX), "e4m3")
            e_b = np.minimum(F32(1.0) / (s_b * s_dec), FLT_MAX)
            q = cast(xb * e_b, "e2m1")
        else:
            base = amax_b / six * s_enc
            cands = []
            for mult in (F32(1.5), F32(1.0)):  # map-to-4, map-to-6
                s = cast(base * mult, "e4m3")
                e = np.minimum(F32(1.0) / (s * s_dec), FLT_MAX)
                qc = cast(xb * e, "e2m1")
                err = np.zeros(xb.shape[:-1], F32)  # (Rb, ty, Kb): one error per block row
                for i in range(tx):
                    val = qc[..., i] * s[..., 0]
                    val = val * amax_s[..., 0]
                    val = val / F32(6.0 * 256.0)
                    diff = val - xb[..., i]
                    err = err + (diff * diff if four_over_six == "mse" else np.abs(diff))
                if ty == 16:  # TE's warp-reduction order
                    err = err[:, 0:8] + err[:, 8:16]
                    err = err[:, 0:4] + err[:, 4:8]
                    err = err[:, 0:2] + err[:, 2:4]
                    err = err[:, 0:1] + err[:, 1:2]
                cands.append((qc, s, err[..., None]))
            (q4, s4, err4), (q6, s6, err6) = cands
            pick4 = err4 < err6  # ties keep map-to-6
            q = np.where(pick4, q4, q6)
            s_b = np.where(pick4, s4, s6)
        x_hat = q * s_b * s_dec
    return unblocks(q), s_b, s_dec, unblocks(x_hat)


TE_CASES = [
    ((1, 16), "tensor", None),
    ((16, 16), "tensor", None),
    ((1, 16), "row", None),
    ((1, 16), "tensor", "mae"),
    ((1, 16), "tensor", "mse"),
    ((16, 16), "tensor", "mae"),
    ((16, 16), "tensor", "mse"),
    ((1, 16), "row", "mae"),
    ((1, 16), "row", "mse"),
]


@pytest.mark.parametrize("tile,scope,fos", TE_CASES)
@pytest.mark.parametrize("data", sorted(DATA))
def test_nvfp4_te_bit_identical_to_reference(data, tile, scope, fos):
    x = with_zero_blocks(DATA[data], tile)
    q_ref, s_ref, s_dec, x_hat_ref = ref_nvfp4_te(x, tile, scope, fos)
    qt = run(jnp.asarray(x), fl.nvfp4(tile=tile, scope=scope, four_over_six=fos))
    np.testing.assert_array_equal(qt.values, q_ref)
    np.testing.assert_array_equal(qt.scale, s_ref)
    np.testing.assert_array_equal(np.broadcast_to(qt.outer, s_dec.shape), s_dec)
    np.testing.assert_array_equal(qt.x_hat, x_hat_ref)
    # codes are the E2M1 bit patterns of the values
    np.testing.assert_array_equal(qt.codes, q_ref.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))


def test_four_over_six_really_chooses_both_candidates():
    x = DATA["normal"]
    amax_b = np.abs(blocks(x, (1, 16))).max(axis=(1, 3), keepdims=True)
    base = amax_b / F32(6) * (F32(1536) / np.abs(x).max())
    s4, s6 = cast(base * F32(1.5), "e4m3"), cast(base, "e4m3")
    for mode in ("mae", "mse"):
        s = np.asarray(run(jnp.asarray(x), fl.nvfp4(four_over_six=mode)).scale)
        assert np.all((s == s4) | (s == s6))
        assert 0.1 < np.mean(s == s4) < 0.9  # both candidates are chosen on normal data


def test_four_over_six_tie_keeps_map_to_six():
    # Values on both grids: x / s6 is in {6, 3, 1.5, 0} and x / s4 in {4, 2, 1, 0},
    # so both candidates are exact, both errors are 0, and the tie keeps map-to-6.
    row = np.array([6, 3, 1.5, 0, -6, -3, -1.5, 0] * 2, np.float32)
    x = embed(row[None, :])  # the other blocks are zero
    for mode in ("mae", "mse"):
        qt = run(jnp.asarray(x), fl.nvfp4(four_over_six=mode))
        s6 = 256.0  # amax 6: S_enc = 6 * 256 / 6, s6 = e4m3(6 / 6 * S_enc); s4 would be 384
        assert np.asarray(qt.scale)[0, 0, 0, 0] == s6
        np.testing.assert_array_equal(qt.values, x)
        np.testing.assert_array_equal(qt.x_hat, x)
        _, s_ref, _, _ = ref_nvfp4_te(x, (1, 16), "tensor", mode)
        np.testing.assert_array_equal(np.asarray(qt.scale), s_ref)


def test_four_over_six_divides_like_te():
    """Blocks where a * (1 / 6) or a * (1 / 1536) in place of a true division flips the choice.

    XLA rewrites a / broadcast(b) into a * (1 / b); TE's reference divides. Found by searching
    random data; the rewritten division picked 2.0 and 0.5625 here.
    """
    bits = np.zeros((1, 48), np.uint32)
    bits[0, :16] = [1059867635, 3197412213, 3205825232, 1048641352, 3200500229, 987523368,
                    3190737404, 3199188108, 3191097269, 3189928788, 3195786619, 1046626940,
                    1026010425, 3159976469, 990812965, 3196222106]  # fmt: skip
    bits[0, 16:32] = [1048080263, 3181106051, 1038531401, 1000879777, 1048383234, 3191121789,
                      1032810584, 3180447369, 1040025809, 3181994599, 1048810842, 3165695259,
                      1043507290, 3155954933, 3187390785, 1038282465]  # fmt: skip
    bits[0, 32] = 1123506202  # the tensor amax, 123.67207
    x = embed(bits.view(np.float32))
    _, s_ref, _, x_hat = ref_nvfp4_te(x, (1, 16), "tensor", "mae")
    np.testing.assert_array_equal(s_ref[0, 0, :2, 0], [1.375, 0.8125])
    qt = run(jnp.asarray(x), fl.nvfp4(four_over_six="mae"))
    np.testing.assert_array_equal(qt.scale, s_ref)
    np.testing.assert_array_equal(qt.x_hat, x_hat)


# ---------------------------------------------------------------------------------------------
# NVFP4, convention "jax": jax's own quantizer.


def jax_reference(x):
    g = jnp.max(jnp.abs(x)) / jnp.float32(6 * 448)
    cfg = BlockScaleConfig(
        mode="nvfp4",
        block_size=16,
        data_type=jnp.float4_e2m1fn,
        scale_type=jnp.float8_e4m3fn,
        global_scale=g,
        infer_only=False,
    )
    x_q, scales = jax_quantize(x, cfg)
    return g, x_q, scales


@pytest.mark.parametrize("data", sorted(DATA))
def test_nvfp4_jax_bit_identical_to_jax_quantizer(data):
    x = jnp.asarray(DATA[data])
    g, x_q, scales = jax_reference(x)
    qt = run(x, fl.nvfp4(convention="jax"))
    np.testing.assert_array_equal(np.asarray(qt.outer).ravel(), [g])
    np.testing.assert_array_equal(
        np.asarray(qt.outer).ravel(), np.float32(np.abs(DATA[data]).max()) / np.float32(2688)
    )
    np.testing.assert_array_equal(qt.values, x_q.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(qt.codes), np.asarray(x_q).view(np.uint8))
    np.testing.assert_array_equal(
        np.asarray(qt.scale).reshape(scales.shape), scales.astype(jnp.float32)
    )
    if data == "edge":  # the underflowing block: scale 0, elements saturate like jax's x / 0
        assert np.all(np.asarray(qt.scale).reshape(scales.shape)[1, 1] == 0)
        np.testing.assert_array_equal(np.asarray(qt.values)[1, 16:32], np.full(16, 6.0))
        np.testing.assert_array_equal(np.asarray(qt.x_hat)[1, 16:32], np.zeros(16))


def test_nvfp4_jax_zero_blocks_are_exact_zeros():
    """jax's quantizer computes 0/0 = NaN elements in an all-zero block; fp4lab gives zeros.

    Only the non-zero blocks are compared with jax.
    """
    x = with_zero_blocks(DATA["normal"])
    g, x_q, scales = jax_reference(jnp.asarray(x))
    qt = run(jnp.asarray(x), fl.nvfp4(convention="jax"))
    x_hat = np.asarray(qt.x_hat)
    np.testing.assert_array_equal(x_hat[0, :16], np.zeros(16))
    np.testing.assert_array_equal(x_hat[-1, -16:], np.zeros(16))
    assert not np.any(np.isnan(x_hat))
    np.testing.assert_array_equal(np.asarray(qt.values)[0, :16], np.zeros(16))
    nonzero = np.abs(blocks(x, (1, 16))).max(axis=(1, 3)) > 0  # (R, K/16)
    s = np.asarray(qt.scale).reshape(scales.shape)
    np.testing.assert_array_equal(s[nonzero], np.asarray(scales.astype(jnp.float32))[nonzero])
    v = blocks(np.asarray(qt.values), (1, 16))[:, 0]  # (R, K/16, 16)
    jv = blocks(np.asarray(x_q.astype(jnp.float32)), (1, 16))[:, 0]
    np.testing.assert_array_equal(v[nonzero], jv[nonzero])


def test_nvfp4_jax_all_zero_tensor():
    qt = run(jnp.zeros(SHAPE), fl.nvfp4(convention="jax"))
    np.testing.assert_array_equal(qt.outer.ravel(), [1.0])  # g = 0 -> 1
    np.testing.assert_array_equal(qt.x_hat, np.zeros(SHAPE))


# ---------------------------------------------------------------------------------------------
# MX.


def ref_mx(x, elem, rounding, block=32):
    """(shared exponent, q, x_hat) of OCP MX with E8M0 scales, from np.frexp."""
    fmt = formats.get_format(elem)
    xb = x.reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    if rounding == "floor":
        m, e = np.frexp(amax)  # amax = m * 2**e, m in [0.5, 1): floor(log2 amax) = e - 1
        shared = np.where(amax > 0, e - 1 - fmt.emax, -127)
    else:
        r = amax / F32(fmt.max)  # float32 division, as the quantizer computes it
        m, e = np.frexp(r)
        shared = np.where(r > 0, np.where(m == 0.5, e - 1, e), -127)  # ceil(log2 r)
    shared = np.clip(shared, -127, 127)
    q = cast((xb.astype(np.float64) * np.ldexp(1.0, -shared)).astype(F32), elem)
    x_hat = (q * np.ldexp(1.0, shared)).astype(F32)
    return shared[..., 0], q.reshape(x.shape), x_hat.reshape(x.shape)


MX_SPECS = [
    ("e2m1", "floor", fl.mxfp4(scale_rounding="floor")),
    ("e2m1", "ceil", fl.mxfp4(scale_rounding="ceil")),
    ("e4m3", "floor", fl.mxfp8()),
    ("e4m3", "ceil", fl.mxfp8(scale_rounding="ceil")),
    ("e5m2", "floor", fl.mxfp8(elem="e5m2")),
]


def check_mx(x, elem, rounding, spec):
    shared, q_ref, x_hat_ref = ref_mx(x, elem, rounding)
    qt = run(jnp.asarray(x), spec)
    scale = np.asarray(qt.scale).reshape(shared.shape)
    np.testing.assert_array_equal(scale, np.ldexp(1.0, shared).astype(F32))
    np.testing.assert_array_equal(qt.e8m0.reshape(shared.shape), shared + 127)
    np.testing.assert_array_equal(qt.values, q_ref)
    np.testing.assert_array_equal(qt.x_hat, x_hat_ref)
    return qt


@pytest.mark.parametrize("elem,rounding,spec", MX_SPECS)
@pytest.mark.parametrize("data", sorted(DATA))
def test_mx_against_reference(data, elem, rounding, spec):
    check_mx(with_zero_blocks(DATA[data], (1, 32)), elem, rounding, spec)


@pytest.mark.parametrize("elem,rounding,spec", MX_SPECS)
def test_mx_hand_checked_cases(elem, rounding, spec):
    fmt = formats.get_format(elem)
    x = np.zeros((6, 32), np.float32)
    x[0] = np.linspace(-1, 1, 32) * 4.0  # amax exactly a power of two
    x[1] = np.linspace(-1, 1, 32) * np.nextafter(F32(8.0), F32(0))  # just below 2**3
    x[2] = np.linspace(-1, 1, 32) * F32(fmt.max)  # amax = max_elem: ceil gives 2**0
    x[3] = 1e-44  # float32 subnormal amax: the scale clamps at 2**-127, elements round to 0
    x[4] = 0.0  # zero block: scale 2**-127, values 0
    x[5] = np.linspace(-1, 1, 32) * np.nextafter(F32(fmt.max), F32(np.inf))  # just above max
    qt = check_mx(embed(x), elem, rounding, spec)
    scale = np.asarray(qt.scale)[:6, 0, 0, 0]
    log2 = np.log2(scale.astype(np.float64))
    if rounding == "floor":
        assert log2[0] == 2 - fmt.emax
        assert log2[1] == 2 - fmt.emax  # floor(log2(7.99)) = 2
        assert log2[2] == 0  # floor(log2(max)) = emax
    else:
        assert log2[0] == np.ceil(np.log2(4.0 / fmt.max))
        assert log2[1] == np.ceil(np.log2(8.0 / fmt.max))
        assert log2[2] == 0  # amax / max = 1 exactly
        assert log2[5] == 1  # a hair above max: next power
    assert scale[3] == scale[4] == F32(2.0**-127)
    x_hat = np.asarray(qt.x_hat)
    np.testing.assert_array_equal(x_hat[3:5, :32], np.zeros((2, 32)))
    np.testing.assert_array_equal(np.asarray(qt.values)[3:5, :32], np.zeros((2, 32)))
    assert not np.any(np.isnan(x_hat))


@pytest.mark.parametrize("spec", [fl.mxfp4(scale_rounding="ceil"), fl.mxfp8(scale_rounding="ceil")])
@pytest.mark.parametrize("data", sorted(DATA))
def test_mx_ceil_scale_codes_equal_jax_rceil(data, spec):
    x = with_zero_blocks(DATA[data], (1, 32))
    fmt = formats.get_format(spec.elem)
    amax = jnp.max(jnp.abs(jnp.asarray(x).reshape(32, -1, 32)), axis=-1)
    expected = cast_to_e8m0_with_rounding_up(amax / jnp.float32(fmt.max))
    qt = run(jnp.asarray(x), spec)
    np.testing.assert_array_equal(qt.e8m0.reshape(expected.shape), expected)


def test_mx_ceil_near_float32_max_stays_finite():
    # ceil(log2(amax / 6)) = 126 would round 3.5 * 2**126 up to 4 * 2**126 = inf; the exponent
    # is capped at 127 - emax_elem so that max_elem * scale is finite.
    for spec, emax in [(fl.mxfp4(scale_rounding="ceil"), 2), (fl.mxfp8(scale_rounding="ceil"), 8)]:
        x = np.full(SHAPE, np.finfo(np.float32).max, np.float32)
        x[0, 1] = 3e38
        qt = run(jnp.asarray(x), spec)
        assert np.asarray(qt.scale).ravel()[0] == F32(2.0 ** (127 - emax))
        assert np.all(np.isfinite(qt.x_hat))
        fmax = formats.get_format(spec.elem).max
        np.testing.assert_array_equal(qt.values[0, 0], fmax)


def test_mx_floor_uses_exponent_bits_not_float_log():
    # amax = 2**k * (2 - 2**-23): a float log2 rounds to k + 1; the exponent bits say k.
    for k in (-100, -30, 20, 100):
        x = np.zeros(SHAPE, np.float32)
        x[0, 0] = np.ldexp(np.nextafter(F32(2.0), F32(0)), k)
        assert np.log2(np.float32(x[0, 0])) == k + 1  # float32 log2 rounds up
        qt = run(jnp.asarray(x), fl.mxfp4())
        assert np.asarray(qt.scale).ravel()[0] == F32(np.ldexp(1.0, k - 2))


# ---------------------------------------------------------------------------------------------
# FP8 per-tensor ("current scaling") and FP32 block scales.


def ref_fp8(x, elem, scope):
    fmax = F32(formats.get_format(elem).max)
    amax = np.abs(x).max(axis=None if scope == "tensor" else 1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(fmax / amax, FLT_MAX)
    enc = np.where(amax == 0, F32(1.0), enc).astype(F32)
    q = cast(x * enc, elem)
    return q, q * (F32(1.0) / enc)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scope", ["tensor", "row"])
@pytest.mark.parametrize("data", ["normal", "student_t", "edge"])
def test_fp8_current_scaling_against_reference(data, elem, scope):
    x = DATA[data].copy()
    x[5] = 0.0  # a zero row
    q_ref, x_hat_ref = ref_fp8(x, elem, scope)
    qt = run(jnp.asarray(x), fl.fp8(elem, scope=scope))
    np.testing.assert_array_equal(qt.values, q_ref)
    np.testing.assert_array_equal(qt.x_hat, x_hat_ref)


def test_fp8_tiny_amax_uses_flt_max_scale():
    # max / amax overflows: the encode scale saturates at FLT_MAX as TE's reference does (it
    # used to fall back to 1, flushing the whole tensor to zero codes).
    x = np.full(SHAPE, 1e-37, np.float32)
    qt = run(jnp.asarray(x), fl.fp8())
    q_ref, _ = ref_fp8(x, "e4m3", "tensor")
    np.testing.assert_array_equal(qt.values, q_ref)
    assert np.all(np.asarray(qt.values) > 0)


def test_fp32_block_scales():
    x = with_zero_blocks(DATA["student_t"])
    spec = fl.QuantSpec(elem="e2m1", tile=(1, 16), block_scale="fp32", outer="none")
    qt = run(jnp.asarray(x), spec)
    xb = blocks(x, (1, 16))
    s = np.abs(xb).max(axis=(1, 3), keepdims=True) / F32(6)
    s = np.where(s == 0, F32(1), s)
    q = cast(xb / s, "e2m1")
    np.testing.assert_array_equal(qt.scale, s)
    np.testing.assert_array_equal(qt.values, unblocks(q))
    np.testing.assert_array_equal(qt.x_hat, unblocks(q * s))


@pytest.mark.parametrize("shape", [(2, 1, 4, 16), (256, 1, 64, 16), (16, 16, 8, 16)])
def test_block_and_scope_amax_against_numpy(shape):
    """The amaxes read from the float bits: max |x| per block and per scope, exactly, with
    NaN (either sign) read as +inf, -0 as 0 and float32 subnormals kept; at a size where the
    CPU's float max reductions go to a library kernel too."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))).astype(np.float32)
    flat = x.reshape(-1)
    flat[:6] = [np.nan, -np.nan, -np.inf, -0.0, 1e-42, -3e-39]  # all in the first block
    flat[16:32] = -0.0  # a block of negative zeros
    flat[32:48] = 1e-41  # a block of subnormals
    flat[48:64] = -np.inf
    xb = jnp.asarray(x)
    absx = np.where(np.isnan(x), np.inf, np.abs(x))
    amax_b = np.asarray(jax.jit(scaling.block_amax)(xb))
    expected = absx.max(axis=(1, 3), keepdims=True)
    np.testing.assert_array_equal(amax_b, expected)
    assert not np.signbit(amax_b).any()
    scope = jax.jit(scaling.scope_amax, static_argnums=1)
    rows = (("row", (2, 3)),) if shape[1] == 1 else ()  # a "row" scope takes 1D tiles only
    for outer, axes in (("tensor", None), *rows):
        want = absx.max(axis=axes, keepdims=True) if axes else absx.max(keepdims=True)
        np.testing.assert_array_equal(scope(xb, outer), want)
        np.testing.assert_array_equal(scope(xb, outer, jnp.asarray(amax_b)), want)
