"""Quantized dot_general: Fprop, Dgrad and Wgrad with their own operand specs.

`qdot_general(lhs, rhs, dimension_numbers, recipe)` is a drop-in for `lax.dot_general`. Its
operands are quantized in the canonical layout of `fp4lab.ops.layout.DotLayout`, lhs -> (B, M, K)
and rhs -> (B, N, K), so any dimension numbers that flax layers use work; the plan of
`fp4lab.ops.plan` chooses and quantizes the operands of each GEMM, and the GEMMs are the ones
`jax.vjp(lax.dot_general)` runs, so a recipe without quantization is bit-identical to
`lax.dot_general` in values and gradients.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from fp4lab.core import recipes
from fp4lab.ops import native, scaffold
from fp4lab.ops.layout import DotLayout
from fp4lab.ops.plan import Gemm, operand_keys, resolve_recipe

__all__ = ["qdot_general", "DotGemm"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DotGemm(Gemm):
    """A quantized lax.dot_general with fixed dimension numbers and precision arguments."""

    dimension_numbers: tuple
    precision: object = None
    preferred_element_type: object = None
    backend: str = "simulated"  # resolved: "simulated" | "native" (the forward GEMM)

    def gemm(self, a, b):
        return lax.dot_general(
            a,
            b,
            self.dimension_numbers,
            precision=self.precision,
            preferred_element_type=self.preferred_element_type,
        )

    def layout(self, lhs_shape, rhs_shape) -> DotLayout:
        return DotLayout.of(lhs_shape, rhs_shape, self.dimension_numbers)

    def forward(self, lhs, rhs, aux):
        if self.backend != "native":
            return super().forward(lhs, rhs, aux)
        r = self.recipe
        y = native.native_fprop(
            lhs,
            rhs,
            self.dimension_numbers,
            r.fprop_x,
            r.fprop_w,
            preferred_element_type=self.preferred_element_type,
        )
        if not self.telemetry:
            return y
        key, amax = aux  # the native operands are the simulated ones, bit for bit
        _, _, stats = self.fprop_operands(
            lhs, rhs, operand_keys(key), amax, rotated=True, stats=True
        )
        return y, stats


def qdot_general(
    lhs,
    rhs,
    dimension_numbers,
    recipe: recipes.GemmRecipe | str | None,
    *,
    key=None,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    backend: str = "simulated",
    probe=None,
    amax: dict | None = None,
):
    """`lax.dot_general` with the three GEMMs of training quantized as `recipe` says.

    Args:
      lhs, rhs, dimension_numbers, precision, preferred_element_type: as `lax.dot_general`.
      recipe: a GemmRecipe, a recipe name (`fp4lab.recipes.names()`) or None (no quantization).
      key: PRNG key for stochastic rounding and random Hadamard signs; required when the
        recipe uses them. Each operand and each GEMM rotation gets its own key folded from it.
      out_sharding: accepted for signature compatibility with flax; must be None.
      backend: "simulated" (reference), "native" (hardware block-scaled GEMM for the forward;
        an error where unsupported) or "auto" (native where supported; says once which).
      probe: telemetry. A zero float32 array of shape (len(BWD_OPERANDS), len(STATS)) of
        `fp4lab.schema`; when given, returns (y, forward statistics (2, len(STATS))) and the
        probe's cotangent carries the backward statistics (Dgrad dy, Dgrad w, Wgrad x, Wgrad dy).
      amax: delayed scaling, {"x": amax, "w": amax}: the outer-scale amax to use for the
        lhs / rhs in every GEMM whose spec has amax_history > 0 (`fp4lab.nnx` keeps the
        histories); default: current scaling.
    Returns:
      dot_general(Q(lhs), Q(rhs)); its VJP runs Dgrad and Wgrad as the recipe's backward says.
    """
    if out_sharding is not None:
        raise ValueError("qdot_general does not support out_sharding")
    recipe, key = resolve_recipe(recipe, key)
    amax = {k: jnp.asarray(v, jnp.float32) for k, v in (amax or {}).items()}
    dn = DotLayout.of(lhs.shape, rhs.shape, dimension_numbers).dimension_numbers
    gemm = DotGemm(
        recipe=recipe,
        telemetry=probe is not None,
        dimension_numbers=dn,
        precision=precision,
        preferred_element_type=preferred_element_type,
        backend=native.resolve(recipe.fprop_x, recipe.fprop_w, backend),
    )
    return scaffold.apply(gemm, lhs, rhs, (key, amax), probe)
