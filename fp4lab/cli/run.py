"""`fp4lab run`: an experiment file's sweep, its tables, figures and summary."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def load_experiment(args):
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
    seeds = args.seeds
    if getattr(args, "design", None):
        from fp4lab.sweep import design

        try:
            seeds = design.named(args.design, args.seeds)
        except ValueError as e:
            raise sweep.ExperimentError(f"--design {args.design} --seeds {args.seeds}: {e}") from e
    return sweep.load_experiment(
        args.experiment, seeds=seeds, steps=args.steps, overrides=overrides
    )


def compile_cache_folder() -> Path:
    """Where `fp4lab run` keeps compiled programs: $XDG_CACHE_HOME/fp4lab/jax, by default
    ~/.cache/fp4lab/jax."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp4lab" / "jax"


def design_text(name: str, n: int | None) -> str:
    from fp4lab.sweep import design

    seeds = design.named(name, n)
    levels = len({s[-1] for s in seeds})
    return f"{len(seeds)} runs a cell ({levels} quant seeds x {levels} init=data seeds)"


def probe(exp, st, workers: int) -> str:
    """Times one run (its first unfinished seed) of the first unfinished cell, compile
    included, and estimates the sweep from it: a compile per program still to run (config and
    call width) and every unfinished run as long as the probe's, over `workers` processes."""
    import time

    from fp4lab.sweep import compute, runner

    work = runner.batches(runner.pending(exp, st))
    cell, seeds, _ = work[0]
    t0 = time.perf_counter()
    try:
        result = compute.compute_cell(cell.config.to_dict(), [seeds[0]])[0]
    except Exception as e:  # traced fine (check_cells) but failed computing: say so, no estimate
        first = (str(e).splitlines() or [""])[0]
        return f"probe: cell {cell.label} failed: {type(e).__name__}: {first}"
    compile_s = result["summary"]["compile_s"]
    run_s = max(time.perf_counter() - t0 - compile_s, result["wall_s"])
    programs = {(c.config, compute.call_width(c.config, len(s))) for c, s, _ in work}
    runs = sum(len(s) for _, s, _ in work)
    total = (len(programs) * compile_s + runs * run_s) / workers
    return (
        f"probe: cell {cell.label}, seeds {'/'.join(map(str, seeds[0]))}: compile "
        f"{_seconds(compile_s)}, run {_seconds(run_s)}; estimate for {runs} runs and "
        f"{len(programs)} programs to compile on {workers} worker(s): about {_seconds(total)} "
        "(every cell timed as this one)"
    )


def _seconds(s: float) -> str:
    s = round(s, 1)
    return f"{int(s // 60)}m{s % 60:04.1f}s" if s >= 60 else f"{s}s"


def run(args) -> int:
    from fp4lab import sweep
    from fp4lab.sweep import compute, experiment, failures, runner, store
    from fp4lab.sweep.compute import use_compile_cache

    if args.xla_log:
        print(
            "fp4lab run: --xla-log is no longer needed (XLA's own lines are not filtered); "
            "it will be removed in the next release",
            file=sys.stderr,
        )
    if not args.no_compile_cache:
        folder = args.compile_cache or compile_cache_folder()
        use_compile_cache(folder, programs=True)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)  # worker processes inherit it

    if args.executor == "ray" and not args.dry_run:
        from fp4lab.sweep import ray as ray_executor

        ray_executor.import_ray()  # a missing Ray is reported before anything runs
    exp = load_experiment(args)
    out = Path(args.out) if args.out else Path("results") / exp.name
    if args.verbose:  # which quantizer this process runs on the CPU, and why
        from fp4lab.core import kernel_route

        print(f"fp4lab: {kernel_route.choice()[1]}")
    if args.dry_run:
        st = store.Store(out)
        runner.check_owner(exp, st, args.force)
        print(f"{exp.name}: {len(exp.cells)} cells, {exp.n_runs} runs -> {out}")
        if getattr(args, "design", None):
            print(f"  seeds by design {args.design}: {design_text(args.design, args.seeds)}")
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
        unfinished = [c for c in exp.cells if not all(map(st.finished, c.run_ids()))]
        experiment.check_cells(unfinished, compute.check_cell)
        if unfinished and not args.no_probe:
            print(probe(exp, st, args.workers))
        return 0
    options = {}
    if args.executor == "ray":
        options = {
            "address": args.address,
            "num_cpus": args.ray_cpus,
            "num_gpus": args.ray_gpus,
            "max_retries": args.max_retries,
        }
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
    if not args.quiet:  # the summary's verdict and the figures take a while on big sweeps
        after = "the summary, the verdict" + ("" if args.no_figures else ", the figures")
        print(f"{exp.name}: post-processing: {after} ...", file=sys.stderr, flush=True)
    results = store.load(out)
    print_summary(results, exp.name)
    analyze_failed = False
    if exp.analyze is not None and not failures.no_finished(results):
        analyze_failed = analyze(exp, results, out)
    if not args.no_figures and not failures.no_finished(results):
        from fp4lab.analysis import plots

        written = plots.standard_figures(results, out / "figures")
        heat = [p for p in written if p.name.startswith("heatmap_rel_err")]
        print(
            f"\n{len(written)} figures in {out / 'figures'}" + (f", e.g. {heat[0]}" if heat else "")
        )
    return 1 if counts["failed"] or analyze_failed else 0


def analyze(exp, results, out: Path) -> bool:
    """Runs the experiment file's analyze(results) and writes each table to out/<name>.csv.
    Returns True when it failed (the error is printed; the runs stay stored)."""
    from fp4lab.sweep.experiment import ExperimentError, analyzed

    try:
        tables = analyzed(exp, results)
    except ExperimentError as e:
        print(f"\n{e}", file=sys.stderr)
        return True
    for name, table in tables.items():
        path = out / f"{name}.csv"
        table.to_csv(path, index=False, float_format="%.5g")
        print(f"\n{name} ({path}):")
        print(table.to_string(index=False))
    return False


def no_seam(runs) -> dict[str, str]:
    """{cell: the modules its runs recorded as left without a seam} (`no_seam`), where any."""
    if "no_seam" not in runs.columns:  # records made before the column
        return {}
    named = runs[runs["no_seam"].map(lambda v: isinstance(v, str) and v != "")]
    return dict(named.groupby("cell", sort=False)["no_seam"].first())


def print_summary(results, name: str) -> None:
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
    for cell, names in no_seam(results.runs).items():
        print(f"{cell}: not quantized, no seam (a custom jnp.dot or @, in high precision): {names}")
    said = verdicts.words(results.runs, report.summary_outcome(results.runs))
    if said.stuck:
        print("\n" + "\n".join(said.stuck))
    if said.cells:
        print(f"\nwhich cells differ, {said.header}")
        print("\n".join(f"  {line}" for line in said.cells))
    if said.streams:
        print("\nwhich seed streams matter, per cell (their own spread; README: Reading a verdict)")
        print("\n".join(f"  {line}" for line in said.streams))
    if failed := failures.first(results):
        print(failed)
