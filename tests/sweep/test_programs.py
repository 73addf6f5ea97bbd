"""Stored programs (fp4lab.sweep.programs): what their key covers, and what a cell computes
from one. The bit-for-bit check across processes is in test_compile_cache.py."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fp4lab.core import cpu_kernels, recipes
from fp4lab.sweep import compute, programs, records, store
from fp4lab.train import Config, trainer

CFG = Config(
    task="teacher", din=16, dout=16, teacher_hidden=(16,), hidden=(32,), batch_size=16,
    steps=4, recipe="nvfp4", telemetry_every=2, eval_batches=1,
)  # fmt: skip
SEEDS = [(0, 1, 2), (3, 4, 5)]


def _keys(width):
    return jax.tree.map(
        lambda *k: jnp.stack(k), *[trainer.make_keys(i, i, i) for i in range(width)]
    )


def _leaves(runs):
    for r in runs:
        yield from (v for k, v in r["summary"].items() if k != "compile_s")
        yield from r["series"].values()
        yield from r["telemetry"]["metrics"].values()


def _equal(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


def test_the_key_follows_what_the_trace_reads(monkeypatch):
    base = programs.program_key(CFG, _keys(2))
    assert programs.program_key(CFG, _keys(2)) == base  # the same inputs: the same key
    assert programs.program_key(dataclasses.replace(CFG, steps=5), _keys(2)) != base
    assert programs.program_key(dataclasses.replace(CFG, seed_batch=3), _keys(2)) != base
    assert programs.program_key(CFG, _keys(3)) != base  # another batch width
    with monkeypatch.context() as m:
        m.setattr(programs, "_source_digest", lambda: "edited")  # an edited fp4lab
        assert programs.program_key(CFG, _keys(2)) != base
    with monkeypatch.context() as m:
        m.setattr(store, "package_versions", lambda: {"jax": "0.0"})
        assert programs.program_key(CFG, _keys(2)) != base
    with monkeypatch.context() as m:
        here = cpu_kernels.available()
        m.setattr(cpu_kernels, "available", lambda: not here)
        assert programs.program_key(CFG, _keys(2)) != base
    with jax.default_matmul_precision("highest"):  # a flag set for a while is traced too
        assert programs.program_key(CFG, _keys(2)) != base
    assert programs.program_key(CFG, _keys(2)) == base


def test_a_registered_recipe_is_keyed_by_its_value():
    try:
        recipes.register("test-program-key", recipes.get("nvfp4").replace(name="a"))
        one = programs.program_key(dataclasses.replace(CFG, recipe="test-program-key"), _keys(2))
        recipes.unregister("test-program-key")
        recipes.register("test-program-key", recipes.get("nvfp4-rl").replace(name="b"))
        two = programs.program_key(dataclasses.replace(CFG, recipe="test-program-key"), _keys(2))
        assert one != two  # the same name, another recipe
    finally:
        recipes.unregister("test-program-key")


def test_a_text_task_keys_its_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcabcabd " * 20)
    cfg = Config(task="text", text_path=str(path), d_model=16, n_layers=1, n_heads=2, d_ff=32,
                 seq_len=8, batch_size=2, steps=2)  # fmt: skip
    one = programs.program_key(cfg, _keys(2))
    path.write_text("abcabcabe " * 20)
    assert programs.program_key(cfg, _keys(2)) != one


def test_a_cell_from_its_stored_program_is_bit_identical_and_a_damaged_one_traced_again(
    tmp_path, monkeypatch
):
    direct = compute.compute_cell(CFG.to_dict(), SEEDS)  # no programs stored
    monkeypatch.setenv(programs.ENV, str(tmp_path))
    compute.clear_cache(CFG)
    stored = compute.compute_cell(CFG.to_dict(), SEEDS)  # traced, exported, stored
    (path,) = tmp_path.iterdir()
    head = json.loads(path.read_bytes().partition(b"\n")[0])
    # telemetry, the quantizers (untelemetered GEMMs) and their keys; jax.random's hash too,
    # which the suite lowers to the kernel (tests/conftest.py)
    called = ["fp4lab_operand_stats", "fp4lab_quantize", "fp4lab_threefry"]
    if os.environ.get("FP4LAB_TEST_JAX_THREEFRY") != "jax":
        called.append("fp4lab_threefry2x32")
    assert head["kernels"] == (called if cpu_kernels.available() else [])
    made = path.stat().st_mtime_ns, path.stat().st_ino
    compute.clear_cache(CFG)
    loaded = compute.compute_cell(CFG.to_dict(), SEEDS)  # from the stored program
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == made  # read, not written again
    _equal(direct, stored)
    _equal(direct, loaded)
    # a damaged program (here, the one just loaded) is traced again, and stored anew
    path.write_bytes(b'{"kernels": []}\nnot a program')
    compute.clear_cache(CFG)
    with pytest.warns(RuntimeWarning, match="cannot read the stored program"):
        again = compute.compute_cell(CFG.to_dict(), SEEDS)
    _equal(direct, again)
    assert programs.exported(None, CFG, _keys(2), tmp_path)  # repaired: loads (width 2)
    compute.clear_cache(CFG)


def _steps(events: list[dict]) -> list[tuple]:
    return sorted((e["seed"], e["step"], e["loss"]) for e in events if e["event"] == "step")


def test_a_program_with_step_reports_is_stored_and_reports_when_loaded(tmp_path, monkeypatch):
    # the reports go through the CPU kernel's queue, not a Python callback: the program can be
    # exported, and a later process loads it and still gets every report
    monkeypatch.setenv(programs.ENV, str(tmp_path))
    compute.clear_cache(CFG)
    shown = []
    first = compute.compute_cell(CFG.to_dict(), SEEDS[:1], progress=shown.append, every=2)
    stored = list(tmp_path.iterdir())
    if not cpu_kernels.available():  # a Python callback then, which cannot be exported
        assert stored == []
        return
    (path,) = stored
    made = path.stat().st_mtime_ns
    compute.clear_cache(CFG)
    again_shown = []
    again = compute.compute_cell(CFG.to_dict(), SEEDS[:1], progress=again_shown.append, every=2)
    assert path.stat().st_mtime_ns == made  # loaded, not traced and stored again
    _equal(first, again)
    steps = [(SEEDS[0], t) for t in (2, 4)]
    assert [(s, t) for s, t, _ in _steps(shown)] == steps
    assert _steps(again_shown) == _steps(shown)
    _equal(first, compute.compute_cell(CFG.to_dict(), SEEDS[:1]))  # as without reports
    compute.clear_cache(CFG)


def test_a_program_that_cannot_be_stored_still_runs(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.tempfile, "mkstemp", full)
    with pytest.warns(RuntimeWarning, match="cannot store the traced program"):
        program = programs.exported(jax.vmap(trainer.make_train(CFG)), CFG, _keys(2), tmp_path)
    assert program.in_avals and not any(tmp_path.iterdir())
