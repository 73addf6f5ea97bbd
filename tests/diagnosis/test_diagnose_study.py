"""fl.diagnose and `fp4lab diagnose` end to end on a tiny model with one planted sensitive GEMM."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import pandas as pd
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab import cli
from fp4lab.diagnosis import choose, verify

PLANTED = '''
"""A tiny MLP whose first layer's Wgrad alone sees a few huge tokens (the loss ignores them)."""
import jax
import jax.numpy as jnp
from flax import nnx
import fp4lab as fl

D = 16
HUGE = {huge}


class Net(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(D, 32, rngs=rngs)
        self.b = nnx.Linear(32, 32, rngs=rngs)
        self.c = nnx.Linear(32, D, rngs=rngs)

    def __call__(self, x):
        return self.c(jnp.tanh(self.b(jnp.tanh(self.a(x)))))


def model(config, rngs):
    return Net(rngs)


def loss(model, batch):
    x, y, w = batch
    return jnp.sum(w[:, None] * (model(x) - y) ** 2) / jnp.sum(w) / D


def batch(key, step):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (32, D))
    big = (jnp.arange(32) % 16) == 0  # one token in 16: huge in x, weight 0 in the loss
    x = jnp.where(big[:, None], HUGE * x, x)
    y = jnp.sin(x) + 0.1 * jax.random.normal(kn, (32, D))
    return x, y, jnp.where(big, 0.0, 1.0)


def get_config():
    return fl.Config(batch_size=32, steps=20, lr=1e-2, warmup=2, eval_batches=2)


def sweep(add):
    add(recipe="nvfp4")
