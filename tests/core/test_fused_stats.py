"""The fused operand statistics (the C++ kernel of `fp4lab.core.cpu_kernels`) against
independent numpy formulas in float64, and against the reference method.

The quantizer's blocks (`quantize_blocks`: the prepared input, its grid values and x_hat in the
moved layout) are the inputs of the numpy formulas; the statistics themselves are written out
here from their definitions in `fp4lab.core.stats`.
"""

import functools
import platform
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import cpu_kernels, formats, hadamard
from fp4lab.core import stats as stats_module
from fp4lab.core.quantize import (
    dequantize_blocks,
    dequantize_terms,
    grid_values,
    quantize_blocks,
    quantize_dequantize,
)
from fp4lab.core.stats import operand_stats, operand_stats_deferred
from fp4lab.schema import STATS

H = hadamard.Hadamard
STAT = {s: i for i, s in enumerate(STATS)}
FLOATS = [STAT["rel_err"], STAT["bias"]]
COUNTS = [STAT[s] for s in ("flush", "saturated", "underflow", "map4")]

SPECS = {
    "nvfp4": fl.nvfp4(),
    "nvfp4-2d": fl.nvfp4(tile=(16, 16)),
    "nvfp4-sr": fl.nvfp4(rounding="stochastic"),
    "nvfp4-h16-random-sr": fl.nvfp4(transform=H(16, "random"), rounding="stochastic"),
    "nvfp4-row": fl.nvfp4(scope="row"),
    "nvfp4-4o6": fl.nvfp4(four_over_six="mae"),
    "nvfp4-no-outer": fl.nvfp4(scope="none"),
    "mxfp4": fl.mxfp4(),
    "mxfp8": fl.mxfp8(),
    "fp8-tensor": fl.fp8(),
    "bf16": fl.cast_spec("bf16"),
    "int8": fl.QuantSpec(elem="int8", tile=(1, 16), block_scale="fp32", outer="none"),
}
# (shape, axis): the last axis, an inner axis (blocked where it lies: block width 1 in the
# kernel's view), a leading batch axis
LAYOUTS = [((32, 64), -1), ((64, 48), 0), ((2, 32, 48), 1)]

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"no CPU kernels here: {cpu_kernels.build_error()}"
)


def _x(shape, seed=0):
    x = 2.0 * jax.random.normal(jax.random.key(seed), shape)
    x = x.at[(0,) * (len(shape) - 1)].set(0.0)  # an all-zero row
    return x.at[(1,) * len(shape)].set(1e-30)  # a value that flushes


def _ftz(v):
    """float32 v with subnormals flushed to a zero of their sign."""
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(v) < tiny, np.copysign(np.float32(0), v), v).astype(np.float32)


@functools.partial(jax.jit, static_argnums=1)
def _quantizer_terms(a, spec, key):
    """The quantizer's moved-layout blocks and their dequantization terms, as one program."""
    xb, scaled, scope, _ = quantize_blocks(a, spec, key, None, None)
    fmt = formats.get_format(spec.elem)
    vals, outer = dequantize_terms(scaled, fmt, scope)
    h32 = dequantize_blocks(scaled, fmt, scope)
    return xb, scaled.scale, h32, vals, outer, grid_values(scaled.q, fmt), scaled.map4


