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
from fp4lab.core.stats import check_method
from fp4lab.ops import custom_vjp, layout, native
from fp4lab.ops.layout import DotLayout
from fp4lab.ops.plan import Gemm, operand_keys, resolve_recipe

__all__ = ["qdot_general", "DotGemm"]


def _swap(a3):
    """(B, P, Q) -> (B, Q, P): puts a canonical operand's other axis last."""
    return jnp.swapaxes(a3, 1, 2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DotGemm(Gemm):
    """A quantized lax.dot_general with fixed dimension numbers and precision arguments."""

    dimension_numbers: tuple
    precision: object = None
    preferred_element_type: object = None
    backends: tuple = ("simulated",) * 3  # resolved, per GEMM: fprop, dgrad, wgrad
    matmul: object = None  # the native GEMM (None: the hardware's); checks pass a reference

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
        if self.backends[0] != "native":
            return super().forward(lhs, rhs, aux)
        r = self.recipe
        y = native.native_fprop(
            lhs,
            rhs,
            self.dimension_numbers,
            r.fprop_x,
            r.fprop_w,
            preferred_element_type=self.preferred_element_type,
            matmul=self.matmul,
        )
        if not self.telemetry:
            return y
        key, amax, when = aux  # the native operands are the simulated ones, bit for bit
        return y, self.fprop_stats(lhs, rhs, operand_keys(key), amax, when)

    def shares_weight(self, lhs_shape, rhs_shape) -> bool:
        return self.backends[:2] == ("simulated",) * 2 and super().shares_weight(
            lhs_shape, rhs_shape
        )

    def grads(self, lhs, rhs, g, aux, saved=None):
        """As the plan's, with Dgrad and Wgrad on the native GEMM where `backends` says.

        In the canonical layout Dgrad is dx (B, M, K) = dy (B, M, N) . w (B, N, K), contracting
        N: the native operands are dy and w^T, both quantized along N. Wgrad is
        dw (B, N, K) = dy^T . x, contracting the tokens M: the operands are dy^T and x^T. The
        simulated results they replace are dropped by the compiler; the telemetry of the
        backward operands is the simulator's (the same quantized values).
        """
        dx, dw, stats = super().grads(lhs, rhs, g, aux, saved)
        if "native" not in self.backends[1:]:
            return dx, dw, stats
        r, lay = self.recipe, self.layout(lhs.shape, rhs.shape)
        dy3 = lay.dy_to(g)
        if self.backends[1] == "native":
            w3 = lay.rhs_to(rhs)
            dx3 = native.native_matmul(dy3, _swap(w3), r.dgrad_dy, r.dgrad_w, matmul=self.matmul)
            dx = lay.lhs_from(dx3.astype(lhs.dtype))
        if self.backends[2] == "native":  # token-padded like the simulated Wgrad (exact)
            x3, dy3_w = lay.lhs_to(lhs), dy3
            tokens = x3.shape[1]
            padded = self.token_padding(lay, tokens)
            if padded != tokens:
                x3, dy3_w = (layout.pad_tokens(a, 1, padded) for a in (x3, dy3))
            dw3 = native.native_matmul(
                _swap(dy3_w), _swap(x3), r.wgrad_dy, r.wgrad_x, matmul=self.matmul
            )
            dw = lay.rhs_from(dw3.astype(rhs.dtype))
        return dx, dw, stats


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
    stats: str = "fused",
    measure=None,
):
    """`lax.dot_general` with the three GEMMs of training quantized as `recipe` says.

    Args:
      lhs, rhs, dimension_numbers, precision, preferred_element_type: as `lax.dot_general`.
      recipe: a GemmRecipe, a recipe name (`fp4lab.recipes.names()`) or None (no quantization).
      key: PRNG key for stochastic rounding and random Hadamard signs; required when the
        recipe uses them. Each operand and each GEMM rotation gets its own key folded from it.
      out_sharding: accepted for signature compatibility with flax; must be None.
      backend: "simulated" (reference), "native" (each GEMM whose operand specs match a
        hardware kernel runs on it, the others simulated; an error where the device cannot)
        or "auto" (native where the device supports it; says once what it chose), see
        `fp4lab.ops.native.gemm_backends`.
      probe: telemetry. A zero float32 array of shape (len(BWD_OPERANDS), len(STATS)) of
        `fp4lab.schema`; when given, returns (y, forward statistics (2, len(STATS))) and the
        probe's cotangent carries the backward statistics (Dgrad dy, Dgrad w, Wgrad x, Wgrad dy).
      stats: how the telemetry computes the statistics, `fp4lab.core.stats.METHODS`.
      measure: telemetry, with a probe: None measures every call; a traced boolean scalar
        measures only where it is true (a lax.cond; the statistics are zeros elsewhere), so one
        compiled step serves steps with and without statistics, and its GEMMs get the same
        operands either way.
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
        stats=check_method(stats),
        dimension_numbers=dn,
        precision=precision,
        preferred_element_type=preferred_element_type,
        backends=tuple(c.backend for c in native.gemm_backends(recipe, backend)),
    )
    return custom_vjp.apply(gemm, lhs, rhs, (key, amax, measure), probe)
