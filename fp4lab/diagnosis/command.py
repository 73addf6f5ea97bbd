"""`fp4lab diagnose EXPERIMENT.py`: its options and what it prints.

Only the standard library at import (`fp4lab --help` stays fast); the study itself is loaded
when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import fp4lab.diagnosis as package

__all__ = ["add_parser", "main"]

HELP = "which layers and GEMMs to keep in high precision: scores, ranking, rules, verification"


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(s) for s in text.split(","))
    except ValueError:
        steps = ()
    if not steps or min(steps) < 0:
        raise argparse.ArgumentTypeError(f"need steps >= 0 separated by commas, got {text!r}")
    return steps


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {kind.__name__}, got {text!r}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _seconds(text: str) -> float | None:
    """ "10m", "90s", "1h", "600" (seconds) or "none" (no time budget)."""
    if text.strip().lower() == "none":
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    scale = units.get(text.strip()[-1:].lower(), 1)
    number = text.strip()[:-1] if text.strip()[-1:].lower() in units else text.strip()
    try:
        value = float(number) * scale
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise argparse.ArgumentTypeError(f"need a time such as 10m, 90s, 1h or none, got {text!r}")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    """Adds the `diagnose` subcommand to the subparsers `sub`."""
    p = sub.add_parser("diagnose", help=HELP, description=HELP)
    p.add_argument("experiment", help="an experiment file (its get_config() and its model)")
    p.add_argument("--out", metavar="DIR", help="outputs (default: results/<file>-diagnose)")
    p.add_argument("--recipe", default="nvfp4", help="the FP4 recipe (default nvfp4)")
    p.add_argument("--hp", default="bf16", help="the recipe of kept GEMMs (default bf16)")
    p.add_argument("--score", default=None, help="the ranking score (default alone_step_loss)")
    p.add_argument(
        "--budget",
        type=_positive(float),
        default=0.1,
        help="share of GEMM FLOPs kept in high precision (default 0.1)",
    )
    p.add_argument(
        "--target",
        type=_positive(float),
        default=0.9,
        help="the other set offered: the cheapest predicted to close this share of the gap "
        "(default 0.9)",
    )
    p.add_argument(
        "--time-budget",
        type=_seconds,
        default=600.0,
        metavar="TIME",
        help="time for stage 1, e.g. 10m, 90s or none: it measures as many samples as fit "
        "(default 10m)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="layers (path regex) kept in high precision and out of the diagnosis (repeatable; "
        "the file's rules with recipe None are kept too)",
    )
    p.add_argument(
        "--checkpoints",
        type=_steps,
        default=(0, 50, 100),
        metavar="S,S,...",
        help="steps of the short run whose weights are measured (default 0,50,100)",
    )
    p.add_argument("--batches", type=_positive(int), default=3, help="batches per checkpoint")
    p.add_argument("--quant-seeds", type=_positive(int), default=3, help="quant seeds per batch")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="set a config field, e.g. --set n_layers=4 (repeatable; as fp4lab run's)",
    )
    p.add_argument("--verify", action="store_true", help="stage 2: train the sets and compare")
    p.add_argument("--verify-steps", type=_positive(int), metavar="N", help="steps of stage 2")
    p.add_argument("--verify-seeds", type=_positive(int), default=4, help="seeds of stage 2")
    p.add_argument(
        "--random-draws", type=_positive(int), default=3, help="random sets of stage 2 (default 3)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines or bar")
    p.set_defaults(func=main)
    return p


def _check_before_stage_1(args, out: Path) -> None:
    """What would fail only after stage 1 (minutes of it), refused before it starts."""
    if args.verify and args.verify_seeds < 4:
        raise ValueError(
            f"--verify-seeds {args.verify_seeds}: verify needs at least 4 seeds for paired "
            "intervals"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for the outputs")
    there = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not os.access(there, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {there} cannot be written; give a folder you can write")
    try:  # the folder made, and a file written in it, as the outputs will be (/proc passes
        out.mkdir(parents=True, exist_ok=True)  # the access test and takes no folder)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise ValueError(f"--out {out} cannot be written ({e}); give a folder you can write") from e


def main(args) -> int:
    """Runs the diagnosis of `args` and prints the ranking, the rules and the summary."""
    out = Path(args.out or Path("results") / f"{Path(args.experiment).stem}-diagnose")
    try:
        _check_before_stage_1(args, out)
        names = ("recipe", "hp", "budget", "target", "checkpoints", "batches", "quant_seeds")
        names += ("time_budget", "verify", "verify_steps", "verify_seeds", "random_draws")
        options = {name: getattr(args, name) for name in names}
        options["exclude"] = tuple(args.exclude)
        if args.score is not None:
            options["score"] = args.score
        options["config"] = package.parse_overrides(args.set or ()) or None
        d = package.diagnose(
            experiment=args.experiment, out=out, progress=not args.quiet, **options
        )
    except ValueError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"fp4lab diagnose: error: {message}", file=sys.stderr)
        return 2
    shown = ["rank", "layer", "gemm", d.score, f"{d.score}_lo", f"{d.score}_hi", "flop_share"]
    if d.table[f"{d.score}_lo"].isna().all():  # fewer than 3 samples: said in the summary
        shown = [c for c in shown if not c.endswith(("_lo", "_hi"))]
    print(d.table[shown].head(10).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"\n# kept in {d.hp}: {d.share:.1%} of GEMM FLOPs (budget {d.budget:.1%})")
    print(d.rules_source)
    if len(d.skipped):
        print("# left out of the set, and why (the budget, or not worth their FLOPs):")
        print(d.skipped.to_string(index=False, float_format=lambda x: f"{x:.4g}") + "\n")
    if d.gap is not None:
        print(d.gap.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print()
    print(d.summary)
    print(f"\nwritten to {out}/ (ranking.csv, sensitivity.png, rules.py, summary.txt, ...)")
    return 0
