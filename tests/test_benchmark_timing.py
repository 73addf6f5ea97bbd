"""The benchmarks' verdicts on ratio goals: the sign test's interval of a median, checked for
coverage by simulation, and the three-way verdict built on it (`benchmarks/timing.py`)."""

import importlib.util
import math
import pathlib

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "timing.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_timing", _PATH)
timing = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(timing)


def _binomial_coverage(n: int, k: int) -> float:
    return sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2**n


def test_the_interval_is_the_order_statistics_the_binomial_gives():
    x = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0]
    # n = 9: k = 2 covers 1 - 2 * (1 + 9) / 512 = 0.961, k = 3 only 0.820
    assert timing.median_interval(x) == (2.0, 8.0)
    assert timing.median_interval(x, level=0.8) == (3.0, 7.0)
    # n = 6: only the extremes, covering 1 - 2 / 64 = 0.969; n = 5: 0.9375 < 0.95, no interval
    assert timing.median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)
    assert timing.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) is None
    with pytest.raises(ValueError, match="level"):
        timing.median_interval(x, level=1.0)


@pytest.mark.parametrize("n", [6, 9, 15, 30])
def test_the_interval_covers_the_median_as_often_as_it_claims(n):
    # skewed, heavy-tailed "step times": lognormal ratios whose median is known (exp(0) = 1)
    rng = np.random.default_rng(n)
    trials = 4000
    samples = np.exp(rng.normal(0.0, 0.3, (trials, n)) + rng.standard_t(3, (trials, n)) * 0.05)
    true_median = 1.0  # the sum of a normal and a t, both symmetric about 0, has median 0
    hits = 0
    for row in samples:
        lo, hi = timing.median_interval(list(row))
        hits += lo <= true_median <= hi
    # the interval's exact coverage for this n, never under the 95 % asked for
    k = next(j for j in range(n // 2, 0, -1) if _binomial_coverage(n, j) >= 0.95)
    exact = _binomial_coverage(n, k)
    assert exact >= 0.95
    se = math.sqrt(exact * (1 - exact) / trials)
    assert abs(hits / trials - exact) < 4 * se, (hits / trials, exact)


def test_the_verdict_says_when_the_rounds_cannot_tell():
    under = [1.05, 1.08, 1.10, 1.06, 1.09, 1.07, 1.11, 1.04, 1.08]
    over = [r + 0.2 for r in under]
    around = [1.12, 1.25, 1.18, 1.22, 1.15, 1.27, 1.19, 1.21, 1.16]
    assert timing.goal_verdict(under, 1.2).startswith("met (95 % interval of the median [1.05")
    assert timing.goal_verdict(over, 1.2).startswith("NOT met (95 % interval")
    assert timing.goal_verdict(around, 1.2).startswith("at the goal: not decided")
    # "at least": a speed-up of at least 1.04x is met by `under`, 1.3x is not
    assert timing.goal_verdict(under, 1.04, at_least=True).startswith("met (")
    assert timing.goal_verdict(under, 1.3, at_least=True).startswith("NOT met (")
    assert timing.goal_verdict(around, 1.2, at_least=True).startswith("at the goal")
    few = timing.goal_verdict([1.1, 1.3, 1.15], 1.2)
    assert few.startswith("met (median of 3 rounds, too few for a 95 % interval")


def test_rounds_pair_by_index_and_must_match():
    assert timing.round_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="cannot be paired"):
        timing.round_ratios([1.0, 2.0], [1.0])


def test_the_header_names_the_cpu_its_extensions_and_the_clone(monkeypatch):
    from fp4lab.core import cpu_kernels

    line = timing.machine()
    assert "CPU: " in line and "ISA " in line and "quantizer kernel clone: " in line
    if cpu_kernels.clones():
        assert f"clone: {cpu_kernels.clones()[-1]} (widest)" in line
        monkeypatch.setenv("FP4LAB_CPU_CLONE", "baseline")
        assert "clone: baseline (forced by FP4LAB_CPU_CLONE=baseline)" in timing.machine()
    monkeypatch.setenv("FP4LAB_QUANTIZER", "reference")
    assert "none: the jnp reference" in timing.machine()


def test_every_benchmark_prints_the_header_first():
    """Every benchmark with a command line prints `machine()` before anything else, so each
    figure it prints names the CPU, its vector extensions and the kernel clone."""
    import ast

    scripts = [p for p in _PATH.parent.glob("*.py") if "def main(" in p.read_text()]
    assert len(scripts) >= 10
    for path in scripts:
        (main,) = [
            f
            for f in ast.parse(path.read_text()).body
            if isinstance(f, ast.FunctionDef) and f.name == "main"
        ]
        prints = sorted(
            (c.lineno, ast.unparse(c))
            for c in ast.walk(main)
            if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "print"
        )
        assert prints and prints[0][1] == "print(machine())", f"{path.name}: {prints[:1]}"
