"""A researcher's own model, loss and data through the whole harness: an experiment file in a
temporary folder (nothing from fp4lab.models or the built-in tasks), `fp4lab run` killed and
resumed, show / ls / report / plot / verdict, bit-identical reruns, seeds independent of their
vmap batch, run ids that cover the file and its data; the same from Python (`fp4lab.own`)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fakes import kill_after_records  # tests/fakes.py

import fp4lab as fl
from fp4lab import cli
from fp4lab.sweep import compute, store
from fp4lab.train.config import Config

OWN = """
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import fp4lab as fl

SEEDS = 3
FLOOR = 0.0
DATA_FILES = ("w.npy",)
W = jnp.asarray(np.load(__file__.rsplit("/", 1)[0] + "/w.npy"))


class Net(nnx.Module):
    def __init__(self, width, rngs):
        self.up = nnx.Linear(16, width, rngs=rngs)
        self.down = nnx.Linear(width, 16, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


def model(config, rngs):
    return Net(config.d_model, rngs)


def loss(model, batch):
    x, y = batch
    return jnp.mean((model(x) - y) ** 2)


def batch(config, key, step):
    x = jax.random.normal(key, (config.batch_size, 16))
    return x, x @ W


def get_config():
    return fl.Config(d_model=16, batch_size=8, steps=4, lr=1e-2, warmup=0, eval_batches=2,
                     seed_batch=2)


def sweep(add):
    add(recipe="bf16")
    add(recipe="nvfp4")
"""


def write_own(folder, text: str = OWN):
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "w.npy", np.eye(16, dtype=np.float32)[::-1].copy())
    path = folder / "own.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_run_ids_cover_the_file_and_its_data_not_its_path(tmp_path):
    a = fl.sweep.load_experiment(write_own(tmp_path / "a"))
    b = fl.sweep.load_experiment(write_own(tmp_path / "b"))  # the same file elsewhere
    assert [c.run_ids() for c in a.cells] == [c.run_ids() for c in b.cells]
    assert a.cells[0].config.task == "own" and set(a.cells[0].data) == {"task_file", "data:w.npy"}
    np.save(tmp_path / "b" / "w.npy", np.eye(16, dtype=np.float32))
    data = fl.sweep.load_experiment(tmp_path / "b" / "own.py")
    code = fl.sweep.load_experiment(write_own(tmp_path / "c", OWN.replace("x @ W", "x @ W * 2")))
    for other in (data, code):
        assert not set(a.cells[0].run_ids()) & set(other.cells[0].run_ids())


def test_built_in_configs_keep_their_run_ids():
    # the ids these configs had before Config gained task_file, task_args and pad_seeds (whose
    # value True is how they were computed; the default False makes other runs, other ids)
    assert store.run_id(Config(pad_seeds=True).to_dict(), (0, 0, 0)) == "e54e70b1e884e4c2"
    cfg = Config(task="teacher", recipe="nvfp4", pad_seeds=True).to_dict()
    assert store.run_id(cfg, (1, 2, 3)) == "8ec86da6e4655e75"
    assert store.run_id(Config().to_dict(), (0, 0, 0)) != "e54e70b1e884e4c2"


def test_a_file_with_half_the_contract_is_told_what_it_lacks(tmp_path):
    path = write_own(tmp_path, OWN.replace("def loss(", "def _loss("))
    with pytest.raises(fl.sweep.ExperimentError, match="but not loss"):
        fl.sweep.load_experiment(path)


def test_a_seed_does_not_depend_on_its_vmap_batch_and_reruns_are_bit_identical(tmp_path):
    exp = fl.sweep.load_experiment(write_own(tmp_path), overrides={"telemetry_every": 2})
    cfg = exp.cells[1].config  # nvfp4, with telemetry
    alone = compute.compute_cell(cfg.replace(seed_batch=1).to_dict(), [(1, 1, 1)])[0]
    batch = compute.compute_cell(cfg.replace(seed_batch=3).to_dict(), [(0, 0, 0), (1, 1, 1)])
    again = compute.compute_cell(cfg.replace(seed_batch=3).to_dict(), [(1, 1, 1)])[0]
    for other in (batch[1], again):
        for k in ("loss", "grad_norm"):
            np.testing.assert_array_equal(alone["series"][k], other["series"][k])
        tel, tel2 = alone["telemetry"]["metrics"], other["telemetry"]["metrics"]
        assert tel and sorted(tel) == sorted(tel2)
        for k in tel:
            np.testing.assert_array_equal(tel[k], tel2[k])
        assert alone["summary"]["eval_hp"] == other["summary"]["eval_hp"]
    assert not np.array_equal(batch[0]["series"]["loss"], batch[1]["series"]["loss"])


@pytest.mark.slow  # a subprocess
def test_own_model_killed_resumed_and_read_back_as_built_in_tasks_are(tmp_path, capsys):
    # a cell's 3 seeds in one call: one program per cell to compile (the property is the
    # bookkeeping of a killed sweep, not the call widths, which the test above checks)
    text = OWN.replace("steps=4", "steps=40").replace("seed_batch=2", "seed_batch=3")
    path = write_own(tmp_path / "exp", text)
    out = tmp_path / "res"
    argv = ["run", str(path), "--out", str(out), "--quiet", "--no-figures", "--telemetry", "20"]
    env = os.environ | {"JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fp4lab.cli", *argv], env=env, stderr=subprocess.PIPE
    )
    runs = out / "runs"
    before = kill_after_records(proc, runs)
    assert 2 <= len(before) < 6, "the sweep must be killed mid-run"
    assert cli.main(argv) == 0
    after = {f.name: f.read_bytes() for f in runs.glob("*.json")}
    exp = fl.sweep.load_experiment(path, overrides={"telemetry_every": 20, "shadow": True})
    assert set(after) == {f"{r}.json" for c in exp.cells for r in c.run_ids()}
    assert all(after[name] == data for name, data in before.items())

    res = fl.load(out)
    assert len(res.runs) == 6 and (res.runs["status"] == "ok").all()
    assert (res.runs["task"] == "own").all() and (res.runs["loss_floor"] == 0).all()
    names = set(res.metrics["metric"])
    assert any(n.startswith("quant/up/") for n in names) and any(
        n.startswith("acc/") for n in names
    )
    capsys.readouterr()
    for command in (["ls"], ["show"], ["report"], ["plot"]):
        assert cli.main([*command, str(out)]) == 0, command
    shown = capsys.readouterr().out
    assert "recipe=nvfp4" in shown and "recipe=bf16" in shown
    assert (out / "report.html").exists()
    figures = {p.name for p in (out / "figures").glob("*.png")}
    assert {"loss_curves.png", "loss_gap.png", "drift_vs_depth.png"} <= figures, figures
    assert any(f.startswith("heatmap_rel_err") for f in figures)
    table = fl.analysis.verdict(res.runs, "loss_gap")
    assert {"recipe=bf16", "recipe=nvfp4"} <= set(table["term"].astype(str).str.split(" - ").sum())

    again = tmp_path / "again"  # a rerun into a fresh folder: the same bits
    assert cli.main([*argv[:3], str(again), *argv[4:]]) == 0
    rerun = fl.load(again)
    for column in ("final_loss", "eval_hp", "loss_gap"):
        a = res.runs.set_index("run_id")[column]
        np.testing.assert_array_equal(a, rerun.runs.set_index("run_id")[column].loc[a.index])
    key = ["run_id", "metric", "step"]
    m1, m2 = (r.metrics.sort_values(key).reset_index(drop=True) for r in (res, rerun))
    np.testing.assert_array_equal(m1["value"].to_numpy(), m2["value"].to_numpy())


def test_the_same_from_python_without_a_seed_loop(tmp_path):
    rng = np.random.default_rng(0)
    x_NxI = rng.normal(size=(64, 16)).astype(np.float32)
    y_NxO = (x_NxI @ rng.normal(size=(16, 16))).astype(np.float32)
    sample = fl.data.arrays.rows((x_NxI, y_NxO), 8)
    nnx, jnp = pytest.importorskip("flax.nnx"), pytest.importorskip("jax.numpy")

    def model(config, rngs):
        return nnx.Linear(16, 16, rngs=rngs)

    def loss(model, batch):
        return jnp.mean((model(batch[0]) - batch[1]) ** 2)

    config = Config(steps=3, warmup=0, eval_batches=1, seed_batch=3)  # a call for the 3 seeds
    records = fl.own.train(model, loss, sample, config.replace(recipe="nvfp4"), seeds=3)
    assert [r["seeds"]["init"] for r in records] == [0, 1, 2]
    assert all(r["status"] == "ok" and np.isfinite(r["summary"]["final_loss"]) for r in records)
    assert len(records[0]["series"]["loss"]) == 3 and records[0]["config"]["task"] == "own"

    cells = {"fp32": {"recipe": "fp32"}, "nvfp4": {"recipe": "nvfp4"}}
    res = fl.own.sweep(model, loss, sample, cells, config, seeds=3, out=tmp_path / "r")
    assert sorted(set(res.runs["cell"])) == ["fp32", "nvfp4"] and len(res.runs) == 6
    nvfp4 = res.runs[res.runs["cell"] == "nvfp4"].sort_values("seed_init")
    assert nvfp4["final_loss"].tolist() == [r["summary"]["final_loss"] for r in records]
    again = fl.own.sweep(model, loss, sample, cells, config, seeds=3, out=tmp_path / "r")
    assert set(again.runs["run_id"]) == set(res.runs["run_id"])  # a rerun skips them all
    other = fl.data.arrays.rows((x_NxI, 2 * y_NxO), 8)  # other data: other runs
    moved = fl.own.train(model, loss, other, config.replace(recipe="nvfp4"), seeds=1)
    assert moved[0]["run_id"] != records[0]["run_id"]


def test_token_files_and_iterators_become_batches(tmp_path):
    tokens = np.arange(100, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    np.save(tmp_path / "train.npy", tokens)
    for name in ("train.bin", "train.npy"):
        np.testing.assert_array_equal(fl.data.arrays.load_tokens(tmp_path / name), tokens)
    jax = pytest.importorskip("jax")
    window = fl.data.arrays.windows(tokens, 4, 9)(jax.random.key(0), 0)
    assert window.shape == (4, 9) and (np.diff(np.asarray(window), axis=1) == 1).all()
    items = ({"x": np.full(3, i)} for i in range(10))
    stacked = fl.data.arrays.stack(items, 5)
    assert stacked["x"].shape == (5, 3)
    rows = fl.data.arrays.rows(stacked, 2)(jax.random.key(1), 0)["x"]
    assert rows.shape == (2, 3) and set(np.asarray(rows)[:, 0]) <= set(range(5))


def test_task_args_are_the_files_own_parameters():
    cfg = Config(task="own", task_file="x.py", task_args={"width": 8, "act": "relu"})
    assert dict(cfg.task_args) == {"width": 8, "act": "relu"}
    assert Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"task_args\['w'\]"):
        Config(task="own", task_file="x.py", task_args={"w": [1, 2]})
    with pytest.raises(ValueError, match="takes no task_file"):
        Config(task="markov", task_args={"width": 8})
    with pytest.raises(ValueError, match="task_file is empty"):
        Config(task="own")