def numpy_stats(a, spec, key):
    """The statistics' definitions in float64 numpy, on the quantizer's moved-layout blocks."""
    xb, scale, h32, vals, outer, v, map4 = _quantizer_terms(a, spec, key)
    fmt = formats.get_format(spec.elem)
    x = np.asarray(xb, np.float64)
    h32 = np.asarray(h32)
    # x_hat is the two float32 products in this order (what the kernel recomputes it as),
    # each flushed to zero below the normal range, as XLA's CPU code computes
    with np.errstate(invalid="ignore", over="ignore"):
        by_hand = _ftz(_ftz(np.asarray(vals) * np.asarray(scale)) * np.asarray(outer))
    np.testing.assert_array_equal(h32, by_hand)
    h = h32.astype(np.float64)
    v = np.asarray(v, np.float64)
    err = h - x
    nx = np.sqrt(np.sum(x * x))
    rel = np.sqrt(np.sum(err * err)) / nx if nx > 0 else 0.0
    sab = np.sum(np.abs(x))
    bias = np.sum(err) / sab if sab > 0 else 0.0
    nz = x != 0

    def frac(count, total):  # a float32 division of exact counts, as jnp divides them
        return np.float32(count) / np.float32(total)

    flush = frac(np.sum(nz & (h == 0)), max(np.sum(nz), 1))
    saturated = frac(np.sum((np.abs(v) == fmt.max) & (np.abs(x) > np.abs(h))), x.size)
    blocks = (x.ndim - 3, x.ndim - 1)
    live, hot = np.any(nz, axis=blocks), np.any(h != 0, axis=blocks)
    underflow = frac(np.sum(live & ~hot), live.size)
    map4 = 0.0 if map4 is None else float(np.mean(np.asarray(map4)))
    return np.array([rel, bias, flush, saturated, underflow, map4])


@pytest.mark.parametrize("shape, axis", LAYOUTS)
@pytest.mark.parametrize("name", SPECS)
def test_fused_statistics_match_their_definitions(name, shape, axis):
    spec = SPECS[name].replace(axis=axis)
    x, key = _x(shape), jax.random.key(7)

    @jax.jit
    def both(x, key):  # the fused statistics and the quantizer's x_hat, as one program
        return operand_stats(x, spec, key=key), fl.quantize(x, spec, key=key).dequantize(
            rotated=True
        )

    (x_hat, got), expected = both(x, key)
    want = numpy_stats(x, spec, key)
    got = np.asarray(got, np.float64)
    # exact counts, and the float32 rounding of the float64 sums (within one ulp)
    np.testing.assert_array_equal(got[COUNTS], want[COUNTS].astype(np.float32))
    np.testing.assert_allclose(got[FLOATS], want[FLOATS], rtol=1.2e-7, atol=1e-30)
    assert got[STAT["rel_err"]] > 0
    assert got[STAT["flush"]] > 0 or name == "bf16"  # bf16 keeps 1e-30
    # x_hat is the quantizer's, bit for bit, whatever the method
    np.testing.assert_array_equal(x_hat, expected)


@pytest.mark.parametrize("shape, axis", LAYOUTS)
@pytest.mark.parametrize("name", SPECS)
def test_fused_and_reference_agree(name, shape, axis):
    spec = SPECS[name].replace(axis=axis)
    x, key = _x(shape, seed=1), jax.random.key(3)
    xf, fused = operand_stats(x, spec, key=key)
    xr, ref = operand_stats(x, spec, key=key, method="reference")
    np.testing.assert_array_equal(xf, xr)
    # the same counts: the reference's means multiply by a rounded 1/n, the kernel divides
    np.testing.assert_allclose(np.asarray(fused)[COUNTS], np.asarray(ref)[COUNTS], rtol=1.2e-7)
    np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("method", ["fused", "reference"])
@pytest.mark.parametrize("shape, axis", LAYOUTS)
@pytest.mark.parametrize("name", SPECS)
def test_deferred_statistics_are_those_of_the_operand_the_gemm_takes(name, shape, axis, method):
    # x_hat now, the statistics later behind a lax.cond (as a training step measures on some
    # steps): x_hat is the plain quantizer's bit for bit, the statistics operand_stats' bit for bit
    spec = SPECS[name].replace(axis=axis)
    x, key = _x(shape, seed=2), jax.random.key(5)

    @jax.jit
    def deferred(x, flag):
        x_hat, measure = operand_stats_deferred(x, spec, key=key, method=method)
        zeros = jnp.zeros(len(STATS), jnp.float32)
        return x_hat, jax.lax.cond(flag, measure, lambda: zeros)

    x_on, on = deferred(x, jnp.bool_(True))
    x_off, off = deferred(x, jnp.bool_(False))
    want_hat, want = operand_stats(x, spec, key=key, method=method)
    plain = quantize_dequantize(x, spec, key=key, rotated=True)
    np.testing.assert_array_equal(x_on, plain)
    np.testing.assert_array_equal(x_off, plain)
    np.testing.assert_array_equal(want_hat, plain)
    np.testing.assert_array_equal(on, want)
    np.testing.assert_array_equal(off, np.zeros(len(STATS), np.float32))


