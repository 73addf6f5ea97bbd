"""Quantized convolution: the three GEMMs of a convolution with their own operand specs.

A convolution is a GEMM over (input channels x window) per output position. Each operand is
quantized along an axis its GEMM contracts (`fp4lab.ops.layout.ConvLayout`):

    Fprop  y  = conv(Q(x), Q(k))        x along its feature axis, k along its input-feature axis
    Dgrad  dx = conv^T(Q(dy), Q(k))     dy along its feature axis, k along its output-feature axis
    Wgrad  dk = corr(Q(x), Q(dy))       x and dy along their batch axis

The plan (`fp4lab.ops.plan`) is the one dot_general uses: the backward GEMMs are the ones
`jax.vjp(lax.conv_general_dilated)` runs on the operands the recipe's backward mode chooses, and
telemetry measures every quantized operand through the same probe. A Hadamard rotates both
operands of its GEMM along those axes and cancels (feature_group_count == 1).
"""

from __future__ import annotations

import dataclasses

from jax import lax

from fp4lab.core import recipes
from fp4lab.core.stats import check_method
from fp4lab.ops import custom_vjp
from fp4lab.ops.layout import ConvLayout
from fp4lab.ops.plan import Gemm, resolve_recipe

__all__ = ["qconv_general_dilated", "ConvGemm"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvGemm(Gemm):
    """A quantized lax.conv_general_dilated with fixed static arguments."""

    kwargs: tuple  # the conv's static arguments, as sorted (name, value) pairs
    conv_layout: ConvLayout

    def gemm(self, a, b):
        return lax.conv_general_dilated(a, b, **dict(self.kwargs))

    def layout(self, lhs_shape, rhs_shape) -> ConvLayout:
        return self.conv_layout


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def qconv_general_dilated(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
    batch_group_count=1,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    *,
    recipe: recipes.GemmRecipe | str | None,
    key=None,
    probe=None,
    stats: str = "fused",
    measure=None,
):
    """`lax.conv_general_dilated` with Fprop, Dgrad and Wgrad quantized as `recipe` says.

    `probe` is telemetry's gradient channel, as in `qdot_general`: when given, returns
    (y, forward statistics) and the probe's cotangent carries the backward statistics;
    `stats` says how they are computed (`fp4lab.core.stats.METHODS`), `measure` when (None:
    every call; a traced flag: where it is true).
    """
    if out_sharding is not None:
        raise ValueError("qconv_general_dilated does not support out_sharding")
    if feature_group_count != 1 or batch_group_count != 1:
        raise ValueError(
            "quantized convolutions support feature_group_count == batch_group_count == 1 only"
        )
    recipe, key = resolve_recipe(recipe, key)
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    conv_layout = ConvLayout(
        lhs_batch=dn.lhs_spec[0],
        lhs_feature=dn.lhs_spec[1],
        rhs_out=dn.rhs_spec[0],
        rhs_in=dn.rhs_spec[1],
        out_batch=dn.out_spec[0],
        out_feature=dn.out_spec[1],
    )
    kwargs = dict(
        window_strides=window_strides,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation,
        dimension_numbers=dn,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    gemm = ConvGemm(
        recipe=recipe,
        telemetry=probe is not None,
        stats=check_method(stats),
        kwargs=tuple(sorted((k, _hashable(v)) for k, v in kwargs.items())),
        conv_layout=conv_layout,
    )
    return custom_vjp.apply(gemm, lhs, rhs, (key, {}, measure), probe)
