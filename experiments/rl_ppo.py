"""PPO under FP4: return curves and divergence on CartPole and Acrobot across recipes and seeds.

    python experiments/rl_ppo.py            (measured: 10.8 min on 2 shared CPU cores)
    python experiments/rl_ppo.py --quick    (2 seeds, 1/10 of the steps: a smoke test)

For each environment (CartPole-v1, Acrobot-v1) and recipe (fp32, bf16, nvfp4, nvfp4-rl: every
GEMM of the actor and the critic, simulated), 8 seeds vmapped in one program run PPO with the
purejaxrl CartPole hyperparameters of fp4lab.rl.ppo for 5e5 environment steps per seed. Writes
to results/rl/: ppo_curves.csv (per env, recipe, seed and every 20th update: env steps, mean
return of the episodes ending in the last 10 updates), ppo_summary.csv (per env and recipe:
seeds solved, i.e. the windowed return reached the gymnasium threshold, 475 for CartPole and
-100 for Acrobot, the median steps to get there, the final windowed return, mean and min over
seeds, and runs with a non-finite loss), ppo_returns.png (median and range over seeds) and
ppo_cartpole_fp32.json (the fp32 CartPole solve check quoted in fp4lab/rl/ppo.py).

Papers: recipes nvfp4 (NVIDIA 2025, arXiv 2509.25149) and nvfp4-rl (humans& 2026, "The 4-bitter
Lesson"); quantized RL policies lose little at 6-8 bits (QuaRL, Krishnan et al. 2019), and NVFP4
weight noise raises the policy's entropy (QeRL, 2025). Expected: fp32 and bf16 solve CartPole on
all or nearly all seeds within 5e5 steps; the FP4 recipes on tiny (64-wide) networks learn more
slowly and less reliably, with nvfp4-rl (per-token scales, four-over-six, chain-rule-consistent
backward) no worse than nvfp4 (stochastic rounding of gradients, Hadamard on Wgrad). Divergence
(non-finite losses) is not expected at these scales: the clipped objective and gradient clipping
bound the updates.

Measured (results/rl/ppo_summary.csv): every recipe solves both tasks on 8 of 8 seeds, none
diverges. CartPole: median steps to 475 are 149k (fp32), 148k (bf16), 157k (nvfp4), 168k
(nvfp4-rl); the final windowed return is 500 on every fp32 seed but 482 (min 411) for nvfp4 and
484 (min 438) for nvfp4-rl, i.e. FP4 policies reach the goal but hold it less steadily. Acrobot:
all recipes end near -83 (solved at 99k-127k steps); FP4 costs nothing visible here.
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

from fp4lab.rl import PPOConfig, ppo

OUT = Path(__file__).resolve().parent.parent / "results" / "rl"
ENVS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}  # gymnasium reward thresholds
RECIPES = ("fp32", "bf16", "nvfp4", "nvfp4-rl")
WINDOW = 10  # updates in the windowed mean return
CURVE_EVERY = 20  # updates between the rows of ppo_curves.csv (the figure uses all)


def run(env: str, recipe: str, seeds: int, steps: int) -> tuple[dict, float, float]:
    """Metrics (host arrays, leading axis = seed), compile seconds, run seconds."""
    train = jax.jit(jax.vmap(ppo.make_train(PPOConfig(env=env, recipe=recipe, total_steps=steps))))
    keys = jax.random.split(jax.random.key(0), seeds)
    t0 = time.perf_counter()
    compiled = train.lower(keys).compile()
    t1 = time.perf_counter()
    out = jax.block_until_ready(compiled(keys))
    t2 = time.perf_counter()
    return jax.tree.map(np.asarray, out.metrics), t1 - t0, t2 - t1


def first_nonfinite(loss_SxU: np.ndarray) -> np.ndarray:
    bad = ~np.isfinite(loss_SxU)
    return np.where(bad.any(axis=1), np.argmax(bad, axis=1), -1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, 1/10 of the steps")
    args = p.parse_args(argv)
    seeds, steps = (2, 50_000) if args.quick else (8, 500_000)
    OUT.mkdir(parents=True, exist_ok=True)
    curves, summary = [], []
    start = time.perf_counter()
    for env, threshold in ENVS.items():
        for recipe in RECIPES:
            m, t_compile, t_run = run(env, recipe, seeds, steps)
            ret = ppo.windowed_return(m, WINDOW)
            solved = ppo.first_solved(m, threshold, WINDOW)
            bad = first_nonfinite(m["loss/total"])
            curves.append(seed_curves(env, recipe, m["env/steps"], ret))
            row = {
                "env": env,
                "recipe": recipe,
                "seeds": seeds,
                "env_steps": int(m["env/steps"][0, -1]),
                "threshold": threshold,
                "solved": int(np.isfinite(solved).sum()),
                "median_steps_to_solve": float(np.nanmedian(solved))
                if np.isfinite(solved).any()
                else float("nan"),
                "final_return_mean": float(np.nanmean(ret[:, -1])),
                "final_return_min": float(np.nanmin(ret[:, -1])),
                "diverged": int((bad >= 0).sum()),
                "compile_s": round(t_compile, 1),
                "run_s": round(t_run, 1),
            }
            summary.append(row)
            print(json.dumps(row), flush=True)
            if env == "CartPole-v1" and recipe == "fp32" and not args.quick:
                check = row | {
                    "first_solved_steps": [None if np.isnan(x) else int(x) for x in solved],
                    "final_windowed_return": [round(float(r), 1) for r in ret[:, -1]],
                    "jax": jax.__version__,
                    "device": jax.devices()[0].device_kind,
                }
                (OUT / "ppo_cartpole_fp32.json").write_text(json.dumps(check, indent=1) + "\n")
    total = time.perf_counter() - start
    suffix = "_quick" if args.quick else ""
    curves = pd.concat(curves)
    last = curves["update"].max()
    thin = curves[(curves["update"] % CURVE_EVERY == 0) | (curves["update"] == last)]
    thin.to_csv(OUT / f"ppo_curves{suffix}.csv", index=False, float_format="%.4g")
    table = pd.DataFrame(summary)
    table.to_csv(OUT / f"ppo_summary{suffix}.csv", index=False)
    plot(curves, OUT / f"ppo_returns{suffix}.png")
    print(table.to_string(index=False))
    print(f"total {total / 60:.1f} min")


def seed_curves(env: str, recipe: str, steps_SxU, return_SxU) -> pd.DataFrame:
    """One row per seed and update: env steps so far and the windowed return."""
    return pd.concat(
        pd.DataFrame(
            {
                "env": env,
                "recipe": recipe,
                "seed": s,
                "update": np.arange(return_SxU.shape[1]),
                "env_steps": steps_SxU[s],
                "return": return_SxU[s],
            }
        )
        for s in range(return_SxU.shape[0])
    )


def draw(curves: pd.DataFrame) -> Figure:
    """Windowed return against env steps: per env a panel, per recipe the median over seeds
    with the min-max band, and the env's solve threshold."""
    envs = list(dict.fromkeys(curves["env"]))
    fig = Figure(figsize=(6 * len(envs), 4))
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs, strict=True):
        for recipe, d in curves[curves.env == env].groupby("recipe", sort=False):
            wide = d.pivot(index="env_steps", columns="seed", values="return")
            x = wide.index.to_numpy()
            ax.plot(x, wide.median(axis=1), label=recipe)
            ax.fill_between(x, wide.min(axis=1), wide.max(axis=1), alpha=0.15)
        ax.axhline(ENVS[env], color="k", lw=0.8, ls="--")
        ax.set(title=env, xlabel="environment steps per seed", ylabel="windowed return")
        ax.legend()
    fig.tight_layout()
    return fig


def plot(curves: pd.DataFrame, path: Path) -> None:
    draw(curves).savefig(path, dpi=110)


if __name__ == "__main__":
    main()