def test_saturation_and_underflow_are_counted_in_the_kernel():
    # a stale amax saturates an FP8 tensor scale; NVFP4 without an outer scale underflows the
    # E4M3 block scale of a block of tiny values
    x = jnp.linspace(1.0, 8.0, 64).reshape(1, 64)
    _, s = operand_stats(x, fl.fp8("e4m3"), amax=jnp.float32(4.0))
    assert float(s[STAT["saturated"]]) == float(np.float32(np.sum(x > 4.0)) / np.float32(64))
    tiny = jnp.concatenate([jnp.full((1, 16), 1e-6), jnp.ones((1, 16))], axis=1)
    x_hat, s = operand_stats(tiny, fl.QuantSpec(outer="none"))
    np.testing.assert_array_equal(x_hat[0, :16], 0.0)
    assert float(s[STAT["underflow"]]) == 0.5 and float(s[STAT["flush"]]) == 0.5


def test_row_lengths_and_block_widths_of_every_kernel_path():
    # rows not a multiple of 8 (the scalar tail), a tensor-scaled row of odd width (a block
    # width neither 1 nor a multiple of 8), and a 1-wide block view (an inner axis)
    cases = [
        ((3, 40), fl.nvfp4(tile=(1, 8), pad=True)),
        ((5, 13), fl.fp8()),
        ((24, 7), fl.QuantSpec(elem="e4m3", tile=(1, 8), block_scale="fp32", outer="none", axis=0)),
    ]
    for shape, spec in cases:
        x, key = _x(shape, seed=2), jax.random.key(0)
        got = np.asarray(operand_stats(x, spec, key=key)[1], np.float64)
        want = numpy_stats(x, spec, key)
        np.testing.assert_array_equal(got[COUNTS], want[COUNTS].astype(np.float32))
        np.testing.assert_allclose(got[FLOATS], want[FLOATS], rtol=1.2e-7, atol=1e-30)


# blocked views (A, t1, B, t2) for every loop of the kernel: 16-wide blocks (one vector a
# block with AVX-512) in 1D and 2D tiles and in several parts, 32-wide blocks (MX), 1-wide
# blocks with rows of 16s, of 16s and an 8, and of 16s and a scalar tail, 8-wide blocks, and
# widths that are scalar only
KERNEL_VIEWS = [
    (600, 1, 8, 16),
    (6, 16, 4, 16),
    (9, 2, 3, 32),
    (7, 16, 32, 1),
    (5, 4, 24, 1),
    (3, 16, 37, 1),
    (11, 1, 5, 8),
    (9, 2, 5, 4),
    (4, 3, 2, 13),
]


def _kernel_operands(view, seed, spread=20):
    """x (magnitudes over about e^-spread to e^spread), grid values q (integers in [-6, 6], so
    some saturate), block scales s (A, B) with a zero block, and outer scales o (A, t1), of the
    blocked view `view`; the products q * s * o stay in the normal range."""
    rng = np.random.default_rng(seed)
    a, t1, b, t2 = view
    x = rng.standard_normal(view) * np.exp(rng.uniform(-spread, spread, view))
    x = np.where(rng.uniform(size=view) < 0.05, 0.0, x).astype(np.float32)
    q = np.round(rng.uniform(-6, 6, view)).astype(np.float32)
    s = np.exp(rng.uniform(-7, 7, (a, b))).astype(np.float32)
    s[0, 0] = 0.0  # a block whose x_hat is all zero
    o = np.exp(rng.uniform(-7, 7, (a, t1))).astype(np.float32)
    return x, q, s, o


