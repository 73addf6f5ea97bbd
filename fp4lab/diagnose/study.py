"""`fl.diagnose(...)`: which layers and GEMMs of a model to keep in high precision.

    import fp4lab as fl
    d = fl.diagnose(model, loss, batch, config=fl.Config(steps=200), out="results/mine-diag")
    d = fl.diagnose(experiment="experiments/own_model.py", verify=True)
    print(d.summary)
    fl.quantize_model(my_model, d.rules, key=key)

Stage 1 (`fp4lab.diagnose.probe`, `scores`): the model under the FP4 recipe with a gate per
layer and GEMM (`gate`), at a few checkpoints of a short run under that recipe, on several
held-out batches and quant seeds: every GEMM alone quantized, every GEMM alone kept in high
precision, the all-FP4 model and the shadow, in one compiled program. The ranking's first
GEMMs within a FLOP budget are the recommended set (`choose`); stage 2 (`verify`) trains it
against all-FP4, all-high-precision, random GEMMs and the last layers at the same FLOP share.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp4lab.analysis.plots.sensitivity import sensitivity_heatmap
from fp4lab.core import recipes
from fp4lab.diagnose import choose, probe, scores, verify
from fp4lab.schema import GEMMS
from fp4lab.sweep import own
from fp4lab.sweep.experiment import load_experiment
from fp4lab.train.config import Config
from fp4lab.train.tasks import eval_batch, make_task
from fp4lab.train.trainer import make_keys

__all__ = ["Diagnosis", "diagnose", "sets_table"]


@dataclasses.dataclass
class Diagnosis:
    """What `diagnose` found; `write(out)` saves it, `summary` says it in one paragraph."""

    table: pd.DataFrame  # ranked: one row per layer and GEMM, every score with its interval
    samples: pd.DataFrame  # one row per layer, GEMM and sample (checkpoint, batch, quant)
    agreement: pd.DataFrame  # Spearman rank correlation of the scores across the table
    score: str  # the score that ranks
    chosen: list  # [(layer, gemm)] recommended for high precision
    share: float  # their share of GEMM FLOPs
    rules: list  # [(path regex, recipe)] for quantize_model / Config.rules
    recipe: Any
    hp: Any
    stage1_s: float  # wall seconds of stage 1 (checkpoints, measurements, scores)
    compiles: int  # traces of stage 1's measuring program (one serves every variant)
    gap: pd.DataFrame | None = None  # stage 2: share of the FP4-to-hp gap each cell closes
    versus: pd.DataFrame | None = None  # stage 2: top-k against random-k and last-blocks
    verify_s: float = 0.0
    sets: dict = dataclasses.field(default_factory=dict)  # stage 2's sets: {cell: [(l, g)]}

    @property
    def rules_source(self) -> str:
        body = choose.rules_source(self.rules)
        return "import fp4lab as fl\n\n" + ("\n" if body.startswith("def") else "") + body + "\n"

    def figure(self):
        return sensitivity_heatmap(self.table, self.score, self.chosen)

    @property
    def summary(self) -> str:
        return _summary(self)

    def write(self, out: str | Path) -> list[Path]:
        """ranking.csv, samples.csv, agreement.csv, rules.py, sensitivity.png, summary.txt
        (and after stage 2 sets.csv: the GEMMs each cell kept, verify.csv, versus.csv) in the
        folder `out`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {name: out / name for name in ("ranking.csv", "samples.csv", "agreement.csv")}
        self.table.to_csv(paths["ranking.csv"], index=False)
        self.samples.to_csv(paths["samples.csv"], index=False)
        self.agreement.to_csv(paths["agreement.csv"])
        if self.sets:
            paths["sets.csv"] = out / "sets.csv"
            sets_table(self.sets).to_csv(paths["sets.csv"], index=False)
        if self.gap is not None:
            paths["verify.csv"] = out / "verify.csv"
            self.gap.to_csv(paths["verify.csv"], index=False)
            paths["versus.csv"] = out / "versus.csv"
            self.versus.to_csv(paths["versus.csv"], index=False)
        paths["rules.py"] = out / "rules.py"
        paths["rules.py"].write_text(self.rules_source)
        paths["sensitivity.png"] = out / "sensitivity.png"
        self.figure().savefig(paths["sensitivity.png"], dpi=150)
        paths["summary.txt"] = out / "summary.txt"
        paths["summary.txt"].write_text(self.summary + "\n")
        return list(paths.values())


def sets_table(sets: dict) -> pd.DataFrame:
    """{cell: [(layer, gemm)]} as rows (cell, layer, gemm)."""
    rows = [(cell, layer, gemm) for cell, kept in sets.items() for layer, gemm in kept]
    return pd.DataFrame(rows, columns=["cell", "layer", "gemm"])


