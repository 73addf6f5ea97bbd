"""An experiment file that defines its own recipe as a value: it runs through the sweep, its
record shows the specs as plain JSON, and the record loads, shows and reproduces."""

import json
import textwrap

import pytest

from fp4lab import cli, sweep
from fp4lab.core import recipes
from fp4lab.sweep import store
from fp4lab.train.config import Config

EXPERIMENT = """
import fp4lab as fl

SEEDS = 2

X = fl.nvfp4()                  # 1x16 blocks, E4M3 block scales, FP32 tensor scale, RNE
W = fl.nvfp4(tile=(16, 16))     # 16x16 weight tiles
H32 = fl.Hadamard(32, signs="none")

# NVFP4 with stochastic rounding only on Dgrad's dy and a 32x32 Hadamard on Wgrad
DY_SR_H32 = fl.GemmRecipe(
    fprop_x=X, fprop_w=W,
    dgrad_dy=X.replace(rounding="stochastic"), dgrad_w=W,
    wgrad_x=X.replace(transform=H32), wgrad_dy=X.replace(transform=H32),
    name="nvfp4-dy-sr-h32",
)


def get_config():
    return fl.Config(task="teacher", din=32, dout=32, teacher_hidden=(32,), hidden=(32,),
                     batch_size=32, steps=2, eval_batches=1, seed_batch=2)


def sweep(add):
    add(recipe=DY_SR_H32)
    add(recipe="nvfp4", gemms={"dgrad_dy": X.replace(rounding="stochastic")})
"""


def test_an_experiment_defines_its_own_recipe(tmp_path, capsys):
    path = tmp_path / "own_recipe.py"
    path.write_text(EXPERIMENT)
    exp = sweep.load_experiment(path)
    assert [c.label for c in exp.cells] == [
        "recipe=nvfp4-dy-sr-h32",
        "recipe=nvfp4,gemms={'dgrad_dy': e2m1/1x16/e4m3/sr}",
    ]
    out = tmp_path / "res"
    counts = sweep.run_experiment(exp, out, progress=False)
    assert counts["failed"] == 0
    records = {r["cell"]: r for r in store.Store(out).records()}
    record = records["recipe=nvfp4-dy-sr-h32"]
    assert record["status"] == "ok"
    spec = record["config"]["recipe"]  # the numerics, as plain JSON
    assert [spec[k]["rounding"] for k in ("fprop_x", "dgrad_dy", "wgrad_x", "wgrad_dy")] == [
        "rne",
        "stochastic",
        "rne",
        "rne",
    ]
    assert (
        spec["wgrad_x"]["transform"]
        == spec["wgrad_dy"]["transform"]
        == {
            "size": 32,
            "signs": "none",
        }
    )
    assert spec["fprop_x"]["transform"] is None and spec["dgrad_w"]["transform"] is None
    assert spec["fprop_w"]["tile"] == [16, 16] and spec["backward"] == "quantized"
    assert record["overrides"]["recipe"] == spec
    on_disk = json.loads(store.Store(out).file(record["run_id"]).read_text())
    assert on_disk["config"]["recipe"]["dgrad_dy"]["rounding"] == "stochastic"
    assert Config.from_dict(record["config"]) == exp.cells[0].config
    other = records["recipe=nvfp4,gemms={'dgrad_dy': e2m1/1x16/e4m3/sr}"]["config"]
    assert other["recipe"] == "nvfp4" and other["gemms"][0][0] == "dgrad_dy"
    assert other["gemms"][0][1]["rounding"] == "stochastic"
    # the record reads back: load, show, reproduce (the recipe's name is registered nowhere)
    assert "nvfp4-dy-sr-h32" not in recipes.names()
    runs = store.load(out).runs
    assert len(runs) == 4 and set(runs["status"]) == {"ok"}
    assert json.loads(runs["recipe"][0])["dgrad_dy"]["rounding"] == "stochastic"
    assert cli.main(["show", str(out)]) == 0
    assert "nvfp4-dy-sr-h32" in capsys.readouterr().out
    sweep.reproduce(out, record["run_id"])  # raises on any difference
    # loading the file again gives the same runs: all finished
    again = sweep.load_experiment(path)
    assert [c.run_ids() for c in again.cells] == [c.run_ids() for c in exp.cells]


@pytest.mark.parametrize(
    "add, message",
    [
        (
            'add(recipe={"dgrad_dy": {"roundng": "stochastic"}})',
            "Config.recipe: GemmRecipe.dgrad_dy: QuantSpec has no field ['roundng']",
        ),
        (
            'add(gemms={"dgrad_dy": {"tile": "16"}})',
            "Config.gemms['dgrad_dy']: QuantSpec.tile='16'",
        ),
        ('add(recipe={"fprop_q": None})', "Config.recipe: GemmRecipe has no field ['fprop_q']"),
        (
            'add(recipe="nvfp4", gemms={"wgrad_dy": fl.nvfp4(transform=fl.Hadamard(32))})',
            "override wgrad_dy: GemmRecipe wgrad: both operands must use the same Hadamard",
        ),
    ],
)
def test_bad_recipe_values_in_a_file_name_the_line_and_field(tmp_path, add, message):
    path = tmp_path / "bad.py"
    body = (
        EXPERIMENT.split("def sweep(add):")[0] + "def sweep(add):\n" + textwrap.indent(add, "    ")
    )
    path.write_text(body + "\n")
    with pytest.raises(sweep.ExperimentError) as e:
        sweep.load_experiment(path)
    text = str(e.value)
    assert message in text and f"bad.py:{body.count(chr(10)) + 1}: cell" in text


def test_the_manifest_names_the_file_relative_to_the_working_directory(tmp_path, monkeypatch):
    from fp4lab.sweep import load_experiment

    (tmp_path / "exps").mkdir()
    path = tmp_path / "exps" / "e.py"
    path.write_text(
        "from fp4lab.train.config import Config\n"
        "def get_config():\n    return Config(task='teacher', steps=1)\n"
        "def sweep(add):\n    add(recipe='fp32')\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_experiment(path).manifest()["path"] == "exps/e.py"  # no machine's path
    monkeypatch.chdir(tmp_path / "exps")
    assert load_experiment(path).manifest()["path"] == "e.py"
