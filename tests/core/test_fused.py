"""The quantizer's CPU kernel (`fp4lab.core.kernel_route`) against the reference it replaces.

`quantize_dequantize` runs the block-scaled rules as one kernel call on the CPU; the
reference is the jnp quantizer of `fp4lab.core.scaling` (`dequantized_view`), itself held to
ml_dtypes, TransformerEngine's and jax.nn's quantizers elsewhere (test_quantize, test_scaling,
test_tiny_values). Here the two must agree bit for bit, over every rule, element format, tile,
scope, rounding, layout and rotation the kernel takes, on inputs at every edge of float32's
range, under vmap, and whatever else shares a vmapped call.
"""

import dataclasses
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import cpu_kernels
from fp4lab.core import kernel_route as fused
from fp4lab.core.hadamard import Hadamard
from fp4lab.core.quantize import dequantized_view, quantize_dequantize

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler here")

H16 = Hadamard.fixed_random(16, seed=0)
SPECS = {
    "nvfp4": fl.nvfp4(),
    "nvfp4-2d": fl.nvfp4(tile=(16, 16)),
    "nvfp4-row": fl.nvfp4(scope="row"),
    "nvfp4-none": fl.nvfp4(scope="none"),
    "nvfp4-sr": fl.nvfp4(rounding="stochastic"),
    "nvfp4-h16-sr": fl.nvfp4(rounding="stochastic", transform=H16),
    "nvfp4-row-h16": fl.nvfp4(scope="row", transform=Hadamard(16, "random")),
    "nvfp4-e4m3-elems": fl.QuantSpec(elem="e4m3", tile=(1, 16)),
    "nvfp4-2d-h16": fl.nvfp4(tile=(16, 16), transform=Hadamard(16)),
    "nvfp4-h32-random": fl.nvfp4(transform=Hadamard(32, "random")),
    "mxfp4-h16": fl.mxfp4(transform=Hadamard(16)),
    "mxfp4": fl.mxfp4(),
    "mxfp4-ceil": fl.mxfp4(scale_rounding="ceil"),
    "mxfp4-sr": fl.mxfp4(rounding="stochastic"),
    "mxfp4-2d-ceil-sr": fl.mxfp4(tile=(32, 32), scale_rounding="ceil", rounding="stochastic"),
    "mxfp4-h32-random": fl.mxfp4(transform=Hadamard(32, "random")),
    "mxfp8": fl.mxfp8(),
    "mxfp8-e5m2-ceil": fl.mxfp8(elem="e5m2", scale_rounding="ceil"),
    "mxfp6-e2m3": fl.QuantSpec(elem="e2m3", tile=(1, 32), block_scale="e8m0", outer="none"),
    "mxfp6-e3m2-sr": fl.QuantSpec(
        elem="e3m2", tile=(1, 32), block_scale="e8m0", outer="none", rounding="stochastic"
    ),
}


