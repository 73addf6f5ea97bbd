"""Tests run on the CPU, in float32, with rank promotion and x64 off.

Compiled programs are shared through jax's persistent cache in `.jax_cache/` inside the
checkout (ignored by git; FP4LAB_TEST_COMPILE_CACHE=off turns it off, or names another folder),
so the test workers and later runs of the tests skip compiles already made: every program,
even an eager operation's, which the second worker (and the README blocks' interpreter,
tests/test_readme.py) would otherwise compile again. `fp4lab run` inside the tests keeps its
own cache there too (XDG_CACHE_HOME).

The tests' programs are compiled without LLVM optimization (XLA_FLAGS
--xla_backend_optimization_level=0, inherited by the subprocesses the tests start): most of
a test's time is XLA compiling small programs it runs a few steps of, and this halves it.
It changes last bits: at its default level LLVM fuses a multiply and an add into one FMA
(`x * 1.3 + 0.7` differs), so a number computed here is not the bits of the same run made
outside the tests, and a check near its threshold (did the model learn?) may land on the other
side. No test compares the two: every bit-for-bit comparison is between programs compiled the
same way, and the RL paths pin their own level (`fp4lab.rl.common.EXACT_CPU`).
FP4LAB_TEST_XLA_OPT=1 keeps XLA's default.

jax.random's Threefry hash lowers to fp4lab's CPU kernel in the tests' own processes
(`cpu_kernels.lower_jax_threefry`: the same bits, tests/core/test_prng.py; a training program
compiles in about a quarter less time). The tests that hold fp4lab's hash against jax's take
jax's own lowering back while they run (the `jax_threefry` fixture), so that their reference
is jax's code. FP4LAB_TEST_JAX_THREEFRY=jax keeps jax's lowering throughout.
"""

import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("FP4LAB_TEST_XLA_OPT") != "1" and "backend_optimization_level" not in (
    os.environ.get("XLA_FLAGS", "")
):
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.extend import random as jex_random  # noqa: E402
from jax.interpreters import mlir  # noqa: E402

from fp4lab.core import cpu_kernels  # noqa: E402
from fp4lab.sweep.compute import use_compile_cache  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

_root = pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"
os.environ["XDG_CACHE_HOME"] = str(_root / "user")
_cache = os.environ.get("FP4LAB_TEST_COMPILE_CACHE", "")
if _cache != "off":
    use_compile_cache(_cache or _root, min_compile_seconds=0)
# jax's CPU lowering of its Threefry primitive, before it is replaced (for `jax_threefry`)
_CPU_RULES = mlir._platform_specific_lowerings["cpu"]
_JAX_THREEFRY = _CPU_RULES[jex_random.threefry2x32_p]
if os.environ.get("FP4LAB_TEST_JAX_THREEFRY") != "jax":
    cpu_kernels.lower_jax_threefry()


def _threefry_rule(rule):
    """Makes `rule` the CPU lowering of jax's Threefry hash; returns the one it replaced. jax's
    caches are cleared, so that nothing traced under the other one is reused."""
    before = _CPU_RULES[jex_random.threefry2x32_p]
    _CPU_RULES[jex_random.threefry2x32_p] = rule
    jax.clear_caches()
    return before


@pytest.fixture(scope="module")
def jax_threefry():
    """jax's own lowering of its Threefry hash while a module's tests run."""
    before = _threefry_rule(_JAX_THREEFRY)
    yield
    _threefry_rule(before)


@pytest.fixture
def to_jax_threefry():
    """A function that gives jax's own lowering of its Threefry hash back for the rest of the
    test (then the suite's again)."""
    before = _CPU_RULES[jex_random.threefry2x32_p]
    yield lambda: _threefry_rule(_JAX_THREEFRY)
    _threefry_rule(before)


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


@pytest.fixture(autouse=True)
def _no_stored_programs_after_a_test(monkeypatch):
    """`fp4lab run` called in a test's process turns stored programs on for that process
    (`fp4lab.sweep.programs`); it stays on for that test only, so that no later test, which may
    patch fp4lab, is handed a program traced from other code."""
    from fp4lab.sweep import programs

    monkeypatch.delenv(programs.ENV, raising=False)


# The tests read the committed results folders (`fl.load`), which builds each
# folder's summary index (`index.sqlite`, ignored by git) beside its files. A test run leaves
# the checkout as it found it: the controller (not an xdist worker, which may end while others
# still read) removes at the end the index files the run created.
_INDEX_NAMES = ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm")
_RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


def _index_files() -> set[pathlib.Path]:
    return {p for name in _INDEX_NAMES for p in _RESULTS.glob(f"*/{name}")}


_index_files_before: set[pathlib.Path] = set()


def pytest_sessionstart(session):
    _index_files_before.update(_index_files())


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker
        return
    for path in _index_files() - _index_files_before:
        path.unlink(missing_ok=True)
