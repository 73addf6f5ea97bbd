"""The `fp4lab` command (bare `fp4lab` prints the help with examples).

fp4lab run EXPERIMENT [--out DIR] [--seeds N] [--steps N] [--set FIELD=VALUE ...] [--dry-run]
                      [--workers N] [--force] [--rerun-stale]
                      [--executor local|ray] [--address ADDR] [--ray-cpus N] [--ray-gpus N]
                      [--max-retries N] [--xla-log]
fp4lab ls RESULTS          runs per cell (done, failed, missing) and the stale runs
fp4lab show RESULTS        the summary table: loss gap with a seed interval, divergences,
                           tokens to target; a warning when the runs come from different code
fp4lab show RESULTS --stale    the same for the stale runs (the file no longer asks for them)
fp4lab plot RESULTS        the standard figures, as PNG files in RESULTS/figures
fp4lab report RESULTS      one self-contained HTML page: RESULTS/report.html
fp4lab compact RESULTS     a finished sweep's per-run files as one Parquet dataset
fp4lab export --tensorboard RESULTS [--out LOGDIR]
                           every run's metrics as TensorBoard scalars, one folder per run
                           (default LOGDIR: RESULTS/tensorboard)
fp4lab diagnose EXPERIMENT [--verify] [--out DIR]
                           which layers and GEMMs to keep in high precision (docs/diagnose.md)
fp4lab formats | demo      the element formats; a tour of the toolkit

Options are never abbreviated (`--seed` is an error, not `--seeds`). A folder given to show,
plot, report or export that is not a results folder (no experiment.json, no runs/) is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import warnings
from pathlib import Path

import fp4lab


def _formats(_args) -> int:
    from fp4lab.core import formats

    print(f"fp4lab {fp4lab.__version__}")
    print("element formats:", ", ".join(formats.format_names()))
    return 0


def _demo(_args) -> int:
    from fp4lab import demo

    return demo.main()


def _load_experiment(args):
    from fp4lab import sweep

    overrides = sweep.parse_overrides(args.set or ())
    if args.telemetry is not None:  # shorthand: telemetry with the high-precision shadow
        both = {"telemetry_every", "shadow"} & set(overrides)
        if both:
            raise sweep.ExperimentError(
                f"--telemetry {args.telemetry} and --set {sorted(both)[0]}=...: give it once"
            )
        overrides |= {"telemetry_every": args.telemetry, "shadow": True}
    if args.steps is not None and "steps" in overrides:
        raise sweep.ExperimentError(
            f"--steps {args.steps} and --set steps={overrides['steps']!r}: give the steps once"
        )
    return sweep.load_experiment(
        args.experiment, seeds=args.seeds, steps=args.steps, overrides=overrides
    )


def compile_cache_folder() -> Path:
    """Where `fp4lab run` keeps compiled programs: $XDG_CACHE_HOME/fp4lab/jax, by default
    ~/.cache/fp4lab/jax."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp4lab" / "jax"