def _edges(shape, seed: int) -> np.ndarray:
    """float32 values at every edge: magnitudes log-uniform over the whole range (subnormals
    included), exact grid points and ties, zeros of both signs, whole blocks of zeros, of
    subnormals and of tiny values, FLT_MAX, and rows scaled so that the scopes fall below
    2**-126 (where the outer scale is subnormal)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    mag = np.exp2(rng.uniform(-149, 128, n)).astype(np.float32)
    sign = np.where(rng.random(n) < 0.5, -1, 1).astype(np.float32)
    x = (mag * sign).reshape(shape)
    flat = x.reshape(-1, shape[-1])
    r = len(flat)
    grid = np.array([0.25, 0.5, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0], np.float32)
    for i in range(r):
        kind = i % 9
        if kind == 0:  # exact grid points and ties, in a block of max 6
            flat[i] = rng.choice(grid, shape[-1]) * np.float32(2.0 ** rng.integers(-20, 20))
        elif kind == 1:
            flat[i] = 0.0
            flat[i, ::3] = -0.0
        elif kind == 2:  # subnormals only
            flat[i] = np.float32(1e-40) * rng.standard_normal(shape[-1]).astype(np.float32)
        elif kind == 3:  # a scope below 2**-126 * 2688: S_enc above 2**126
            flat[i] = np.float32(1e-36) * rng.standard_normal(shape[-1]).astype(np.float32)
        elif kind == 4:
            flat[i] = rng.standard_normal(shape[-1]).astype(np.float32)
            flat[i, 0] = np.finfo(np.float32).max
        elif kind == 5:
            flat[i] = rng.standard_normal(shape[-1]).astype(np.float32) * np.float32(1e-30)
    return x


def _same(ref, got):
    ref, got = np.asarray(ref), np.asarray(got)
    assert ref.shape == got.shape and ref.dtype == got.dtype
    both_nan = np.isnan(ref) & np.isnan(got)
    bits = ref.view(np.uint32 if ref.dtype == np.float32 else np.uint16)
    other = got.view(bits.dtype)
    bad = ~(both_nan | (bits == other))
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} differ, e.g. x_hat {ref[bad][:4]} (reference) against "
        f"{got[bad][:4]} (kernel)"
    )


def _both(spec, rotated=True):
    """(reference, kernel): jitted functions of (x, key, amax) giving x_hat."""
    assert fused.enabled(), "FP4LAB_QUANTIZER=reference is set: the kernel is not under test"

    def ref(x, key, amax):
        return dequantized_view(x, spec, key, None, amax, rotated)[0]

    def kernel(x, key, amax):
        return quantize_dequantize(x, spec, key=key, amax=amax, rotated=rotated)

    return jax.jit(ref), jax.jit(kernel)


def _each_clone(monkeypatch):
    """Forces each clone of the kernel's element loops this CPU runs in turn (FP4LAB_CPU_CLONE),
    yielding its name."""
    for clone in cpu_kernels.clones():
        monkeypatch.setenv("FP4LAB_CPU_CLONE", clone)
        assert fused.enabled() == clone
        yield clone


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("axis", [-1, 0])
def test_kernel_equals_reference_bit_for_bit_in_every_clone(name, axis, monkeypatch):
    """The grid through every clone (x86-64: AVX-512F, AVX2 and SSE2, those this CPU runs)."""
    spec = SPECS[name].replace(axis=axis)
    assert fused.supports(spec, jax.random.key(0), None)
    ref = _both(spec)[0]
    xs = [jnp.asarray(_edges((64, 128), seed)) for seed in range(3)]
    keys = [jax.random.key(seed) for seed in range(3)]
    want = [ref(x, key, None) for x, key in zip(xs, keys, strict=True)]
    for clone in _each_clone(monkeypatch):
        kernel = _both(spec)[1]  # traced anew: the clone is an attribute of the call
        lowered = kernel.lower(xs[0], keys[0], None).as_text()
        assert f"clone = {cpu_kernels.CLONES.index(clone) + 1}" in lowered, clone
        for x, key, w in zip(xs, keys, want, strict=True):
            _same(w, kernel(x, key, None))


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-sr", "mxfp4-ceil", "mxfp6-e3m2-sr"])
def test_rows_with_a_tail_in_every_clone(name, monkeypatch):
    """Blocked in place along axis 0, a row is the 72 columns: vectors of every clone's width
    (4, 8 or 16 lanes) and a tail of scalars after them (72 = 4 * 16 + 8), the saturation
    count included."""
    spec = SPECS[name].replace(axis=0)
    ref = _both(spec)[0]
    x = jnp.asarray(_edges((64, 72), 8))
    key = jax.random.key(5)
    want = ref(x, key, None)
    counts = set()
    for _ in _each_clone(monkeypatch):
        _same(want, _both(spec)[1](x, key, None))
        view = x.reshape(1, 64 // spec.tile[1], spec.tile[1], 72, 1)  # (P, L/tx, tx, Q, 1)
        _, sat = fused.dequantized_blocks(view, spec, key, None, in_place=True, count=True)
        counts.add(float(sat))
    assert len(counts) == 1 and counts.pop() > 0


def test_the_clones_and_a_clone_that_cannot_run(monkeypatch):
    here = cpu_kernels.clones()
    assert here[0] == "baseline" and set(here) <= set(cpu_kernels.CLONES)
    if platform.machine() == "x86_64":  # the widest this CPU has runs by default
        flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
        assert ("avx2" in here) == (" avx2" in flags), (here, "avx2")
        assert ("avx512f" in here) == (" avx512f" in flags), (here, "avx512f")
    monkeypatch.delenv("FP4LAB_CPU_CLONE", raising=False)
    assert cpu_kernels.clone() == here[-1]
    # unforced, a program names no clone: the CPU that runs it picks its widest
    lowered = jax.jit(lambda x: fl.fake_quant(x, fl.nvfp4())).lower(jnp.ones((16, 16))).as_text()
    assert "fp4lab_quantize" in lowered and "clone = 0" in lowered
    monkeypatch.setenv("FP4LAB_CPU_CLONE", "neon9")
    with pytest.raises(ValueError, match="FP4LAB_CPU_CLONE='neon9'.*baseline"):
        fused.enabled()
    # the kernel refuses a clone the CPU lacks, rather than run it (or another)
    x = jnp.ones((16, 16), jnp.float32).reshape(1, 16, 1, 16)
    call = jax.ffi.ffi_call(
        "fp4lab_quantize",
        [jax.ShapeDtypeStruct((16, 16), jnp.float32)]
        + [jax.ShapeDtypeStruct((1,), jnp.float32)] * 2,
    )
    attrs = dict(
        pa=1,
        t1=16,
        nb=1,
        t2=16,
        unb=256,
        rule=1,
        scope=0,
        given=0,
        sr=0,
        stream=0,
        kmin=np.int64(127),
        mbits=1,
        emax=2,
        vmax=np.float32(6),
        inv_max=np.float32(1 / 6),
        rotate=0,
        hk=0,
        sign=0,
        rest=np.float32(1),
        count=0,
    )
    args = (x.reshape(16, 16), jnp.zeros(2, jnp.uint32), jnp.zeros(1), jnp.ones(16))
    assert np.asarray(call(*args, **attrs, clone=1)[0]).tolist() == np.ones((16, 16)).tolist()
    with pytest.raises(Exception, match="no such clone"):
        jax.block_until_ready(call(*args, **attrs, clone=9))


@pytest.mark.parametrize("scale", [1.0, 1e-36, 1e-39, 1e-44, 5e37])
def test_whole_tensors_at_the_ends_of_the_range(scale):
    """Scopes whose S_enc exceeds 2**126 (a subnormal outer scale), and ones near FLT_MAX."""
    rng = np.random.default_rng(1)
    x = jnp.asarray((rng.standard_normal((32, 64)) * scale).astype(np.float32))
    for name in ("nvfp4", "nvfp4-2d", "nvfp4-sr", "mxfp4", "mxfp4-ceil", "mxfp8-e5m2-ceil"):
        ref, kernel = _both(SPECS[name])
        _same(ref(x, jax.random.key(2), None), kernel(x, jax.random.key(2), None))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs(bad):
    x = np.asarray(_edges((32, 64), 4))
    x[3, 5] = bad
    x[20, 40:48] = bad
    for name in ("nvfp4", "nvfp4-row", "nvfp4-2d", "mxfp4", "mxfp4-ceil", "nvfp4-sr"):
        ref, kernel = _both(SPECS[name])
        got = kernel(jnp.asarray(x), jax.random.key(0), None)
        _same(ref(jnp.asarray(x), jax.random.key(0), None), got)
        assert np.isnan(np.asarray(got)[20, 40]), "a non-finite block dequantizes to NaN"


def test_a_zero_tensor_stays_zero():
    x = jnp.zeros((16, 64), jnp.float32)
    for name in ("nvfp4", "nvfp4-row", "mxfp4", "mxfp4-ceil"):
        ref, kernel = _both(SPECS[name])
        got = kernel(x, None, None)
        _same(ref(x, None, None), got)
        assert not np.asarray(got).any()


@pytest.mark.parametrize("amax", [1.0, 1e-38, 3e38, 0.02])
def test_a_given_amax(amax):
    """Delayed scaling: the tensor scope's amax given (here smaller or larger than x's)."""
    spec = fl.nvfp4(amax_history=4)
    ref, kernel = _both(spec)
    x = jnp.asarray(_edges((32, 64), 5))
    a = jnp.float32(amax)
    _same(ref(x, None, a), kernel(x, None, a))


def test_layouts_padding_rotation_and_dtypes():
    """A middle axis blocked in place, a padded axis, the unrotated domain, bfloat16 input."""
    rng = np.random.default_rng(7)
    x3 = jnp.asarray(rng.standard_normal((4, 64, 10)).astype(np.float32))
    for spec in (
        fl.nvfp4(axis=1),
        fl.nvfp4(axis=1, rounding="stochastic"),
        fl.mxfp4(axis=1),
        fl.nvfp4(axis=1, rounding="stochastic", transform=Hadamard(16, "random")),  # in the kernel
    ):
        ref, kernel = _both(spec)
        _same(ref(x3, jax.random.key(1), None), kernel(x3, jax.random.key(1), None))
    xp = jnp.asarray(rng.standard_normal((5, 40)).astype(np.float32))
    ref, kernel = _both(fl.nvfp4(tile=(16, 16), pad=True))
    _same(ref(xp, None, None), kernel(xp, None, None))
    ref, kernel = _both(SPECS["nvfp4-h16-sr"], rotated=False)
    _same(ref(xp[:, :32], jax.random.key(3), None), kernel(xp[:, :32], jax.random.key(3), None))
    xb = jnp.asarray(rng.standard_normal((8, 64)), jnp.bfloat16)
    ref, kernel = _both(fl.nvfp4())
    _same(ref(xb, None, None), kernel(xb, None, None))


def test_vmap_each_member_as_alone_and_as_the_reference():
    """Batched (a seed vmap): each member's x_hat is its own, the reference's batched, and its
    value alone, whatever else shares the call; the keys batched too."""
    xs = jnp.asarray(np.stack([_edges((32, 64), s) for s in range(4)]))
    keys = jax.random.split(jax.random.key(9), 4)
    # along axis 0 the two Hadamard specs rotate in the kernel, with each member's own signs
    rotating = [dataclasses.replace(SPECS[n], axis=0) for n in ("nvfp4-h16-sr", "mxfp4-h32-random")]
    for spec in [SPECS[n] for n in ("nvfp4", "nvfp4-row", "nvfp4-sr", "mxfp4-sr")] + rotating:
        ref, kernel = _both(spec)
        batched = jax.vmap(kernel)(xs, keys, None)
        _same(jax.vmap(ref)(xs, keys, None), batched)
        for i in range(4):
            _same(kernel(xs[i], keys[i], None), batched[i])
        # nested: a vmap over seeds of a vmap over micro-batches
        nested = jax.vmap(jax.vmap(kernel, in_axes=(0, None, None)))(
            xs.reshape(2, 2, 32, 64), keys[:2], None
        )
        _same(
            jax.vmap(jax.vmap(ref, in_axes=(0, None, None)))(
                xs.reshape(2, 2, 32, 64), keys[:2], None
            ),
            nested,
        )


def test_the_public_path_takes_the_kernel_and_can_be_told_not_to(monkeypatch):
    x = jnp.asarray(_edges((32, 64), 2))
    lowered = jax.jit(lambda x: quantize_dequantize(x, fl.nvfp4())).lower(x).as_text()
    assert "fp4lab_quantize" in lowered
    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    assert not fused.enabled()
    lowered = jax.jit(lambda x: quantize_dequantize(x, fl.mxfp4())).lower(x).as_text()
    assert "fp4lab_quantize" not in lowered


def test_what_the_kernel_does_not_take_runs_the_reference():
    key = jax.random.key(0)
    for spec in (
        fl.nvfp4(four_over_six="mae"),
        fl.nvfp4(convention="jax"),
        fl.QuantSpec(elem="e2m1", tile=(1, 16), block_scale="fp32", outer="none"),
        fl.QuantSpec(elem="int4", tile=(1, 16), block_scale="fp32", outer="none"),
        fl.fp8(),
        fl.cast_spec("bf16"),
    ):
        assert not fused.supports(spec, key, None), spec
    assert not fused.supports(fl.nvfp4(scope="row"), key, jnp.ones(3))  # one amax per row
    assert not fused.supports(fl.nvfp4(rounding="stochastic"), jax.random.PRNGKey(0)[:1], None)


def test_gradients_are_the_references():
    """quantize_dequantize has no straight-through gradient (fake_quant has): both paths give
    the same (zero) derivative."""
    x = jnp.asarray(_edges((16, 32), 3))
    spec = fl.nvfp4()
    ref, kernel = _both(spec)
    g_ref = jax.grad(lambda x: ref(x, None, None).sum())(x)
    g_got = jax.grad(lambda x: kernel(x, None, None).sum())(x)
    _same(g_ref, g_got)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-2d", "mxfp4", "nvfp4-sr"])
def test_the_saturation_count_is_the_same_in_every_clone(name, monkeypatch):
    """The kernel's count of saturated elements (the statistics' `saturated`, held to the jnp
    statistics in test_fused_stats for the widest clone) and x_hat, in every clone."""
    spec = SPECS[name]
    t1, t2 = spec.tile
    x = jnp.asarray(_edges((64, 128), 6))
    xb = x.reshape(64 // t1, t1, 128 // t2, t2)
    got = {}
    for clone in _each_clone(monkeypatch):
        x_hat, sat = fused.dequantized_blocks(
            xb, spec, jax.random.key(4), None, in_place=False, count=True
        )
        got[clone] = (np.asarray(x_hat), np.asarray(sat))
    first = got[cpu_kernels.clones()[-1]]
    assert first[1] > 0  # the edges saturate some elements
    for clone, (x_hat, sat) in got.items():
        _same(first[0], x_hat)
        assert sat == first[1], (clone, sat, first[1])
