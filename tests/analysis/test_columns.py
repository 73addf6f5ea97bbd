"""Each public analysis and plot function, given a table without a column it reads, fails at
its door with one line naming the function, the column and what fills it; docs/schema.md lists
the columns of `fp4lab.schema`."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fp4lab.analysis import export, factors, frames, plots, report, tables
from fp4lab.analysis.columns import MissingColumn
from fp4lab.schema import METRICS_COLUMNS, RUNS_COLUMNS


def runs_table() -> pd.DataFrame:
    row = {c: 0.0 for c in RUNS_COLUMNS}
    row |= {"run_id": "r0", "experiment": "x", "cell": "a", "status": "ok", "diverged": False}
    row |= {"divergence_kind": "", "measure": "recipe", "recipe": "bf16", "task": "own"}
    return pd.DataFrame([row, row | {"run_id": "r1", "seed_init": 1}])


def metrics_table() -> pd.DataFrame:
    return pd.DataFrame({"run_id": ["r0"], "step": [0], "metric": ["loss"], "value": [1.0]})


def results(runs=None, metrics=None):
    runs = runs_table() if runs is None else runs
    return SimpleNamespace(runs=runs, metrics=metrics_table() if metrics is None else metrics)


def without(table: pd.DataFrame, column: str) -> pd.DataFrame:
    return table.drop(columns=[column])


R, M = runs_table, metrics_table
HEATMAP_INPUT = {"quant/l/fprop/x/rel_err": 0.1}
CASES = [  # (function, the column dropped, the call)
    ("divergence_rate", "divergence_kind",
     lambda: tables.divergence_rate(without(R(), "divergence_kind"))),
    ("loss_gap", "loss_floor", lambda: tables.loss_gap(without(R(), "loss_floor"))),
    ("paired_difference", "cell", lambda: tables.paired_difference(without(R(), "cell"), "a")),
    ("tokens_to_target", "target_loss",
     lambda: tables.tokens_to_target(without(R(), "target_loss"))),
    ("ok_runs", "status", lambda: frames.ok_runs(without(R(), "status"))),
    ("scalar_metric", "metric", lambda: frames.scalar_metric(without(M(), "metric"), "loss")),
    ("quant_telemetry", "value", lambda: frames.quant_telemetry(without(M(), "value"))),
    ("grad_telemetry", "step", lambda: frames.grad_telemetry(without(M(), "step"))),
    ("acc_telemetry", "run_id", lambda: frames.acc_telemetry(without(M(), "run_id"))),
    ("attach", "cell", lambda: frames.attach(M(), without(R(), "cell"))),
    ("depths", "metric", lambda: frames.depths(without(M(), "metric"))),
    ("variance_decomposition", "final_loss",
     lambda: factors.variance_decomposition(without(R(), "final_loss"), "final_loss")),
    ("gradient_flow_heatmap", "metric",
     lambda: plots.gradient_flow_heatmap(frames.to_frame(HEATMAP_INPUT))),
    ("drift_vs_depth", "value", lambda: plots.drift_vs_depth(without(M(), "value"))),
    ("loss_curves", "loss_floor", lambda: plots.loss_curves(without(R(), "loss_floor"), M())),
    ("ladder", "gap", lambda: plots.ladder(pd.DataFrame({"cell": ["a"]}), "gap")),
    ("gnr_curves", "step", lambda: plots.gnr_curves(without(M(), "step"))),
    ("format_staircase", "scale",
     lambda: plots.format_staircase(pd.DataFrame({"rel_err": [0.1], "format": ["e2m1"]}))),
    ("iter_figures", "status", lambda: next(plots.iter_figures(results(without(R(), "status"))))),
    ("standard_figures", "metric",  # its figures come from iter_figures, which names itself
     lambda: plots.standard_figures(results(metrics=without(M(), "metric")), "figs")),
    ("cell_table", "divergence_kind", lambda: report.cell_table(without(R(), "divergence_kind"))),
    ("render", "cell", lambda: report.render(results(without(R(), "cell")))),
    ("write_report", "experiment",  # the page comes from render, which names itself
     lambda: report.write_report(results(without(R(), "experiment")), "r.html")),
    ("run_folders", "seed_init", lambda: export.run_folders(without(R(), "seed_init"))),
    ("tensorboard", "value",
     lambda: export.tensorboard(results(metrics=without(M(), "value")), "tb")),
]  # fmt: skip
READS = {"standard_figures": "iter_figures", "write_report": "render"}


@pytest.mark.parametrize(("function", "column", "call"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_column_is_one_line_naming_it_and_its_source(
    function, column, call, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingColumn) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    assert (
        message.startswith(f"{READS.get(function, function)}: ")
        and f"no column {column!r}" in message
    ), message
    if column in RUNS_COLUMNS or column in METRICS_COLUMNS:
        assert "filled by fp4lab" in message, message
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing written


def test_to_frame_output_is_told_apart_from_a_metrics_table():
    with pytest.raises(KeyError) as err:  # a KeyError as before, with a message now
        plots.gradient_flow_heatmap(frames.to_frame({"quant/l/fprop/x/rel_err": np.float32(0.1)}))
    assert "to_frame gives telemetry rows" in str(err.value)


def test_a_complete_table_passes_the_checks():
    rate = tables.divergence_rate(runs_table())
    assert rate["n"].tolist() == [2]
    assert frames.scalar_metric(metrics_table(), "loss")["value"].tolist() == [1.0]


def test_docs_schema_lists_every_column_of_the_schema():
    text = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
    for column in (*RUNS_COLUMNS, *METRICS_COLUMNS):
        assert f"`{column}`" in text, column
