"""Tests run on the CPU, in float32, with rank promotion and x64 off.

Compiled programs are shared through jax's persistent cache in `.jax_cache/` inside the
checkout (ignored by git; FP4LAB_TEST_COMPILE_CACHE=off turns it off, or names another folder),
so the test workers and later runs of the tests skip compiles already made. `fp4lab run`
inside the tests keeps its own cache there too (XDG_CACHE_HOME).
"""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from fp4lab.sweep.compute import use_compile_cache  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

_root = pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"
os.environ["XDG_CACHE_HOME"] = str(_root / "user")
_cache = os.environ.get("FP4LAB_TEST_COMPILE_CACHE", "")
if _cache != "off":
    use_compile_cache(_cache or _root)


@pytest.fixture
def documented_keys():
    """The per-call operand keys as docs/architecture.md §3 states them, written out here
    rather than taken from the code: operand i of (fprop_x, fprop_w, dgrad_dy, dgrad_w,
    wgrad_x, wgrad_dy) gets fold_in(key, i); GEMM g of (fprop, dgrad, wgrad) rotates with
    fold_in(key, 100 + g)."""

    def keys(key):
        names = ("fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_x", "wgrad_dy")
        ks = {n: jax.random.fold_in(key, i) for i, n in enumerate(names)}
        gemms = ("fprop", "dgrad", "wgrad")
        return ks | {
            f"{g}_transform": jax.random.fold_in(key, 100 + i) for i, g in enumerate(gemms)
        }

    return keys
