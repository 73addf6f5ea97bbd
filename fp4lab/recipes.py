"""GemmRecipe and the named recipes of the literature.

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
Recipes are values: printable, comparable, hashable; `recipe.replace(...)` makes variants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fp4lab.quantize import QuantSpec
from fp4lab.quantize import cast_spec as _cast
from fp4lab.quantize import fp8 as _fp8
from fp4lab.quantize import mxfp4 as _mxfp4
from fp4lab.quantize import mxfp8 as _mxfp8
from fp4lab.quantize import nvfp4 as _nvfp4
from fp4lab.transforms import Hadamard

__all__ = ["GemmRecipe", "get", "names", "BACKWARD_MODES", "GEMMS", "OPERANDS"]

BACKWARD_MODES = ("quantized", "dequantized", "high_precision")
GEMMS = ("fprop", "dgrad", "wgrad")
OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("x", "dy")}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmRecipe:
    """Operand specs of the three GEMMs of a linear layer and the backward mode.

    `None` for a spec keeps that operand in the input precision. With backward="dequantized"
    or "high_precision" the Dgrad and Wgrad specs are not used.
    """

    fprop_x: QuantSpec | None = None  # activations in the forward GEMM
    fprop_w: QuantSpec | None = None  # weights in the forward GEMM
    dgrad_dy: QuantSpec | None = None  # output gradient in the input-gradient GEMM
    dgrad_w: QuantSpec | None = None  # weights in the input-gradient GEMM
    wgrad_x: QuantSpec | None = None  # activations in the weight-gradient GEMM
    wgrad_dy: QuantSpec | None = None  # output gradient in the weight-gradient GEMM
    backward: str = "quantized"  # "quantized" | "dequantized" | "high_precision"
    name: str = dataclasses.field(default="", compare=False)  # label for tables

    def __post_init__(self):
        if self.backward not in BACKWARD_MODES:
            raise ValueError(
                f"GemmRecipe.backward={self.backward!r}; allowed: {', '.join(BACKWARD_MODES)}"
            )
        for g in GEMMS:
            a, b = (self.spec(g, o) for o in OPERANDS[g])
            for o, s in zip(OPERANDS[g], (a, b), strict=True):
                if s is not None and not isinstance(s, QuantSpec):
                    raise ValueError(f"GemmRecipe.{g}_{o} must be a QuantSpec or None, got {s!r}")
            ta = a.transform if a is not None else None
            tb = b.transform if b is not None else None
            if ta is not None and tb is not None and ta != tb:
                raise ValueError(
                    f"GemmRecipe {g}: both operands must use the same Hadamard, got {ta} and {tb}"
                )

    def spec(self, gemm: str, operand: str) -> QuantSpec | None:
        return getattr(self, f"{gemm}_{operand}")

    def transform(self, gemm: str) -> Hadamard | None:
        """The Hadamard applied to both operands of `gemm` (from either spec), or None."""
        for o in OPERANDS[gemm]:
            s = self.spec(gemm, o)
            if s is not None and s.transform is not None:
                return s.transform
        return None

    def used_specs(self) -> dict[str, QuantSpec | None]:
        """{"fprop_x": spec, ...} for the GEMM operands this backward mode quantizes."""
        gemms = GEMMS if self.backward == "quantized" else ("fprop",)
        return {f"{g}_{o}": self.spec(g, o) for g in gemms for o in OPERANDS[g]}

    @property
    def needs_key(self) -> bool:
        return any(s is not None and s.needs_key for s in self.used_specs().values())

    @property
    def is_identity(self) -> bool:
        return all(s is None for s in self.used_specs().values())

    def replace(self, **changes) -> GemmRecipe:
        """A copy with some fields changed, e.g. recipe.replace(wgrad_x=None, wgrad_dy=None)."""
        return dataclasses.replace(self, **changes)


def _all(spec: QuantSpec | None, **kw) -> dict:
    return {f"{g}_{o}": spec for g in GEMMS for o in OPERANDS[g]} | kw


def fp32() -> GemmRecipe:
    """No quantization: every GEMM in the input precision (the reference)."""
    return GemmRecipe(name="fp32")


def bf16() -> GemmRecipe:
    """BF16 operands in all three GEMMs (FP32 accumulation), the usual mixed-precision baseline."""
    return GemmRecipe(**_all(_cast("bf16")), name="bf16")


def fp16() -> GemmRecipe:
    """FP16 operands in all three GEMMs, no scaling: gradients below 2^-24 flush to zero, the
    classic case for loss scaling (Micikevicius et al. 2018, arXiv 1710.03740)."""
    return GemmRecipe(**_all(_cast("fp16")), name="fp16")


def fp8() -> GemmRecipe:
    """FP8 with per-tensor current scaling: E4M3 forward, E5M2 gradients (the "hybrid" format).

    Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv 2209.05433), §4;
    NVIDIA TransformerEngine `Format.HYBRID`.
    """
    e4, e5 = _fp8("e4m3"), _fp8("e5m2")
    return GemmRecipe(
        fprop_x=e4, fprop_w=e4, dgrad_dy=e5, dgrad_w=e4, wgrad_x=e4, wgrad_dy=e5, name="fp8"
    )


def mxfp8() -> GemmRecipe:
    """MXFP8: E4M3 elements, 32-blocks, E8M0 scales rounded up (RCEIL), all six operands.

    Source: Mishra et al. 2025, "Recipes for Pre-training LLMs with MXFP8" (arXiv 2506.08027),
    which uses E4M3 for all tensors and rounds the shared exponent up.
    """
    return GemmRecipe(**_all(_mxfp8(scale_rounding="ceil")), name="mxfp8")


def mxfp4() -> GemmRecipe:
    """MXFP4 on all three GEMMs: 1x32 blocks for activations and gradients, 32x32 for weights.

    Source: Cim et al. 2026 (arXiv 2605.09825), §3: E2M1, E8M0 scales, RNE. The E8M0 rounding
    is not confirmed there; this uses the OCP floor rule (switch with scale_rounding="ceil").
    """
    act, w = _mxfp4(), _mxfp4(tile=(32, 32))
    return GemmRecipe(**_all(act, fprop_w=w, dgrad_w=w), name="mxfp4")


def _with_hadamard(recipe: GemmRecipe, h: Hadamard, name: str) -> GemmRecipe:
    specs = {k: getattr(recipe, k) for k in _all(None) if getattr(recipe, k) is not None}
    return recipe.replace(**{k: s.replace(transform=h) for k, s in specs.items()}, name=name)


def mxfp4_h16() -> GemmRecipe:
    """MXFP4 with a deterministic 16x16 Hadamard on both operands of all three GEMMs.

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: Sylvester Hadamard, no sign flips,
    scaled by 1/sqrt(16), along the contraction axis; brings the FP4 overhead back to 8-9 %.
    Tiles as in `mxfp4` (the rotation acts within rows, so 32x32 weight tiles stay intact).
    """
    return _with_hadamard(mxfp4(), Hadamard(16, "none"), "mxfp4-h16")


def mxfp4_h32() -> GemmRecipe:
    """As mxfp4-h16 with a 32x32 Hadamard (Cim et al. 2026, arXiv 2605.09825, Table 1)."""
    return _with_hadamard(mxfp4(), Hadamard(32, "none"), "mxfp4-h32")


def mxfp4_sr() -> GemmRecipe:
    """MXFP4 on all three GEMMs with stochastic rounding of the elements (Cim et al. 2026 ablation).

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: with Fprop, Dgrad and Wgrad in MXFP4,
    stochastic rounding does not converge. The secondary transcriptions do not say which operands
    were rounded stochastically; here all six are (tiles and scales as in `mxfp4`).
    """
    r = mxfp4()
    specs = {k: getattr(r, k) for k in _all(None)}
    return r.replace(
        **{k: s.replace(rounding="stochastic") for k, s in specs.items()}, name="mxfp4-sr"
    )


def mxfp4_h16_rs() -> GemmRecipe:
    """MXFP4 with a random-sign 16x16 Hadamard on both operands of all three GEMMs.

    Source: Cim et al. 2026 (arXiv 2605.09825), Table 1: the randomized Hadamard (sign flips
    drawn at random) does not converge, unlike the deterministic one (`mxfp4-h16`). Signs are
    drawn from the quantization stream, fresh per layer, GEMM and step.
    """
    return _with_hadamard(mxfp4(), Hadamard(16, "random"), "mxfp4-h16-rs")


def nvfp4() -> GemmRecipe:
    """NVIDIA's NVFP4 pretraining recipe.

    Source: NVIDIA 2025, "Pretraining LLMs with NVFP4" (arXiv 2509.25149), §4 and App. B:
    2D 16x16 weight tiles (Fprop and Dgrad see the same quantized weight), 1x16 activations and
    gradients, stochastic rounding on gradients only, a 16x16 Hadamard with one fixed random
    sign vector on the Wgrad inputs only, FP32 tensor scale, RNE elsewhere. (Which layers stay
    in BF16 is a rule, not part of the recipe.)
    """
    w = _nvfp4(tile=(16, 16))
    x = _nvfp4()
    dy = _nvfp4(rounding="stochastic")
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


_SR_GROUPS = {  # NVIDIA 2025, Fig. 10: which tensors are rounded stochastically
    "gradients": ("dgrad_dy", "wgrad_dy"),
    "activations": ("fprop_x", "wgrad_x"),
    "weights": ("fprop_w", "dgrad_w"),
}


def _nvfp4_variant(*, sr: tuple[str, ...], hadamard: tuple[str, ...], name: str) -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the tensor groups `sr` and its 16x16 Hadamard on the
    GEMMs `hadamard` (NVIDIA's recipe: sr=("gradients",), hadamard=("wgrad",))."""
    base = nvfp4()
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


