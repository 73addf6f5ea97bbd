"""The instability words: coverage and size simulated at the designs the studies run."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from fp4lab.analysis import instability
from fp4lab.analysis.intervals import exact_binomial_interval


def _runs(cells: dict[str, list[bool]], **extra) -> pd.DataFrame:
    rows = []
    for cell, spiked in cells.items():
        for i, s in enumerate(spiked):
            rows.append(
                {
                    "cell": cell,
                    "status": "ok",
                    "spikes": 3 * int(s),
                    "first_spike": 500.0 if s else np.nan,
                    "max_spike": 2.5 if s else np.nan,
                    "diverged_at_end": False,
                    "diverged": False,
                    "seed_init": i,
                    "seed_data": i,
                    "seed_quant": i,
                    "final_loss": 0.1 + i,
                }
                | extra
            )
    return pd.DataFrame(rows)


def test_spike_rates_give_exact_intervals():
    runs = _runs({"a": [True] * 8, "b": [False] * 7 + [True]})
    rates = instability.spike_rates(runs).set_index("cell")
    assert rates.loc["a", "spiked"] == 8 and rates.loc["b", "spiked"] == 1
    ci = exact_binomial_interval(1, 8)
    assert rates.loc["b", "spiked_lo"] == pytest.approx(ci.lo)
    assert rates.loc["b", "spiked_hi"] == pytest.approx(ci.hi)
    assert rates.loc["a", "events"] == 24


def test_clopper_pearson_covers_at_the_studies_8_runs():
    """At 8 and 4 runs, every true rate on a grid: coverage >= 95 % (exactly computed)."""
    for n in (4, 8):
        k = np.arange(n + 1)
        ci = exact_binomial_interval(k, np.full(n + 1, n))
        for p in np.linspace(0.01, 0.99, 99):
            inside = (ci.lo <= p) & (p <= ci.hi)
            assert scipy_stats.binom.pmf(k, n, p)[inside].sum() >= 0.95 - 1e-12


def test_fisher_contrast_holds_its_size_and_says_no():
    """Equal true rates at 8 vs 8 runs: "higher"/"lower" at most 5 % of the time (simulated),
    and 8/8 against 0/8 is "higher" with disjoint intervals."""
    rng = np.random.default_rng(0)
    said = {}  # the word of each table drawn: a table drawn again is judged once (~1/3 repeat)
    for p in (0.1, 0.5, 0.9):
        words = []
        for _ in range(400):
            spiked = tuple(rng.random(8) < p), tuple(rng.random(8) < p)
            if spiked not in said:
                runs = _runs({"a": list(spiked[0]), "b": list(spiked[1])})
                said[spiked] = instability.rate_contrast(runs, "a", "b")["verdict"]
            words.append(said[spiked])
        assert np.mean([w != "no evidence" for w in words]) <= 0.05
    runs = _runs({"a": [True] * 8, "b": [False] * 8})
    row = instability.rate_contrast(runs, "a", "b")
    assert row["verdict"] == "higher" and row["disjoint"] and row["p"] < 0.001
    assert instability.rate_contrast(runs, "b", "a")["verdict"] == "lower"
    table = instability.contrasts(runs, [("a", "b"), ("b", "a")])
    assert list(table["family"]) == [2, 2] and list(table["contrast"]) == ["a vs b", "b vs a"]
    with pytest.raises(ValueError, match="outcome"):
        instability.rate_contrast(runs, "a", "b", outcome="loss")


def _design(rng, pairs, quant, icc, rate=0.5):
    """A latent-threshold model: y = 1{a_pair + e_run > c}, Var(a) = icc, Var(e) = 1 - icc."""
    c = scipy_stats.norm.ppf(1 - rate)
    a = rng.normal(0, np.sqrt(icc), pairs)
    rows = []
    for i in range(pairs):
        for q in range(quant):
            y = a[i] + rng.normal(0, np.sqrt(1 - icc)) > c
            rows.append(
                {
                    "cell": "c",
                    "status": "ok",
                    "spikes": int(y),
                    "seed_init": i,
                    "seed_data": i,
                    "seed_quant": q,
                    "final_loss": rng.random(),
                    "first_spike": np.nan,
                    "max_spike": np.nan,
                    "diverged_at_end": False,
                    "diverged": False,
                }
            )
    return pd.DataFrame(rows)


def test_the_permutation_test_of_init_and_data_holds_its_size_and_has_power():
    """At the attribution study's 8 pairs x 4 quant seeds: with the pair irrelevant (icc 0)
    "matters" at most 5 % of the time; with init and data deciding (icc 0.9) most of the time."""
    rng = np.random.default_rng(1)
    null = [
        instability.stream_attribution(_design(rng, 8, 4, 0.0), permutations=400)["verdict"].iloc[0]
        for _ in range(200)
    ]
    assert np.mean([w == "matters" for w in null]) <= 0.05 + 0.03  # 200 draws: MC error ~1.5 %
    strong = [
        instability.stream_attribution(_design(rng, 8, 4, 0.9), permutations=400)["verdict"].iloc[0]
        for _ in range(40)
    ]
    assert np.mean([w == "matters" for w in strong]) >= 0.7


def test_flips_are_exact_and_a_recipe_that_draws_nothing_says_so():
    runs = _design(np.random.default_rng(2), 4, 3, 0.0)
    runs["spikes"] = [1, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0]  # pair 2 flips, the rest agree
    row = instability.stream_attribution(runs, permutations=200).iloc[0]
    assert row["flips"] == 1 and row["quant"] == "decides"
    det = runs.copy()
    det["spikes"] = [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    det["final_loss"] = np.repeat([0.1, 0.2, 0.3, 0.4], 3)  # bit-identical runs per pair
    row = instability.stream_attribution(det, permutations=200).iloc[0]
    assert row["flips"] == 0 and row["quant"] == "draws nothing" and row["within"] == 0
    one = runs[runs["seed_quant"] == 0]
    assert "no design" in instability.stream_attribution(one)["verdict"].iloc[0]


def test_lr_sensitivity_caps_diverged_runs_at_the_initial_loss():
    rows = []
    for lr, losses in {0.01: [0.5, 0.6], 0.1: [0.2, 0.3], 1.0: [np.nan, 5.0]}.items():
        for x in losses:
            rows.append(
                {"recipe": "r", "lr": lr, "final_loss": x, "initial_loss": 2.0, "status": "ok"}
            )
    table, per_lr = instability.lr_sensitivity(pd.DataFrame(rows))
    # capped means: 0.55, 0.25, 2.0 -> mean 0.9333 - best 0.25
    assert table["sensitivity"].iloc[0] == pytest.approx((0.55 + 0.25 + 2.0) / 3 - 0.25)
    assert table["best_lr"].iloc[0] == 0.1
    assert list(per_lr["loss"]) == pytest.approx([0.55, 0.25, 2.0])


def test_predictive_scores_a_signal_that_rises_before_each_event():
    rng = np.random.default_rng(3)
    metrics, runs = [], []
    for r in range(6):
        n, event = 400, 200 + 20 * r
        loss = 1 + 0.05 * rng.standard_normal(n)
        loss[event : event + 3] = 4.0
        rising = 1 + 0.05 * rng.standard_normal(n)
        rising[event - 30 : event] *= np.linspace(1.5, 4, 30)  # rises 30 steps before
        flat = 1 + 0.05 * rng.standard_normal(n)
        for name, v in (("loss", loss), ("rising", rising), ("flat", flat)):
            metrics.append(
                pd.DataFrame({"run_id": f"r{r}", "step": np.arange(n), "metric": name, "value": v})
            )
        runs.append({"run_id": f"r{r}", "spike_events": f"{event}:4:3"})
    out = instability.predictive(
        pd.concat(metrics), pd.DataFrame(runs), ["rising", "flat"], horizon=50
    ).set_index("signal")
    assert out.loc["rising", "auc_lo"] > 0.6 and out.loc["rising", "lead_median"] >= 20
    assert abs(out.loc["flat", "auc"] - 0.5) < 0.1 and out.loc["flat", "lead_median"] == 0
    assert instability.parse_events("12:2.5:3;40:inf:1") == [(12, 2.5, 3), (40, np.inf, 1)]
    assert instability.parse_events(np.nan) == []


def test_signal_growth_reads_the_peak_before_the_first_event_with_t_intervals():
    rng = np.random.default_rng(5)
    metrics, runs = [], []
    for cell, rise in (("grows", 4.0), ("bounded", 1.0)):
        for r in range(5):
            n, event = 100, 60 if cell == "grows" else np.nan
            v = 2.0 * np.linspace(1, rise, n) * (1 + 0.01 * rng.standard_normal(n))
            v[0] = 2.0
            if cell == "grows":
                v[60:] = 1e6  # the blow-up itself is not the growth before it
                v[10] = np.nan  # a non-finite value is left out of the peak
            rid = f"{cell}{r}"
            metrics.append(pd.DataFrame({"run_id": rid, "step": np.arange(n), "metric": "s",
                                         "value": v}))  # fmt: skip
            runs.append({"run_id": rid, "cell": cell, "status": "ok", "first_spike": event})
    runs.append({"run_id": "late", "cell": "bounded", "status": "ok", "first_spike": np.nan})
    out = instability.signal_growth(pd.concat(metrics), pd.DataFrame(runs), ["s"])
    out = out.set_index("cell")
    grows, bounded = out.loc["grows"], out.loc["bounded"]
    assert grows["runs"] == 5 and grows["left_out"] == 0 and bounded["left_out"] == 1
    assert grows["start"] == pytest.approx(2.0) and grows["start_lo"] == pytest.approx(2.0)
    # the peak before step 60 is 2 * (1 + 3 * 59/99) = 5.58, not the 1e6 after it
    assert grows["peak"] == pytest.approx(2 * (1 + 3 * 59 / 99), rel=0.03)
    assert grows["growth_lo"] > 2.5 and grows["growth_hi"] < 3.0
    assert bounded["growth"] == pytest.approx(1.0, abs=0.03)
