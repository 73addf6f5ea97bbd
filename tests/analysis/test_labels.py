"""Readable names in figures: cells in words, statistics by what they measure."""

import pytest

from fp4lab import analysis
from fp4lab.analysis.labels import cell_label, stat_label
from fp4lab.schema import ACC_STATS, GRAD_NOISE_STATS, GRAD_STATS, STATS


@pytest.mark.parametrize(
    "cell, readable",
    [
        ("recipe=bf16", "BF16"),
        ("recipe=nvfp4", "NVFP4"),
        ("recipe=nvfp4-rl", "NVFP4-RL"),
        ("recipe=mxfp4-h16", "MXFP4-H16"),
        ("recipe=nvfp4,wgrad=bf16", "NVFP4, Wgrad in BF16"),
        ("recipe=nvfp4,wgrad_dy=fp8", "NVFP4, Wgrad dy in FP8"),
        ("recipe=nvfp4,lr=0.001", "NVFP4, lr 0.001"),
        ("lr=0.001", "lr 0.001"),
        # the runner's name of a cell with GEMM overrides: a dict, spaces inside its braces
        (
            "recipe=nvfp4,gemms={'wgrad': 'bf16', 'dgrad_dy': None}",
            "NVFP4, Wgrad in BF16, Dgrad dy in high precision",
        ),
        ("recipe=e2m1/1x16/e4m3/sr", "e2m1/1x16/e4m3/sr"),  # a spec summary is not a name
        ("hidden=(64, 64)", "hidden (64, 64)"),
    ],
)
def test_runner_cell_names_read_as_words(cell, readable):
    assert cell_label(cell) == readable


@pytest.mark.parametrize(
    "cell",
    [
        "nvfp4, first 3 in bf16",
        "base",
        "fixed",
        "recipe=nvfp4 [stale 1a2b3c]",
        "a=b,c",
        "it's=nvfp4",
        "recipe=(nvfp4",
    ],
)
def test_a_name_someone_wrote_is_kept(cell):
    assert cell_label(cell) == cell


def test_labels_override_the_names_they_give_and_only_those():
    labels = {"recipe=bf16": "baseline"}
    assert cell_label("recipe=bf16", labels) == "baseline"
    assert cell_label("recipe=nvfp4", labels) == "NVFP4"
    # a value of another runs column reads as its key=value part would
    assert cell_label("nvfp4-rl", by="recipe") == "NVFP4-RL"
    assert cell_label(0.001, by="lr") == "lr 0.001"
    assert cell_label(0.001, {0.001: "small lr"}, by="lr") == "small lr"


def test_every_statistic_of_the_schema_has_a_readable_name():
    assert stat_label("rel_err") == "relative error"
    assert stat_label("loss") == "loss (nats)"
    assert stat_label("loss_gap") == "loss gap to the floor (nats)"
    assert stat_label("loss_gap", unit=False) == "loss gap to the floor"
    assert stat_label("saturated") == "saturated (fraction of elements)"
    assert stat_label("wall_s") == "wall time (s)"
    # "cos" is the shadow gradient's unless asked for as drift
    assert stat_label("cos") == "cosine to the exact gradient"
    assert stat_label("cos", kind="acc") == "cosine to the high-precision shadow"
    assert stat_label("not_a_stat") == "not_a_stat"
    kinds = [("quant", s) for s in STATS] + [("grad", s) for s in GRAD_STATS + GRAD_NOISE_STATS]
    kinds += [("acc", s) for stats in ACC_STATS.values() for s in stats]
    names = {(kind, s): stat_label(s, kind=kind) for kind, s in kinds}
    assert all(name != s and "_" not in name for (_, s), name in names.items()), names
    assert len(set(names.values())) == len(names)  # no two statistics share a name


def test_the_labels_are_part_of_the_analysis_api():
    assert analysis.cell_label is cell_label and analysis.stat_label is stat_label


def test_a_loss_is_in_nats_for_language_models_and_a_squared_error_for_the_teacher():
    assert stat_label("loss", task="markov") == "loss (nats)"
    assert stat_label("loss_gap", task="teacher") == "loss gap to the floor (mean squared error)"
    assert stat_label("rel_err", task="teacher") == "relative error"
