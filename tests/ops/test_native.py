"""Backends: the parts of the native path that run on the CPU, and device selection."""

import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.ops import custom_vjp as scaffold
from fp4lab.ops import native
from fp4lab.ops.dot_general import DotGemm, qdot_general

DN = (((2,), (0,)), ((), ()))
NV = fl.nvfp4(convention="jax")
MX8 = fl.mxfp8(scale_rounding="ceil")
F8 = fl.fp8("e4m3")


def _xw():
    x = jax.random.normal(jax.random.key(0), (2, 16, 64))
    w = jax.random.normal(jax.random.key(1), (64, 32))
    return x, w


@pytest.mark.parametrize("spec,block", [(NV, 16), (MX8, 32)])
def test_native_operands_are_the_simulated_ones_bit_for_bit(spec, block):
    x, _ = _xw()
    x3 = x.reshape(1, 32, 64)
    q = fl.quantize(x3, spec)
    vals, scales, outer = native.to_native(q)
    assert vals.shape == (1, 32, 64) and scales.shape == (1, 32, 64 // block)
    np.testing.assert_array_equal(vals.astype(jnp.float32), q.values())
    np.testing.assert_array_equal(scales.astype(jnp.float32).reshape(q.scale.shape), q.scale)
    np.testing.assert_array_equal(outer, jnp.asarray(q.outer).reshape(-1)[0])
    # the scale layout is the one jax.nn.scaled_matmul documents: a * repeat(scales, block)
    deq = vals.astype(jnp.float32) * jnp.repeat(scales.astype(jnp.float32), block, axis=-1)
    np.testing.assert_array_equal(deq * outer, q.dequantize())


@pytest.mark.parametrize("spec", [NV, MX8, F8])
def test_native_forward_matches_simulated_within_accumulation_error(spec):
    x, w = _xw()
    recipe = recipes.GemmRecipe(fprop_x=spec, fprop_w=spec)
    y_sim = qdot_general(x, w, DN, recipe)
    y_nat = native.native_fprop(x, w, DN, spec, spec, matmul=native.reference_matmul)
    assert y_nat.shape == y_sim.shape == (2, 16, 32)
    np.testing.assert_allclose(y_nat, y_sim, rtol=1e-5, atol=1e-4 * float(jnp.abs(y_sim).max()))


def test_output_rescaling_is_the_product_of_outer_scales():
    x, w = _xw()
    seen = {}

    def spy(a, b, sa, sb, preferred_element_type):
        out = native.reference_matmul(a, b, sa, sb, preferred_element_type)
        seen["raw"] = out
        return out

    y = native.native_fprop(x, w, DN, NV, NV, matmul=spy)
    gx = float(jnp.abs(x).max()) / (6 * 448)
    gw = float(jnp.abs(w).max()) / (6 * 448)
    np.testing.assert_array_equal(
        y.reshape(1, 32, 32), seen["raw"] * (jnp.float32(gx) * jnp.float32(gw))
    )


def test_native_kind():
    assert native.native_kind(NV, NV) == "nvfp4"
    assert native.native_kind(MX8, MX8) == "mxfp8"
    assert native.native_kind(F8, fl.fp8("e5m2")) == "fp8"
    assert native.native_kind(fl.nvfp4(), fl.nvfp4()) is None  # "te" convention: simulated only
    assert native.native_kind(fl.mxfp8(), fl.mxfp8()) is None  # floor rule: not what RCEIL does
    assert native.native_kind(NV.replace(rounding="stochastic"), NV) is None
    assert native.native_kind(NV, None) is None


def test_device_selection_with_fake_devices():
    blackwell = native.Device("gpu", 10.0, "B200")
    hopper = native.Device("gpu", 9.0, "H100")
    cpu = native.Device("cpu", None, "cpu")
    assert native.resolve(NV, NV, "native", blackwell) == "native"
    assert native.resolve(F8, F8, "native", hopper) == "native"
    with pytest.raises(RuntimeError, match="compute capability >= 10"):
        native.resolve(NV, NV, "native", hopper)
    with pytest.raises(RuntimeError, match="cpu"):
        native.resolve(NV, NV, "native", cpu)
    with pytest.raises(ValueError, match="no native kernel"):
        native.resolve(fl.nvfp4(), fl.nvfp4(), "native", blackwell)
    with pytest.raises(ValueError, match="allowed: 'simulated', 'native', 'auto'"):
        native.resolve(NV, NV, "gpu", blackwell)
    assert native.resolve(NV, NV, "simulated", blackwell) == "simulated"


def test_auto_falls_back_and_says_so_once():
    native.reset_announcements()
    tiny = native.Device("cpu", None, "cpu")
    with pytest.warns(UserWarning, match="chose simulated"):
        assert native.resolve(NV, NV, "auto", tiny) == "simulated"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.resolve(NV, NV, "auto", tiny) == "simulated"
    with pytest.warns(UserWarning, match="chose native"):
        assert native.resolve(NV, NV, "auto", native.Device("gpu", 10.0, "B200")) == "native"


def test_native_on_this_cpu_is_a_clear_error():
    x, w = _xw()
    recipe = recipes.GemmRecipe(fprop_x=NV, fprop_w=NV)
    if native.current_device().platform != "cpu":
        pytest.skip("runs on CPU machines")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        qdot_general(x, w, DN, recipe, backend="native")


# ---------------------------------------------------------------------------------------------
# All three GEMMs.

BLACKWELL = native.Device("gpu", 10.0, "B200")
HOPPER = native.Device("gpu", 9.0, "H100")
CPU = native.Device("cpu", None, "cpu")


def _cotangent(shape):
    return jax.random.normal(jax.random.key(9), shape)


def _all_six(spec, **kw):
    return recipes.GemmRecipe(**dict.fromkeys(schema.OPERAND_NAMES, spec), **kw)


def _fp8_recipe(**kw):
    e4, e5 = fl.fp8("e4m3"), fl.fp8("e5m2")
    return recipes.GemmRecipe(
        fprop_x=e4, fprop_w=e4, dgrad_dy=e5, dgrad_w=e4, wgrad_x=e4, wgrad_dy=e5, **kw
    )


def _backends(choices):
    return [c.backend for c in choices]


def test_each_gemm_is_judged_on_its_own_specs():
    mixed = _all_six(NV).replace(dgrad_dy=NV.replace(rounding="stochastic"))
    choices = native.gemm_backends(mixed, "native", BLACKWELL)
    assert [c.gemm for c in choices] == list(schema.GEMMS)
    assert _backends(choices) == ["native", "simulated", "native"]
    assert [c.kind for c in choices] == ["nvfp4", None, "nvfp4"]
    assert "no native kernel" in choices[1].reason
    assert _backends(native.gemm_backends(_fp8_recipe(), "native", HOPPER)) == ["native"] * 3
    assert (
        _backends(native.gemm_backends(_all_six(MX8), "simulated", BLACKWELL)) == ["simulated"] * 3
    )


def test_backward_modes_without_quantized_backward_operands_run_their_backward_simulated():
    for mode in ("dequantized", "high_precision"):
        choices = native.gemm_backends(_all_six(NV, backward=mode), "native", BLACKWELL)
        assert _backends(choices) == ["native", "simulated", "simulated"]
        assert all(mode in c.reason for c in choices[1:])


def test_native_errors_and_auto_fallbacks_name_the_gemm_and_the_reason():
    with pytest.raises(RuntimeError, match="fprop: nvfp4 needs a GPU with compute capability"):
        native.gemm_backends(_all_six(NV), "native", HOPPER)
    with pytest.raises(ValueError, match="no GEMM of recipe nvfp4 matches a native kernel"):
        native.gemm_backends(recipes.get("nvfp4"), "native", BLACKWELL)
    native.reset_announcements()
    with pytest.warns(UserWarning, match="fprop simulated .nvfp4 needs a GPU"):
        choices = native.gemm_backends(_all_six(NV), "auto", CPU)
    assert _backends(choices) == ["simulated"] * 3


def _value_and_grads(recipe, backends, x, w, dn=DN):
    gemm = DotGemm(recipe=recipe, dimension_numbers=dn, backends=backends)

    def loss(x, w):
        y = scaffold.apply(gemm, x, w, (jax.random.key(0), {}, None))
        return jnp.sum(y * _cotangent(y.shape))  # fixed: not computed from y

    return jax.jit(jax.value_and_grad(loss, (0, 1)))(x, w)


@pytest.mark.parametrize(
    "backends", [("native", "simulated", "simulated"), ("simulated", "native", "native")]
)
def test_fp8_gemms_run_natively_on_the_cpu_and_match_the_simulator(backends):
    # XLA's FP8 dot runs on the CPU too, so per-tensor FP8 checks every GEMM of the native path
    x, w = _xw()
    sim = _value_and_grads(_fp8_recipe(), ("simulated",) * 3, x, w)
    nat = _value_and_grads(_fp8_recipe(), backends, x, w)
    pairs = list(zip(jax.tree.leaves(sim), jax.tree.leaves(nat), strict=True))
    for a, b in pairs:
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(jnp.abs(a).max()))
    assert any(not np.array_equal(a, b) for a, b in pairs)  # the native GEMMs really ran


