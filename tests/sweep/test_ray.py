"""The ray executor: the same numbers as local, lost workers retried, failures recorded, resume.

One local Ray instance (2 CPUs) serves the whole module; each sweep is a tiny teacher MLP. The
first test trains it (local and Ray, bit for bit); the tests of the executor's bookkeeping
(retries, failures, cancels, the index) compute with `fakes.fake_compute` (plain data, no jax in
the workers), as jax adds nothing to what they check. The compute functions below travel to the
workers by value (this module and tests/fakes.py are registered with cloudpickle), so the
workers need not import them; they keep their state (crash markers, attempt logs) in files
under tmp_path.
"""

import collections
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import fakes  # tests/fakes.py
import pandas as pd
import pytest

from fp4lab import cli, sweep
from fp4lab.sweep import compact, index, store
from fp4lab.sweep import ray as ray_executor

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'fp4lab[ray]'")

pytestmark = pytest.mark.slow  # Ray starts a cluster of processes

BASE = """
from fp4lab.train.config import Config

SEEDS = 2

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=3, eval_batches=1, seed_batch=2)

def sweep(add):
"""

RECIPES = """
add(recipe="fp32")
add(recipe="bf16")
"""

SEEDED = """
add("a", recipe="fp32", lr=1e-3, seeds=[(0, 0, 0), (1, 1, 1)])
add("b", recipe="fp32", lr=2e-3, seeds=[(2, 2, 2), (3, 3, 3)])
add("c", recipe="fp32", lr=3e-3, seeds=[(4, 4, 4), (5, 5, 5)])
add("d", recipe="fp32", lr=4e-3, seeds=[(6, 6, 6), (7, 7, 7)])
"""  # four cells, four configs (one config under two labels is an error)


