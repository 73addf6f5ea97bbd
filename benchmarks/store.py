"""The results store at 100,000 runs: `ls`, the resume check, the runs table and one metric of
one cell, each against its goal, on a synthetic folder that this script writes.

    python benchmarks/store.py                 # 100,000 runs x 300 steps x 20 metrics
    python benchmarks/store.py --runs 10000    # smaller, faster
    python benchmarks/store.py --keep DIR      # write (or reuse) the folder in DIR

The folder is written directly in compacted form (`fp4lab.sweep.compact`: one records part, one
metrics part with a row group per cell), not by a sweep: 1000 cells (teacher configs differing
in lr) x 100 seed triples (i, i, i), each run with a sealed record (checksum) and 300 steps of
20 metrics. Each metric's curve is a decaying exponential scaled per metric and per cell, times
(1 + 2 % Gaussian noise) drawn per run, step and metric (seeded by the cell), rounded to
float32 as a run's metrics are. The noise does not compress (the metrics part is about 2.6 GB,
4.4 bytes a value); real curves are smoother and compress somewhat better, so this errs on the
slow side. Its index is then built by the same `Store.refresh` a reader runs
on a folder it has not seen. Generation runs in a process of its own, so the peak memory
printed is the measurements'. Each figure is the median of `--reps` calls, wall and CPU
seconds (the CPU figure is the one to read on a shared machine); `fp4lab ls` is timed in this
process and as a fresh process (which must not load jax). The last rows time `ls` on the
committed results/randomness_vs_error folder (warm index; cold: the index deleted first).

Measured: see docs/store.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from timing import machine  # benchmarks/timing.py

from fp4lab import cli
from fp4lab.sweep import compact, index, runner, store
from fp4lab.sweep.experiment import Cell, Experiment
from fp4lab.sweep.records import seal
from fp4lab.train.config import Config

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"ls": 1.0, "resume check": 2.0, "runs table": 2.0, "one metric of one cell": 2.0}
COMMITTED_GOAL = 0.5  # ls on results/randomness_vs_error
CELLS, STEPS, METRICS = 1000, 300, 20
SERIES = ("loss", "grad_norm", "loss_scale")


def experiment(runs: int) -> Experiment:
    """The synthetic sweep: CELLS cells of runs // CELLS seed triples (i, i, i)."""
    per = runs // CELLS
    seeds = tuple((i, i, i) for i in range(per))
    cells = []
    for c in range(CELLS):
        cfg = Config(task="teacher", steps=STEPS, lr=1e-3 * (1 + c / CELLS))
        cells.append(Cell(f"c{c}", {"lr": cfg.lr}, cfg, seeds))
    return Experiment("synthetic", "synthetic.py", Config(task="teacher"), tuple(cells))


def generate(out: Path, runs: int) -> None:
    """Writes the folder in compacted form (module docstring), then builds its index."""
    exp = experiment(runs)
    st = store.Store(out)
    st.write_experiment(exp.manifest())
    (out / compact.FOLDER).mkdir(parents=True, exist_ok=True)
    names = [*SERIES, *(f"quant/l{i // 4}/fprop/x/rel_err_{i % 4}" for i in range(17))]
    base = np.exp(-np.arange(STEPS) / 100.0)[None, :] * np.arange(1, METRICS + 1)[:, None]
    prov = store.provenance()
    rows = {"run_id": [], "cell": [], "status": [], "record": []}
    mpath = out / compact.FOLDER / "metrics-0001.parquet"
    per = runs // CELLS
    n = STEPS * METRICS  # rows of one run
    run_of_row = np.repeat(np.arange(per, dtype=np.int32), n)
    seed_of_row = np.repeat(np.arange(per, dtype=np.int64), n)  # the seeds are (i, i, i)
    metric = pa.DictionaryArray.from_arrays(
        np.tile(np.repeat(np.arange(METRICS, dtype=np.int32), STEPS), per), names
    )
    with pq.ParquetWriter(mpath, compact.METRICS_SCHEMA, compression="zstd") as writer:
        for c, cell in enumerate(exp.cells):
            cfg, ids = cell.config.to_dict(), cell.run_ids()
            for seed, rid in zip(cell.seeds, ids, strict=True):
                summary = {"final_loss": 0.1 + seed[0] / 1e3, "eval_loss": 0.1, "loss_gap": 0.01}
                record = {"run_id": rid, "experiment": exp.name, "cell": cell.label}
                record |= {"overrides": cell.overrides, "config": cfg, "data": {}}
                record |= {"seeds": dict(zip(("init", "data", "quant"), seed, strict=True))}
                record |= {"numerics": store.NUMERICS_VERSION, "provenance": prov}
                record |= {"status": "ok", "summary": summary, "wall_s": 1.0}
                record["metrics"] = {"file": f"{rid}.parquet", "sha256": "0" * 64}
                record["metrics"]["series"] = list(SERIES)
                rows["run_id"].append(rid)
                rows["cell"].append(cell.label)
                rows["status"].append("ok")
                rows["record"].append(seal(record)[1])
            columns = {
                "run_id": pa.DictionaryArray.from_arrays(run_of_row, ids).cast(pa.string()),
                "cell": pa.DictionaryArray.from_arrays(np.zeros(per * n, np.int32), [cell.label]),
                "seed_init": seed_of_row,
                "seed_data": seed_of_row,
                "seed_quant": seed_of_row,
                "step": np.tile(np.arange(STEPS, dtype=np.int64), METRICS * per),
                "metric": metric,
                "value": values(base, c, per),
            }
            columns["cell"] = columns["cell"].cast(pa.string())
            columns["metric"] = columns["metric"].cast(pa.string())
            table = pa.table(columns, schema=compact.METRICS_SCHEMA)
            writer.write_table(table, row_group_size=1 << 30)
    sha = hashlib.sha256(mpath.read_bytes()).hexdigest()
    schema = compact.RECORDS_SCHEMA.with_metadata({b"fp4lab.metrics_sha256": sha.encode()})
    table = pa.table(rows, schema=schema)
    pq.write_table(table, out / compact.FOLDER / "records-0001.parquet", compression="zstd")
    t0 = time.perf_counter()
    store.Store(out).index()  # built as any reader builds it
    print(f"  index built from the records part in {time.perf_counter() - t0:.1f} s")