def nvfp4_no_sr() -> GemmRecipe:
    """`nvfp4` with round-to-nearest-even everywhere, no stochastic rounding (NVIDIA 2025,
    arXiv 2509.25149, Fig. 10 ablation: SR on the gradients is what the recipe needs)."""
    return _nvfp4_variant(sr=(), hadamard=("wgrad",), name="nvfp4-no-sr")


def nvfp4_sr_acts() -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the activations as well as the gradients (NVIDIA
    2025, arXiv 2509.25149, Fig. 10 ablation: SR on activations hurts)."""
    return _nvfp4_variant(
        sr=("gradients", "activations"), hadamard=("wgrad",), name="nvfp4-sr-acts"
    )


def nvfp4_sr_weights() -> GemmRecipe:
    """`nvfp4` with stochastic rounding on the weights as well as the gradients (NVIDIA 2025,
    arXiv 2509.25149, Fig. 10 ablation: SR on weights hurts)."""
    return _nvfp4_variant(sr=("gradients", "weights"), hadamard=("wgrad",), name="nvfp4-sr-weights")


def nvfp4_no_h() -> GemmRecipe:
    """`nvfp4` without the Hadamard on Wgrad (NVIDIA 2025, arXiv 2509.25149, Fig. 11 ablation:
    the Wgrad Hadamard helps)."""
    return _nvfp4_variant(sr=("gradients",), hadamard=(), name="nvfp4-no-h")


def nvfp4_h_fprop() -> GemmRecipe:
    """`nvfp4` with its 16x16 Hadamard on the forward GEMM as well as Wgrad (NVIDIA 2025,
    arXiv 2509.25149, Fig. 11 ablation: a Hadamard on Fprop hurts)."""
    return _nvfp4_variant(sr=("gradients",), hadamard=("fprop", "wgrad"), name="nvfp4-h-fprop")


def nvfp4_h_dgrad() -> GemmRecipe:
    """`nvfp4` with its 16x16 Hadamard on the input-gradient GEMM as well as Wgrad (NVIDIA 2025,
    arXiv 2509.25149, Fig. 11 ablation: a Hadamard on Dgrad hurts)."""
    return _nvfp4_variant(sr=("gradients",), hadamard=("dgrad", "wgrad"), name="nvfp4-h-dgrad")


def nvfp4_rl() -> GemmRecipe:
    """The NVFP4 recipe of the "4-bitter lesson" for RL.

    Source: humans& 2026, "The 4-bitter Lesson" (Miles PR #1261): 1x16 blocks with E4M3
    scales; per-token (row) FP32 outer scale for activations, per tensor for weights; no 2D
    blocks, no Hadamard, no stochastic rounding; four-over-six (MAE) on weights and activations;
    the backward in high precision on the dequantized forward operands.
    """
    return GemmRecipe(
        fprop_x=_nvfp4(scope="row", four_over_six="mae"),
        fprop_w=_nvfp4(four_over_six="mae"),
        backward="dequantized",
        name="nvfp4-rl",
    )


_REGISTRY: dict[str, Callable[[], GemmRecipe]] = {
    "fp32": fp32,
    "bf16": bf16,
    "fp16": fp16,
    "fp8": fp8,
    "mxfp8": mxfp8,
    "mxfp4": mxfp4,
    "mxfp4-h16": mxfp4_h16,
    "mxfp4-h32": mxfp4_h32,
    "mxfp4-sr": mxfp4_sr,
    "mxfp4-h16-rs": mxfp4_h16_rs,
    "nvfp4": nvfp4,
    "nvfp4-rl": nvfp4_rl,
    "nvfp4-no-sr": nvfp4_no_sr,
    "nvfp4-sr-acts": nvfp4_sr_acts,
    "nvfp4-sr-weights": nvfp4_sr_weights,
    "nvfp4-no-h": nvfp4_no_h,
    "nvfp4-h-fprop": nvfp4_h_fprop,
    "nvfp4-h-dgrad": nvfp4_h_dgrad,
}


def names() -> tuple[str, ...]:
    """The names `get` accepts."""
    return tuple(_REGISTRY)


def get(name: str | GemmRecipe | None) -> GemmRecipe | None:
    """The named recipe (a GemmRecipe passes through; None stays None = high precision)."""
    if name is None or isinstance(name, GemmRecipe):
        return name
    if name not in _REGISTRY:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]()


def doc(name: str) -> str:
    """The docstring (source and description) of a named recipe."""
    get(name)
    return _REGISTRY[name].__doc__ or ""