def _kernel_numpy(x, q, s, o, vmax):
    """The kernel's five statistics from their definitions, float64 sums, x_hat = (q*s)*o."""
    a, t1, b, t2 = x.shape
    h = (q * s[:, None, :, None]) * o[:, :, None, None]  # float32 products, in this order
    xd, hd = x.astype(np.float64), h.astype(np.float64)
    err = hd - xd
    nz = x != 0

    def frac(count, total):
        return np.float32(count) / np.float32(total)

    return np.array(
        [
            np.sqrt(np.sum(err * err)) / np.sqrt(np.sum(xd * xd)),
            np.sum(err) / np.sum(np.abs(xd)),
            frac(np.sum(nz & (h == 0)), max(np.sum(nz), 1)),
            frac(np.sum((np.abs(q) == vmax) & (np.abs(x) > np.abs(h))), x.size),
            frac(np.sum(np.any(nz, axis=(1, 3)) & ~np.any(h != 0, axis=(1, 3))), a * b),
        ]
    )


@pytest.mark.parametrize("view", KERNEL_VIEWS)
def test_the_kernel_against_its_formulas_on_every_loop(view):
    x, q, s, o = _kernel_operands(view, seed=sum(view))
    got = np.asarray(
        cpu_kernels.block_stats(
            *map(jnp.asarray, (x, q)), s[:, None, :, None], o[:, :, None, None], 6.0
        ),
        np.float64,
    )
    want = _kernel_numpy(x, q, s, o, 6.0)
    np.testing.assert_array_equal(got[2:], want[2:].astype(np.float32))
    np.testing.assert_allclose(got[:2], want[:2], rtol=1.2e-7)
    assert got[3] > 0 and got[4] > 0  # saturated elements and an underflowed block were there


def test_an_x_hat_below_the_normal_range_is_flushed_as_xla_flushes_it():
    # a tensor of tiny values (amax about 4e-33): NVFP4's tensor scale makes some products q*s*o
    # subnormal, which XLA's CPU code flushes to zero; the kernel computes x_hat in the same
    # floating-point environment, so its counts are those of the quantizer's x_hat
    spec = fl.nvfp4()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32) * np.float32(1e-33)
    # blocks near the bottom of the normal range (the inputs themselves stay normal)
    tiny = rng.uniform(1.2e-38, 1e-37, (64, 128)) * rng.choice([-1.0, 1.0], (64, 128))
    x[:, 128:] = tiny.astype(np.float32)
    # the quantizer's terms from the program numpy_stats compiles below (not op by op)
    _, scale, _, vals, outer, _, _ = _quantizer_terms(jnp.asarray(x), spec, None)
    exact = np.asarray(vals, np.float64) * np.asarray(scale) * np.asarray(outer)
    assert np.any((exact != 0) & (np.abs(exact) < np.finfo(np.float32).tiny))  # the case is here
    got = np.asarray(operand_stats(jnp.asarray(x), spec)[1], np.float64)
    want = numpy_stats(jnp.asarray(x), spec, None)
    np.testing.assert_array_equal(got[COUNTS], want[COUNTS].astype(np.float32))
    np.testing.assert_allclose(got[FLOATS], want[FLOATS], rtol=1.2e-7)


def test_non_finite_and_zero_operands():
    spec = fl.nvfp4()
    x = _x((16, 32))
    for bad in (jnp.nan, jnp.inf):
        _, s = operand_stats(x.at[3, 5].set(bad), spec)
        assert np.isnan(s[STAT["rel_err"]]) and np.isnan(s[STAT["bias"]])
    # the reference keeps what it always recorded: 0 for a NaN, NaN for an infinity
    _, s = operand_stats(x.at[3, 5].set(jnp.nan), spec, method="reference")
    assert float(s[STAT["rel_err"]]) == 0.0 and float(s[STAT["bias"]]) == 0.0
    _, s = operand_stats(x.at[3, 5].set(jnp.inf), spec, method="reference")
    assert np.isnan(s[STAT["rel_err"]])
    x_hat, s = operand_stats(jnp.zeros((16, 32)), spec)
    np.testing.assert_array_equal(x_hat, 0.0)
    np.testing.assert_array_equal(s, 0.0)


