"""The 4-bitter Lesson's GRPO claims on a 12-block policy: which blocks to keep in BF16, a
sampler that quantizes the MLP GEMMs only, and the backward modes over 300 updates.

    python experiments/rl_deep.py            (measured: see "Measured" below)
    python experiments/rl_deep.py --quick    (1 seed, a few updates: a smoke test)

Paper: humans& 2026, "The 4-bitter Lesson" (Qwen3-30B-A3B, GRPO, NVFP4 on the MoE experts):
mean train-rollout |delta log p| BF16 0.0103, MXFP8 0.0203, NVFP4 0.0328, NVFP4 + four-over-six
0.0313; keeping the last ~15 % of the layers in BF16 buys the largest drop in mismatch; the
straight-through high-precision backward shows gradient spikes that the chain-rule-consistent
(dequantized) backward does not. `rl_mismatch.py` asked this of a 4-block model over 60 updates:
4 blocks cannot hold "the last 15 %", every sampler GEMM was quantized where the paper quantizes
the experts, and no mode showed a spike in 60 updates.

Here: the task of `fp4lab.rl.grpo` (sort 4 digits, reward = the fraction of answer tokens
right), a 12-block fp4lab Transformer under a scan (d_model 32, 2 heads, SwiGLU 64, the LM head
in BF16 in every sampler and trainer), 40 supervised warm-start steps, then GRPO with 16
prompts x 8 samples per update; 8 seeds (6 in the backward study), each variant's seed i
from the same key, so that the
variants of a study share their initial weights and warm start (paired). Studies:

  scope       trainer BF16; sampler BF16 | MXFP8 | NVFP4 (per-token activation scale) | NVFP4 +
              four-over-six (`nvfp4-rl`), with every block GEMM quantized ("all") or only the
              SwiGLU GEMMs (gate, up, down: "MLP"; the attention projections in BF16), the
              closest this dense model comes to the paper's experts. 100 updates.
  exceptions  trainer BF16, sampler NVFP4 (all GEMMs); blocks kept in BF16: none | last 1 (8 % of
              the blocks) | last 2 (17 %: the paper's "last ~15 %") | first 1 | first 2.
              100 updates.
  backward    sampler and trainer both `nvfp4-rl` forward (their mismatch is 0 exactly, so only
              the backward differs): high_precision (straight-through on the unquantized
              operands) | dequantized (the exact gradient of the quantized forward) | quantized
              (Dgrad and Wgrad operands NVFP4 1x16 too); Adam at 3e-4 and at 3e-3 (ten times
              the GRPO rate of the other studies, to provoke spikes), SGD at 0.3. 300 updates.

Measured per seed: the mismatch averaged over updates (mean |delta log p| on the sampled
tokens, KL(sampler || trainer)); the reward of the last 20 % of updates; gradient-norm spikes
(norm > 5 x the median of the previous 32 updates, measured before the global-norm clip at 1).
Statistics: per study, each contrast is a paired difference over the 8 seeds with a Student t
interval, Bonferroni over the study's contrasts ("higher" / "lower" where the interval excludes
0, else "no evidence"); a variant's own mean has a plain 95 % t interval; the share of runs
with a spike an exact (Clopper-Pearson) interval.

Choices that could favour an outcome, fixed before the runs: 12 blocks (so that 2 blocks are
17 %), 100 and 300 updates, the learning rates (3e-4 and SGD 0.3 as in `rl_mismatch.py`, 3e-3
chosen as ten times it without a pilot). A timing probe of 30 updates (one seed, NVFP4 sampler
with the last block in BF16) was the only run made before this file. What it cannot show: the
paper's scale (a 32-wide policy, so its mismatch is larger than the paper's), and "MLP only"
is not "experts only" (a dense model has no router).

Writes results/rl_deep/: variants.csv (one row per variant: means and intervals),
seeds.csv (one row per variant and seed: what the other tables are computed from; the committed
one has 5 significant digits), paired.csv (the contrasts with their words; `paired_from_seeds`
recomputes it), curves.csv (per update, mean over seeds) and rl_deep.png.

Measured: 60 min in all (20 runs of 6-8 seeds; "exceptions: none" is "scope: nvfp4, all" and
ran once), on two cores shared for its first 37 min with another two-core job: 1-2 min a
variant of 100 updates, 3-6 min one of 300.

What it gave (8 seeds; 6 in the backward study; mean |delta log p| over the 100 updates):
- Scope: BF16 0 (sampler = trainer), MXFP8 0.064 (all GEMMs) / 0.034 (MLP only), NVFP4 0.319 /
  0.136, NVFP4 + four-over-six 0.285 / 0.124: the paper's order, about 10 times its size (a
  32-wide policy). Quantizing only the MLP GEMMs lowers the mismatch by half in every format
  ("lower", e.g. NVFP4 -0.182 [-0.234, -0.130]); four-over-six lowers it by 0.012 [0.008,
  0.017] with the MLP only ("lower") and by 0.034 [-0.002, +0.070] with all GEMMs ("no
  evidence").
- Exceptions: the last block or the last two (17 %) in BF16 change nothing measurable (-0.005
  [-0.029, +0.020], -0.007 [-0.026, +0.011]); the first block in BF16 halves the mismatch
  (-0.173 [-0.225, -0.120]), the first two cut it by two thirds (-0.216 [-0.275, -0.157]); the
  last two against the first one or two: "higher". Here the blocks to keep in BF16 are the
  first, not the last: the error of the first blocks reaches the logits through every later
  block, and this policy's head is in BF16 already (the paper's "last layers" may include it).
- Backward: no spike in any mode at Adam 3e-4 or SGD 0.3 over 300 updates. At Adam 3e-3 every
  mode spikes: high-precision 4.8 spikes a run (6 of 6 runs), dequantized 4.5 (6 of 6),
  quantized 2.8 (5 of 6); the paired differences from dequantized, +0.3 [-1.3, +2.0] and -1.7
  [-10.7, +7.4] spikes, and in late reward, "no evidence" everywhere. The paper's "the
  high-precision backward spikes, the dequantized one does not" is not reproduced: where spikes
  appear here, the dequantized backward has them as often.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

import fp4lab as fl
from fp4lab.analysis import exact_binomial_interval, t_interval
from fp4lab.core import recipes
from fp4lab.models import TransformerConfig
from fp4lab.rl import GRPOConfig, grpo

OUT = Path(__file__).resolve().parent.parent / "results" / "rl_deep"
BLOCKS = 12
MODEL = TransformerConfig(
    vocab=16, d_model=32, n_layers=BLOCKS, n_heads=2, d_ff=64, max_len=16, scan_layers=True
)
BASE = GRPOConfig(model=MODEL, warmup_steps=40, updates=100, prompts=16, group=8, lr=3e-4)
SEEDS = 8  # the scope and exceptions studies
SEEDS_BACKWARD = 6  # the backward study (300 updates each)
LATE = 0.2  # the reward of the last 20 % of updates

NVFP4 = fl.GemmRecipe(
    fprop_x=fl.nvfp4(scope="row"), fprop_w=fl.nvfp4(), backward="dequantized", name="nvfp4"
)
NVFP4_46 = recipes.get("nvfp4-rl")  # per-token activations, four-over-six, dequantized backward
QUANTIZED_BWD = NVFP4_46.replace(
    dgrad_dy=fl.nvfp4(),
    dgrad_w=fl.nvfp4(),
    wgrad_x=fl.nvfp4(),
    wgrad_dy=fl.nvfp4(),
    backward="quantized",
)
HEAD = (fl.Rule(r".*lm_head", "bf16"),)
ATTENTION = (fl.Rule(r".*attn\..*", "bf16"),)


def blocks(*ids: int) -> tuple:
    """Rules keeping these blocks in BF16 (under the scan a rule matches the whole path)."""
    return tuple(fl.Rule(rf"blocks\.{i}\..*", "bf16") for i in ids)


def variants() -> list[tuple[str, str, GRPOConfig]]:
    out = [("scope", "bf16", BASE.replace(sampler_recipe="bf16", trainer_recipe="bf16"))]
    for fmt, recipe in [("mxfp8", "mxfp8"), ("nvfp4", NVFP4), ("nvfp4 + 4/6", NVFP4_46)]:
        for scope, rules in [("all", HEAD), ("MLP", HEAD + ATTENTION)]:
            cfg = BASE.replace(sampler_recipe=recipe, sampler_rules=rules, trainer_recipe="bf16")
            out.append(("scope", f"{fmt}, {scope}", cfg))
    last = BLOCKS - 1
    for name, ids in [
        ("none", ()),
        ("last 1", (last,)),
        ("last 2", (last - 1, last)),
        ("first 1", (0,)),
        ("first 2", (0, 1)),
    ]:
        cfg = BASE.replace(
            sampler_recipe=NVFP4, sampler_rules=HEAD + blocks(*ids), trainer_recipe="bf16"
        )
        out.append(("exceptions", name, cfg))
    for opt, lr in [("adam", 3e-4), ("adam", 3e-3), ("sgd", 0.3)]:
        for mode, recipe in [
            ("high_precision", NVFP4_46.replace(backward="high_precision")),
            ("dequantized", NVFP4_46),
            ("quantized", QUANTIZED_BWD),
        ]:
            cfg = BASE.replace(
                updates=300,
                sampler_recipe=NVFP4_46,
                sampler_rules=HEAD,
                trainer_recipe=recipe,
                trainer_rules=HEAD,
                optimizer=opt,
                lr=lr,
            )
            out.append(("backward", f"{mode} / {opt} {lr:g}", cfg))
    return out


# (study, variant, reference, metric): each row of paired.csv is variant - reference
CONTRASTS = [
    *[
        ("scope", f"{fmt}, MLP", f"{fmt}, all", "abs_logp")
        for fmt in ("mxfp8", "nvfp4", "nvfp4 + 4/6")
    ],
    *[
        ("scope", f"{b}, {scope}", f"{a}, {scope}", "abs_logp")
        for scope in ("all", "MLP")
        for a, b in [("mxfp8", "nvfp4"), ("nvfp4", "nvfp4 + 4/6")]
    ],
    *[("exceptions", v, "none", "abs_logp") for v in ("last 1", "last 2", "first 1", "first 2")],
    ("exceptions", "last 2", "first 1", "abs_logp"),
    ("exceptions", "last 2", "first 2", "abs_logp"),
    *[
        ("backward", f"{mode} / {opt}", f"dequantized / {opt}", metric)
        for opt in ("adam 0.0003", "adam 0.003", "sgd 0.3")
        for mode in ("high_precision", "quantized")
        for metric in ("spikes", "reward_late")
    ],
]


def run(cfg: GRPOConfig, seeds: int) -> tuple[dict, float]:
    """Metrics (leading axis = seed) and seconds. Seeds run one after another through one
    compiled single-seed program (as in `rl_mismatch.py`: a vmapped program may compile the
    sampler's and the trainer's forward passes differently on XLA:CPU)."""
    train = jax.jit(grpo.make_train(cfg))
    t0 = time.perf_counter()
    outs = [train(k) for k in jax.random.split(jax.random.key(0), seeds)]
    outs = jax.block_until_ready([o.metrics | o.warmup for o in outs])
    metrics = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *outs)
    return metrics, time.perf_counter() - t0


def per_seed(m: dict) -> pd.DataFrame:
    """One row per seed: the quantities the contrasts compare."""
    updates = m["reward/mean"].shape[1]
    late = max(1, round(LATE * updates))
    return pd.DataFrame(
        {
            "seed": np.arange(m["reward/mean"].shape[0]),
            "abs_logp": m["mismatch/abs_logp"].mean(axis=1),
            "kl": m["mismatch/kl"].mean(axis=1),
            "reward_late": m["reward/mean"][:, -late:].mean(axis=1),
            "spikes": m["grad/spike"].sum(axis=1).astype(np.float64),
            "grad_norm": np.median(m["grad/norm"], axis=1),
        }
    )


def variant_row(study: str, name: str, seeds: pd.DataFrame, seconds: float) -> dict:
    row = {"study": study, "variant": name, "seeds": len(seeds)}
    for metric in ("abs_logp", "kl", "reward_late", "spikes"):
        i = t_interval(seeds[metric])
        row |= {metric: i.estimate, f"{metric}_lo": i.lo, f"{metric}_hi": i.hi}
    w = exact_binomial_interval(int((seeds["spikes"] > 0).sum()), len(seeds))
    row |= {"runs_with_spike": int((seeds["spikes"] > 0).sum())}
    row |= {"spike_share_lo": w.lo, "spike_share_hi": w.hi}
    row |= {"grad_norm": float(seeds["grad_norm"].median()), "seconds": round(seconds, 1)}
    return row


def paired(per_variant: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """paired.csv: every contrast of CONTRASTS whose two variants ran, Bonferroni per study."""
    rows = [c for c in CONTRASTS if (c[0], c[1]) in per_variant and (c[0], c[2]) in per_variant]
    out = []
    for study, variant, reference, metric in rows:
        m = sum(r[0] == study for r in rows)
        d = per_variant[study, variant][metric] - per_variant[study, reference][metric]
        i = t_interval(d.to_numpy(), level=1 - 0.05 / m)
        word = "higher" if i.lo > 0 else "lower" if i.hi < 0 else "no evidence"
        if d.abs().max() == 0:
            word = "equal on every seed"
        out.append(
            dict(study=study, contrast=f"{variant} - {reference}", metric=metric)
            | dict(effect=i.estimate, lo=i.lo, hi=i.hi, n=len(d), rows=m, verdict=word)
        )
    return pd.DataFrame(out)


def curve(study: str, name: str, m: dict) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "study": study,
            "variant": name,
            "update": np.arange(m["reward/mean"].shape[1]),
            "reward": m["reward/mean"].mean(axis=0),
            "abs_logp": m["mismatch/abs_logp"].mean(axis=0),
            "grad_norm": m["grad/norm"].mean(axis=0),
            "spike_share": m["grad/spike"].mean(axis=0),
        }
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 seed, 4 warm-start steps, 3 updates")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    rows, curves, per_variant, done = [], [], {}, {}
    start = time.perf_counter()
    for study, name, cfg in variants():
        seeds = 1 if args.quick else SEEDS_BACKWARD if study == "backward" else SEEDS
        if args.quick:
            cfg = cfg.replace(warmup_steps=4, updates=3)
        if repr(cfg) not in done:  # "exceptions: none" is "scope: nvfp4, all"
            done[repr(cfg)] = run(cfg, seeds)
        m, seconds = done[repr(cfg)]
        per_variant[study, name] = per_seed(m)
        rows.append(variant_row(study, name, per_variant[study, name], seconds))
        curves.append(curve(study, name, m))
        print(json.dumps(rows[-1]), flush=True)
    total = time.perf_counter() - start
    suffix = "_quick" if args.quick else ""
    table, curves = pd.DataFrame(rows), pd.concat(curves)
    per_seed_table = pd.concat(
        [d.assign(study=s, variant=v) for (s, v), d in per_variant.items()], ignore_index=True
    )
    write = dict(index=False, float_format="%.5g")
    table.to_csv(OUT / f"variants{suffix}.csv", **write)
    per_seed_table.to_csv(OUT / f"seeds{suffix}.csv", index=False)  # all digits: recomputes
    paired(per_variant).to_csv(OUT / f"paired{suffix}.csv", **write)
    curves.to_csv(OUT / f"curves{suffix}.csv", **write)
    plot(table, curves, OUT / f"rl_deep{suffix}.png")
    print(paired(per_variant).to_string(index=False))
    print(f"total {total / 60:.1f} min")


def paired_from_seeds(seeds: pd.DataFrame) -> pd.DataFrame:
    """paired.csv recomputed from seeds.csv (the per-seed table the run writes)."""
    groups = seeds.groupby(["study", "variant"], sort=False)
    per_variant = {k: d.reset_index(drop=True) for k, d in groups}
    return paired(per_variant)


def plot(table: pd.DataFrame, curves: pd.DataFrame, path: Path) -> None:
    fig = Figure(figsize=(18, 4))
    axes = fig.subplots(1, 3)
    for ax, study in zip(axes[:2], ("scope", "exceptions"), strict=True):
        d = table[table.study == study]
        err = np.stack([d.abs_logp - d.abs_logp_lo, d.abs_logp_hi - d.abs_logp]).clip(min=0)
        ax.bar(d.variant, d.abs_logp, yerr=np.nan_to_num(err), capsize=3)
        ax.set(title=f"{study}: mean |delta log p| (trainer BF16)", ylabel="|delta log p|")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    for variant, d in curves[curves.study == "backward"].groupby("variant", sort=False):
        axes[2].plot(d["update"], d["grad_norm"], label=variant, lw=0.8)
    axes[2].set(title="backward: gradient norm (mean over seeds)", xlabel="GRPO update")
    axes[2].set_yscale("log")
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
