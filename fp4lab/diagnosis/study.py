"""`fl.diagnose(...)`: which layers and GEMMs of a model to keep in high precision.

    import fp4lab as fl
    d = fl.diagnose(model, loss, batch, config=fl.Config(steps=200), out="results/mine-diag")
    d = fl.diagnose(experiment="experiments/own_model.py", verify=True)
    print(d.summary)
    fl.quantize_model(my_model, d.rules, key=key)

Stage 1 (`fp4lab.diagnosis.probe`, `scores`): the model under the FP4 recipe with a gate per
layer and GEMM (`gate`), at a few checkpoints of a short run under that recipe, on several
held-out batches and quant seeds: every GEMM alone quantized, every GEMM alone kept in high
precision, the all-FP4 model and the shadow, in one compiled program. The ranking's GEMMs
worth keeping within a FLOP budget (a ceiling) are the recommended set (`choose`), its share of
the gap measured with the set kept (`scores.kept_share`); stage 2 (`verify`) trains it against
all-FP4, all-high-precision, random GEMMs and the last layers within its FLOP share.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pandas as pd

from fp4lab.analysis.plots.sensitivity import sensitivity_heatmap
from fp4lab.core import recipes
from fp4lab.diagnosis import choose, probe, report, scores, stage1, verify
from fp4lab.sweep import own
from fp4lab.sweep.experiment import load_experiment
from fp4lab.train.config import Config
from fp4lab.train.tasks import make_task
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
    budget: float  # the FLOP share the recommended set was chosen within
    skipped: pd.DataFrame  # GEMMs the budget or the rule left out, and why (`choose.left_out`)
    target: float  # the predicted share of the FP4 gap `reaching` aims at
    reaching: list  # [(layer, gemm)]: the cheapest set predicted to reach `target`
    rules: list  # [(path regex, recipe)] for quantize_model / Config.rules
    recipe: Any
    hp: Any
    stage1_s: float  # wall seconds of stage 1 (checkpoints, measurements, scores)
    compiles: int  # traces of stage 1's measuring program (one serves every variant)
    planned: int = 0  # samples of stage 1's full design; fewer ran when its time budget ended
    excluded: tuple = ()  # path patterns kept out of the diagnosis (high precision throughout)
    gap: pd.DataFrame | None = None  # stage 2: share of the FP4-to-hp gap each cell closes
    gap_own: pd.DataFrame | None = None  # the same on eval_loss (the runs' own forward)
    versus: pd.DataFrame | None = None  # stage 2: top-k against random-k and last-blocks
    gap_hp: tuple | None = None  # stage 2: the FP4-to-hp gap on eval_hp (mean, lo, hi, pairs)
    gap_own_total: tuple | None = None  # the same on eval_loss (the runs' own forward)
    verify_s: float = 0.0
    trained_s: float = 0.0  # stage 2: the training runs' own seconds (a resumed call: earlier)
    sets: dict = dataclasses.field(default_factory=dict)  # stage 2's sets: {cell: [(l, g)]}
    over_budget: str = ""  # why no GEMM fits the budget, in words (`choose.over_budget`)
    # the share of the all-FP4 measure keeping `chosen` removes, the set itself measured at
    # stage 1 (`scores.kept_share`: estimate, lo, hi, samples); None: no set or no such score
    predicted: tuple | None = None

    @property
    def rules_source(self) -> str:
        body = choose.rules_source(self.chosen, self.recipe, self.hp, keep=self.excluded)
        return "import fp4lab as fl\n\n" + ("\n" if body.startswith("def") else "") + body + "\n"

    def figure(self):
        scale = (0.0, 1.0) if self.score in scores.SHARES else None
        return sensitivity_heatmap(self.table, self.score, self.chosen, scale=scale)

    @property
    def summary(self) -> str:
        return report.summary(self)

    def write(self, out: str | Path) -> list[Path]:
        """ranking.csv, samples.csv, agreement.csv, rules.py, sensitivity.png, summary.txt,
        skipped.csv (when the budget or the rule left out a GEMM), and after stage 2 sets.csv
        (the GEMMs each cell kept), verify.csv (each cell's share of the gap on eval_hp, and
        with `_own` on eval_loss), versus.csv, in the folder `out`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {name: out / name for name in ("ranking.csv", "samples.csv", "agreement.csv")}
        self.table.to_csv(paths["ranking.csv"], index=False)
        self.samples.to_csv(paths["samples.csv"], index=False)
        self.agreement.to_csv(paths["agreement.csv"])
        if self.sets:
            paths["sets.csv"] = out / "sets.csv"
            sets_table(self.sets).to_csv(paths["sets.csv"], index=False)
        if len(self.skipped):
            paths["skipped.csv"] = out / "skipped.csv"
            self.skipped.to_csv(paths["skipped.csv"], index=False)
        if self.gap is not None:
            paths["verify.csv"] = out / "verify.csv"
            own = self.gap_own.drop(columns="family", errors="ignore")
            both = self.gap.merge(own, on="cell", suffixes=("", "_own"))
            both.to_csv(paths["verify.csv"], index=False)
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