def _config(model, loss, batch, experiment, config, task_options) -> Config:
    """The config whose task diagnose studies: an experiment file's base, or `config` with the
    functions registered as its task (`fp4lab.own.task`), or `config` alone (a built-in task)."""
    given = [model is not None, loss is not None, batch is not None]
    if experiment is not None:
        if any(given) or task_options:
            raise ValueError("diagnose: give an experiment file or model, loss and batch, not both")
        return load_experiment(experiment, overrides=_fields(config or {})).base
    cfg = config if isinstance(config, Config) else Config(**dict(config or {}))
    if any(given):
        if not all(given):
            raise ValueError("diagnose: a model of your own needs model, loss and batch")
        cfg = cfg.replace(task="own", task_file=own.task(model, loss, batch, **task_options))
    return cfg


def _fields(config) -> dict:
    if isinstance(config, Config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return dict(config)


def _check(recipe, hp, score, budget, checkpoints, batches, quant_seeds) -> None:
    recipes.get(recipe)  # an unknown name raises, listing the known ones
    recipes.get(hp)
    if score not in scores.SCORES:
        raise ValueError(f"diagnose: score={score!r}; allowed: {', '.join(scores.SCORES)}")
    if not 0 < budget <= 1:
        raise ValueError(f"diagnose: budget={budget!r}; need a share of GEMM FLOPs in (0, 1]")
    if not checkpoints or any(isinstance(c, bool) or int(c) != c or c < 0 for c in checkpoints):
        raise ValueError(f"diagnose: checkpoints={checkpoints!r}; need steps >= 0")
    for name, n in (("batches", batches), ("quant_seeds", quant_seeds)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"diagnose: {name}={n!r}; need an int >= 1")


def diagnose(
    model=None,
    loss=None,
    batch=None,
    *,
    experiment: str | Path | None = None,
    config: Config | dict | None = None,
    recipe="nvfp4",
    hp="bf16",
    checkpoints=(0, 50, 100),
    batches: int = 3,
    quant_seeds: int = 3,
    score: str = "removed_grad_rel",
    budget: float = 0.1,
    verify: bool = False,
    verify_steps: int | None = None,
    verify_seeds: int = 4,
    out: str | Path | None = None,
    level: float = 0.95,
    progress: bool = True,
    **task_options,
) -> Diagnosis:
    """Ranks every layer x GEMM of a model by how much quantizing it hurts, recommends a set to
    keep in high precision within a FLOP budget, and (with `verify`) checks it by training.

    Args:
      model, loss, batch: your task (`fp4lab.own`: model(config, rngs), loss(model, batch),
        batch(key, step) or batch(config, key, step)); `task_options` (eval_batch, floor,
        tokens_per_step, data) as `fl.own.task`. Or:
      experiment: an experiment file (its get_config() and model, built-in or its own).
      config: the Config (or overrides of the experiment's base): model sizes, batch size,
        optimizer; its recipe, gemms, rules and phases are replaced by the diagnosis' own.
      recipe: the FP4 recipe diagnosed. hp: the high-precision recipe kept GEMMs get.
      checkpoints: optimizer steps of the short run (under `recipe`) whose weights are
        measured (clipped to config.steps). batches: held-out batches per checkpoint.
        quant_seeds: quantization seeds per batch.
      score: the ranking score (`fp4lab.diagnose.scores.SCORES`). budget: the share of GEMM
        FLOPs the recommended set may keep in high precision.
      verify: run stage 2 (`fp4lab.diagnose.verify`) for `verify_steps` steps (default the
        config's) on `verify_seeds` (>= 4) seed triples into `out`/verify.
      out: a folder for the outputs (`Diagnosis.write`); required with verify.
      level: coverage of every interval. progress: the sweep's progress display (stage 2).
    Returns:
      A `Diagnosis`.
    Raises:
      ValueError: a bad argument (the message names it).
    """
    _check(recipe, hp, score, budget, checkpoints, batches, quant_seeds)
    if verify and out is None:
        raise ValueError("diagnose: verify writes its runs into a results folder; pass out=...")
    cfg = _config(model, loss, batch, experiment, config, task_options)
    steps = sorted({min(int(c), cfg.steps) for c in checkpoints})
    start = time.perf_counter()
    task = make_task(cfg)
    keys = make_keys(0, 0, 0)
    measurer = probe.Probe(task, recipe, keys)
    weights = probe.checkpoints(task, cfg, recipe, keys, steps)
    rests = [measurer.rest_for(keys, k) for k in probe.quant_keys(range(quant_seeds))]
    gates = probe.variants(len(measurer.sites))
    rows = []
    for step, params in zip(steps, weights, strict=True):
        for b in range(batches):
            data = eval_batch(task, keys, b)
            for q, rest in enumerate(rests):
                out_b, shadow = measurer.measure(params, rest, data, gates)
                sample = {"checkpoint": step, "batch": b, "quant": q}
                rows.append(scores.sample_rows(out_b, shadow, measurer.sites, sample))
    samples = pd.concat(rows, ignore_index=True)
    table = scores.rank(scores.summarize(samples, measurer.sites, level=level), score)
    chosen = choose.top(table, budget)
    result = Diagnosis(
        table=table,
        samples=samples,
        agreement=scores.agreement(table),
        score=score,
        chosen=chosen,
        share=choose.share(table, chosen),
        rules=choose.rules(chosen, recipe, hp),
        recipe=recipe,
        hp=hp,
        stage1_s=time.perf_counter() - start,
        compiles=measurer.compiles(),
    )
    if verify:
        _verify(result, cfg, verify_steps, verify_seeds, Path(out) / "verify", level, progress)
    if out is not None:
        result.write(out)
    return result


def _verify(result: Diagnosis, cfg, steps, seeds, folder, level, progress) -> None:
    start = time.perf_counter()
    table, share = result.table, result.share
    result.sets = {
        "top-k": result.chosen,
        "random-k": choose.at_random(table, share, seed=0),
        "last-blocks": choose.last(table, share),
    }
    sets = {k: choose.rules(v, result.recipe, result.hp) for k, v in result.sets.items()}
    base = cfg if steps is None else cfg.replace(steps=int(steps))
    overrides = verify.cells(result.recipe, result.hp, sets)
    runs = verify.run(base, overrides, seeds=seeds, out=folder, progress=progress)
    gap = verify.gap_table(runs, level=level)
    gap["flop_share"] = gap["cell"].map(
        {"fp4": 0.0, "hp": 1.0} | {k: choose.share(table, v) for k, v in result.sets.items()}
    )
    result.gap, result.versus = gap, verify.versus(runs, level=level)
    result.verify_s = time.perf_counter() - start


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.0f} %"


