"""Analysis of results: pandas, matplotlib and seaborn only; depends on `fp4lab.schema` alone.

frames      the runs and metrics tables; to_frame and the parsing of telemetry keys
intervals   Wilson, t and BCa intervals
crossed     crossed seed streams as random effects: mean squares, generalized intervals,
            each stream's own variance and its exact F-test
montecarlo  the Monte Carlo error of interval ends drawn at random, and the words read off them
association within_correlation: does one per-run quantity predict another, within cells,
            seeds resampled
components  variance components of the seed streams per cell (variance_components)
verdicts    the verdict table: precision choices against each seed stream's own spread
explain     why a verdict row is not judged: confounded streams, missing seed combinations,
            cells that did not learn
instability spike and divergence shares with exact intervals, Fisher contrasts, the quant
            stream's flips, LR sensitivity, predictive signals, fork outcomes
tables      per-cell tables: divergence rate, loss gap, paired differences, tokens to target
            (retarget: tokens to target read again from another stored series)
factors     shares of variance of a main-effects model of the design factors
labels      readable names of cells and statistics for figures (cell_label, stat_label)
plots       figures (imported on first use: `fp4lab.analysis.plots`)
report      the HTML report of a results folder (`fp4lab.analysis.report`)
export      a results folder as TensorBoard event files (`fp4lab.analysis.export`)
"""

from fp4lab.analysis.association import Correlation, within_correlation
from fp4lab.analysis.components import variance_components
from fp4lab.analysis.factors import design_factors, seed_factors, variance_decomposition
from fp4lab.analysis.frames import (
    IDENTITY,
    SEEDS,
    SUMMARIES,
    acc_telemetry,
    attach,
    depths,
    grad_telemetry,
    layer_order,
    ok_runs,
    quant_telemetry,
    scalar_metric,
    to_frame,
)
from fp4lab.analysis.intervals import (
    Interval,
    MCInterval,
    bootstrap_ci,
    exact_binomial_interval,
    log_ratio_interval,
    median_interval,
    percentile_interval,
    ratio_ci,
    t_interval,
    wilson_interval,
)
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.analysis.tables import (
    BASELINE_RECIPES,
    default_baseline,
    divergence_rate,
    fixed_rows,
    loss_gap,
    paired_difference,
    retarget,
    tokens_to_target,
    with_family,
)
from fp4lab.analysis.verdicts import verdict

__all__ = [
    "BASELINE_RECIPES",
    "Correlation",
    "IDENTITY",
    "Interval",
    "MCInterval",
    "SEEDS",
    "SUMMARIES",
    "attach",
    "bootstrap_ci",
    "cell_label",
    "default_baseline",
    "design_factors",
    "divergence_rate",
    "exact_binomial_interval",
    "fixed_rows",
    "grad_telemetry",
    "acc_telemetry",
    "layer_order",
    "depths",
    "log_ratio_interval",
    "loss_gap",
    "median_interval",
    "ok_runs",
    "paired_difference",
    "percentile_interval",
    "quant_telemetry",
    "ratio_ci",
    "retarget",
    "scalar_metric",
    "seed_factors",
    "stat_label",
    "t_interval",
    "tokens_to_target",
    "to_frame",
    "variance_components",
    "variance_decomposition",
    "verdict",
    "wilson_interval",
    "with_family",
    "within_correlation",
]
