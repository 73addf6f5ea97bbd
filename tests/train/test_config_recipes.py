"""Recipes as values in Config: stored as plain JSON, read back, hashed, applied per phase; built-in
names keep the run ids they had before values were allowed."""

import dataclasses
import json
from pathlib import Path

import pytest

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.sweep import store
from fp4lab.sweep.store import run_id
from fp4lab.train import trainer
from fp4lab.train.config import Config, ConfigError

X, W = fl.nvfp4(), fl.nvfp4(tile=(16, 16))
H32 = fl.Hadamard(32, signs="none")
H32_X = X.replace(transform=H32)
# NVFP4 with stochastic rounding only on Dgrad's dy and a 32-Hadamard on Wgrad
DY_SR_H32 = fl.GemmRecipe(
    fprop_x=X,
    fprop_w=W,
    dgrad_dy=X.replace(rounding="stochastic"),
    dgrad_w=W,
    wgrad_x=X.replace(transform=H32),
    wgrad_dy=X.replace(transform=H32),
    name="nvfp4-dy-sr-h32",
)
RESULTS = Path(__file__).resolve().parents[2] / "results"


def old_to_dict(cfg: Config) -> dict:
    """Config.to_dict as it was before recipe values: the reference for the hashes of names."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def test_names_serialize_and_hash_as_before():
    cfg = Config(
        recipe="nvfp4",
        gemms={"wgrad": "bf16"},
        rules=[("lm_head", "bf16"), ("embed", None)],
        phases=[(0.5, {"gemms": {"fprop": "bf16"}, "backward": "dequantized"}), (0.9, "bf16")],
        steps=100,
    )
    assert cfg.to_dict() == old_to_dict(cfg)
    assert run_id(cfg.to_dict(), (1, 2, 3)) == run_id(old_to_dict(cfg), (1, 2, 3))


def test_committed_records_keep_their_run_ids(monkeypatch):
    checked = 0
    folders = {p.parent for kept in ("runs", "compact") for p in RESULTS.glob(f"*/{kept}")}
    for folder in sorted(folders):  # per-run files or compacted (`fp4lab.sweep.compact`)
        st = store.Store(folder)
        record = st.read(min(st.statuses()), metrics=False)  # one run per folder
        cfg = Config.from_dict(record["config"]).to_dict()
        seeds = tuple(record["seeds"][s] for s in ("init", "data", "quant"))
        # a record of an older numerics version keeps the id that version gave it
        monkeypatch.setattr(store, "NUMERICS_VERSION", record.get("numerics", 1))
        assert store.run_id(cfg, seeds, record.get("data")) == record["run_id"], folder
        checked += 1
    assert checked >= 5


def test_a_recipe_value_is_stored_as_plain_json_and_read_back():
    cfg = Config(
        recipe=DY_SR_H32, rules=[("lm_head", DY_SR_H32.replace(wgrad_x=None, wgrad_dy=None))]
    )
    d = json.loads(json.dumps(cfg.to_dict()))
    spec = d["recipe"]
    assert spec["dgrad_dy"]["rounding"] == "stochastic" and spec["wgrad_dy"]["rounding"] == "rne"
    assert spec["wgrad_x"]["transform"] == {"size": 32, "signs": "none"}
    assert spec["fprop_x"]["transform"] is None and spec["fprop_w"]["tile"] == [16, 16]
    assert d["rules"][0][1]["wgrad_x"] is None
    back = Config.from_dict(d)
    assert back == cfg and hash(back) == hash(cfg) and back.to_dict() == d
    assert back.recipe == DY_SR_H32  # equal as a value; the name is a label, not stored
    named = run_id(Config(recipe="nvfp4").to_dict(), (0, 0, 0))
    assert run_id(d, (0, 0, 0)) != named


def test_a_value_equal_to_a_builtin_recipe_is_its_name():
    nv = recipes.get("nvfp4").replace(name="mine")
    cfg = Config(
        recipe=nv, gemms={"wgrad": recipes.get("bf16")}, rules=[("x", recipes.get("fp32"))]
    )
    assert cfg == Config(recipe="nvfp4", gemms={"wgrad": "bf16"}, rules=[("x", "fp32")])
    assert (
        cfg.to_dict()
        == Config(recipe="nvfp4", gemms={"wgrad": "bf16"}, rules=[("x", "fp32")]).to_dict()
    )
    assert Config(phases=[(0.5, nv)]).phases == ((0.5, (("recipe", "nvfp4"),)),)


def test_a_registered_name_is_stored_as_its_value():
    try:
        recipes.register("test-dy-sr-h32", DY_SR_H32)
        cfg = Config(recipe="test-dy-sr-h32", gemms={"wgrad": "test-dy-sr-h32"})
        assert cfg.recipe == DY_SR_H32 and cfg.recipe.name == "test-dy-sr-h32"
        assert cfg.to_dict()["recipe"] == DY_SR_H32.to_dict()
        # a GEMM taken from a recipe that is not built-in: the specs it gives that GEMM
        assert cfg.gemms == (("wgrad_dy", DY_SR_H32.wgrad_dy), ("wgrad_x", DY_SR_H32.wgrad_x))
    finally:
        recipes.unregister("test-dy-sr-h32")
    assert Config.from_dict(cfg.to_dict()) == cfg  # reads back where the name is unknown


def test_overrides_per_gemm_and_per_operand():
    sr = fl.nvfp4(rounding="stochastic")
    cfg = Config(recipe="nvfp4", gemms={"fprop": "bf16", "fprop_x": sr, "dgrad_dy": None})
    assert cfg.gemms == (("dgrad_dy", None), ("fprop", "bf16"), ("fprop_x", sr))
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["gemms"][1] == ["fprop", "bf16"] and d["gemms"][2][1]["rounding"] == "stochastic"
    assert Config.from_dict(d) == cfg
    ((_, _, rules),) = trainer.phase_rules(cfg)
    got = rules[-1].recipe
    nv, bf = recipes.get("nvfp4"), recipes.get("bf16")
    assert got == nv.replace(fprop_x=sr, fprop_w=bf.fprop_w, dgrad_dy=None)  # operand keys win
    assert got.name == "nvfp4+dgrad_dy=None+fprop=bf16+fprop_x=e2m1/1x16/e4m3/sr"
    # an operand taken from a recipe value: its spec there
    cfg = Config(recipe="bf16", gemms={"wgrad_x": DY_SR_H32, "wgrad_dy": DY_SR_H32})
    assert cfg.gemms == (("wgrad_dy", DY_SR_H32.wgrad_dy), ("wgrad_x", DY_SR_H32.wgrad_x))


def test_the_trainer_applies_values_in_every_phase():
    cfg = Config(
        recipe=DY_SR_H32,
        rules=[("lm_head", None), ("blocks\\.0\\..*", DY_SR_H32.replace(dgrad_dy=X))],
        phases=[
            (0.5, {"gemms": {"wgrad": "bf16"}}),
            (0.8, DY_SR_H32.replace(backward="dequantized", name="dq")),
        ],
        steps=10,
    )
    cfg = Config.from_dict(json.loads(json.dumps(cfg.to_dict())))  # as a worker sees it
    (a, b, first), (c, d, second), (e, f, last) = trainer.phase_rules(cfg)
    assert [(a, b), (c, d), (e, f)] == [(0, 5), (5, 8), (8, 10)]
    assert first[0].recipe is None and first[1].recipe == DY_SR_H32.replace(dgrad_dy=X)
    assert first[-1].recipe == DY_SR_H32 and first[-1].recipe.name == "custom"
    bf = recipes.get("bf16")
    assert second[-1].recipe == DY_SR_H32.replace(wgrad_x=bf.wgrad_x, wgrad_dy=bf.wgrad_dy)
    assert second[-1].recipe.name == "custom+wgrad=bf16" and len(second) == 3
    assert len(last) == 1 and last[0].recipe == DY_SR_H32.replace(backward="dequantized")


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(recipe={"fprop_q": None}), "Config.recipe: GemmRecipe has no field ['fprop_q']"),
        (
            dict(recipe={"dgrad_dy": {"rounding_mode": "stochastic"}}),
            "Config.recipe: GemmRecipe.dgrad_dy: QuantSpec has no field ['rounding_mode']",
        ),
        (
            dict(gemms={"dgrad_dy": {"tile": "big"}}),
            "Config.gemms['dgrad_dy']: QuantSpec.tile='big'; allowed: an int",
        ),
        (dict(gemms={"wgrad": 3}), "Config.gemms['wgrad']=3 (int); allowed: a recipe name"),
        (dict(gemms={"wgrad_w": None}), "Config.gemms key='wgrad_w'; allowed: 'fprop'"),
        (dict(recipe=3), "Config.recipe=3 (int); allowed: a recipe name (fp32, bf16"),
        (dict(recipe=X), "Config.recipe=QuantSpec(e2m1/1x16/e4m3): a QuantSpec is one operand"),
        (dict(rules=[("x", 5)]), "Config.rules[0] recipe=5 (int); allowed: a recipe name"),
        (dict(phases=[(0.5, X)]), "Config.phases[0] change=QuantSpec("),
        (
            dict(phases=[(0.5, {"recipe": {"backward": "fast"}})]),
            "Config.phases[0].recipe: GemmRecipe.backward='fast'; allowed: 'quantized'",
        ),
        (
            dict(recipe="nvfp4", gemms={"wgrad_dy": X.replace(transform=H32)}),
            "Config.recipe and gemms: override wgrad_dy: GemmRecipe wgrad: both operands must",
        ),
        (
            dict(recipe="nvfp4", steps=10, phases=[(5, {"gemms": {"wgrad_x": H32_X}})]),
            "Config.phases[0]: override wgrad_x: GemmRecipe wgrad: both operands must use",
        ),
    ],
)
def test_bad_values_name_the_field(bad, message):
    with pytest.raises(ConfigError) as e:
        Config(**bad)
    assert message in str(e.value)