def values(base: np.ndarray, c: int, per: int) -> np.ndarray:
    """The `per` runs' curves of cell `c`: the cell's curve times (1 + 2% Gaussian noise), the
    noise seeded by the cell, each value rounded to float32 as a run's metrics are."""
    noise = np.random.default_rng(c).standard_normal((per, base.size))
    curves = base.ravel()[None, :] * (1 + c / CELLS) * (1 + 0.02 * noise)
    return curves.astype(np.float32).astype(np.float64).ravel()


def median_s(fn, reps: int) -> tuple[float, float]:
    """Medians of `reps` calls: wall seconds and this process's CPU seconds."""
    wall, busy = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        busy.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(busy)


def fresh_ls(folder: Path, reps: int) -> tuple[float, float]:
    """`fp4lab ls` as a fresh process: medians of wall and CPU (user + system) seconds. The
    child fails if the command loaded jax."""
    code = "import sys; from fp4lab import cli; r = cli.main(sys.argv[1:]); "
    code += "sys.exit(r or ('jax' in sys.modules and 'ls loaded jax'))"
    wall, busy = [], []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code, "ls", str(folder)], check=True, stdout=subprocess.DEVNULL
        )
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(wall), statistics.median(busy)


def ls(folder: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["ls", str(folder)]) == 0


def resume_check(folder: Path, runs: int) -> None:
    exp = experiment(runs)  # fresh cells: their run ids are computed in the call
    st = store.Store(folder)
    runner.check_owner(exp, st, force=False)
    assert runner.pending(exp, st) == []


def row(name: str, seconds: tuple[float, float], goal: float | None) -> None:
    wall, busy = seconds
    verdict = "" if goal is None else "meets" if wall <= goal else "MISSES"
    against = "" if goal is None else f"goal <= {goal:g} s"
    print(f"  {name:44s} {wall:7.3f} s  (cpu {busy:6.3f} s)   {against:14s} {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--keep", metavar="DIR", help="write the folder here (reused if there)")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    print(machine())  # the CPU, its vector extensions and the kernel clone
    if args.generate:
        generate(Path(args.generate), args.runs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp) / "synthetic"
        if not (folder / compact.FOLDER).is_dir():
            print(f"writing {args.runs} runs x {STEPS} steps x {METRICS} metrics to {folder}")
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, __file__, "--runs", str(args.runs), "--generate", str(folder)],
                check=True,
            )
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
            print(f"  written in {time.perf_counter() - t0:.0f} s, {size:.0f} MiB")
        print(f"{args.runs} runs, median of {args.reps} calls:")
        row("fp4lab ls (in this process)", median_s(lambda: ls(folder), args.reps), GOALS["ls"])
        row("fp4lab ls (a fresh process, no jax)", fresh_ls(folder, args.reps), None)
        check = median_s(lambda: resume_check(folder, args.runs), args.reps)
        row("resume check (check_owner + pending)", check, GOALS["resume check"])
        table = median_s(lambda: store.load(folder, metrics=False), args.reps)
        row("runs table (load(metrics=False))", table, GOALS["runs table"])

        def one():
            res = store.load(folder, metrics="loss", cells=["c17"])
            assert len(res.metrics) == (args.runs // CELLS) * STEPS

        row("one metric of one cell", median_s(one, args.reps), GOALS["one metric of one cell"])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        print(f"  peak memory of these measurements: {peak:.0f} MiB")
    committed = ROOT / "results" / "randomness_vs_error"
    if (committed / compact.FOLDER).is_dir() or (committed / "runs").is_dir():
        ls(committed)  # the index up to date
        row(
            f"fp4lab ls {committed.relative_to(ROOT)}",
            median_s(lambda: ls(committed), args.reps),
            COMMITTED_GOAL,
        )

        def cold():
            copy = Path(tempfile.mkdtemp())
            shutil.copytree(
                committed, copy / "r", ignore=shutil.ignore_patterns(f"{index.INDEX_FILE}*")
            )
            t0 = time.perf_counter()
            ls(copy / "r")
            seconds = time.perf_counter() - t0
            shutil.rmtree(copy)
            return seconds

        first = statistics.median(cold() for _ in range(3))
        print(f"  the same with no index yet (built first): {first:.3f} s")
        row("the same as a fresh process", fresh_ls(committed, args.reps), None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
