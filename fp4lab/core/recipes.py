"""GemmRecipe (`fp4lab.core.gemm_recipe`) and the named recipes of the literature.

A linear layer's training runs three GEMMs, each with two operands:

    Fprop  y  = x  . w        specs: fprop_x, fprop_w
    Dgrad  dx = dy . w^T      specs: dgrad_dy, dgrad_w
    Wgrad  dw = x^T . dy      specs: wgrad_x, wgrad_dy

Each operand is quantized along its own GEMM's contraction axis (Wgrad along the token axis).
`backward` chooses what the two backward GEMMs consume:

    "quantized"       Dgrad/Wgrad quantize their own operands with their own specs
    "dequantized"     the dequantized Fprop operands and the unquantized dy: the exact gradient
                      of the quantized forward (chain-rule consistent)
    "high_precision"  the original operands (straight-through)

A Hadamard in either spec of a GEMM rotates both of its operands (it then cancels exactly).
Recipes are values: printable, comparable, hashable; `recipe.replace(...)` makes variants,
`override(recipe, {"wgrad": "bf16", "dgrad_dy": spec})` replaces the specs of whole GEMMs or of
single operands, and `to_dict` / `from_dict` give and read their plain JSON (what a run record
stores). The built-in recipes below are reached by name (`get`, `names`, `doc`); an experiment
file or a notebook can name its own with `register`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable

from fp4lab import schema
from fp4lab.core import spec as specs
from fp4lab.core.gemm_recipe import GemmRecipe
from fp4lab.core.hadamard import Hadamard
from fp4lab.core.spec import QuantSpec
from fp4lab.schema import GEMMS, OPERANDS

__all__ = [
    "GemmRecipe",
    "get",
    "names",
    "doc",
    "register",
    "unregister",
    "builtin_names",
    "builtin_name",
    "override",
    "nvfp4_ablation",
]

_REGISTRY: dict[str, Callable[[], GemmRecipe]] = {}  # the built-in recipes of this module
_REGISTERED: dict[str, tuple[GemmRecipe, str]] = {}  # register(): name -> (recipe, doc)


def _register(name: str):
    """Registers a recipe constructor under `name`; its docstring is the recipe's `doc`."""

    def add(fn: Callable[[], GemmRecipe]) -> Callable[[], GemmRecipe]:
        _REGISTRY[name] = fn
        return fn

    return add


def _all(spec: QuantSpec | None, **kw) -> dict:
    return dict.fromkeys(schema.OPERAND_NAMES, spec) | kw


@_register("fp32")
def _fp32() -> GemmRecipe:
    """No quantization: every GEMM in the input precision (the reference)."""
    return GemmRecipe(name="fp32")


@_register("bf16")
def _bf16() -> GemmRecipe:
    """BF16 operands in all three GEMMs (FP32 accumulation), the usual mixed-precision baseline."""
    return GemmRecipe(**_all(specs.cast_spec("bf16")), name="bf16")


@_register("fp16")
def _fp16() -> GemmRecipe:
    """FP16 operands in all three GEMMs, no scaling: gradients below 2^-24 flush to zero, the
    classic case for loss scaling (Micikevicius et al. 2018, arXiv 1710.03740)."""
    return GemmRecipe(**_all(specs.cast_spec("fp16")), name="fp16")


@_register("fp8")
def _fp8() -> GemmRecipe:
    """FP8 with per-tensor current scaling: E4M3 forward, E5M2 gradients (the "hybrid" format).

    Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv 2209.05433), §4;
    NVIDIA TransformerEngine `Format.HYBRID`.
    """
    e4, e5 = specs.fp8("e4m3"), specs.fp8("e5m2")
    return GemmRecipe(
        fprop_x=e4, fprop_w=e4, dgrad_dy=e5, dgrad_w=e4, wgrad_x=e4, wgrad_dy=e5, name="fp8"
    )


@_register("mxfp8")
def _mxfp8() -> GemmRecipe:
    """MXFP8: E4M3 elements, 32-blocks, E8M0 scales rounded up (RCEIL), all six operands.

    Source: Mishra et al. 2025, "Recipes for Pre-training LLMs with MXFP8" (arXiv 2506.08027),
    which uses E4M3 for all tensors and rounds the shared exponent up.
    """
    return GemmRecipe(**_all(specs.mxfp8(scale_rounding="ceil")), name="mxfp8")


@_register("mxfp4")
def _mxfp4() -> GemmRecipe:
    """MXFP4 on all three GEMMs: 1x32 blocks for activations and gradients, 32x32 for weights.

    Source: Cim et al. 2026 (arXiv 2605.09825), §3: E2M1, E8M0 scales, RNE. The E8M0 rounding
    is not confirmed there; this uses the OCP floor rule (switch with scale_rounding="ceil").
    """
    act, w = specs.mxfp4(), specs.mxfp4(tile=(32, 32))
    return GemmRecipe(**_all(act, fprop_w=w, dgrad_w=w), name="mxfp4")


