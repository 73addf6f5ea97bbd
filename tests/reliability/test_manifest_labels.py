"""A hand-edited experiment.json never pools a run under a label of another config: two labels
swapped, or run ids added to a cell, give a warning and leave those runs out of the cell, and
`ls` and `show` count the same runs."""

import json
import re

import numpy as np
import pytest

from fp4lab import cli, sweep
from fp4lab.sweep import store

EXPERIMENT = """
from fp4lab.train.config import Config

def get_config():
    return Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                  batch_size=32, steps=3, eval_batches=1, seed_batch=2)

def sweep(add):
    add(recipe="bf16", seeds=2)
    add(recipe="nvfp4", seeds=2)
"""


def fake_compute(config, seeds):
    """Plain data shaped like compute_cell's; the loss tells the recipes apart."""
    out = []
    for s in seeds:
        loss = {"bf16": 1.0, "nvfp4": 2.0}[config["recipe"]] + sum(s) / 100
        summary = {"final_loss": loss, "final_train_loss": loss, "eval_loss": loss}
        summary |= {"loss_floor": 0.0, "loss_gap": loss, "diverged": False}
        summary |= {"divergence_step": float("nan"), "divergence_kind": ""}
        summary |= {"target_loss": float("nan"), "tokens_to_target": float("nan")}
        summary |= {"tokens_per_step": 32, "eval_hp": loss, "loss_gap_hp": loss}
        series = {"loss": np.full(config["steps"], loss, np.float32)}
        out.append({"summary": summary, "series": series, "wall_s": 0.0})
    return out


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(EXPERIMENT)
    out = tmp_path / "res"
    sweep.run_experiment(sweep.load_experiment(path), out, progress=False, compute=fake_compute)
    return out


def edit_manifest(out, change):
    f = out / "experiment.json"
    manifest = json.loads(f.read_text())
    change(manifest["cells"])
    f.write_text(json.dumps(manifest))


def ls_counts(out, capsys) -> dict[str, int]:
    assert cli.main(["ls", str(out)]) == 0
    text = capsys.readouterr().out
    return {m[1]: int(m[2]) for m in re.finditer(r"^  (\S+)\s+ok (\d+)", text, re.M)}


def test_swapped_labels_warn_and_pool_nothing_of_another_config(folder, capsys):
    def swap(cells):
        cells[0]["label"], cells[1]["label"] = cells[1]["label"], cells[0]["label"]

    edit_manifest(folder, swap)
    with pytest.warns(UserWarning) as caught:
        assert cli.main(["show", str(folder)]) == 0
    said = sorted(str(w.message).split(" of another")[0] for w in caught)
    assert said == [f"experiment.json: cell 'recipe={r}' lists 2 runs" for r in ("bf16", "nvfp4")]
    text = capsys.readouterr()
    rows = {line.split()[0]: line for line in text.out.splitlines() if "recipe=" in line}
    assert "2.01" in rows["recipe=nvfp4"] and "1.02" in rows["recipe=bf16"]
    with pytest.warns(UserWarning, match="lists 2 runs of another config") as caught:
        runs = store.load(folder).runs
    assert len(caught) == 2
    for cell, recipe in zip(runs["cell"], runs["recipe"], strict=True):
        assert cell == f"recipe={recipe}"  # never BF16's numbers under recipe=nvfp4


def test_run_ids_added_to_a_cell_count_the_same_in_ls_and_show(folder, capsys):
    def add_ids(cells):
        cells[0]["run_ids"] += cells[1]["run_ids"]

    edit_manifest(folder, add_ids)
    with pytest.warns(UserWarning, match="cell 'recipe=bf16' lists 2 runs of another config"):
        counts = ls_counts(folder, capsys)
    with pytest.warns(UserWarning):
        shown = store.load(folder).runs.groupby("cell").size().to_dict()
    assert counts == shown == {"recipe=bf16": 2, "recipe=nvfp4": 2}


def test_a_run_listed_twice_counts_once(folder, capsys):
    def twice(cells):
        cells[0]["run_ids"] += cells[0]["run_ids"][:1]

    edit_manifest(folder, twice)
    assert ls_counts(folder, capsys) == {"recipe=bf16": 2, "recipe=nvfp4": 2}


def test_a_label_renamed_keeps_its_runs_without_a_warning(folder, capsys, recwarn):
    def rename(cells):
        cells[0]["label"] = "bf16 baseline"

    edit_manifest(folder, rename)
    runs = store.load(folder).runs
    assert runs.groupby("cell").size().to_dict() == {"bf16 baseline": 2, "recipe=nvfp4": 2}
    assert not [w for w in recwarn if "not pooled" in str(w.message)]
