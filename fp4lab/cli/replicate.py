"""`fp4lab replicate RESULTS --seeds-from N`: a finished study's cells on fresh seeds, and
which of its words survive them (`fp4lab.sweep.fresh`)."""

from __future__ import annotations

import argparse

HELP = "a finished study on fresh seeds: its words"
MAX_WORKERS = 1024  # processes of --workers (run's too): each loads jax; more is no machine's


def add_parser(sub, number) -> argparse.ArgumentParser:
    """Adds the `replicate` subcommand to the subparsers `sub` (`number`: the int parser)."""
    p = sub.add_parser("replicate", help=HELP, description=HELP)
    p.add_argument("results", help="a finished study's results folder")
    p.add_argument(
        "--seeds-from",
        type=number(int, 1),
        required=True,
        metavar="N",
        help="move every seed up by N: must clear every seed the study used (refused else)",
    )
    p.add_argument("--experiment", help="its experiment file (default: the one it records)")
    p.add_argument("--out", metavar="DIR", help="fresh results folder (default RESULTS_fresh<N>)")
    p.add_argument(
        "--executor", choices=("local", "ray"), default="local", help="as for `fp4lab run`"
    )
    p.add_argument("--address", metavar="ADDR", help="ray: the cluster to join")
    p.add_argument(
        "--workers",
        type=number(int, 1, MAX_WORKERS),
        default=1,
        metavar="N",
        help="local: processes",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=replicate)
    return p


def replicate(args) -> int:
    from fp4lab.cli.run import compile_cache_folder
    from fp4lab.sweep.compute import use_compile_cache
    from fp4lab.sweep.fresh import replicate as run

    use_compile_cache(compile_cache_folder(), programs=True)
    options = {"address": args.address} if args.executor == "ray" else {}
    words = run(
        args.results,
        args.seeds_from,
        experiment=args.experiment,
        out=args.out,
        executor=args.executor,
        workers=args.workers,
        progress=not args.quiet,
        **options,
    )
    print(words.to_string(index=False))
    counts = words["replication"].value_counts()
    print(", ".join(f"{n} {word}" for word, n in counts.items()))
    return 0
