"""The MXFP4 ladder on the language model: Cim et al. 2026 (arXiv 2605.09825), Table 1, small.

    fp4lab run experiments/mxfp4_ladder_lm.py --workers 1

The paper trains Llama 3.1-8B on C4 against an FP8 baseline and counts the extra tokens each
MXFP4 step needs to reach the target perplexity: Fprop in MXFP4 +8-9 %, +Dgrad +10-11 %,
+Wgrad +26-27 %; with all three in MXFP4, stochastic rounding and a random-sign 16x16 Hadamard
do not converge, a deterministic Hadamard (H16 or H32) brings it back to +8-9 %.

Here: the project's Llama-style LM (4 pre-norm blocks under a scan, d_model 64, 4 heads, d_ff
128, the LM head in BF16 in every cell) on the synthetic Markov language (vocab 64, branching 4;
its entropy rate is the exact floor), Adam at 3e-3 with 20 warm-up steps, 600 steps of 16 x 64
= 1024 tokens, 8 seeds (init, data and quant streams equal: (i, i, i)).

Why this design can show the effect where the MLP ladder (`mxfp4_ladder.py`) could not: the
Wgrad GEMM contracts over the tokens of a step, 1024 = 32 MX blocks of 32 (the MLP's contracted
over 64 examples, 2 blocks), so its accumulated error has the paper's structure; the forward
GEMMs contract over d_model 64 and d_ff 128 (2 and 4 blocks), the paper's over thousands.

The target is the training loss smoothed over 20 steps reaching 0.045 nats above the floor.
It was set from a pilot run of the FP8 cell (4 seeds: smoothed gaps 0.048, 0.041, 0.043, 0.032
at step 300 of 600), so FP8 reaches it about half-way through its run and every rung can reach
it within its 600 steps; the pilot was the only look at any cell before the target was fixed.
The paper's target is perplexity on held-out data; this one is the training loss (tokens to
target reads the training series: the held-out loss is computed at the end only), which is
under each cell's own quantized forward: the measure itself is in MXFP4 for every rung above
FP8.

What it cannot show: the paper's magnitudes (an 8B model's GEMMs contract over thousands of
elements); outliers in the residual stream (the built-in LM has none and no knob for them:
`experiments/diagnose_lm.py` shows how an own-model file adds them), so the Hadamard's rungs
test rotation without the outliers it is meant for. Measured: 16m24s wall on two idle cores
(64 runs, about 75 s a cell of 8 seeds including an 11 s compile).

Outcome: tokens to target per cell and the overhead against FP8 (`analysis.tokens_to_target`,
bootstrap over seeds, never-reached runs count as infinite); the final held-out loss gap under
a high-precision forward (`loss_gap_hp`) by the verdict's fixed rows against FP8.

What it gave (results/mxfp4_ladder_lm/, numerics version 2): overheads over FP8 of Fprop +18 %
[+6, +27], +Dgrad +17 % [+6, +25], +Wgrad (all three) +28 % [+16, +37]: the paper's largest
step, Wgrad, is the largest here too, and all three land at the paper's +26-27 %; Fprop alone
costs twice the paper's +8-9 %. Stochastic rounding converged in all 8 seeds but costs most,
+45 % [+31, +55] (the paper's did not converge); random-sign H16 +23 % [+10, +35],
deterministic H16 +22 % [+11, +32] and H32 +17 % [+3, +28]: the Hadamard rungs sit between
Fprop-only and all three, not back at Fprop-only, and the random-sign and deterministic H16
intervals overlap almost entirely (their difference was not tested). The held-out gap under a
high-precision forward is higher than FP8's for every rung from +Dgrad up except random-sign
H16 (verdict "no evidence", as for Fprop alone).
"""

from fp4lab import analysis
from fp4lab.train.config import Config

SEEDS = 8

LADDER = (
    ("fp8", "fp8", {}),
    ("fprop", "fp8", {"fprop": "mxfp4"}),
    ("fprop+dgrad", "fp8", {"fprop": "mxfp4", "dgrad": "mxfp4"}),
    ("fprop+dgrad+wgrad", "mxfp4", {}),
    ("all+sr", "mxfp4-sr", {}),
    ("all+h16 random signs", "mxfp4-h16-rs", {}),
    ("all+h16", "mxfp4-h16", {}),
    ("all+h32", "mxfp4-h32", {}),
)


def get_config():
    return Config(
        task="markov",
        vocab=64,
        branching=4,
        d_model=64,
        n_layers=4,
        scan_layers=True,
        n_heads=4,
        d_ff=128,
        seq_len=64,
        batch_size=16,
        steps=600,
        lr=3e-3,
        warmup=20,
        eval_batches=4,
        seed_batch=4,
        target_gap=0.045,
        target_window=20,
        rules=((r"lm_head", "bf16"),),
    )


def sweep(add):
    for name, recipe, gemms in LADDER:
        add(name, recipe=recipe, gemms=gemms, seeds=SEEDS)


def analyze(results):
    """overhead.csv: tokens to target and the overhead against FP8; gap_hp.csv: the verdict's
    fixed rows on the final held-out gap under a high-precision forward, each cell against FP8."""
    runs = results.runs
    t = analysis.tokens_to_target(runs, baseline="fp8")
    cols = ["cell", "n", "reached", "never", "tokens", "tokens_lo", "tokens_hi"]
    v = analysis.verdict(runs, "loss_gap_hp", baseline="fp8")
    fixed = v[v.kind == "fixed"]
    return {
        "overhead": t[cols + ["overhead", "overhead_lo", "overhead_hi"]],
        "gap_hp": fixed[["term", "effect", "lo", "hi", "verdict"]],
    }
