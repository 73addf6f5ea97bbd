"""The report's config and provenance section, and the experiment's tables formatted for reading."""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_plots import make_results  # tests/analysis/test_plots.py

from fp4lab.analysis import report

pytestmark = pytest.mark.filterwarnings("error")


@dataclasses.dataclass
class Results:
    """What the results store's loader returns (store.load), as far as the report reads it."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    path: Path | None = None
    experiment: dict | None = None
    provenance: pd.DataFrame | None = None
    config_fields: tuple[str, ...] = ()


def bare(**kw) -> Results:
    """The synthetic sweep of test_plots (bf16, nvfp4, mxfp4; seeds 0-2), without metrics."""
    plain = make_results(telemetry=False)
    return Results(plain.runs, plain.metrics.iloc[:0], **kw)


def section(page: str, title: str) -> str:
    """The HTML of one <h2> section of the page."""
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 1)
    return page[start : end if end >= 0 else len(page)]


def cells_of(html_table: str) -> list[list[str]]:
    """The text of every row of the (first) table in `html_table`."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", html_table, re.DOTALL)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.DOTALL) for r in rows]


# ---------------------------------------------------------------------------------------------
# The experiment's tables.


def test_format_table_merges_intervals_and_rounds():
    table = pd.DataFrame(
        {
            "cell": ["recipe=bf16", "recipe=nvfp4", "recipe=mxfp4"],
            "pairs": [8, 8, 0],
            "diff": [-0.021757123456789, 0.0, np.nan],
            "diff_lo": [-0.022945000001, 0.0, np.nan],
            "diff_hi": [-0.020534, np.nan, np.nan],
            "tokens": [19392.0, np.inf, 8.0],
            "share": [0.105413, np.nan, 7.6437e-06],
            "lo": [1.0, 2.0, 3.0],  # a bare bound is a number, not merged
            "note": ["", np.nan, "not varied"],
            "ok": [True, False, True],
        }
    )
    table.loc[0, "note"] = np.nan  # as read_csv gives an empty text cell
    out = report.format_table(table)
    assert list(out.columns) == [
        "cell",
        "pairs",
        "diff [lo, hi]",
        "tokens",
        "share",
        "lo",
        "note",
        "ok",
    ]
    assert out["diff [lo, hi]"].tolist() == ["-0.02176 [-0.02295, -0.02053]", "0 [0, –]", "–"]
    assert out["tokens"].tolist() == ["19,392", "∞", "8"]
    assert out["share"].tolist() == ["0.1054", "–", "7.644e-06"]
    assert out["pairs"].tolist() == ["8", "8", "0"] and out["lo"].tolist() == ["1", "2", "3"]
    assert out["note"].tolist() == ["", "", "not varied"]
    assert out["ok"].tolist() == ["True", "False", "True"]
    assert out["cell"].tolist() == table["cell"].tolist()


def test_a_lo_hi_pair_of_text_columns_is_not_merged():
    table = pd.DataFrame({"x": [1.5], "x_lo": ["a"], "x_hi": ["b"]})
    assert list(report.format_table(table).columns) == ["x", "x_lo", "x_hi"]


def test_the_report_shows_the_tables_formatted(tmp_path):
    pd.DataFrame(
        {
            "cell": ["recipe=bf16", "recipe=nvfp4"],
            "pairs": [3, 3],
            "diff": [-0.021757123456789, 0.0],
            "diff_lo": [-0.022945000001, 0.0],
            "diff_hi": [-0.020534, 0.0],
        }
    ).to_csv(tmp_path / "paired.csv", index=False)
    page = report.render(bare(path=tmp_path))
    tables = section(page, "Tables")
    assert "<h3>paired.csv</h3>" in tables
    assert cells_of(tables) == [
        ["cell", "pairs", "diff [lo, hi]"],
        ["recipe=bf16", "3", "-0.02176 [-0.02295, -0.02053]"],
        ["recipe=nvfp4", "3", "0 [0, 0]"],
    ]
    assert "0.021757" not in page and "diff_lo" not in page


# ---------------------------------------------------------------------------------------------
# Config and provenance.


def provenance(runs: pd.DataFrame) -> pd.DataFrame:
    """Two code versions: the mxfp4 runs were made by a later revision."""
    later = runs["recipe"].eq("mxfp4").to_numpy()
    return pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "numerics": 1,
            "code": np.where(
                later,
                "fp4lab 0.1.0 (bbbbbbbbbb), jax 0.10.2",
                "fp4lab 0.1.0 (aaaaaaaaaa), jax 0.10.2",
            ),
            "jax": "0.10.2",
            "jaxlib": "0.10.2",
            "flax": "0.12.8",
            "device": "cpu",
            "backend": "cpu",
            "python": "3.11.7",
            "time_utc": np.where(later, "2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z"),
        }
    )