@pytest.fixture(scope="module")
def ray_cluster():
    """A fresh local Ray instance with 2 CPUs for this module; the workers inherit the CPU jax."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(fakes)
    yield ray
    ray.cloudpickle.unregister_pickle_by_value(fakes)
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def write_experiment(tmp_path: Path, cells: str = SEEDED) -> sweep.Experiment:
    path = tmp_path / "exp.py"
    path.write_text(BASE + textwrap.indent(textwrap.dedent(cells), "    "))
    return sweep.load_experiment(path)


def run_ids(exp: sweep.Experiment) -> set[str]:
    return {r for c in exp.cells for r in c.run_ids()}


def run_files(out: Path) -> dict[str, bytes]:
    return {f.stem: f.read_bytes() for f in (out / "runs").glob("*.json")}


def numbers(record: dict) -> str:
    """A run record without its wall-clock fields (wall_s, compile_s, provenance, checksum)."""
    body = {k: v for k, v in record.items() if k not in ("wall_s", "provenance", "checksum")}
    body["summary"] = {k: v for k, v in body["summary"].items() if k != "compile_s"}
    return json.dumps(body, sort_keys=True)  # exact: floats round-trip, NaN == NaN


def first_seed(config, seeds) -> str:
    return str(seeds[0][0])


def logged(log: Path, key=first_seed, crash=lambda config, seeds: False, cell=fakes.fake_compute):
    """compute(config, seeds) for the workers: logs key(config, seeds) to `log` (one line per
    attempt), kills its own process when crash(config, seeds), else computes the cell with
    `cell` (the fake by default)."""

    def compute(config, seeds):
        with open(log, "a") as f:
            f.write(f"{key(config, seeds)}\n")
        if crash(config, seeds):
            os._exit(1)  # no exception, no cleanup: the worker process is gone
        return cell(config, seeds)

    return compute


def attempts(log: Path) -> collections.Counter:
    return collections.Counter(log.read_text().split())


# ---------------------------------------------------------------------------------------------
# Same numbers, driver-side writes.


def test_ray_gives_the_local_numbers_bit_for_bit(ray_cluster, tmp_path):
    exp = write_experiment(tmp_path, RECIPES)
    local = sweep.run_experiment(exp, tmp_path / "local", progress=False)
    remote = sweep.run_experiment(exp, tmp_path / "ray", executor="ray", progress=False)
    assert local == remote == {"cells": 2, "runs": 4, "skipped": 0, "done": 4, "failed": 0}
    a = {r["run_id"]: r for r in store.Store(tmp_path / "local").records()}
    b = {r["run_id"]: r for r in store.Store(tmp_path / "ray").records()}
    assert set(a) == set(b) == run_ids(exp)
    for rid in a:
        assert b[rid]["status"] == "ok" and len(b[rid]["series"]["loss"]) == 3
        assert numbers(a[rid]) == numbers(b[rid]), f"run {rid} differs between local and ray"
    assert ray.is_initialized()  # a connection made by someone else is left open


# ---------------------------------------------------------------------------------------------
# Failures.


def test_a_worker_that_dies_is_retried_and_every_run_is_done_once(ray_cluster, tmp_path):
    exp = write_experiment(tmp_path)
    marker, log = tmp_path / "crashed", tmp_path / "attempts.log"

    def crash_once_in_cell_c(config, seeds):
        if seeds[0][0] == 4 and not marker.exists():
            marker.touch()
            return True
        return False

    compute = logged(log, crash=crash_once_in_cell_c)
    counts = sweep.run_experiment(
        exp, tmp_path / "res", executor="ray", compute=compute, progress=False
    )
    assert marker.exists(), "the worker never crashed"
    assert attempts(log) == {"0": 1, "2": 1, "4": 2, "6": 1}  # cell c: a crash, then a retry
    assert counts == {"cells": 4, "runs": 8, "skipped": 0, "done": 8, "failed": 0}
    records = store.Store(tmp_path / "res").records()
    assert sorted(r["run_id"] for r in records) == sorted(run_ids(exp))  # each run exactly once
    assert all(r["status"] == "ok" for r in records)


def test_a_cell_that_raises_is_failed_with_its_traceback_not_retried(ray_cluster, tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a")  # readable, but too short to train on: the cell raises when it runs
    body = f'add(recipe="fp32")\nadd("text", task="text", text_path={str(tiny)!r})'
    exp = write_experiment(tmp_path, body)
    log = tmp_path / "attempts.log"
    compute = logged(log, key=lambda config, seeds: config["task"], cell=sweep.compute_cell)
    counts = sweep.run_experiment(
        exp, tmp_path / "res", executor="ray", compute=compute, progress=False
    )
    assert counts == {"cells": 2, "runs": 4, "skipped": 0, "done": 2, "failed": 2}
    assert attempts(log) == {"teacher": 1, "text": 1}  # an exception is not retried
    by_cell = collections.defaultdict(list)
    for r in store.Store(tmp_path / "res").records():
        by_cell[r["cell"]].append(r)
    assert [r["status"] for r in by_cell["recipe=fp32"]] == ["ok", "ok"]
    failed = by_cell["text"]
    assert [r["status"] for r in failed] == ["failed", "failed"]
    assert all(r["error"].startswith("Traceback") for r in failed)
    assert all("ValueError" in r["error"] and "at least 2 characters" in r["error"] for r in failed)


def test_a_cell_whose_worker_always_dies_fails_after_max_retries(ray_cluster, tmp_path):
    exp = write_experiment(tmp_path, SEEDED)
    log, out = tmp_path / "attempts.log", tmp_path / "res"
    compute = logged(log, crash=lambda config, seeds: seeds[0][0] == 4)
    counts = sweep.run_experiment(
        exp, out, executor="ray", compute=compute, max_retries=1, progress=False
    )
    assert counts == {"cells": 4, "runs": 8, "skipped": 0, "done": 6, "failed": 2}
    assert attempts(log) == {"0": 1, "2": 1, "4": 2, "6": 1}  # one try, one retry, then it stops
    failed = [r for r in store.Store(out).records() if r["status"] == "failed"]
    assert {r["cell"] for r in failed} == {"c"} and len(failed) == 2
    message = "the worker computing this cell died on each of its 2 tries (max_retries=1)"
    assert all(r["error"].startswith(message) for r in failed)
    assert all("WorkerCrashedError" in r["error"] for r in failed)


class LossyRay:
    """Stands in for `ray` in `_cancel`: tasks end when cancelled, but the first cancel of each
    task in `lose` is lost, as when it reaches the task while Ray hands it to a worker."""

    def __init__(self, lose=(), stuck=()):
        self.lose, self.stuck = set(lose), set(stuck)
        self.ended, self.cancels = set(), collections.Counter()

    def cancel(self, ref, force):
        assert force
        self.cancels[ref] += 1
        if ref in self.lose:
            self.lose.discard(ref)
        elif ref not in self.stuck:
            self.ended.add(ref)

    def wait(self, refs, num_returns, timeout):
        assert num_returns == len(refs)
        return [r for r in refs if r in self.ended], [r for r in refs if r not in self.ended]


def test_a_lost_cancel_is_sent_again_until_the_task_has_ended():
    fake = LossyRay(lose={"b"})
    ray_executor.cancel(fake, ["a", "b", "c"])
    assert fake.ended == {"a", "b", "c"}
    assert fake.cancels == {"a": 1, "b": 2, "c": 1}  # only the lost one is cancelled again


def test_a_task_that_never_ends_is_reported_not_waited_for_forever():
    fake = LossyRay(stuck={"b"})
    with pytest.warns(RuntimeWarning, match=r"1 cancelled Ray task\(s\) had not ended after 0.2 s"):
        ray_executor.cancel(fake, ["a", "b"], timeout_s=0.2)
    assert fake.ended == {"a"} and fake.cancels["b"] >= 1


def test_options_are_checked_and_missing_ray_is_explained(monkeypatch):
    with pytest.raises(ValueError, match="max_retries=-1; must be an int >= 0"):
        ray_executor.run([], None, None, max_retries=-1)
    with pytest.raises(ValueError, match="num_cpus=-1, num_gpus=0; must be >= 0"):
        ray_executor.run([], None, None, num_cpus=-1)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ray_executor.RayNotInstalled, match=r"pip install 'fp4lab\[ray\]'"):
        ray_executor.import_ray()


def test_cli_without_ray_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    exp = write_experiment(tmp_path, 'add(recipe="fp32")')
    monkeypatch.setitem(sys.modules, "ray", None)
    out = tmp_path / "res"
    assert cli.main(["run", exp.path, "--out", str(out), "--executor", "ray"]) == 2
    assert "pip install 'fp4lab[ray]'" in capsys.readouterr().err
    assert not out.exists()  # reported before anything ran


# ---------------------------------------------------------------------------------------------
# Interrupt and resume.


def sleep_unless_first(config, seeds):
    """compute() that sleeps a minute before every cell but the one at seed 0."""
    if seeds[0][0] != 0:
        time.sleep(60)
    return fakes.fake_compute(config, seeds)


def test_interrupted_sweep_cancels_its_tasks_and_resumes(ray_cluster, tmp_path, monkeypatch):
    exp = write_experiment(tmp_path)
    out = tmp_path / "res"
    write = store.Store.write

    def write_then_interrupt(self, record):  # Ctrl-C right after the first cell is on disk
        path = write(self, record)
        if len(list(self.runs_dir.glob("*.json"))) == 2:
            raise KeyboardInterrupt
        return path

    # as if this process had joined a cluster itself: it must disconnect on the way out
    calls = []
    monkeypatch.setattr(store.Store, "write", write_then_interrupt)
    answers = iter([False])  # the executor asks first; Ray's internals, asking later, get True
    monkeypatch.setattr(ray, "is_initialized", lambda: next(answers, True))
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(ray_executor, "check_address", lambda address: None)  # a cluster there
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    with pytest.raises(KeyboardInterrupt):
        sweep.run_experiment(
            exp,
            out,
            executor="ray",
            address="head:6379",
            compute=sleep_unless_first,
            progress=False,
        )
    monkeypatch.undo()
    assert calls == [("init", {"address": "head:6379"}), "shutdown"]
    before = run_files(out)
    assert len(before) == 2
    # the three sleeping or queued cells were cancelled: both CPUs are free long before a minute
    deadline = time.perf_counter() + 20
    while ray.available_resources().get("CPU", 0) < 2 and time.perf_counter() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == 2
    counts = sweep.run_experiment(
        exp, out, executor="ray", compute=fakes.fake_compute, progress=False
    )
    assert counts == {"cells": 4, "runs": 8, "skipped": 2, "done": 6, "failed": 0}
    after = run_files(out)
    assert set(after) == run_ids(exp)  # every run exactly once, no strays
    assert all(after[rid] == data for rid, data in before.items())  # finished runs untouched
    assert not list((out / "runs").glob(".*"))  # no temporary files


# ---------------------------------------------------------------------------------------------
# The index and compaction.


def test_the_driver_writes_the_index_and_a_compacted_folder_resumes_under_ray(
    ray_cluster, tmp_path
):
    """The driver writes each record's index row as it writes the record (the index holds every
    run before any reader refreshes it, and equals the one rebuilt from the files); a rerun
    under Ray reads it and computes nothing; after compaction a new cell is all it computes."""
    exp = write_experiment(tmp_path)
    out, log = tmp_path / "res", tmp_path / "attempts.log"
    counts = sweep.run_experiment(exp, out, executor="ray", compute=logged(log), progress=False)
    assert counts["done"] == 8
    written = index.Index(out, store.config_id, store.code_version, store.NUMERICS_VERSION)
    assert {row[0] for row in written.rows()} == run_ids(exp)  # no refresh: the driver's rows
    written.close()
    live = store.Store(out).index().dump()
    for f in out.glob(f"{index.INDEX_FILE}*"):
        f.unlink()
    assert store.Store(out).index().dump() == live
    log.unlink()
    counts = sweep.run_experiment(exp, out, executor="ray", compute=logged(log), progress=False)
    assert (counts["done"], counts["skipped"]) == (0, 8) and not log.exists()
    before = store.load(out).runs
    assert compact.compact(out) == {"runs": 8, "part": 1}
    more = write_experiment(
        tmp_path, SEEDED + 'add("e", recipe="fp32", lr=5e-3, seeds=[(8, 8, 8)])'
    )
    counts = sweep.run_experiment(more, out, executor="ray", compute=logged(log), progress=False)
    assert (counts["done"], counts["skipped"]) == (1, 8) and attempts(log) == {"8": 1}
    after = store.load(out)
    assert set(after.runs["run_id"]) == run_ids(more) == set(after.metrics["run_id"])
    same = after.runs[after.runs["run_id"].isin(before["run_id"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(same.drop(columns="wall_s"), before.drop(columns="wall_s"))
