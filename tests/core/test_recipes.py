"""Named recipes are values with sources; GemmRecipe validates its fields."""

import dataclasses
import json
import pathlib

import pytest

import fp4lab as fl
from fp4lab.core import recipes

REQUIRED = ["fp32", "bf16", "fp8", "mxfp8", "mxfp4", "mxfp4-h16", "nvfp4", "nvfp4-rl"]


def test_required_names_exist():
    assert set(REQUIRED) <= set(recipes.names())


@pytest.mark.parametrize("name", recipes.names())
def test_recipes_are_values_with_a_source(name):
    r = recipes.get(name)
    assert r == recipes.get(name) and hash(r) == hash(recipes.get(name))
    assert name in repr(r)
    doc = recipes.doc(name)
    assert len(doc) > 40
    if name not in ("fp32", "bf16"):
        assert "arXiv" in doc or "PR" in doc or "Source" in doc


def test_replace_makes_variants():
    r = recipes.get("nvfp4")
    v = r.replace(wgrad_x=None, wgrad_dy=None)
    assert v != r and v.wgrad_x is None and v.fprop_x == r.fprop_x
    assert hash(v) != hash(r)


def test_recipe_contents_follow_the_sources():
    nv = recipes.get("nvfp4")
    assert nv.fprop_w.tile == (16, 16) and nv.dgrad_w.tile == (16, 16)
    assert nv.fprop_x.tile == (1, 16)
    assert nv.dgrad_dy.rounding == "stochastic" and nv.wgrad_dy.rounding == "stochastic"
    assert nv.fprop_x.rounding == "rne" and nv.fprop_w.rounding == "rne"
    assert nv.transform("wgrad") is not None and nv.transform("fprop") is None
    assert nv.transform("dgrad") is None
    assert isinstance(nv.transform("wgrad").signs, tuple)
    rl = recipes.get("nvfp4-rl")
    assert rl.backward == "dequantized" and rl.fprop_x.outer == "row"
    assert rl.fprop_x.four_over_six == "mae" and rl.fprop_w.outer == "tensor"
    h = recipes.get("mxfp4-h16")
    for g in recipes.GEMMS:
        assert h.transform(g) == fl.Hadamard(16, "none")
    fp8 = recipes.get("fp8")
    assert fp8.fprop_x.elem == "e4m3" and fp8.dgrad_dy.elem == "e5m2"
    assert recipes.get("fp32").is_identity


def test_nvfp4_ablations_change_one_thing():
    """NVIDIA 2025 Figs. 10-11: each ablation differs from nvfp4 only where its name says."""
    nv = recipes.get("nvfp4")
    assert recipes.nvfp4_ablation(sr=("gradients",), hadamard=("wgrad",), name="x") == nv

    def rounding(r):
        return {k: s.rounding for k, s in r.used_specs().items()}

    sr = {k for k, v in rounding(nv).items() if v == "stochastic"}
    assert sr == {"dgrad_dy", "wgrad_dy"}
    expect = {
        "nvfp4-no-sr": set(),
        "nvfp4-sr-acts": sr | {"fprop_x", "wgrad_x"},
        "nvfp4-sr-weights": sr | {"fprop_w", "dgrad_w"},
    }
    for name, want in expect.items():
        r = recipes.get(name)
        assert {k for k, v in rounding(r).items() if v == "stochastic"} == want, name
        assert [r.transform(g) for g in recipes.GEMMS] == [nv.transform(g) for g in recipes.GEMMS]
    h = nv.transform("wgrad")
    hs = {
        "nvfp4-no-h": (),
        "nvfp4-h-fprop": ("fprop", "wgrad"),
        "nvfp4-h-dgrad": ("dgrad", "wgrad"),
    }
    for name, gemms in hs.items():
        r = recipes.get(name)
        assert rounding(r) == rounding(nv), name
        assert [r.transform(g) for g in recipes.GEMMS] == [
            h if g in gemms else None for g in recipes.GEMMS
        ]
        for key, spec in r.used_specs().items():  # tiles and scales untouched
            assert spec.replace(transform=None) == nv.used_specs()[key].replace(transform=None)


def test_bad_fields_are_errors():
    with pytest.raises(ValueError, match="allowed: 'quantized', 'dequantized', 'high_precision'"):
        recipes.GemmRecipe(backward="exact")
    with pytest.raises(ValueError, match="must be a QuantSpec"):
        recipes.GemmRecipe(fprop_x="nvfp4")
    h16, h32 = fl.Hadamard(16), fl.Hadamard(32)
    with pytest.raises(ValueError, match="same Hadamard"):
        recipes.GemmRecipe(fprop_x=fl.mxfp4(transform=h16), fprop_w=fl.mxfp4(transform=h32))
    with pytest.raises(ValueError, match="known recipes"):
        recipes.get("nvfp8")


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipes.get("nvfp4").backward = "dequantized"


def test_readme_lists_every_registered_recipe():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"# {recipes.names()!r}" in readme


# ---------------------------------------------------------------------------------------------
# Recipes as values: plain JSON, register, override.


@pytest.mark.parametrize("name", recipes.builtin_names())
def test_every_builtin_recipe_round_trips_through_plain_json(name):
    r = recipes.get(name)
    d = json.loads(json.dumps(r.to_dict()))  # plain JSON: no objects left
    assert recipes.GemmRecipe.from_dict(d) == r
    assert "name" not in d  # a label, not numerics: equal recipes give equal dicts
    assert recipes.builtin_name(r.replace(name="another label")) == name