def _run(args) -> int:
    from fp4lab import sweep
    from fp4lab.stderr_filter import filter_stderr
    from fp4lab.sweep import compute, failures, runner, store
    from fp4lab.sweep.compute import use_compile_cache

    if not args.no_compile_cache:
        folder = args.compile_cache or compile_cache_folder()
        use_compile_cache(folder, programs=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)  # worker processes inherit it

    if args.executor == "ray" and not args.dry_run:
        from fp4lab.sweep import ray as ray_executor

        ray_executor.import_ray()  # a missing Ray is reported before anything runs
    exp = _load_experiment(args)
    out = Path(args.out) if args.out else Path("results") / exp.name
    if args.dry_run:
        st = store.Store(out)
        runner.check_owner(exp, st, args.force)
        print(f"{exp.name}: {len(exp.cells)} cells, {exp.n_runs} runs -> {out}")
        if exp.overrides:
            values = (f"{k}={getattr(exp.base, k)!r}" for k in exp.overrides)
            print("  for every cell: " + ", ".join(values))
        for cell in exp.cells:
            done = sum(st.finished(r) for r in cell.run_ids())
            seeds = " ".join("/".join(map(str, s)) for s in cell.seeds)
            print(
                f"  {cell.label}  seeds(init/data/quant) {seeds}  [{done}/{len(cell.seeds)} done]"
            )
        # each unfinished cell's run traced for shapes: does it fail at its start?
        unfinished = (c for c in exp.cells if not all(map(st.finished, c.run_ids())))
        failures.check_cells(unfinished, compute.check_cell)
        return 0
    options = {}
    if args.executor == "ray":
        options = {
            "address": args.address,
            "num_cpus": args.ray_cpus,
            "num_gpus": args.ray_gpus,
            "max_retries": args.max_retries,
        }
    # XLA's slow-compile banners (on fd 2, from this process and the workers) as one line each
    with contextlib.nullcontext() if args.xla_log else filter_stderr():
        counts = sweep.run_experiment(
            exp,
            out,
            executor=args.executor,
            workers=args.workers,
            progress=not args.quiet,
            force=args.force,
            rerun_stale=args.rerun_stale,
            progress_every=(None if args.stream or not args.quiet else 0)
            if args.progress_every is None
            else args.progress_every,
            stream=args.stream,
            **options,
        )
    print(
        f"{exp.name}: {counts['done']} runs done, {counts['skipped']} already finished, "
        f"{counts['failed']} failed -> {out}"
    )
    results = store.load(out)
    _print_summary(results, exp.name)
    analyze_failed = False
    if exp.analyze is not None and not failures.no_finished(results):
        analyze_failed = _analyze(exp, results, out)
    if not args.no_figures and not failures.no_finished(results):
        from fp4lab.analysis import plots

        written = plots.standard_figures(results, out / "figures")
        heat = [p for p in written if p.name.startswith("heatmap_rel_err")]
        print(
            f"\n{len(written)} figures in {out / 'figures'}" + (f", e.g. {heat[0]}" if heat else "")
        )
    return 1 if counts["failed"] or analyze_failed else 0


def _analyze(exp, results, out: Path) -> bool:
    """Runs the experiment file's analyze(results) and writes each table to out/<name>.csv.
    Returns True when it failed (the error is printed; the runs stay stored)."""
    import pandas as pd

    try:
        tables = exp.analyze(results)
        if not isinstance(tables, dict) or not all(
            isinstance(k, str) and k.isidentifier() and isinstance(v, pd.DataFrame)
            for k, v in tables.items()
        ):
            raise TypeError("must return {name: DataFrame}, names usable as file names")
    except Exception as e:
        print(f"\n{exp.path}: analyze(results) raised {type(e).__name__}: {e}", file=sys.stderr)
        return True
    for name, table in tables.items():
        path = out / f"{name}.csv"
        table.to_csv(path, index=False, float_format="%.5g")
        print(f"\n{name} ({path}):")
        print(table.to_string(index=False))
    return False


def _print_summary(results, name: str) -> None:
    import pandas as pd

    from fp4lab.analysis import report, verdicts
    from fp4lab.sweep import failures

    if results.runs.empty:
        print("no finished runs")
        return
    if failures.no_finished(results):  # no summary to tabulate: say why
        print(f"\n{name}: no run finished; {failures.first(results)}")
        return
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(f"\n{name}: per cell, intervals over seeds (95 %)")
        print(report.cell_table(results.runs).to_string(index=False))
    header, lines = verdicts.in_words(results.runs, report.summary_outcome(results.runs))
    if lines:
        print(f"\nwhich cells differ, {header}")
        print("\n".join(f"  {line}" for line in lines))
    if failed := failures.first(results):
        print(failed)


def _ls(args) -> int:
    from fp4lab.sweep import store
    from fp4lab.sweep.cells import checked

    path = Path(args.results)
    kept = ("runs", "compact")  # per-run files, a compacted dataset (`fp4lab.sweep.compact`)
    folders = [path] if any((path / k).exists() for k in kept) else []
    folders = folders or sorted({p.parent for k in kept for p in path.glob(f"*/{k}")})
    if not folders:
        print(f"{path}: no results here")
        return 1
    for folder in folders:
        st = store.Store(folder)  # what follows reads its index only (`fp4lab.sweep.index`)
        manifest = st.experiment() or {}
        records = {r["run_id"]: r for r in st.summaries()}
        print(f"{folder}  ({manifest.get('name', folder.name)})")
        listed = manifest.get("cells") and checked(manifest, [*records.values()], st.config_ids())
        current = {rid for c in listed or () for rid in c["run_ids"]} or records  # as store.load
        if current is records:  # no manifest, or one that pools no run: the records' labels
            listed = _cells_of(store.label_runs([*records.values()], {}, ids=st.config_ids()))
        for cell in listed:
            rs = [records.get(r) for r in cell["run_ids"]]
            ok = sum(r is not None and r["status"] == "ok" for r in rs)
            failed = sum(r is not None and r["status"] == "failed" for r in rs)
            missing = len(rs) - ok - failed
            print(f"  {cell.get('label', '?'):40s} ok {ok}  failed {failed}  missing {missing}")
        stale = sum(rid not in current for rid in records)
        if stale:
            print(f"  stale: {stale} runs the experiment file no longer asks for (show --stale)")
    return 0