def test_a_vmapped_members_statistics_do_not_depend_on_the_batch():
    spec = fl.nvfp4(transform=H(16, "random"), rounding="stochastic", axis=0)
    xs = jnp.stack([_x((64, 32), seed=s) for s in range(3)])
    key = jax.random.key(5)

    def one(x):
        return operand_stats(x, spec, key=key)

    batched = jax.jit(jax.vmap(one))(xs)[1]
    reordered = jax.jit(jax.vmap(one))(xs[::-1])[1]
    for i in range(3):
        alone = jax.jit(one)(xs[i])[1]
        np.testing.assert_array_equal(batched[i], alone)
        np.testing.assert_array_equal(reordered[2 - i], alone)
    np.testing.assert_array_equal(jax.jit(jax.vmap(one))(xs)[1], batched)  # and twice the same


def _bits(tree):
    return [np.asarray(a).view(np.uint32) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize("shape, axis", LAYOUTS)
@pytest.mark.parametrize("name", SPECS)
def test_the_quantizer_kernels_statistics_are_the_jnp_quantizers_bit_for_bit(
    name, shape, axis, monkeypatch
):
    # where the quantizer runs as its CPU kernel, the statistics kernel measures the kernel's
    # x_hat (scales of 1) and takes its saturation count: the same x_hat and the same bits
    spec = SPECS[name].replace(axis=axis)
    x = _x(shape, seed=2).at[(2,) * len(shape)].set(1e4)  # an outlier that saturates
    key = jax.random.key(5)
    got = operand_stats(x, spec, key=key)
    got_deferred = operand_stats_deferred(x, spec, key=key)
    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    want = operand_stats(x, spec, key=key)
    for g, w in zip(_bits(got), _bits(want), strict=True):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(_bits((got_deferred[0], got_deferred[1]())), _bits(want), strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_quantizer_kernels_statistics_under_vmap(monkeypatch):
    spec = fl.nvfp4(transform=H(16, "random"), rounding="stochastic", axis=0)
    xs = jnp.stack([_x((64, 32), seed=s) for s in range(3)])
    keys = jax.random.split(jax.random.key(5), 3)

    def one(x, key):
        return operand_stats(x, spec, key=key)

    got = jax.jit(jax.vmap(one))(xs, keys)
    assert "fp4lab_quantize" in jax.jit(jax.vmap(one)).lower(xs, keys).as_text()
    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    assert "fp4lab_quantize" not in jax.jit(jax.vmap(one)).lower(xs, keys).as_text()
    want = jax.jit(jax.vmap(one))(xs, keys)
    for g, w in zip(_bits(got), _bits(want), strict=True):
        np.testing.assert_array_equal(g, w)


def test_nothing_differentiates_through_the_statistics():
    spec = fl.nvfp4()

    def f(x):
        x_hat, s = operand_stats(x, spec)
        return jnp.sum(x_hat) + s[0]

    g = jax.grad(f)(_x((16, 32)))  # x_hat has no gradient path either (the quantizer's rounding)
    assert g.shape == (16, 32)


def test_without_a_kernel_fused_falls_back_to_the_reference_with_a_warning(monkeypatch):
    spec = fl.nvfp4(rounding="stochastic")
    x, key = _x((16, 32)), jax.random.key(1)
    ref = operand_stats(x, spec, key=key, method="reference")
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    monkeypatch.setattr(cpu_kernels, "build_error", lambda: "no compiler (test)")
    monkeypatch.setattr(stats_module, "_warned", [])
    with pytest.warns(RuntimeWarning, match="no CPU kernels here"):
        got = operand_stats(x, spec, key=key)
    np.testing.assert_array_equal(got[1], ref[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        operand_stats(x, spec, key=key)  # said once
        x_hat, measure = operand_stats_deferred(x, spec, key=key)  # deferred: the same fallback
    np.testing.assert_array_equal(x_hat, ref[0])
    np.testing.assert_array_equal(measure(), ref[1])


def test_an_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="method='exact'"):
        operand_stats(jnp.ones((4, 16)), fl.nvfp4(), method="exact")
    with pytest.raises(RuntimeError, match="not available"):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(cpu_kernels, "available", lambda: False)
            cpu_kernels.block_stats(*(jnp.ones((1, 1, 1, 16)),) * 4, 6.0)


def test_kernels_are_built_once_into_the_cache_folder(tmp_path):
    # without the library built at install (a copy of the package without it), a fresh process
    # with an empty cache folder builds the library there; the next one loads it and compiles
    # nothing. The compiler found is this one's, behind a `c++` first on the PATH that logs its
    # calls and adds -O0 last: what is checked is where and how often the build happens, not its
    # code, and -O0 takes a fraction of -O3's time (the FFI headers' templates)
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    package = Path(cpu_kernels.__file__).parents[1]
    shutil.copytree(package, tmp_path / "src" / "fp4lab", ignore=shutil.ignore_patterns("*.so"))
    cache = tmp_path / "cache"
    env = dict(os.environ, FP4LAB_KERNEL_CACHE=str(cache), JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = str(tmp_path / "src")
    compiler = shutil.which(cpu_kernels.compile_command()[0])
    (tmp_path / "bin").mkdir()
    cxx, log = tmp_path / "bin" / "c++", tmp_path / "calls.log"
    cxx.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{compiler}" "$@" -O0\n')
    cxx.chmod(0o755)
    env["PATH"] = f"{cxx.parent}{os.pathsep}{env.get('PATH', '')}"
    if env.get("CXX"):
        env["CXX"] = str(cxx)
    code = (
        "from fp4lab.core import cpu_kernels as k; assert k.available(), k.build_error(); "
        f"assert k.library().parent == __import__('pathlib').Path({str(cache)!r}), k.library()"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, timeout=300)
    (lib,) = cache.glob("kernels-*.so")  # one file, no temporaries left behind
    built = lib.stat().st_mtime_ns
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, timeout=300)
    assert [p.name for p in cache.iterdir()] == [lib.name]
    assert lib.stat().st_mtime_ns == built
    assert len(log.read_text().splitlines()) == 1  # one build, by the first process


def _host_cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (empty where it does not exist)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


_CLONES: dict[str, str] = {}  # variant -> the FFI target its build registered (once a process)


def _clone_target(variant: str, flags: tuple[str, ...], folder) -> str:
    """The kernel built as one copy for `flags` (no target clones), registered under its own
    FFI target; built once a process. `flags` may hold -DFP4LAB_NO_AVX512 (the generic loop
    only, without the AVX-512 loop of 16-wide masks)."""
    import ctypes
    import subprocess

    if variant not in _CLONES:
        symbol = f"fp4lab_operand_stats_{variant.replace('-', '_')}"
        lib = folder / f"{symbol}.so"
        defines = ("-DFP4LAB_CLONES=", f"-DFP4LAB_STATS_SYMBOL={symbol}")
        command = cpu_kernels.compile_command(defines + flags)
        subprocess.run(
            [*command, str(cpu_kernels.SOURCE), "-o", str(lib)], check=True, capture_output=True
        )
        handle = ctypes.CDLL(str(lib))
        jax.ffi.register_ffi_target(symbol, jax.ffi.pycapsule(getattr(handle, symbol)), "cpu")
        _CLONES[variant] = symbol
    return _CLONES[variant]


def _order_operands(n_rows: int = 5000, row: int = 32):
    """Operands (x, x_hat) of shape (n_rows, 1, row // 16, 16) whose bias, sum(x_hat - x) /
    sum|x|, shows the kernel's order of summation, with its value under the documented order
    (module comment of operand_stats.cc: lane k % 8 of a row, parts of 2048 such block rows
    added in order lane by lane, then lanes 0..7 in order). x is 1 everywhere, so sum|x| is
    the element count; x_hat - x is 0 except where a case puts +-2^60 or 1 (2^60 + 1 == 2^60
    in float64: the 1 is lost when it meets the large value first)."""
    big, n = 2.0**60, n_rows * row
    cases = {
        # one lane: +big, then 100 ones, then -big: the ones are lost, 0 (16 lanes: 100)
        "within a lane": (
            [(0, 0, big), (200, 0, -big)] + [(r, 8, 1.0) for r in range(1, 101)],
            0.0,
        ),
        # three parts, one lane: +big, -big, 1 added in order: 1 (in reverse: 0)
        "parts in order": ([(0, 2, big), (2048, 2, -big), (4096, 2, 1.0)], 1.0 / n),
        # lanes 3, 4, 5 of one part: big, -big, 1 summed in lane order: 1 (as a tree: 0)
        "lanes in order": ([(0, 3, big), (0, 4, -big), (0, 5, 1.0)], 1.0 / n),
    }
    out = {}
    for name, (entries, bias) in cases.items():
        x = np.ones((n_rows, row), np.float32)
        x_hat = x.copy()
        for r, k, d in entries:
            x_hat[r, k] = np.float32(1.0 + d)
        shape = (n_rows, 1, row // 16, 16)
        out[name] = (x.reshape(shape), x_hat.reshape(shape), np.float32(bias))
    return out


def test_the_kernel_sums_in_its_documented_order():
    # the bias of operands built so that another order of the float64 sums gives another
    # value, against the value the documented order gives (worked out by hand above)
    for name, (x, x_hat, bias) in _order_operands().items():
        # x_hat as the grid values, block and outer scales 1: x_hat = (x_hat * 1) * 1
        got = np.asarray(cpu_kernels.block_stats(jnp.asarray(x), jnp.asarray(x_hat), 1, 1, 6.0))
        assert got[STAT["bias"]] == bias, (name, got[STAT["bias"]], bias)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the kernel's clones are x86-64 code")
def test_every_cpu_clone_of_the_kernel_gives_the_same_bits(tmp_path):
    # the generic loop's baseline, AVX2 and AVX-512 copies and the AVX-512 loop of 16-wide
    # masks (those this CPU can run), each built on its own, against the dispatching build, on
    # operands of every kernel path (`KERNEL_VIEWS`, and 16-wide blocks in several parts), with
    # values over about 1e-17 to 1e17, zeros, blocks of scale 0 and a NaN: the same bits
    # everywhere; and each sums in the documented order
    host = _host_cpu_flags()
    generic = ("-DFP4LAB_NO_AVX512",)
    variants = {"baseline": generic}
    variants |= {"avx2": (*generic, "-mavx2")} if "avx2" in host else {}
    if "avx512f" in host:
        variants |= {"avx512": (*generic, "-mavx512f"), "avx512-masks": ()}
    views = [(2100, 1, 2, 16), (300, 16, 20, 16), *KERNEL_VIEWS]
    for variant, flags in variants.items():
        target = _clone_target(variant, flags, tmp_path)
        for name, (x, x_hat, bias) in _order_operands().items():
            a, t1, b, t2 = x.shape
            args = (x, x_hat, np.ones((a, b), np.float32), np.ones((a, t1), np.float32))
            call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((5,), jnp.float32))
            got = np.asarray(call(*args, pa=a, t1=t1, nb=b, t2=t2, vmax=np.float32(6.0)))
            assert got[STAT["bias"]] == bias, (variant, name)
        for view in views:
            a, t1, b, t2 = view
            call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((5,), jnp.float32))
            x, q, sc, o = _kernel_operands(view, seed=a + b, spread=40)
            for nan in (False, True):
                if nan:
                    x = x.copy()
                    x.flat[7] = np.nan
                args = tuple(map(jnp.asarray, (x, q, sc, o)))
                scales = (sc[:, None, :, None], o[:, :, None, None])
                want = np.asarray(cpu_kernels.block_stats(*args[:2], *scales, 6.0))
                got = np.asarray(call(*args, pa=a, t1=t1, nb=b, t2=t2, vmax=np.float32(6.0)))
                assert got.tobytes() == want.tobytes(), (variant, view, nan, got, want)
