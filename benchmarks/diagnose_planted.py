"""The full check of `diagnose`'s default score on the planted models of tests/diagnosis/planted.py:
per plant, the ground truth (each GEMM trained alone quantized, 3 seeds), stage 1 (3
checkpoints x 3 batches x 3 quant seeds) and stage 2 (top-k against 3 random draws and
last-blocks, 4 seeds, 40 steps).

    python benchmarks/diagnose_planted.py                  # every plant
    python benchmarks/diagnose_planted.py --plants fprop --out planted-check

Run time: 515 s on two CPU cores under a load of about 8 (other jobs), all four plants, every
one passing (84 to 222 s a plant; 800 s under a load of 10 with a cold compile cache).
Passes when, for every plant with a culprit, the culprit is stage 1's first (apart from the
rest) and the ground truth's, the decoy is in stage 1's lower half and under 5 % of the gap by
the ground truth, and top-k closes a resolved share of the gap above the random draws' mean;
for the model without a plant, when the summary says the ranking is not decided.
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
from fp4lab.diagnosis import scores  # noqa: E402

STAGE1 = dict(checkpoints=(0, 20, 40), batches=3, quant_seeds=3, time_budget=None)


def check(plant: str, out: Path) -> tuple[bool, str]:
    """(passed, one line) of one plant."""
    start = time.perf_counter()
    truth = planted_truth.ground_truth(plant, seeds=3, steps=40).set_index(["layer", "gemm"])
    d = fl.diagnose(experiment=planted.__file__, config={"task_args": {"plant": plant}},
                    verify=True, out=out / plant, progress=False, **STAGE1)  # fmt: skip
    t, g = d.table, d.gap.set_index("cell")
    first = (t.loc[0, "layer"], t.loc[0, "gemm"])
    tied = scores.tied_at_top(t, d.score)
    ranks = t.set_index(["layer", "gemm"])["rank"]
    top, rnd = g.loc["top-k"], g.loc["random-k"]
    line = (
        f"{plant:6s} first {first} (tied {tied}); truth first {truth.index[0]} "
        f"{truth['truth'].iloc[0]:.2f} of gap {truth['gap'].iloc[0]:.4f}; decoy rank "
        f"{ranks[planted.DECOY]:.0f} (truth {truth.loc[planted.DECOY, 'truth']:.1%}); top-k "
        f"{top['gap_closed']:.0%} [{top['lo']:.0%}, {top['hi']:.0%}], random-k "
        f"{rnd['gap_closed']:.0%}; {time.perf_counter() - start:.0f} s"
    )
    half = len(t) / 2
    if plant == "none":
        return "is not decided" in d.summary, line
    ok = first == planted.CULPRIT[plant] == truth.index[0] and tied == 1
    ok &= ranks[planted.DECOY] > half and abs(truth.loc[planted.DECOY, "truth"]) < 0.05
    ok &= top["lo"] > 0 and top["gap_closed"] > rnd["gap_closed"]
    return bool(ok), line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", default=",".join(planted.PLANTS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(machine())  # the CPU, its vector extensions and the kernel clone
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix="diagnose-planted-"))
    passed = True
    for plant in args.plants.split(","):
        ok, line = check(plant, out)
        passed &= ok
        print(("PASS " if ok else "FAIL ") + line, flush=True)
    print(f"{time.perf_counter() - start:.0f} s in all; outputs in {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