def test_backend_report_says_per_layer_and_gemm_where_it_ran():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(64, 32, rngs=rngs)

        def __call__(self, x):
            return self.up(x)

    model = Net(nnx.Rngs(0))
    native.reset_announcements()
    with pytest.warns(UserWarning, match="backend='auto'"):
        fl.quantize_model(model, [fl.Rule(".*", _all_six(NV, name="nv-jax"))], backend="auto")
        model(jnp.ones((4, 64)))
    report = fl.backend_report(model)
    assert report[["gemm", "backend", "kind"]].values.tolist() == [
        [g, "simulated", "nvfp4"] for g in schema.GEMMS
    ]
    assert report["reason"].str.contains("needs a GPU with compute capability >= 10").all()
    assert set(report["path"]) == {"up"} and set(report["recipe"]) == {"nv-jax"}


@pytest.mark.slow  # a subprocess
def test_native_gpu_benchmark_cpu_check_passes():
    bench = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    result = subprocess.run(
        [sys.executable, "native_gpu.py", "--cpu-check"],
        cwd=bench,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parity within 1e-05: all ok" in result.stdout
    assert result.stdout.count("| ok |") == 3  # one row per kind: every GEMM within 1e-5


def test_native_wgrad_pads_a_token_count_the_blocks_do_not_divide():
    # 4 sequences of 31 predicted tokens: 124 tokens, not a multiple of a 16- or 32-block.
    # Per-tensor FP8 has no blocks, so check the padding with the reference matmul on MXFP8.
    x = jax.random.normal(jax.random.key(0), (4, 31, 64))
    w = jax.random.normal(jax.random.key(1), (64, 32))
    recipe = _all_six(MX8)

    def grads(backends):
        gemm = DotGemm(
            recipe=recipe, dimension_numbers=DN, backends=backends, matmul=native.reference_matmul
        )
        y, vjp = jax.vjp(
            lambda a, b: scaffold.apply(gemm, a, b, (jax.random.key(0), {}, None)), x, w
        )
        return vjp(_cotangent(y.shape))

    sim = grads(("simulated",) * 3)
    nat = grads(("simulated", "simulated", "native"))
    np.testing.assert_array_equal(nat[0], sim[0])  # Dgrad untouched
    scale = float(jnp.abs(sim[1]).max())
    np.testing.assert_allclose(nat[1], sim[1], rtol=1e-5, atol=1e-5 * scale)
