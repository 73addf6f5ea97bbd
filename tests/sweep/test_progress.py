"""Live progress: step reports from inside a compiled cell, plain lines off a terminal, the
per-step JSONL stream; none of it changes a bit of the results."""

import io
import json
import re
import textwrap
import time

import numpy as np
import pytest

from fp4lab import sweep
from fp4lab.sweep import runner, store
from fp4lab.sweep.progress import FINISHING
from fp4lab.train.config import Config

MLP = dict(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,), batch_size=32)


CFG = Config(**MLP, steps=6, eval_batches=1, seed_batch=2, recipe="nvfp4", telemetry_every=2)
# telemetry every 2 steps (a one-step inner scan per chunk) and a phase switch at step 3 (a
# one-step head and a one-step tail): one-step scans in every position, in one program
PHASED = CFG.replace(steps=7, phases=((3, "bf16"),))
SEEDS = [(0, 0, 0), (1, 2, 3), (4, 5, 6), (7, 7, 7)]


def _differs(a: dict, b: dict) -> list[str]:
    la, lb = _leaves(a), _leaves(b)
    assert la.keys() == lb.keys()
    return [k for k in la if not np.array_equal(la[k], lb[k], equal_nan=True)]


def test_progress_callback_leaves_every_result_unchanged():
    cfg, every = PHASED, 1
    # SR and telemetry on, 4 seeds in two calls of 2 (one program width, so two compiles, not
    # four: a call's seeds run one after the other at every width): the step report (the CPU
    # kernel's queue, or a Python callback) behind a lax.cond reads the step's outputs; every
    # number of every run (series, telemetry, summary with eval_hp) is bit-identical to the
    # program without it. (XLA inlines one-iteration loops only without side effects: the
    # trainer unrolls them itself.)
    seeds = SEEDS
    plain = sweep.compute_cell(cfg.to_dict(), seeds)
    events = []
    shown = sweep.compute_cell(cfg.to_dict(), seeds, progress=events.append, every=every)
    for a, b in zip(plain, shown, strict=True):
        assert _differs(a["series"], b["series"]) == []
        assert _differs(a["telemetry"], b["telemetry"]) == []
        sa = {k: v for k, v in a["summary"].items() if k != "compile_s"}
        sb = {k: v for k, v in b["summary"].items() if k != "compile_s"}
        assert sa.keys() == sb.keys()
        assert [k for k in sa if not (sa[k] == sb[k] or (sa[k] != sa[k] and sb[k] != sb[k]))] == []
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["compile", "compiled"]
    steps = {(e["seed"], e["step"]): e for e in events if e["event"] == "step"}
    assert len(steps) == kinds.count("step")  # no step reports twice
    assert kinds.count("compiled") == 1  # the second call reuses the first's program
    due = set(range(every, cfg.steps + 1, every)) | {cfg.steps}  # every k-th and the last
    assert set(steps) == {(s, t) for s in seeds for t in due}
    for s, out in zip(seeds, plain, strict=True):  # each report is that seed's own step
        for t in due:
            assert steps[s, t]["loss"] == float(out["series"]["loss"][t - 1])
            assert steps[s, t]["grad_norm"] == float(out["series"]["grad_norm"][t - 1])


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key in tree for k, v in _leaves(tree[key], f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}


def test_bad_progress_every_is_an_error_and_0_reports_the_compile_only():
    cfg = Config(**MLP, steps=2, eval_batches=1, seed_batch=1)
    with pytest.raises(ValueError, match=r"every=-1; must be an int >= 0"):
        sweep.compute_cell(cfg.to_dict(), [(0, 0, 0)], progress=print, every=-1)
    sweep.clear_cache(cfg)
    events = []
    sweep.compute_cell(cfg.to_dict(), [(0, 0, 0)], progress=events.append, every=0)
    assert [e["event"] for e in events] == ["compile", "compiled"]


EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=6, eval_batches=1, seed_batch=2)

def sweep(add):
    add("a", recipe="fp32", seeds=2)
