"""The default score on planted models (planted.py): the culprit first and in the set, the decoy
last and out of it, two culprits and moved plants kept, no score below zero; on the model with
no plant no culprit-sized share, and an undecided ranking predicts nothing; the ground truth of
the subtlest plant, measured by training.

The full check (every case's stage 2, the ground truth with --truth) is
benchmarks/diagnose_planted.py.
"""

import dataclasses
import re

import planted  # tests/diagnosis/planted.py
import planted_truth
import pytest

import fp4lab as fl
from fp4lab import cli
from fp4lab.diagnosis import scores

SMALL = dict(checkpoints=(20, 40), batches=1, quant_seeds=2, time_budget=None, progress=False)


def _diagnose(plant: str, **options):
    return fl.diagnose(experiment=planted.__file__, config={"task_args": {"plant": plant}},
                       **(SMALL | options))  # fmt: skip


@pytest.mark.parametrize("plant", ["fprop", "dgrad", "wgrad"])
def test_the_default_score_ranks_the_culprit_first_and_apart(plant):
    d = _diagnose(plant)
    t = d.table
    assert d.score == scores.DEFAULT == "alone_step_loss"
    assert (t.loc[0, "layer"], t.loc[0, "gemm"]) == planted.CULPRIT[plant]
    assert scores.tied_at_top(t, d.score) == 1 and "apart from the rest" in d.summary
    ranks = t.set_index(["layer", "gemm"])["rank"]
    assert ranks[planted.DECOY] > len(t) / 2  # the decoy: among the least sensitive
    # the set holds the culprit first and nothing that does not buy its FLOPs: no decoy (a's
    # Fprop may join it: x's two informative channels share FP4 blocks with larger ones)
    assert d.chosen[0] == planted.CULPRIT[plant] and planted.DECOY not in d.chosen
    assert set(d.chosen) <= {planted.CULPRIT[plant], ("a", "fprop")}
    # the decoy: unresolved (not listed) or named as not worth its FLOPs, never the budget's
    why = d.skipped.set_index(["layer", "gemm"])["why"]
    assert why.get(planted.DECOY, "unresolved") in ("unresolved", "not worth its FLOPs")
    # a decided ranking: a prediction, of the set measured kept (the culprit: most of the gap)
    share, lo, hi, n = d.predicted
    assert (
        n == 4
        and 0.5 < lo <= share <= hi
        and f"predicted to close {100 * share:.0f} %" in d.summary
    )
    # a decided ranking: the other scores' order is no news, however low their agreement
    low = d.agreement * 0 + 0.1
    assert "disagree" not in dataclasses.replace(d, agreement=low).summary
    # no sign bias: under Adam the score is >= 0 (up to eps) for every GEMM
    assert (t[d.score] > -1e-6).all()
    # the gradient's relative error puts the decoy (large error, no effect) above the Fprop
    # culprit: the failure this score replaces
    if plant == "fprop":
        by_grad = scores.rank(t, "removed_grad_rel")
        assert (by_grad.loc[0, "layer"], by_grad.loc[0, "gemm"]) == planted.DECOY


def test_with_no_plant_no_gemm_takes_a_culprit_s_share_and_an_undecided_ranking_predicts_none():
    d = _diagnose("none", batches=2)
    assert (d.table[d.score] > -1e-6).all()  # no sign bias
    # Fprops carry what FP4 costs here (x's informative channels share blocks with larger
    # ones), spread over layers: the set's measured share is far from a culprit's (> 80 %)
    assert d.chosen and d.predicted is not None and d.predicted[0] < 0.6
    # where the first k cannot be told apart: no predicted share, and what would decide it
    tied = d.table.copy()
    tied.loc[1, "alone_step_loss_hi"] = tied.loc[0, "alone_step_loss_hi"]
    undecided = dataclasses.replace(d, table=tied)
    k = scores.tied_at_top(tied, d.score)
    assert k is not None and k > 1
    assert f"is not decided: the first {k} cannot be told apart" in undecided.summary
    assert "no share of the gap is predicted while the ranking is not decided" in undecided.summary
    assert "predicted to close" not in undecided.summary
    assert re.search(r"About \d+ samples per GEMM \(now 8: more batches", undecided.summary)
    low = dataclasses.replace(undecided, agreement=d.agreement * 0 + 0.1)
    assert "The scores disagree as well (Spearman with alone_step_loss: " in low.summary
    high = dataclasses.replace(undecided, agreement=d.agreement * 0 + 0.9)
    assert "disagree" not in high.summary
    # with its interval clear of the rest but by less than 2x the second: no sample count helps
    alone = tied.assign(alone_step_loss_lo=[0.03, *[0.0] * 14])
    alone["alone_step_loss_hi"] = [1.0, *[0.02] * 14]
    alone.loc[1, "alone_step_loss"] = d.table.loc[0, "alone_step_loss"] * 0.6
    alone = dataclasses.replace(d, table=alone)
    first = f"{d.table.loc[0, 'layer']} {d.table.loc[0, 'gemm'].capitalize()}"
    assert f"is not decided: the first, {first} (" in alone.summary
    assert "stands apart but by less than 2x the second" in alone.summary
    assert "More samples only narrow the intervals" in alone.summary
    assert "predicted to close" not in alone.summary


@pytest.mark.parametrize("plant, moved", [("fprop+wgrad", False), ("fprop", True)])
def test_two_culprits_of_different_kinds_and_moved_plants_are_both_kept(plant, moved):
    config = {"task_args": {"plant": plant, "moved": moved}}
    try:
        d = fl.diagnose(experiment=planted.__file__, budget=0.25, config=config, **SMALL)
    except ValueError as e:
        # The moved Fprop plant's model learns slowly (0.656 -> 0.59-0.67 in 40 steps); whether
        # that passes diagnose's "did it learn?" check depends on the CPU and XLA's compile
        # options (open in issue 69). Refusing is an answer; a ranking must be right.
        assert moved and "did not learn" in str(e)
        return
    culprits = planted.culprits(plant, moved)
    assert set(culprits) <= set(d.chosen) and planted.DECOY not in d.chosen
    assert (d.table[d.score] > -1e-6).all()


def test_too_few_samples_are_said_in_words_not_as_nan(tmp_path, capsys):
    fprop = 'task_args={"plant": "fprop"}'
    argv = ["diagnose", planted.__file__, "--out", str(tmp_path), "--checkpoints", "20",
            "--batches", "1", "--quant-seeds", "1", "--set", fprop]  # fmt: skip
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "there is no interval (3 are needed)" in printed
    assert "nan" not in printed.lower()


def test_the_wgrad_plant_hurts_training_and_the_decoy_does_not():
    truth = planted_truth.ground_truth("wgrad", seeds=2, steps=40).set_index(["layer", "gemm"])
    assert truth["gap"].iloc[0] > 0.01  # FP4 costs loss on this model
    assert truth.loc[planted.CULPRIT["wgrad"], "truth"] > 0.5  # most of the gap, alone
    assert abs(truth.loc[planted.DECOY, "truth"]) < 0.1