def _compact(args) -> int:
    from fp4lab.sweep import compact

    counts = compact.compact(_results_folder(args.results))
    where = f"part {counts['part']} of {args.results}/{compact.FOLDER}"
    print(
        f"{args.results}: {counts['runs']} runs compacted"
        + (f" into {where}" if counts["part"] else "")
    )
    return 0


def _cells_of(labelled) -> list[dict]:
    """Cells of a folder without a manifest: the records grouped by label and config."""
    cells: dict[str, list[str]] = {}
    for r, label in labelled:
        cells.setdefault(label, []).append(r["run_id"])
    return [{"label": k, "run_ids": v} for k, v in cells.items()]


def _results_folder(path) -> Path:
    """`path` as a results folder: one holding experiment.json or runs/.

    Raises:
      StoreError: `path` is a file, or a folder that is not a results folder (the message
        names the results folders inside it, if any). FileNotFoundError: no such folder.
    """
    from fp4lab.sweep.records import StoreError

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no results folder at {path}")
    if not path.is_dir():
        raise StoreError(f"{path} is a file; give a results folder (the one holding runs/)")
    if (path / "experiment.json").is_file() or (path / "runs").is_dir():
        return path
    inside = sorted(
        str(p) for p in path.iterdir() if (p / "experiment.json").is_file() or (p / "runs").is_dir()
    )
    where = f"; the results folders in it: {', '.join(inside)}" if inside else ""
    raise StoreError(
        f"{path} is not a results folder (no experiment.json, no runs/): `fp4lab run "
        f"EXPERIMENT --out {path}` makes one{where}"
    )


def _show(args) -> int:
    from fp4lab.sweep import store

    results = store.load(_results_folder(args.results), stale=args.stale)
    name = (results.experiment or {}).get("name", Path(args.results).name)
    if args.stale:
        print(f"{name}: stale runs, per config ([stale <config id>]), never pooled with current")
    _warn_mixed_code(results, args.results)
    _print_summary(results, name)
    if results.n_stale and not args.stale:
        print(f"\n({results.n_stale} stale runs not shown: fp4lab show {args.results} --stale)")
    return 0


def _warn_mixed_code(results, folder) -> None:
    """A warning on stderr when the shown runs were made by different code versions."""
    prov = results.provenance
    if prov is None or prov.empty:
        return
    counts = prov.groupby("code", dropna=False).size().sort_values(ascending=False)
    if len(counts) > 1:
        parts = "; ".join(f"{n} runs by {code}" for code, n in counts.items())
        print(
            f"warning: {folder} mixes code versions: {parts}. `fp4lab run EXPERIMENT --out "
            f"{folder} --rerun-stale` recomputes the runs made by other code.",
            file=sys.stderr,
        )


def _plot(args) -> int:
    from fp4lab.analysis import plots
    from fp4lab.sweep import failures, store

    results = store.load(_results_folder(args.results))
    if failures.no_finished(results):
        return _no_runs("plot", args.results, failures.first(results))
    out = Path(args.out) if args.out else Path(args.results) / "figures"
    for path in plots.standard_figures(results, out):
        print(path)
    return 0


def _no_runs(command: str, folder: str, failed: str | None = None) -> int:
    """The error of a command that needs finished runs in a results folder that has none."""
    what = f"no finished run ({failed})" if failed else "no runs of its experiment yet"
    print(
        f"fp4lab {command}: error: {folder} holds {what}; nothing to {command} (fp4lab ls "
        f"{folder})",
        file=sys.stderr,
    )
    return 1