def _check(score, budget, checkpoints, batches, quant_seeds, target, time_budget, draws) -> None:
    """Every argument of stage 1 and of the sets; `_check_verify` those of stage 2."""
    if score not in scores.SCORES:
        raise ValueError(f"diagnose: score={score!r}; allowed: {', '.join(scores.SCORES)}")
    if not 0 < budget <= 1:
        raise ValueError(f"diagnose: budget={budget!r}; need a share of GEMM FLOPs in (0, 1]")
    if not checkpoints or any(isinstance(c, bool) or int(c) != c or c < 0 for c in checkpoints):
        raise ValueError(f"diagnose: checkpoints={checkpoints!r}; need steps >= 0")
    for name, n in (("batches", batches), ("quant_seeds", quant_seeds), ("random_draws", draws)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"diagnose: {name}={n!r}; need an int >= 1")
    if not 0 < target <= 1:
        raise ValueError(f"diagnose: target={target!r}; need a share of the gap in (0, 1]")
    if time_budget is not None and not time_budget > 0:
        raise ValueError(f"diagnose: time_budget={time_budget!r}; need seconds > 0 or None")


def _recipes(recipe, hp) -> None:
    """Unknown names raise, listing the known ones (an experiment file's registered recipes
    among them: call this after loading it); so does an `hp` that cannot take a GEMM's place in
    `recipe` (`choose.kept_recipe`)."""
    recipes.get(recipe)
    recipes.get(hp)
    choose.kept_recipe(recipe, hp, ["fprop"])


def _check_verify(cfg: Config, recipe, hp, steps, seeds, out, excluded) -> Config:
    """Stage 2's config, every argument that could make stage 2 fail checked before stage 1
    runs: the folder, the steps, the seeds, and the cells' configs (all-FP4, all-hp and a kept
    set: `verify.experiment` builds each)."""
    if out is None:
        raise ValueError("diagnose: verify writes its runs into a results folder; pass out=...")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"diagnose: out={str(out)!r} is a file; verify needs a folder")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"diagnose: verify_steps={steps!r}; need an int >= 1 or None")
    base = cfg if steps is None else cfg.replace(steps=int(steps))
    sets = {"top-k": choose.rules([("probe", "fprop")], recipe, hp, keep=excluded)}
    verify.experiment(base, verify.cells(recipe, hp, sets, keep=excluded), seeds=seeds)
    return base


