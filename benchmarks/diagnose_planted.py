"""The full check of `diagnose` on the planted models of tests/diagnosis/planted.py: per case,
stage 1 (3 checkpoints x 3 batches x 3 quant seeds) and stage 2 (top-k against 3 random draws
and last-blocks, 4 seeds, 40 steps; budget 10 %, 20 % for the two culprits), with the
predicted share of the recommended set beside the share stage 2 verifies (the calibration
table of docs/diagnose.md); with --truth also the ground truth (each GEMM trained alone
quantized, 3 seeds).

    python benchmarks/diagnose_planted.py                      # every case
    python benchmarks/diagnose_planted.py --cases fprop,none --truth --out planted-check

The cases: the plants fprop, dgrad, wgrad, their moved variants (fprop@moved: the Fprop plant
on c, the decoy on b's input; dgrad@moved: the Dgrad plant on b), two culprits of different
GEMM kinds (fprop+wgrad: b's Fprop and a's Wgrad), and none (no plant).

Passes when, for every case with a culprit, every culprit is in the recommended set, the decoy
is not, and the set closes at least 85 % of the gap (stage 2's estimate) with its interval
above the random draws' mean; for none, when the summary predicts no share and says the ranking
does not beat random-k (or that there is no set to verify).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "tests" / "diagnosis"
sys.path.insert(0, str(HERE))

import planted  # noqa: E402  (tests/diagnosis/planted.py)
import planted_truth  # noqa: E402
from timing import machine  # noqa: E402  (benchmarks/timing.py)

import fp4lab as fl  # noqa: E402
from fp4lab.diagnosis import choose, report  # noqa: E402

STAGE1 = dict(checkpoints=(0, 20, 40), batches=3, quant_seeds=3, time_budget=None)
CASES = ("fprop", "dgrad", "wgrad", "fprop@moved", "dgrad@moved", "fprop+wgrad", "none")
# the budget (a ceiling) of each case, default 10 %: the two culprits cost 14.3 % together
BUDGET = {"fprop+wgrad": 0.2}


def check(case: str, out: Path, truth: bool) -> tuple[bool, str]:
    """(passed, one line) of one case."""
    start = time.perf_counter()
    plant, _, where = case.partition("@")
    moved = where == "moved"
    line = f"{case:12s}"
    if truth:
        t = planted_truth.ground_truth(plant, seeds=3, steps=40, moved=moved)
        t = t.set_index(["layer", "gemm"])
        line += (
            f" truth first {t.index[0]} {t['truth'].iloc[0]:.2f} of gap {t['gap'].iloc[0]:.4f},"
            f" decoy {t.loc[planted.DECOY, 'truth']:.1%};"
        )
    task_args = {"plant": plant, "moved": moved}
    budget = BUDGET.get(case, 0.1)
    d = fl.diagnose(experiment=planted.__file__, config={"task_args": task_args}, verify=True,
                    out=out / case.replace("@", "-"), progress=False, budget=budget,
                    **STAGE1)  # fmt: skip
    culprits = planted.culprits(plant, moved)
    said = "no prediction"
    if report.decided(d) and d.predicted is not None:
        share, lo, hi, _ = d.predicted
        added = choose.predicted_share(d.table, d.chosen, d.score)
        said = f"predicted {share:.0%} [{lo:.0%}, {hi:.0%}] (scores added {added:.0%})"
    line += f" set {[f'{layer} {g}' for layer, g in d.chosen]} ({d.share:.1%} of FLOPs), {said}"
    if "top-k" in d.sets:
        g = d.gap.set_index("cell")
        top = g.loc["top-k"]
        rnd = g.loc["random-k", "gap_closed"] if "random-k:0" in d.sets else float("nan")
        line += (
            f"; verified {top['gap_closed']:.0%} [{top['lo']:.0%}, {top['hi']:.0%}], random-k "
            f"{rnd:.0%}; gap {d.gap_hp[0]:.4f} [{d.gap_hp[1]:.4f}, {d.gap_hp[2]:.4f}]"
        )
    line += f"; {time.perf_counter() - start:.0f} s"
    if plant == "none":
        ok = "predicted to close" not in d.summary
        ok &= "does not beat random-k" in d.summary or "top-k" not in d.sets
        return bool(ok), line
    ok = set(culprits) <= set(d.chosen) and planted.DECOY not in d.chosen
    if ok:
        ok = top["gap_closed"] >= 0.85 and top["lo"] > rnd
    return bool(ok), line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--truth", action="store_true", help="the ground truth of each case too")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(machine())  # the CPU, its vector extensions and the kernel clone
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix="diagnose-planted-"))
    passed = True
    for case in args.cases.split(","):
        ok, line = check(case, out, args.truth)
        passed &= ok
        print(("PASS " if ok else "FAIL ") + line, flush=True)
    print(f"{time.perf_counter() - start:.0f} s in all; outputs in {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
