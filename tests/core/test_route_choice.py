"""The default quantizer per CPU class (`kernel_route.choice`): the kernel where it measured no
slower than the jnp path, else the jnp path, with the same bits either way, said in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4lab as fl
from fp4lab.core import cpu_kernels, kernel_route

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler here")


def _default(monkeypatch, faster: str | None = None):
    for name in ("FP4LAB_QUANTIZER", "FP4LAB_CPU_CLONE", "FP4LAB_TEST_JNP_FASTER"):
        monkeypatch.delenv(name, raising=False)
    if faster is not None:
        monkeypatch.setenv("FP4LAB_TEST_JNP_FASTER", faster)


def _lowered(x, spec) -> str:
    return jax.jit(lambda v: fl.fake_quant(v, spec)).lower(x).as_text()


def test_the_default_picks_the_jnp_path_where_it_is_faster_with_the_same_bits(monkeypatch):
    rng = np.random.default_rng(0)
    mag = np.exp2(rng.uniform(-140, 100, (64, 128))).astype(np.float32)
    x = jnp.asarray(mag * np.where(rng.random((64, 128)) < 0.5, -1, 1).astype(np.float32))
    spec = fl.nvfp4()
    clone = cpu_kernels.clone()
    _default(monkeypatch)
    monkeypatch.setitem(kernel_route.MEASURED, clone, (0.9, "a test's figure"))
    pick, why = kernel_route.choice()
    assert pick == "kernel" and clone in why and "0.90x" in why, why
    assert kernel_route.enabled() == clone and "fp4lab_quantize" in _lowered(x, spec)
    kernel = np.asarray(jax.jit(lambda v: fl.fake_quant(v, spec))(x))
    # the jnp path made 100x faster: the default takes it, and says so
    _default(monkeypatch, faster="100")
    pick, why = kernel_route.choice()
    assert pick == "reference" and "FP4LAB_TEST_JNP_FASTER=100" in why and "90.00x" in why, why
    assert kernel_route.enabled() == "" and "fp4lab_quantize" not in _lowered(x, spec)
    jnp_path = np.asarray(jax.jit(lambda v: fl.fake_quant(v, spec))(x))
    assert (np.isnan(kernel) == np.isnan(jnp_path)).all()
    assert (kernel.view(np.uint32) == jnp_path.view(np.uint32))[~np.isnan(kernel)].all()


def test_a_forced_path_or_clone_overrides_the_figures(monkeypatch):
    _default(monkeypatch, faster="100")
    monkeypatch.setenv("FP4LAB_CPU_CLONE", "baseline")
    pick, why = kernel_route.choice()
    assert pick == "kernel" and why.endswith("FP4LAB_CPU_CLONE=baseline"), why
    monkeypatch.delenv("FP4LAB_CPU_CLONE")
    monkeypatch.setenv("FP4LAB_QUANTIZER", "kernel")
    assert kernel_route.choice()[0] == "kernel" and kernel_route.enabled()
    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    assert kernel_route.choice() == ("reference", "the jnp quantizer: FP4LAB_QUANTIZER=reference")
    assert kernel_route.enabled() == ""
    monkeypatch.delenv("FP4LAB_QUANTIZER")
    monkeypatch.setenv("FP4LAB_TEST_JNP_FASTER", "fast")
    with pytest.raises(ValueError, match="FP4LAB_TEST_JNP_FASTER='fast': give a number > 0"):
        kernel_route.choice()


def test_every_clone_has_a_figure_and_the_run_records_the_choice(monkeypatch):
    assert set(kernel_route.MEASURED) == set(cpu_kernels.CLONES)
    for ratio, where in kernel_route.MEASURED.values():
        assert ratio > 0 and "20" in where  # a figure and where and when it was measured
    from fp4lab.sweep import provenance

    _default(monkeypatch)
    assert provenance.host()["quantizer"] == kernel_route.choice()[1]