"""


def test_plain_progress_lines_and_the_jsonl_stream(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    out = tmp_path / "res"
    log = io.StringIO()  # not a terminal: plain lines
    bar = runner.Progress
    try:  # every step line printed (no rate limit) so that the test sees them
        runner.Progress = lambda *a, **k: bar(*a, **(k | {"stream": log, "interval": 0}))
        sweep.run_experiment(sweep.load_experiment(path), out, progress_every=2, stream=True)
    finally:
        runner.Progress = bar
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert re.search(r"compiling cell a \(seeds 0-1\) \.\.\.$", lines[0])
    assert re.search(r"compiled cell a \(seeds 0-1\) in \d+s$", lines[1])
    steps = [
        line for line in lines if re.search(r"a \(seeds 0-1\): seed \d/2, step \d/6 loss", line)
    ]
    assert [re.search(r"seed (\d)/2, step (\d)/6", s).groups() for s in steps] == [
        (s, t) for s in "12" for t in "246"
    ]
    assert "cell ETA" in steps[0]
    assert re.search(r"done, loss [\d.]+ \| sweep 1/1 batches, 2/2 runs", lines[-1])
    rows = [json.loads(line) for line in (out / runner.STREAM_FILE).read_text().splitlines()]
    assert set(rows[0]) == set(runner.STREAM_FIELDS)
    results = store.load(out)
    assert {r["run_id"] for r in rows} == set(results.runs["run_id"])
    assert sorted({r["step"] for r in rows}) == [2, 4, 6]
    loss = results.metrics.query("metric == 'loss'").set_index(["run_id", "step"])["value"]
    for r in rows:  # the stream holds the stored numbers (step n is the n-th step, index n-1)
        assert r["loss"] == loss[r["run_id"], r["step"] - 1]
        assert r["cell"] == "a"


def test_progress_every_and_stream_are_checked(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    exp = sweep.load_experiment(path)
    with pytest.raises(sweep.ExperimentError, match="progress_every=-1; must be an int >= 0"):
        sweep.run_experiment(exp, tmp_path / "r", progress_every=-1)
    with pytest.raises(sweep.ExperimentError, match="stream=True needs step reports"):
        sweep.run_experiment(exp, tmp_path / "r", progress_every=0, stream=True)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("workers", [1, 2])
def test_compiles_are_shown_with_any_number_of_workers(tmp_path, workers):
    """Without step reports (the default) every compile is still a line, in worker processes
    too; and the program compiled is the one without step reports."""
    path = tmp_path / "exp.py"
    path.write_text(
        textwrap.dedent(
            EXPERIMENT.replace("seeds=2)", 'seeds=2)\n    add("b", recipe="bf16", seeds=2)')
        )
    )
    log = io.StringIO()
    bar = runner.Progress
    try:
        runner.Progress = lambda *a, **k: bar(*a, **(k | {"stream": log}))
        sweep.clear_cache()
        sweep.run_experiment(sweep.load_experiment(path), tmp_path / "r", workers=workers)
    finally:
        runner.Progress = bar
    text = log.getvalue()
    for cell in ("a", "b"):
        assert f"compiling cell {cell} (seeds 0-1) ..." in text, text
        assert re.search(rf"compiled cell {cell} \(seeds 0-1\) in \d+s", text), text
    assert ", step " not in text
    if workers == 2:  # and with reports asked for, steps too, from the worker processes
        log.truncate(0)
        try:
            runner.Progress = lambda *a, **k: bar(*a, **(k | {"stream": log, "interval": 0}))
            sweep.run_experiment(
                sweep.load_experiment(path), tmp_path / "s", workers=2, progress_every=2
            )
        finally:
            runner.Progress = bar
        assert re.search(r": seed \d/2, step \d+/\d+", log.getvalue()), log.getvalue()


@pytest.mark.slow
def test_one_scanned_lm_config_compiled_with_and_without_step_reports_in_one_process():
    """The second program of one config in a process (here with step reports after one
    without; the quickstart's kind of cell, small) used to reuse jax's inner traces of the
    first and fail when called ("Computation compiled for 11 inputs but called with 3"); both
    now run, with the same numbers."""
    lm = Config(task="markov", vocab=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=8)
    cfg = lm.replace(scan_layers=True, batch_size=4, steps=4, recipe="bf16", eval_batches=2)
    cfg = cfg.replace(rules=((r"lm_head", "bf16"),), telemetry_every=2, target_gap=0.1)
    plain = sweep.compute_cell(cfg.to_dict(), [(0, 0, 0)])
    shown = sweep.compute_cell(cfg.to_dict(), [(0, 0, 0)], progress=lambda e: None, every=2)
    assert _differs(plain[0]["series"], shown[0]["series"]) == []


def _stepping_compute(config, seeds, progress=None):
    """`fakes.fake_compute` that reports as compute_cell does on the CPU: a compile, then each
    seed's steps in turn (the seeds of a call run one after the other)."""
    from tests.fakes import fake_compute

    if progress is not None:
        progress({"event": "compile"})
        progress({"event": "compiled", "seconds": 2.0, "width": len(seeds)})
        for seed in seeds:
            for step in range(2, config["steps"] + 1, 2):
                progress({"event": "step", "seed": tuple(seed), "step": step, "loss": 1.0})
                progress({"event": "step", "seed": tuple(seed), "step": step, "loss": 1.0})
    return fake_compute(config, seeds)


def test_a_three_seed_call_reports_every_seed_and_its_finishing_phase(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(EXPERIMENT).replace("seeds=2", "seeds=3, seed_batch=3"))
    log = io.StringIO()
    bar = runner.Progress
    try:
        runner.Progress = lambda *a, **k: bar(*a, **(k | {"stream": log, "interval": 0}))
        sweep.run_experiment(sweep.load_experiment(path), tmp_path / "r", compute=_stepping_compute)
    finally:
        runner.Progress = bar
    lines = log.getvalue().splitlines()
    found = [re.search(r"a \(seeds 0-2\): seed (\d)/3, step (\d)/6 loss", x) for x in lines]
    shown = [(int(m.group(1)), int(m.group(2))) for m in found if m]
    assert shown == [(s, t) for s in (1, 2, 3) for t in (2, 4, 6)]  # repeats are dropped
    etas = [re.search(r"cell ETA (\S+), sweep ETA (\S+)\)$", x) for x in lines if "seed " in x]
    assert all(etas) and etas[-1].groups() == ("0s", "0s")
    done = [i for i, x in enumerate(lines) if x.endswith(f"a (seeds 0-2): {FINISHING} ...")]
    assert len(done) == 1 and "seed 3/3, step 6/6" in lines[done[0] - 1]
    assert re.search(
        r"a \(seeds 0-2\): done, loss [\d.]+ \| sweep 1/1 batches, 3/3 runs", lines[-1]
    )


def test_the_eta_counts_every_seed_and_the_compiles_to_come(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    bar = runner.Progress(2, 6, io.StringIO(), steps=[10, 10], seeds=[3, 3], live=False)
    bar.event(0, {"event": "compiled", "seconds": 30.0})
    for t, now in ((1, 31.0), (10, 40.0)):  # seed 1: one second a step
        clock[0] = now
        bar.event(0, {"event": "step", "seed": (0, 0, 0), "step": t})
    # 20 seed-steps left in batch 0 and 30 in batch 1 at 1 s, and batch 1's compile (30 s)
    assert bar.eta() == 20 + 30 + 30
