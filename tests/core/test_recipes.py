"""Named recipes are values with sources; GemmRecipe validates its fields."""

import dataclasses
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