def _report(args) -> int:
    from fp4lab.analysis import report
    from fp4lab.sweep import failures, store

    results = store.load(_results_folder(args.results))
    if failures.no_finished(results):
        return _no_runs("report", args.results, failures.first(results))
    print(report.write_report(results, args.out or args.results))
    return 0


def _export(args) -> int:
    from fp4lab.analysis import export
    from fp4lab.sweep import failures, store

    results = store.load(_results_folder(args.results))
    if failures.no_finished(results):
        return _no_runs("export", args.results, failures.first(results))
    out = Path(args.out) if args.out else Path(args.results) / "tensorboard"
    try:
        folders = export.tensorboard(results, out)
    except export.TensorBoardNotInstalled as e:
        print(f"fp4lab export: error: {e}", file=sys.stderr)
        return 2
    for folder in folders:
        print(folder)
    print(f"view them: tensorboard --logdir {out}")
    return 0


EXAMPLES = """examples:
  fp4lab run experiments/quickstart.py --workers 2       run a sweep (resumes where it stopped)
  fp4lab run experiments/quickstart.py --dry-run         its cells and seeds, what is finished
  fp4lab run experiments/quickstart.py --set lr=1e-3 --set d_model=128
                                                         the same sweep with other config values
  fp4lab run experiments/quickstart.py --telemetry 25    with per-layer error and drift telemetry
  fp4lab plot results/quickstart                         its figures, drift heatmaps included
  fp4lab ls results                                      runs per cell of every results folder
  fp4lab show results/quickstart                         the summary table
  fp4lab report results/quickstart                       one HTML page with tables and figures
  fp4lab export --tensorboard results/quickstart         every run's metrics for TensorBoard
  fp4lab formats                                         the element formats
  fp4lab run -h                                          the options of one command
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser that never takes an abbreviation for an option (`--seed` is an
    error, not `--seeds`); the subcommands' parsers are made of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _number(kind: type, low: int):
    """An argparse type: a `kind` (int or float) >= `low`, else a clear error."""
    what = f"{'an integer' if kind is int else 'a number'} >= {low}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= low:  # `not >=`: NaN is rejected too
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `fp4lab` command: every subcommand and option with its help."""
    parser = _Parser(
        prog="fp4lab",
        description=fp4lab.__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fp4lab {fp4lab.__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, fn, text in (
        ("formats", _formats, "list the element formats"),
        ("demo", _demo, "a tour: formats, a quantized model, telemetry"),
    ):
        sub.add_parser(name, help=text, description=text).set_defaults(func=fn)

    text = "run an experiment file (resumes where it stopped)"
    run = sub.add_parser("run", help=text, description=text)
    run.add_argument("experiment", help="a Python file with get_config() and sweep(add)")
    run.add_argument(
        "--out", metavar="DIR", help="results folder (default: results/<experiment name>)"
    )
    run.add_argument(
        "--seeds", type=_number(int, 1), metavar="N", help="run seeds 0..N-1 in every cell"
    )
    run.add_argument(
        "--steps",
        type=_number(int, 1),
        metavar="N",
        help="override the number of steps of every cell",
    )
    run.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="set a config field in every cell, e.g. --set lr=1e-3 --set d_model=128 "
        "(repeatable; the value is parsed as the field's type; checked like the file)",
    )
    run.add_argument(
        "--telemetry",
        type=_number(int, 1),
        metavar="K",
        help="every K steps, record the telemetry of every quantized GEMM with the "
        "high-precision shadow: operand errors (quant/), gradients against the exact ones "
        "(grad/) and the drift of each layer's activations and gradients (acc/); the same as "
        "--set telemetry_every=K --set shadow=True",
    )
    run.add_argument("--dry-run", action="store_true", help="list the cells, trace each, stop")
    run.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where cells compute: local (this machine, --workers processes) or ray (one Ray "
        "task per cell; see --address) (default local)",
    )
    run.add_argument(
        "--address",
        metavar="ADDR",
        help="ray: the cluster to join (default: RAY_ADDRESS, else start one here)",
    )
    run.add_argument(
        "--ray-cpus",
        type=_number(float, 0),
        default=1,
        metavar="N",
        help="ray: CPUs per cell (default 1)",
    )
    run.add_argument(
        "--ray-gpus",
        type=_number(float, 0),
        default=0,
        metavar="N",
        help="ray: GPUs per cell (default 0)",
    )
    run.add_argument(
        "--max-retries",
        type=_number(int, 0),
        default=3,
        metavar="N",
        help="ray: reruns of a cell whose worker died (default 3)",
    )
    run.add_argument(
        "--workers",
        type=_number(int, 1),
        default=1,
        metavar="N",
        help="local: processes computing cells (default 1)",
    )
    run.add_argument(
        "--force", action="store_true", help="run into a folder holding another experiment"
    )
    run.add_argument(
        "--rerun-stale",
        action="store_true",
        help="recompute finished runs that another code version (fp4lab, git, jax) made",
    )
    run.add_argument(
        "--compile-cache",
        metavar="DIR",
        help=f"jax's persistent compilation cache (default {compile_cache_folder()}), with "
        "each cell's traced program in its programs/ folder: reruns and added seeds skip "
        "tracing and compiling; results are bit-identical without it",
    )
    run.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="trace and compile every cell afresh (also for code that patches fp4lab at run time)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--progress-every",
        type=int,
        metavar="K",
        help="steps between progress reports from inside a cell (default: about 50 a run; "
        "with --quiet, none unless --stream; 0: only whole cells move the bar). Reports change "
        "no number; on the CPU they cost a run about nothing and the compile caches keep their "
        "programs (elsewhere, or without fp4lab's CPU kernels, they are a Python callback and "
        "a rerun with them compiles afresh)",
    )
    run.add_argument(
        "--stream",
        action="store_true",
        help="append each reported step of each run to OUT/stream.jsonl while it runs",
    )
    run.add_argument("--no-figures", action="store_true", help="do not write the figures")
    run.add_argument(
        "--xla-log",
        action="store_true",
        help="show XLA's own log lines unfiltered (by default each of its slow-compile "
        "banners is one line while the sweep runs, e.g. 'XLA: compiling jit_train took 2m4.8s')",
    )
    run.set_defaults(func=_run)

    for name, fn, text in (
        ("ls", _ls, "runs per cell of a results folder (or of every folder under it)"),
        ("show", _show, "the summary table of a results folder"),
        ("plot", _plot, "write the standard figures (PNG)"),
        ("report", _report, "write one self-contained HTML page"),
        ("compact", _compact, "move the per-run files into one Parquet dataset"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("results", help="a results folder")
        if name in ("plot", "report"):
            p.add_argument("--out", help="where to write (default: inside the results folder)")
        if name == "show":
            p.add_argument("--stale", action="store_true", help="the stale runs instead")
        p.set_defaults(func=fn)

    text = "write every run's metrics in another format (TensorBoard event files)"
    export = sub.add_parser("export", help=text, description=text)
    export.add_argument("results", help="a results folder")
    formats = export.add_mutually_exclusive_group(required=True)
    formats.add_argument(
        "--tensorboard",
        action="store_true",
        help="TensorBoard event files: one folder per run, <cell>/init<i>_data<d>_quant<q>, every "
        'metric a scalar by step (needs tensorboardX: pip install "fp4lab[tensorboard]")',
    )
    export.add_argument(
        "--out", metavar="LOGDIR", help="where to write (default: RESULTS/tensorboard)"
    )
    export.set_defaults(func=_export)

    from fp4lab.diagnose import command as diagnose_command  # the standard library only

    diagnose_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # bare `fp4lab`: the help with examples
        parser.print_help()
        return 0
    from fp4lab.sweep.experiment import ExperimentError
    from fp4lab.sweep.ray import RayNotInstalled
    from fp4lab.sweep.records import StoreError
    from fp4lab.train.config import ConfigError

    previous = _terminate_as_interrupt() if args.command == "run" else None
    formatwarning = warnings.formatwarning
    warnings.formatwarning = _one_line_warning
    try:
        return args.func(args)
    except BrokenPipeError:  # `fp4lab ... | head`: the reader is gone, say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ExperimentError, ConfigError, StoreError, OSError, RayNotInstalled) as e:
        print(f"fp4lab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"\nfp4lab {args.command}: interrupted; finished runs are stored, run again to resume",
            file=sys.stderr,
        )
        return 130
    finally:
        warnings.formatwarning = formatwarning
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def _terminate_as_interrupt():
    """SIGTERM (a scheduler's timeout, `kill`) raises KeyboardInterrupt in the main thread, so
    `fp4lab run` stops its workers and exits as on Ctrl-C. Returns the previous handler."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