def _with_hadamard(recipe: GemmRecipe, h: Hadamard, name: str) -> GemmRecipe:
    used = {k: getattr(recipe, k) for k in schema.OPERAND_NAMES if getattr(recipe, k) is not None}
    return recipe.replace(**{k: s.replace(transform=h) for k, s in used.items()}, name=name)


@_register("mxfp4-h16")
def _mxfp4_h16() -> GemmRecipe:
    """MXFP4 with a deterministic 16x16 Hadamard on both operands of all three GEMMs.

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: Sylvester Hadamard, no sign flips,
    scaled by 1/sqrt(16), along the contraction axis; brings the FP4 overhead back to 8-9 %.
    Tiles as in `mxfp4` (the rotation acts within rows, so 32x32 weight tiles stay intact).
    """
    return _with_hadamard(_mxfp4(), Hadamard(16, "none"), "mxfp4-h16")


@_register("mxfp4-h32")
def _mxfp4_h32() -> GemmRecipe:
    """As mxfp4-h16 with a 32x32 Hadamard (Cim et al. 2026, arXiv 2605.09825, Table 1)."""
    return _with_hadamard(_mxfp4(), Hadamard(32, "none"), "mxfp4-h32")


@_register("mxfp4-sr")
def _mxfp4_sr() -> GemmRecipe:
    """MXFP4 on all three GEMMs with stochastic rounding of the elements (Cim et al. 2026 ablation).

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: with Fprop, Dgrad and Wgrad in MXFP4,
    stochastic rounding does not converge. The secondary transcriptions do not say which operands
    were rounded stochastically; here all six are (tiles and scales as in `mxfp4`).
    """
    r = _mxfp4()
    return r.replace(
        **{k: getattr(r, k).replace(rounding="stochastic") for k in schema.OPERAND_NAMES},
        name="mxfp4-sr",
    )


@_register("mxfp4-h16-rs")
def _mxfp4_h16_rs() -> GemmRecipe:
    """MXFP4 with a random-sign 16x16 Hadamard on both operands of all three GEMMs.

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: the randomized Hadamard (sign flips
    drawn at random) does not converge, unlike the deterministic one (`mxfp4-h16`). Signs are
    drawn from the quantization stream, fresh per layer, GEMM and step.
    """
    return _with_hadamard(_mxfp4(), Hadamard(16, "random"), "mxfp4-h16-rs")


@_register("nvfp4")
def _nvfp4() -> GemmRecipe:
    """NVIDIA's NVFP4 pretraining recipe.

    Source: NVIDIA 2025, "Pretraining LLMs with NVFP4" (arXiv 2509.25149), §4 and App. B:
    2D 16x16 weight tiles (Fprop and Dgrad see the same quantized weight), 1x16 activations and
    gradients, stochastic rounding on gradients only, a 16x16 Hadamard with one fixed random
    sign vector on the Wgrad inputs only, FP32 tensor scale, RNE elsewhere. (Which layers stay
    in BF16 is a rule, not part of the recipe.)
    """
    w = specs.nvfp4(tile=(16, 16))
    x = specs.nvfp4()
    dy = specs.nvfp4(rounding="stochastic")
    h = Hadamard.fixed_random(16, seed=0)
    return GemmRecipe(
        fprop_x=x,
        fprop_w=w,
        dgrad_dy=dy,
        dgrad_w=w,
        wgrad_x=x.replace(transform=h),
        wgrad_dy=dy.replace(transform=h),
        name="nvfp4",
    )


@_register("nvfp4-rl")
def _nvfp4_rl() -> GemmRecipe:
    """The NVFP4 recipe of the "4-bitter lesson" for RL.

    Source: humans& 2026, "The 4-bitter Lesson" (Miles PR #1261): 1x16 blocks with E4M3
    scales; per-token (row) FP32 outer scale for activations, per tensor for weights; no 2D
    blocks, no Hadamard, no stochastic rounding; four-over-six (MAE) on weights and activations;
    the backward in high precision on the dequantized forward operands.
    """
    return GemmRecipe(
        fprop_x=specs.nvfp4(scope="row", four_over_six="mae"),
        fprop_w=specs.nvfp4(four_over_six="mae"),
        backward="dequantized",
        name="nvfp4-rl",
    )


_SR_GROUPS = {  # NVIDIA 2025, Fig. 10: which tensors are rounded stochastically
    "gradients": ("dgrad_dy", "wgrad_dy"),
    "activations": ("fprop_x", "wgrad_x"),
    "weights": ("fprop_w", "dgrad_w"),
}


