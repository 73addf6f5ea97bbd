"""Every word the verdict prints that is not a judgement says why, in terms a reader can act on:
confounded streams and the design that separates them, the seed combinations an unbalanced
cell lacks, and cells whose runs did not learn."""

import numpy as np
import pandas as pd
from crossed_design import crossed_cell  # tests/analysis/crossed_design.py

from fp4lab import analysis
from fp4lab.analysis import verdicts

DRAWS = 4000  # the words tested here do not depend on the interval ends' last digits


def _same_seeds(name, n, rng, offset=0.0):
    """A cell run with `seeds=n`: triples (i, i, i)."""
    y = offset + np.random.default_rng(rng).normal(size=n)
    seeds = dict(seed_init=range(n), seed_data=range(n), seed_quant=range(n))
    return pd.DataFrame(dict(run_id=[f"{name}{i}" for i in range(n)], cell=name, status="ok"))\
        .assign(loss_gap=y, **{k: list(v) for k, v in seeds.items()})  # fmt: skip


def test_streams_that_moved_together_are_called_confounded_with_the_design_to_use():
    runs = _same_seeds("c", 4, 0)
    v = analysis.verdict(runs, draws=DRAWS)
    row = v[v["kind"] == "random"].iloc[0]
    assert row["factor"] == "init=data=quant"
    assert (
        "init=data=quant: confounded, the init, data, quant seeds moved together in every run, "
        "so which of them acts cannot be said; to separate them: seeds=fl.design.crossed() or "
        "`fp4lab run --design streams` (the quant stream crossed with the others)"
    ) in row["evidence"]
    line = verdicts.stream_words(v)[0]
    assert line.startswith("init=data=quant in c: ") and "confounded" in line


def test_an_unbalanced_cell_names_the_missing_and_repeated_combinations():
    runs = crossed_cell("c", (3, 1, 3), rng=1)  # init x quant, 9 runs
    runs = pd.concat([runs.drop(index=[4]), runs.iloc[[0]]])  # 1/0/1 missing, 0/0/0 twice
    v = analysis.verdict(runs, draws=DRAWS)
    rows = v[v["kind"] == "random"].set_index("factor")
    assert set(rows.loc[["init", "quant"], "verdict"]) == {"unbalanced"}
    assert rows.loc["quant", "evidence"] == (
        "missing init/data/quant 1/0/1 (1 of 9 combinations); ran more than once: "
        "init/data/quant 0/0/0"
    )
    line = next(x for x in verdicts.stream_words(v) if x.startswith("quant in c"))
    assert line == f"quant in c: unbalanced: {rows.loc['quant', 'evidence']}"


def test_a_cell_that_did_not_learn_gets_no_verdict_words_and_leaves_the_family():
    sd = (0.01, 0.01, 0.0, 0.0, 0.0, 0.0, 0.005)
    a = crossed_cell("recipe=bf16", (3, 3, 1), sd, 0).assign(recipe="bf16", learned=True)
    b = crossed_cell("recipe=nvfp4", (3, 3, 1), sd, 1, 2.3).assign(recipe="nvfp4", learned=True)
    b.loc[b.index[:7], "learned"] = False
    runs = pd.concat([a, b])
    why = "7 of 9 runs: the training loss did not fall by more than its batch-to-batch noise"
    v = analysis.verdict(runs, baseline="recipe=bf16", draws=DRAWS)
    fixed = v.iloc[0]
    assert fixed["verdict"] == "did not learn" and np.isnan(fixed["lo"])
    assert fixed["evidence"] == f"recipe=nvfp4 did not learn ({why})"
    stuck_rows = v[(v["kind"] == "random") & (v["term"] == "recipe=nvfp4")]
    assert len(stuck_rows) and set(stuck_rows["verdict"]) == {"did not learn"}
    learned_rows = v[(v["kind"] == "random") & (v["term"] == "recipe=bf16")]
    assert "did not learn" not in set(learned_rows["verdict"])
    # the family: only the learned cell's stream factors (2 of them)
    assert v.attrs["comparisons"] == analysis.verdict(a, draws=DRAWS).attrs["comparisons"] == 2
    said = verdicts.words(runs, "loss_gap", draws=DRAWS)
    assert said.stuck == [f"recipe=nvfp4: did not learn: {why}"]
    assert said.cells == [f"recipe=nvfp4: not judged: recipe=nvfp4 did not learn ({why})"]
    assert not [x for x in said.streams if "recipe=nvfp4" in x]
    assert verdicts.words(a, "loss_gap", draws=DRAWS).stuck == []
    old = runs.assign(learned=np.nan)  # records made before the column: nothing is claimed
    assert verdicts.words(old, "loss_gap", draws=DRAWS).stuck == []


def test_two_one_seed_cells_on_the_same_seed_are_told_one_shared_seed():
    a = _same_seeds("a", 1, 0)
    b = _same_seeds("b", 1, 1, offset=1.0)
    row = analysis.verdict(pd.concat([a, b]), baseline="a", draws=DRAWS).iloc[0]
    assert row["verdict"] == "too few seeds"
    assert row["evidence"] == (
        "one shared seed (init/data/quant 0/0/0), no stream varied in both cells: no interval; "
        "need 3 levels of a stream in each"
    )
    apart = _same_seeds("b", 1, 1).assign(seed_init=5, seed_data=5, seed_quant=5)
    row = analysis.verdict(pd.concat([a, apart]), baseline="a", draws=DRAWS).iloc[0]
    assert (row["verdict"], row["evidence"]) == ("no shared seeds", "nothing to pair on")


def test_runs_that_did_not_learn_because_they_diverged_are_said_to_have_diverged():
    from fp4lab.analysis import explain

    rows = pd.DataFrame({"status": ["ok"] * 4, "learned": [False, False, True, False],
                         "diverged": [True, False, False, True]})  # fmt: skip
    assert explain.not_learned(rows) == (
        "2 of 4 runs diverged (a non-finite loss, or one far above its first or running "
        "median); 1 of 4 runs: the training loss did not fall by more than its batch-to-batch "
        "noise"
    )
    assert explain.not_learned(rows.drop(columns="diverged")).startswith("3 of 4 runs: the")
