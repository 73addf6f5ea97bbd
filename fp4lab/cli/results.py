"""The commands that read a results folder: ls, show, plot, report, compact, export."""

from __future__ import annotations

import sys
from pathlib import Path

from fp4lab.cli.run import print_summary


def ls(args) -> int:
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
        made = st.made()
        status = {rid: m[2] for rid, m in made.items()}
        print(f"{folder}  ({manifest.get('name', folder.name)})")
        listed = manifest.get("cells") and checked(manifest, made)
        current = {rid for c in listed or () for rid in c["run_ids"]} or status  # as store.load
        if current is status:  # no manifest, or one that pools no run: the records' labels
            labelled = store.label_runs(st.frame(["run_id", "cell", "config_key"]), {})
            pairs = zip(labelled["run_id"].tolist(), labelled["label"].tolist(), strict=True)
            listed = cells_of(pairs)
        damaged = st.damaged()  # a damaged part's runs, with a record or not
        for cell in listed:
            states = ["damaged" if r in damaged else status.get(r) for r in cell["run_ids"]]
            ok, failed, bad = (states.count(s) for s in ("ok", "failed", "damaged"))
            missing = len(states) - ok - failed - bad
            counts = f"ok {ok}  failed {failed}  missing {missing}"
            print(f"  {cell.get('label', '?'):40s} {counts}" + (f"  damaged {bad}" if bad else ""))
        stale = len(status.keys() - current)
        if stale:
            print(f"  stale: {stale} runs the experiment file no longer asks for (show --stale)")
    return 0


def compact(args) -> int:
    from fp4lab.sweep import compact

    if args.check:
        return check_parts(results_folder(args.results))
    counts = compact.compact(results_folder(args.results))
    where = f"part {counts['part']} of {args.results}/{compact.FOLDER}"
    print(
        f"{args.results}: {counts['runs']} runs compacted"
        + (f" into {where}" if counts["part"] else "")
    )
    return 0


def check_parts(folder: Path) -> int:
    """`fp4lab compact --check`: every part of the folder's dataset read and checked (its
    records and the sha256 of its metrics part), one line each; 1 if any is damaged."""
    import warnings

    from fp4lab.sweep import compact

    found = compact.parts(folder)
    damaged = 0
    for name, _, _ in found:
        with warnings.catch_warnings():  # the line below says it
            warnings.simplefilter("ignore")
            records, why, held = compact.check_part(folder, name)
        if why is None:
            print(f"{folder / name}: ok, {len(records)} runs")
        else:
            damaged += 1
            print(f"{folder / name}: damaged ({why}); {len(held)} runs: {', '.join(held)}")
    print(f"{folder}: {len(found)} parts checked, {damaged} damaged")
    return 1 if damaged else 0


def cells_of(labelled) -> list[dict]:
    """Cells of a folder without a manifest: (run id, label) pairs grouped by label."""
    cells: dict[str, list[str]] = {}
    for rid, label in labelled:
        cells.setdefault(label, []).append(rid)
    return [{"label": k, "run_ids": v} for k, v in cells.items()]


def results_folder(path) -> Path:
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


def show(args) -> int:
    from fp4lab.sweep import store

    results = store.load(results_folder(args.results), stale=args.stale)
    name = (results.experiment or {}).get("name", Path(args.results).name)
    if args.stale:
        if not results.n_stale:
            print(f"{name}: no stale runs (every run is one its experiment file asks for)")
            return 0
        print(f"{name}: stale runs, per config ([stale <config id>]), never pooled with current")
    warn_mixed_code(results, args.results)
    print_summary(results, name)
    if results.n_stale and not args.stale:
        print(f"\n({results.n_stale} stale runs not shown: fp4lab show {args.results} --stale)")
    return 0


def warn_mixed_code(results, folder) -> None:
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


def plot(args) -> int:
    from fp4lab.analysis import plots
    from fp4lab.sweep import failures, store

    results = store.load(results_folder(args.results))
    if failures.no_finished(results):
        return no_runs("plot", args.results, failures.first(results))
    out = Path(args.out) if args.out else Path(args.results) / "figures"
    for path in plots.standard_figures(results, out):
        print(path)
    return 0


def no_runs(command: str, folder: str, failed: str | None = None) -> int:
    """The error of a command that needs finished runs in a results folder that has none."""
    what = f"no finished run ({failed})" if failed else "no runs of its experiment yet"
    print(
        f"fp4lab {command}: error: {folder} holds {what}; nothing to {command} (fp4lab ls "
        f"{folder})",
        file=sys.stderr,
    )
    return 1


def report(args) -> int:
    from fp4lab.analysis import report
    from fp4lab.sweep import failures, store

    results = store.load(results_folder(args.results))
    if failures.no_finished(results):
        return no_runs("report", args.results, failures.first(results))
    print(report.write_report(results, args.out or args.results))
    return 0


def export(args) -> int:
    from fp4lab.analysis import export
    from fp4lab.sweep import failures, store

    results = store.load(results_folder(args.results))
    if failures.no_finished(results):
        return no_runs("export", args.results, failures.first(results))
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