def nvfp4_ablation(*, sr: tuple[str, ...], hadamard: tuple[str, ...], name: str) -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the tensor groups `sr` and its 16x16 Hadamard on the
    GEMMs `hadamard` (NVIDIA's recipe: sr=("gradients",), hadamard=("wgrad",))."""
    base = _nvfp4()
    h = base.transform("wgrad")
    stochastic = {op for group in sr for op in _SR_GROUPS[group]}
    changes = {}
    for g in GEMMS:
        for o in OPERANDS[g]:
            key = f"{g}_{o}"
            spec = base.spec(g, o)
            spec = spec.replace(rounding="stochastic" if key in stochastic else "rne")
            changes[key] = spec.replace(transform=h if g in hadamard else None)
    return base.replace(**changes, name=name)


@_register("nvfp4-no-sr")
def _nvfp4_no_sr() -> GemmRecipe:
    """`nvfp4` with round-to-nearest-even everywhere, no stochastic rounding (NVIDIA 2025,
    arXiv 2509.25149, Fig. 10 ablation: SR on the gradients is what the recipe needs)."""
    return nvfp4_ablation(sr=(), hadamard=("wgrad",), name="nvfp4-no-sr")


@_register("nvfp4-sr-acts")
def _nvfp4_sr_acts() -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the activations as well as the gradients (NVIDIA
    2025, arXiv 2509.25149, Fig. 10 ablation: SR on activations hurts)."""
    return nvfp4_ablation(
        sr=("gradients", "activations"), hadamard=("wgrad",), name="nvfp4-sr-acts"
    )


@_register("nvfp4-sr-weights")
def _nvfp4_sr_weights() -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the weights as well as the gradients (NVIDIA 2025,
    arXiv 2509.25149, Fig. 10 ablation: SR on weights hurts)."""
    return nvfp4_ablation(sr=("gradients", "weights"), hadamard=("wgrad",), name="nvfp4-sr-weights")


@_register("nvfp4-no-h")
def _nvfp4_no_h() -> GemmRecipe:
    """`nvfp4` without the Hadamard on Wgrad (NVIDIA 2025, arXiv 2509.25149, Fig. 11 ablation:
    the Wgrad Hadamard helps)."""
    return nvfp4_ablation(sr=("gradients",), hadamard=(), name="nvfp4-no-h")


@_register("nvfp4-h-fprop")
def _nvfp4_h_fprop() -> GemmRecipe:
    """`nvfp4` with its 16x16 Hadamard on the forward GEMM as well as Wgrad (NVIDIA 2025,
    arXiv 2509.25149, Fig. 11 ablation: a Hadamard on Fprop hurts)."""
    return nvfp4_ablation(sr=("gradients",), hadamard=("fprop", "wgrad"), name="nvfp4-h-fprop")


@_register("nvfp4-h-dgrad")
def _nvfp4_h_dgrad() -> GemmRecipe:
    """`nvfp4` with its 16x16 Hadamard on the input-gradient GEMM as well as Wgrad (NVIDIA 2025,
    arXiv 2509.25149, Fig. 11 ablation: a Hadamard on Dgrad hurts)."""
    return nvfp4_ablation(sr=("gradients",), hadamard=("dgrad", "wgrad"), name="nvfp4-h-dgrad")


def names() -> tuple[str, ...]:
    """The names `get` accepts: the built-in recipes, then those added with `register`."""
    return (*_REGISTRY, *_REGISTERED)


def builtin_names() -> tuple[str, ...]:
    """The names of the recipes this module defines (not those added with `register`)."""
    return tuple(_REGISTRY)


@functools.cache
def _builtins() -> dict[GemmRecipe, str]:
    out: dict[GemmRecipe, str] = {}
    for name, fn in _REGISTRY.items():
        out.setdefault(fn(), name)  # the first name of equal recipes
    return out


def builtin_name(recipe: GemmRecipe) -> str | None:
    """The name of the built-in recipe equal to `recipe` (names are labels and take no part in
    equality), or None: `builtin_name(get("bf16").replace(name="mine")) == "bf16"`."""
    return _builtins().get(recipe)


def get(name: str | GemmRecipe | None) -> GemmRecipe | None:
    """The named recipe (a GemmRecipe passes through; None stays None = high precision)."""
    if name is None or isinstance(name, GemmRecipe):
        return name
    if isinstance(name, str) and name in _REGISTERED:
        return _REGISTERED[name][0]
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(names())}")
    return _REGISTRY[name]()


def doc(name: str) -> str:
    """The docstring (source and description) of a named recipe."""
    get(name)
    if name in _REGISTERED:
        return _REGISTERED[name][1]
    return _REGISTRY[name].__doc__ or ""