def test_spec_json_shows_every_field_and_reads_partial_dicts():
    spec = fl.nvfp4(rounding="stochastic", transform=fl.Hadamard.fixed_random(16, seed=3))
    d = spec.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(fl.QuantSpec)}
    assert d["tile"] == [1, 16] and d["rounding"] == "stochastic"
    assert d["transform"]["size"] == 16 and set(d["transform"]["signs"]) == {1.0, -1.0}
    assert fl.QuantSpec.from_dict(json.loads(json.dumps(d))) == spec
    assert fl.QuantSpec.from_dict({"rounding": "stochastic"}) == fl.nvfp4(rounding="stochastic")
    assert fl.Hadamard.from_dict({"size": 32}) == fl.Hadamard(32, "none")


@pytest.mark.parametrize(
    "d, message",
    [
        ({"fprop_q": None}, "GemmRecipe has no field ['fprop_q']; allowed: fprop_x,"),
        ({"fprop_q": None}, "did you mean 'fprop_x'?"),
        ({"dgrad_dy": {"roundng": "stochastic"}}, "GemmRecipe.dgrad_dy: QuantSpec has no field"),
        ({"dgrad_dy": {"roundng": "stochastic"}}, "did you mean 'rounding'?"),
        ({"dgrad_dy": {"rounding": 1}}, "QuantSpec.rounding=1; allowed: 'rne', 'stochastic'"),
        ({"fprop_x": {"tile": "16"}}, "QuantSpec.tile='16'; allowed: an int n >= 1"),
        ({"fprop_x": {"elem": "e2m2"}}, "QuantSpec.elem: unknown element format 'e2m2'"),
        ({"fprop_x": {"pad": "yes"}}, "QuantSpec.pad='yes'; allowed: True or False"),
        ({"wgrad_x": {"transform": {"size": "32"}}}, "Hadamard.size='32'; allowed: a power"),
        ({"wgrad_x": {"transform": {"sise": 32}}}, "Hadamard has no field ['sise']"),
        ({"wgrad_x": {"transform": {"signs": [1, 2]}}}, "Hadamard.signs must hold 16 values"),
        ({"wgrad_x": {"transform": "h32"}}, "QuantSpec.transform='h32'; allowed: Hadamard"),
        ({"fprop_x": "nvfp4"}, "GemmRecipe.fprop_x must be a QuantSpec or None"),
        ({"backward": "exact"}, "GemmRecipe.backward='exact'; allowed: 'quantized'"),
        (["nvfp4"], "GemmRecipe: expected a dict of its fields"),
    ],
)
def test_bad_json_names_the_field(d, message):
    with pytest.raises(ValueError) as e:
        recipes.GemmRecipe.from_dict(d)
    assert message in str(e.value)


def test_register_names_a_recipe_and_refuses_clashes():
    mine = recipes.get("nvfp4").replace(dgrad_dy=fl.nvfp4(), wgrad_dy=None, wgrad_x=None)
    try:
        got = recipes.register("test-mine", mine, doc="NVFP4, RNE dy, Wgrad unquantized")
        assert got == mine and got.name == "test-mine"
        assert recipes.get("test-mine") == mine and recipes.get("test-mine").name == "test-mine"
        assert recipes.names()[-1] == "test-mine" and "test-mine" not in recipes.builtin_names()
        assert recipes.doc("test-mine") == "NVFP4, RNE dy, Wgrad unquantized"
        assert recipes.register("test-mine", mine) == got  # again, equal: nothing happens
        assert recipes.builtin_name(mine) is None  # only built-in names canonicalise
        with pytest.raises(ValueError, match="'test-mine' is already registered as a different"):
            recipes.register("test-mine", recipes.get("bf16"))
        with pytest.raises(ValueError, match="'nvfp4' is a built-in recipe; choose another"):
            recipes.register("nvfp4", mine)
        with pytest.raises(ValueError, match="a QuantSpec is one operand"):
            recipes.register("test-spec", fl.nvfp4())
        with pytest.raises(ValueError, match="allowed: a non-empty string"):
            recipes.register("", mine)
        with pytest.raises(ValueError, match="a built-in recipe cannot be removed"):
            recipes.unregister("bf16")
    finally:
        recipes.unregister("test-mine")
    assert "test-mine" not in recipes.names()
    with pytest.raises(ValueError, match="known recipes"):
        recipes.get("test-mine")


def test_override_replaces_gemms_then_operands():
    nv, bf = recipes.get("nvfp4"), recipes.get("bf16")
    sr = fl.nvfp4(rounding="stochastic")
    r = recipes.override(nv, {"wgrad_dy": None, "wgrad": "bf16", "fprop_x": sr})
    # the same recipe written field by field (operand keys refine the GEMM key)
    assert r == nv.replace(wgrad_x=bf.wgrad_x, wgrad_dy=None, fprop_x=sr) and r.name == "nvfp4"
    assert recipes.override(nv, [("dgrad", bf)]) == nv.replace(
        dgrad_dy=bf.dgrad_dy, dgrad_w=bf.dgrad_w
    )
    assert recipes.override(nv, {"fprop": sr}) == nv.replace(fprop_x=sr, fprop_w=sr)
    assert recipes.override(nv, {}) == nv
    with pytest.raises(ValueError, match="override key 'wgrad_w'; allowed: fprop, dgrad"):
        recipes.override(nv, {"wgrad_w": None})
    with pytest.raises(ValueError, match="override 'wgrad': unknown recipe 'bf17'"):
        recipes.override(nv, {"wgrad": "bf17"})
    with pytest.raises(ValueError, match="override 'fprop'=3 \\(int\\); allowed: a recipe name"):
        recipes.override(nv, {"fprop": 3})
    with pytest.raises(ValueError, match="override wgrad_dy: GemmRecipe wgrad: both operands"):
        recipes.override(nv, {"wgrad_dy": fl.nvfp4(transform=fl.Hadamard(32))})