'''
ARGS = dict(checkpoints=(0, 10), batches=2, quant_seeds=2)


def _file(folder, huge=1e4):
    path = folder / f"planted_{int(huge)}.py"
    path.write_text(PLANTED.format(huge=huge))
    return path


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diagnose")
    path, out = _file(folder), folder / "out"
    argv = ["diagnose", str(path), "--out", str(out), "--checkpoints", "0,10", "--batches", "2",
            "--quant-seeds", "2", "--set", "lr=0.01"]  # fmt: skip
    rc = cli.main(argv)
    return rc, path, out


def test_the_cli_writes_every_output(cli_run, capsys):
    rc, _, out = cli_run
    assert rc == 0
    for name in ("ranking.csv", "samples.csv", "agreement.csv", "rules.py", "sensitivity.png",
                 "summary.txt"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    summary = (out / "summary.txt").read_text()
    assert "1 compile(s)" in summary and "a Wgrad" in summary


def test_the_planted_wgrad_ranks_first_by_the_default_score_and_its_own_error(cli_run):
    table = pd.read_csv(cli_run[2] / "ranking.csv")
    assert (table.loc[0, "layer"], table.loc[0, "gemm"]) == ("a", "wgrad")
    assert table.loc[0, "alone_step_loss_lo"] > table.loc[1:, "alone_step_loss_hi"].max()
    own = table.sort_values("own_error", ascending=False)
    assert (own.iloc[0]["layer"], own.iloc[0]["gemm"]) == ("a", "wgrad")
    assert own.iloc[0]["own_error"] > 10 * own.iloc[1]["own_error"]
    assert len(table) == 9 and table["samples"].eq(2 * 2 * 2).all()


def test_without_the_outliers_the_same_gemm_is_not_singled_out(tmp_path):
    d = fl.diagnose(experiment=_file(tmp_path, huge=1), **ARGS)
    row = d.table.set_index(["layer", "gemm"]).loc[("a", "wgrad")]
    assert row["own_error"] < 1  # an ordinary FP4 error, not the planted one (> 10)
    assert d.compiles == 1


def test_same_seeds_give_the_same_csv(cli_run, tmp_path):
    _, path, out = cli_run
    fl.diagnose(experiment=path, out=tmp_path, **ARGS)
    for name in ("ranking.csv", "samples.csv", "agreement.csv", "rules.py"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


def test_the_printed_rules_run_unchanged_through_quantize_model(cli_run):
    source = (cli_run[2] / "rules.py").read_text()
    scope = {}
    exec(source, scope)  # the printed text, as a user pastes it
    rules = scope["rules"]
    assert [r.path for r in rules] == ["a", ".*"]
    assert rules[0].recipe.wgrad_x == fl.recipes.get("bf16").wgrad_x
    assert rules[0].recipe.fprop_x == fl.recipes.get("nvfp4").fprop_x

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(16, 32, rngs=rngs), nnx.Linear(32, 16, rngs=rngs)

    model = fl.quantize_model(Net(nnx.Rngs(0)), rules, key=jax.random.key(0))
    table = fl.describe(model).set_index("path")["recipe"]
    assert table["a"] == "nvfp4+wgrad=bf16" and table["b"] == "nvfp4"
    fl.Config(recipe="nvfp4", rules=tuple((r.path, r.recipe) for r in rules[:-1]))


def test_bad_input_is_one_line(tmp_path, capsys):
    path = _file(tmp_path)
    assert cli.main(["diagnose", str(path), "--score", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "score='nope'" in err
    assert cli.main(["diagnose", str(path), "--set", "nope=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    assert cli.main(["diagnose", str(tmp_path / "missing.py")]) == 2
    assert "no such experiment file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="budget"):
        fl.diagnose(experiment=path, budget=2.0)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(verify_seeds=3), "at least 4 seeds"),
        (dict(verify_steps=0), "verify_steps=0"),
        (dict(verify_steps=2.5), "verify_steps=2.5"),
        (dict(out=None), "pass out="),
        (dict(hp="nope"), "unknown recipe 'nope'"),
    ],
)
def test_what_would_make_stage_2_fail_is_checked_before_stage_1(tmp_path, options, words):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=re.escape(words)):
        fl.diagnose(experiment=_file(tmp_path), verify=True, **({"out": out} | options), **ARGS)
    assert not out.exists()  # nothing measured, nothing written
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file; verify needs a folder"):
        fl.diagnose(experiment=_file(tmp_path), verify=True, out=tmp_path / "file", **ARGS)


def test_a_model_of_your_own_from_python():
    def model(config, rngs):
        return nnx.Sequential(
            nnx.Linear(16, 16, rngs=rngs), jnp.tanh, nnx.Linear(16, 16, rngs=rngs)
        )

    def loss(model, batch):
        return jnp.mean((model(batch) - jnp.roll(batch, 1, axis=-1)) ** 2)

    def batch(key, step):
        return jax.random.normal(key, (16, 16))

    d = fl.diagnose(model, loss, batch, config=fl.Config(batch_size=16, steps=4),
                    checkpoints=(0, 4), batches=1, quant_seeds=1)  # fmt: skip
    assert sorted(set(d.table["layer"])) == ["layers.0", "layers.2"]
    # six GEMMs of equal cost: none fits a 10 % budget (a ceiling), which the summary says
    assert d.chosen == [] and d.share == 0 and d.rules[-1] == (".*", "nvfp4")
    assert (
        "Nothing is kept: no GEMM fits the budget of 10.00% of GEMM FLOPs: the cheapest costs "
        "16.67%; raise the budget to at least that." in d.summary
    )
    assert choose.over_budget(d.table, 1 / 6) == ""


def test_verify_trains_the_sets_and_reports_the_gap_they_close(tmp_path):
    # budget 1 (allowed): a ceiling, not a quota; the set holds what is worth keeping
    d = fl.diagnose(experiment=_file(tmp_path), out=tmp_path / "out", verify=True,
                    verify_steps=12, progress=False, budget=1.0, **ARGS)  # fmt: skip
    assert d.chosen == [("a", "wgrad")] and "budget 100.0%, a ceiling" in d.summary
    gap = d.gap.set_index("cell")
    draws = ["random-k:0", "random-k:1", "random-k:2"]
    assert list(gap.index) == ["fp4", "hp", "top-k", "random-k", "last-blocks", *draws]
    # no whole layer fits a's Wgrad's 1/12 of the FLOPs (the smallest layer costs 3/12): no
    # last-blocks cell, said in words
    assert "last-blocks" not in d.sets and gap.loc["last-blocks", "pairs"] == 0
    assert "No whole layer fits top-k's FLOP share: no last-blocks cell." in d.summary
    assert (gap.drop(index="last-blocks")["pairs"] == 4).all()
    assert gap.loc["fp4", "gap_closed"] == 0 and gap.loc["hp", "gap_closed"] == 1
    assert gap.loc["top-k", "flop_share"] == pytest.approx(d.share)
    one = d.table["flop_share"].max()  # within one GEMM of top-k's share, and not above it
    assert all(d.share - one < gap.loc[c, "flop_share"] <= d.share + 1e-12 for c in draws)
    # random-k is the draws' mean per seed: its share of the gap is their mean
    assert gap.loc["random-k", "gap_closed"] == pytest.approx(gap.loc[draws, "gap_closed"].mean())
    assert list(d.gap_own["cell"]) == list(gap.index) and "eval_loss" in d.gap_own
    assert "random-k (3 draws" in d.summary and "the draws from" in d.summary
    stage2 = d.summary.split("\n\n")[1]
    assert "on eval_hp (held out, high-precision forward)" in stage2 and "on eval_loss" in stage2
    unresolved = dataclasses.replace(d, gap_hp=(0.001, -0.002, 0.004, 4))
    stage2 = unresolved.summary.split("\n\n")[1]
    assert stage2.startswith("The FP4-to-bf16 gap on eval_hp is not resolved (0.001, [-0.002, ")
    apart = dataclasses.replace(d, gap_own_total=(d.gap_hp[0] / 10, 0.0, 1.0, 4))
    assert "The two losses disagree: FP4 hurts the trained weights more" in apart.summary
    assert gap.loc["top-k", "lo"] <= gap.loc["top-k", "gap_closed"] <= gap.loc["top-k", "hi"]
    # the planted Wgrad kept in BF16 closes most of the gap; random GEMMs do not
    assert gap.loc["top-k", "gap_closed"] > 0.5 > gap.loc["random-k", "gap_closed"]
    assert list(d.versus["against"]) == ["random-k"]
    assert "beats random-k" in d.summary
    assert (tmp_path / "out" / "verify.csv").is_file()
    kept = pd.read_csv(tmp_path / "out" / "sets.csv")
    assert set(kept["cell"]) == {"top-k", *draws}
    top = kept[kept["cell"] == "top-k"]
    assert list(zip(top["layer"], top["gemm"], strict=True)) == d.chosen
    # a set with no random control (a budget keeping every GEMM: every draw is the whole
    # model) is said in words, not divided by zero
    runs = fl.load(tmp_path / "out" / "verify").runs
    alone = runs[~runs["cell"].astype(str).str.startswith("random-k")]
    assert verify.versus(alone).empty
    bare = dataclasses.replace(
        d,
        sets={"top-k": d.chosen},
        gap=verify.gap_table(alone).merge(d.gap[["cell", "flop_share"]], on="cell"),
        versus=verify.versus(alone),
    )
    stage2 = bare.summary.split("\n\n")[1]
    assert "No random set within top-k's FLOP share differs from top-k" in stage2
    assert "The ranking beats random-k" not in stage2 and "does not beat" not in stage2
    empty = dataclasses.replace(bare, sets={}, chosen=[])
    assert "The recommended set is empty: stage 2 measured the FP4 gap alone." in empty.summary


MINE = """
fl.recipes.register("mine-fp4", fl.recipes.get("nvfp4").replace(backward="dequantized"))
_base = get_config


def get_config():
    return _base().replace(rules=(("c", None),))
"""


def test_the_file_s_recipes_and_rules_are_honoured_and_stage_1_shows_progress(tmp_path, capsys):
    path = _file(tmp_path)
    path.write_text(path.read_text() + MINE)
    out = tmp_path / "out"
    argv = ["diagnose", str(path), "--out", str(out), "--recipe", "mine-fp4", "--checkpoints",
            "0,10", "--batches", "2", "--quant-seeds", "2", "--exclude", "b"]  # fmt: skip
    try:
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        # the first estimate comes after the first sample, before the rest are measured
        assert re.search(r"stage 1: 1/8 samples in \d+ s \(\d+ s compiling\); the rest about", err)
        assert "stage 1: 8/8" not in err and "stage 1: 2/8 samples" in err
        table = pd.read_csv(out / "ranking.csv")
        assert set(table["layer"]) == {"a"}  # b excluded, c kept by the file's rule
        summary = (out / "summary.txt").read_text()
        assert "Left in high precision and out of the diagnosis: b, c." in summary
        source = (out / "rules.py").read_text()
    finally:
        fl.recipes.unregister("mine-fp4")
    scope = {}
    exec(source, scope)  # registers mine-fp4 again: the text runs on its own, names kept
    try:
        rules = scope["rules"]
        assert [(r.path, r.recipe) for r in rules[:2]] == [("b", None), ("c", None)]
        model = fl.quantize_model(_Net(nnx.Rngs(0)), rules, key=jax.random.key(0))
        names = fl.describe(model).set_index("path")["recipe"]
        assert names["a"].startswith("mine-fp4") and names["b"] == "-"
    finally:
        fl.recipes.unregister("mine-fp4")


class _Net(nnx.Module):
    def __init__(self, rngs):
        self.a, self.b = nnx.Linear(16, 32, rngs=rngs), nnx.Linear(32, 16, rngs=rngs)
        self.c, self.d = nnx.Linear(16, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)


def test_a_time_budget_stops_stage_1_and_says_so(tmp_path, capsys):
    d = fl.diagnose(experiment=_file(tmp_path), checkpoints=(0, 10), batches=3, quant_seeds=3,
                    time_budget=1e-3)  # fmt: skip
    assert (d.table["samples"] == 2).all() and d.planned == 18  # one round: at least one
    assert "The time budget stopped it after 2 of 18 samples." in d.summary
    assert (
        "Its samples cover checkpoints 0, 10; held-out batches 0; quant seeds 0: its intervals "
        "carry no variation over held-out batches or quant seeds." in d.summary
    )
    err = capsys.readouterr().err
    assert "ends it after 2 of 18 samples" in err
    # the first estimate is the whole design's, and the budget's cap is said apart
    assert re.search(r"the rest about \d+ s, the time budget leaves 0 s of it", err)