def register(name: str, recipe: GemmRecipe, *, doc: str = "") -> GemmRecipe:
    """Adds `recipe` under `name`, so `get(name)`, rules and configs can name it; returns it,
    labelled `name`. `doc` is what `doc(name)` returns (say where the recipe comes from).

    Registering the same name again with an equal recipe does nothing, so an experiment file or
    a notebook cell can run twice. A run record stores a registered recipe as its specs, never
    by its name (`fp4lab.train.config`): the record reads back where the name is not
    registered.

    Raises:
      ValueError: `name` is a built-in recipe, or registered with a different recipe; `name`
        is not a non-empty string or `recipe` not a GemmRecipe.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: name={name!r}; allowed: a non-empty string")
    if not isinstance(recipe, GemmRecipe):
        raise ValueError(
            f"register({name!r}, ...): recipe={recipe!r}; allowed: a GemmRecipe "
            "(a QuantSpec is one operand: put it in the operands of a GemmRecipe)"
        )
    if name in _REGISTRY:
        raise ValueError(
            f"register({name!r}, ...): {name!r} is a built-in recipe; choose another name"
        )
    if name in _REGISTERED and _REGISTERED[name][0] != recipe:
        raise ValueError(
            f"register({name!r}, ...): {name!r} is already registered as a different recipe; "
            f"choose another name, or unregister({name!r}) first"
        )
    recipe = dataclasses.replace(recipe, name=name)
    _REGISTERED[name] = (recipe, doc)
    return recipe


def unregister(name: str) -> None:
    """Removes a recipe added with `register` (a built-in recipe cannot be removed)."""
    if name in _REGISTRY:
        raise ValueError(f"unregister({name!r}): a built-in recipe cannot be removed")
    if name not in _REGISTERED:
        raise ValueError(f"unregister({name!r}): not registered; registered: {list(_REGISTERED)}")
    del _REGISTERED[name]


_Override = str | GemmRecipe | QuantSpec | None


def override(
    recipe: GemmRecipe, changes: dict[str, _Override] | Iterable[tuple[str, _Override]]
) -> GemmRecipe:
    """`recipe` with the specs of whole GEMMs or of single operands replaced.

    changes: {key: value}; a key is a GEMM ("fprop", "dgrad", "wgrad": both of its operands) or
    an operand ("dgrad_dy", ...: `schema.OPERAND_NAMES`); a value is a recipe name or a
    GemmRecipe (take its specs for the key), a QuantSpec (the spec of the operand, or of both
    operands of the GEMM) or None (unquantized). GEMM keys apply first, so an operand key
    refines a GEMM key: {"wgrad": "bf16", "wgrad_dy": None}. The name and backward mode stay.
    The key "norms" sets the spec of the norm layers' vectors (`GemmRecipe.norms`: a QuantSpec,
    or None for high precision), the key "outputs" the spec of the GEMMs' outputs
    (`GemmRecipe.outputs`).

    Raises:
      ValueError: an unknown key or recipe name, a value of another type, or a result whose
        GEMM has two different Hadamards (each message names the key).
    """
    items = list(changes.items() if isinstance(changes, dict) else changes)
    gemm_first = sorted(items, key=lambda kv: kv[0] not in GEMMS)
    fields: dict[str, QuantSpec | None] = {}
    for key, value in gemm_first:
        if key in ("norms", "outputs"):
            if value is not None and not isinstance(value, QuantSpec):
                raise ValueError(
                    f"override {key!r}={value!r} ({type(value).__name__}); allowed: a QuantSpec "
                    "(e.g. fl.mxfp4()) or None"
                )
            fields[key] = value
            continue
        if key in GEMMS:
            targets = [(schema.operand_name(key, o), key, o) for o in OPERANDS[key]]
        elif key in schema.OPERAND_NAMES:
            gemm, operand = key.split("_", 1)
            targets = [(key, gemm, operand)]
        else:
            allowed = (*GEMMS, *schema.OPERAND_NAMES, "norms", "outputs")
            hint = schema.did_you_mean(key, allowed)
            raise ValueError(f"override key {key!r}; allowed: {', '.join(allowed)}{hint}")
        if isinstance(value, str):
            try:
                value = get(value)
            except ValueError as e:
                raise ValueError(f"override {key!r}: {e}") from e
        for field, gemm, operand in targets:
            if value is None or isinstance(value, QuantSpec):
                fields[field] = value
            elif isinstance(value, GemmRecipe):
                fields[field] = value.spec(gemm, operand)
            else:
                raise ValueError(
                    f"override {key!r}={value!r} ({type(value).__name__}); allowed: a recipe "
                    "name, a GemmRecipe, a QuantSpec or None"
                )
    try:
        return recipe.replace(**fields)
    except ValueError as e:
        raise ValueError(f"override {', '.join(k for k, _ in items)}: {e}") from e
