"""The default score on planted models (planted.py): the culprit first, the decoy below it, and a
model with no plant left undecided; the ground truth of the subtlest plant, measured by training.

The full check (every plant's ground truth and stage 2) is benchmarks/diagnose_planted.py.
"""

import dataclasses

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
    # the set holds the culprit and nothing that does not buy its FLOPs: no decoy
    assert d.chosen == [planted.CULPRIT[plant]]
    assert planted.DECOY not in set(zip(d.skipped["layer"], d.skipped["gemm"], strict=True))
    assert "predicted to close" in d.summary  # a decided ranking: a prediction
    # no sign bias: under Adam the score is >= 0 (up to eps) for every GEMM
    assert (t[d.score] > -1e-6).all()
    # the gradient's relative error puts the decoy (large error, no effect) above the Fprop
    # culprit: the failure this score replaces
    if plant == "fprop":
        by_grad = scores.rank(t, "removed_grad_rel")
        assert (by_grad.loc[0, "layer"], by_grad.loc[0, "gemm"]) == planted.DECOY


def test_with_no_plant_the_summary_says_the_ranking_is_not_decided():
    d = _diagnose("none", batches=2)
    k = scores.tied_at_top(d.table, d.score)
    assert k is not None and k > 1
    assert f"is not decided: the first {k} cannot be told apart" in d.summary
    # with more samples the first's interval clears the rest, but by less than 2x the second
    alone = dataclasses.replace(d, table=d.table.assign(alone_step_loss_lo=[0.03, *[0.0] * 14]))
    alone.table["alone_step_loss_hi"] = [1.0, *[0.02] * 14]
    alone.table.loc[1, "alone_step_loss"] = d.table.loc[0, "alone_step_loss"] * 0.6
    first = f"{d.table.loc[0, 'layer']} {d.table.loc[0, 'gemm'].capitalize()}"
    assert f"is not decided: the first, {first} (" in alone.summary
    assert "stands apart but by less than 2x the second" in alone.summary
    assert "no GEMM stands out" in alone.summary


@pytest.mark.parametrize("plant, moved", [("fprop+wgrad", False), ("fprop", True)])
def test_two_culprits_of_different_kinds_and_moved_plants_are_both_kept(plant, moved):
    d = fl.diagnose(experiment=planted.__file__, budget=0.25,
                    config={"task_args": {"plant": plant, "moved": moved}}, **SMALL)  # fmt: skip
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