def test_config_and_provenance_section(tmp_path):
    plain = bare()
    runs = plain.runs.assign(
        weight_decay=0.1, target_gap=None, rules='[["lm_head", "bf16"]]', lr=1e-3
    )
    runs.loc[runs["recipe"] == "mxfp4", "seed_quant"] += 10  # a crossed design in one cell
    manifest = {
        "name": "synthetic",
        "file": "synthetic.py",
        "cells": [{"label": c, "overrides": {}, "run_ids": []} for c in pd.unique(runs["cell"])],
        "overrides": {"lr": 0.001, "steps": 12},
    }
    fields = ("recipe", "lr", "steps", "weight_decay", "target_gap", "rules", "target_loss")
    results = Results(runs, plain.metrics, None, manifest, provenance(runs), fields)
    page = report.write_report(results, tmp_path).read_text(encoding="utf-8")
    assert page.index("<h2>Figures</h2>") < page.index("<h2>Config and provenance</h2>")
    part = section(page, "Config and provenance")
    assert "Experiment <b>synthetic</b> from <code>synthetic.py</code>, 3 cells." in part
    assert "<code>lr=0.001, steps=12</code>" in part
    tables = re.findall(r"<table.*?</table>", part, re.DOTALL)
    per_cell, shared, prov = (cells_of(t) for t in tables)
    assert per_cell == [
        ["cell", "runs", "seeds", "recipe"],
        ["recipe=bf16", "3", "3: 0–2 in every stream", "bf16"],
        ["recipe=nvfp4", "3", "3: 0–2 in every stream", "nvfp4"],
        ["recipe=mxfp4", "3", "3 triples: init 0, 1, 2; data 0, 1, 2; quant 10, 11, 12", "mxfp4"],
    ]
    assert shared == [
        ["lr", "0.001", "steps", "12", "weight_decay", "0.1"],
        ["target_gap", "None", "rules", "[[&quot;lm_head&quot;, &quot;bf16&quot;]]"],
    ]  # target_loss is left out: its column holds the summary's resolved target
    assert "The 5 config fields every cell has in common." in part
    assert "These runs come from 2 different code versions or environments." in part
    assert prov[0] == [
        "runs",
        "code",
        "numerics",
        "jax",
        "jaxlib",
        "flax",
        "python",
        "backend",
        "device",
        "sweep started (UTC)",
    ]
    assert prov[1][:3] == ["6", "fp4lab 0.1.0 (aaaaaaaaaa), jax 0.10.2", "1"]
    assert prov[2][:2] == ["3", "fp4lab 0.1.0 (bbbbbbbbbb), jax 0.10.2"]
    assert prov[1][3:] == [
        "0.10.2",
        "0.10.2",
        "0.12.8",
        "3.11.7",
        "cpu",
        "cpu",
        "2026-01-01T00:00:00Z",
    ]


def test_config_section_without_the_stores_extras():
    """runs and metrics only: the config columns are what is neither identity, seed nor
    summary; no manifest, no provenance."""
    part = section(report.render(bare()), "Config and provenance")
    per_cell, shared = (cells_of(t) for t in re.findall(r"<table.*?</table>", part, re.DOTALL))
    assert per_cell[0] == ["cell", "runs", "seeds", "recipe"]
    assert shared == [["lr", "0.001", "steps", "12"]]
    assert "No provenance recorded." in part and "Experiment <b>" not in part


# ---------------------------------------------------------------------------------------------
# One interval for one contrast: the report's verdict and `fp4lab show`'s words.


def test_the_report_and_show_give_a_contrast_one_family_and_one_interval():
    """Three cells: all pairs would be 3 contrasts, every cell against BF16 is 2. The report's
    "what matters" table and the summary's words (`fp4lab show`, `run`) use the same rows."""
    from fp4lab.analysis import verdicts

    runs = bare().runs
    assert runs["cell"].nunique() == 3
    said = verdicts.words(runs, "loss_gap")
    family = int(re.search(r"Bonferroni over (\d+) rows", said.header).group(1))
    page = report.render(bare())
    note = re.search(r"every cell against (\S+); (\d+) comparisons", page)
    assert note and note.group(1) == "recipe=bf16" and int(note.group(2)) == family
    table = verdicts.verdict(runs, "loss_gap", baseline=verdicts.baseline_cell(runs))
    fixed = table[table["kind"] == "fixed"]
    assert sorted(fixed["term"]) == ["recipe=mxfp4 - recipe=bf16", "recipe=nvfp4 - recipe=bf16"]
    judged = fixed[fixed["verdict"].isin(["higher", "lower", "no evidence"])]
    assert len(judged), fixed["verdict"]
    for row in judged.itertuples():  # the words quote the interval the report shows
        shown = f"{row.effect:+.3g} [{row.lo:+.3g}, {row.hi:+.3g}]"
        assert any(shown in line for line in said.cells), (shown, said.cells)
    for row in fixed.drop(judged.index).itertuples():  # not judged: the same word in both
        assert any(
            line.startswith(row.term.split(" - ")[0]) and row.verdict in line for line in said.cells
        )