def _excluded(cfg: Config, exclude) -> tuple[str, ...]:
    """The path patterns diagnose leaves in high precision: `exclude`, then those of the
    config's rules that keep a layer out of FP4 (`probe.high_precision`: None, bf16, fp8...)."""
    if isinstance(exclude, str):
        exclude = (exclude,)
    own_rules = tuple(path for path, recipe in cfg.rules if probe.high_precision(recipe))
    return tuple(dict.fromkeys((*exclude, *own_rules)))


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
    time_budget: float | None = 600.0,
    score: str = scores.DEFAULT,
    budget: float = 0.1,
    target: float = 0.9,
    exclude=(),
    verify: bool = False,
    verify_steps: int | None = None,
    verify_seeds: int = 4,
    random_draws: int = 3,
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
      experiment: an experiment file (its get_config() and model, built-in or its own; the
        recipes it registers can be named).
      config: the Config (or overrides of the experiment's base): model sizes, batch size,
        optimizer; its recipe, gemms and phases are replaced by the diagnosis' own, and of its
        rules those that keep a layer out of FP4 (None, bf16, fp8, ...) are kept (`exclude`).
      recipe: the FP4 recipe diagnosed. hp: the high-precision recipe kept GEMMs get.
      checkpoints: optimizer steps of the short run (under `recipe`) whose weights are
        measured (clipped to config.steps). batches: held-out batches per checkpoint.
        quant_seeds: quantization seeds per batch.
      time_budget: seconds for stage 1: the rounds of samples (`fp4lab.diagnosis.stage1`) stop
        when the next would pass it (None: all batches x quant_seeds rounds).
      score: the ranking score (`fp4lab.diagnosis.scores.SCORES`). budget: the share of GEMM
        FLOPs the recommended set may keep in high precision. target: the predicted share of
        the FP4 gap the other set offered (`choose.reaching`) reaches at the least FLOPs.
      exclude: path regexes of layers left in high precision and out of the diagnosis.
      verify: run stage 2 (`fp4lab.diagnosis.verify`) for `verify_steps` steps (default the
        config's) on `verify_seeds` (>= 4) seed triples into `out`/verify, with
        `random_draws` random sets.
      out: a folder for the outputs (`Diagnosis.write`); required with verify.
      level: coverage of every interval. progress: progress lines of stage 1 (stderr) and
        the sweep's display in stage 2.
    Returns:
      A `Diagnosis`.
    Raises:
      ValueError: a bad argument (the message names it).
    """
    _check(score, budget, checkpoints, batches, quant_seeds, target, time_budget, random_draws)
    cfg = _config(model, loss, batch, experiment, config, task_options)
    _recipes(recipe, hp)
    excluded = _excluded(cfg, exclude)
    if verify:
        base = _check_verify(cfg, recipe, hp, verify_steps, verify_seeds, out, excluded)
    steps = sorted({min(int(c), cfg.steps) for c in checkpoints})
    start = time.perf_counter()
    task = make_task(cfg)
    keys = make_keys(0, 0, 0)
    measurer = probe.Probe(task, recipe, keys, step=probe.step_of(cfg), exclude=excluded)
    weights = probe.checkpoints(task, cfg, recipe, keys, steps, exclude=excluded)
    measured = stage1.measure(
        measurer, keys, weights, steps, batches=batches, quant_seeds=quant_seeds,
        time_budget=time_budget, progress=progress, spent=time.perf_counter() - start,
    )  # fmt: skip
    table = scores.rank(scores.summarize(measured.samples, measurer.sites, level=level), score)
    chosen = choose.top(table, budget, score)
    compiles = measurer.compiles()  # of the program that measures every variant
    predicted = None
    if chosen:
        gates = scores.kept_gates(measurer.sites, chosen)
        replayed = stage1.replay(measurer, keys, weights, steps, measured.samples, gates)
        predicted = scores.kept_share(replayed, score, level=level)
    result = Diagnosis(
        table=table,
        samples=measured.samples,
        agreement=scores.agreement(table),
        score=score,
        chosen=chosen,
        share=choose.share(table, chosen),
        budget=budget,
        skipped=choose.left_out(table, chosen, score),
        target=target,
        reaching=choose.reaching(table, target, score),
        rules=choose.rules(chosen, recipe, hp, keep=excluded),
        recipe=recipe,
        hp=hp,
        stage1_s=time.perf_counter() - start,
        compiles=compiles,
        planned=measured.planned,
        excluded=excluded,
        over_budget=choose.over_budget(table, budget),
        predicted=predicted,
    )
    if verify:
        folder = Path(out) / "verify"
        _verify(result, base, verify_seeds, random_draws, folder, level, progress)
    if out is not None:
        result.write(out)
    return result


def _verify(result: Diagnosis, base, seeds, draws, folder, level, progress) -> None:
    """Stage 2 of `result` on `base` (`_check_verify`'s config): the cells that have a set (no
    top-k, random-k or last-blocks where the set is empty, no random draw that equals top-k)."""
    start = time.perf_counter()
    table, share = result.table, result.share
    result.sets = {}
    randoms = []
    if result.chosen:
        last = choose.last(table, share)
        randoms = choose.random_sets(table, share, draws, avoid=(result.chosen, last))
        result.sets["top-k"] = result.chosen
        result.sets |= {verify.random_label(j): kept for j, kept in enumerate(randoms)}
        if last:
            result.sets["last-blocks"] = last
    keep = result.excluded
    sets = {k: choose.rules(v, result.recipe, result.hp, keep=keep) for k, v in result.sets.items()}
    overrides = verify.cells(result.recipe, result.hp, sets, keep=keep)
    runs = verify.run(base, overrides, seeds=seeds, out=folder, progress=progress)
    shares = {"fp4": 0.0, "hp": 1.0} | {k: choose.share(table, v) for k, v in result.sets.items()}
    if randoms:
        shares["random-k"] = sum(choose.share(table, v) for v in randoms) / len(randoms)
    result.gap = verify.gap_table(runs, level=level)
    result.gap_own = verify.gap_table(runs, outcome="eval_loss", level=level)
    for frame in (result.gap, result.gap_own):
        frame["flop_share"] = frame["cell"].map(shares)
    result.gap_hp = verify.gap(runs, level=level)
    result.gap_own_total = verify.gap(runs, outcome="eval_loss", level=level)
    result.versus = verify.versus(runs, level=level)
    result.verify_s = time.perf_counter() - start
    result.trained_s = float(runs["wall_s"].astype(float).sum()) if "wall_s" in runs else 0.0