def _summary(d: Diagnosis) -> str:
    t = d.table
    first = t.iloc[0]
    n = t["samples"].iloc[0]
    names = [f"{layer} {gemm.capitalize()}" for layer, gemm in d.chosen]
    hp = d.hp if isinstance(d.hp, str) else getattr(d.hp, "name", "high precision")
    agree = d.agreement[d.score].drop(d.score).dropna().sort_values(ascending=False)
    by_gemm = t.groupby("gemm")[d.score].mean().reindex(list(GEMMS))
    text = (
        f"Stage 1 ({n} samples: checkpoints x batches x quant seeds; {d.stage1_s:.0f} s, "
        f"{d.compiles} compile(s) for {len(t) * 2 + 2} variants) ranks by {d.score}: first "
        f"{first['layer']} {first['gemm'].capitalize()} ({first[d.score]:.3g}, "
        f"[{first[d.score + '_lo']:.3g}, {first[d.score + '_hi']:.3g}]); by GEMM the mean is "
        + ", ".join(f"{g.capitalize()} {v:.3g}" for g, v in by_gemm.items())
        + f". Keeping {', '.join(names)} in {hp} costs {d.share:.1%} of GEMM FLOPs. "
        f"Agreement with {d.score} (Spearman): "
        + ", ".join(f"{k} {v:.2f}" for k, v in agree.items())
        + "."
    )
    if d.gap is not None:
        g = d.gap.set_index("cell")
        closed = [
            f"{c} {_pct(g.loc[c, 'gap_closed'])} [{_pct(g.loc[c, 'lo'])}, {_pct(g.loc[c, 'hi'])}]"
            for c in ("top-k", "random-k", "last-blocks")
        ]
        v = d.versus.set_index("against")
        beats = v.loc["random-k", "verdict"] == "lower"
        text += (
            f" Stage 2 ({d.verify_s:.0f} s, {int(g.loc['fp4', 'pairs'])} paired seeds): share of "
            f"the FP4-to-{hp} gap on eval_hp closed: "
            + "; ".join(closed)
            + ". "
            + ("The ranking beats random-k" if beats else "The ranking does not beat random-k")
            + f" (top-k - random-k eval_hp {v.loc['random-k', 'diff']:.3g}, "
            f"[{v.loc['random-k', 'diff_lo']:.3g}, {v.loc['random-k', 'diff_hi']:.3g}]: "
            f"{v.loc['random-k', 'verdict']}); against last-blocks: "
            f"{v.loc['last-blocks', 'verdict']}."
        )
    return text
