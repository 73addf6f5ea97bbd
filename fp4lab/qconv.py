"""Quantized convolution: the three GEMMs of a convolution with their own operand specs.

A convolution is a GEMM over (input channels x window) per output position. Each operand is
quantized along an axis its GEMM contracts:

    Fprop  y  = conv(Q(x), Q(k))        x along its feature axis, k along its input-feature axis
    Dgrad  dx = conv^T(Q(dy), Q(k))     dy along its feature axis, k along its output-feature axis
    Wgrad  dk = corr(Q(x), Q(dy))       x and dy along their batch axis

The backward GEMMs are the ones `jax.vjp(lax.conv_general_dilated)` runs, on the operands the
recipe's backward mode chooses, exactly as `qdot_general` does for dot products. A Hadamard
rotates both operands of its GEMM along those axes and cancels (feature_group_count == 1).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax

from fp4lab import recipes as R
from fp4lab.qdot import _operand, operand_keys, resolve_recipe_and_key

__all__ = ["qconv_general_dilated"]


@dataclasses.dataclass(frozen=True)
class _Conv:
    recipe: R.GemmRecipe
    kwargs: tuple  # the conv's static arguments, as sorted (name, value) pairs
    axes: tuple  # (lhs batch, lhs feature, rhs out-feature, rhs in-feature, out batch, out feat)

    def conv(self, lhs, rhs):
        return lax.conv_general_dilated(lhs, rhs, **dict(self.kwargs))


def _fprop(c: _Conv, lhs, rhs, keys):
    r = c.recipe
    lb, lf, ro, ri, ob, of = c.axes
    t, tk = r.transform("fprop"), keys["fprop_transform"]
    x, _ = _operand(lhs, r.fprop_x, lf, t, keys["fprop_x"], tk, False)
    w, _ = _operand(rhs, r.fprop_w, ri, t, keys["fprop_w"], tk, False)
    return x, w


def _forward(c: _Conv, lhs, rhs, key):
    x, w = _fprop(c, lhs, rhs, operand_keys(key))
    return c.conv(x, w)


def _grads(c: _Conv, lhs, rhs, g, key):
    r = c.recipe
    keys = operand_keys(key)
    lb, lf, ro, ri, ob, of = c.axes
    if r.backward == "high_precision":
        w_d, dy_d, x_w, dy_w = rhs, g, lhs, g
    elif r.backward == "dequantized":
        if r.transform("fprop") is not None:
            raise ValueError(
                "backward='dequantized' with a rotated Fprop is not supported for "
                "convolutions; use backward='quantized' or drop the Hadamard"
            )
        x_hat, w_hat = _fprop(c, lhs, rhs, keys)
        w_d, dy_d, x_w, dy_w = w_hat, g, x_hat, g
    else:
        td, tw = r.transform("dgrad"), r.transform("wgrad")
        kd, kw = keys["dgrad_transform"], keys["wgrad_transform"]
        dy_d, _ = _operand(g, r.dgrad_dy, of, td, keys["dgrad_dy"], kd, False)
        w_d, _ = _operand(rhs, r.dgrad_w, ro, td, keys["dgrad_w"], kd, False)
        x_w, _ = _operand(lhs, r.wgrad_x, lb, tw, keys["wgrad_x"], kw, False)
        dy_w, _ = _operand(g, r.wgrad_dy, ob, tw, keys["wgrad_dy"], kw, False)
    _, vjp_lhs = jax.vjp(lambda a: c.conv(a, w_d), lhs)
    _, vjp_rhs = jax.vjp(lambda b: c.conv(x_w, b), rhs)
    (dx,) = vjp_lhs(dy_d.astype(g.dtype))
    (dw,) = vjp_rhs(dy_w.astype(g.dtype))
    return dx, dw


_forward = jax.jit(_forward, static_argnums=0)
_grads = jax.jit(_grads, static_argnums=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _qconv(c: _Conv, lhs, rhs, key):
    return _forward(c, lhs, rhs, key)


def _qconv_fwd(c, lhs, rhs, key):
    return _forward(c, lhs, rhs, key), (lhs, rhs, key)


def _qconv_bwd(c, res, g):
    lhs, rhs, key = res
    dx, dw = _grads(c, lhs, rhs, g, key)
    return dx, dw, None


_qconv.defvjp(_qconv_fwd, _qconv_bwd)


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
    recipe: R.GemmRecipe | str | None,
    key=None,
):
    """`lax.conv_general_dilated` with Fprop, Dgrad and Wgrad quantized as `recipe` says."""
    if out_sharding is not None:
        raise ValueError("qconv_general_dilated does not support out_sharding")
    if feature_group_count != 1 or batch_group_count != 1:
        raise ValueError(
            "quantized convolutions support feature_group_count == batch_group_count == 1 only"
        )
    recipe, key = resolve_recipe_and_key(recipe, key)
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    axes = (
        dn.lhs_spec[0],
        dn.lhs_spec[1],
        dn.rhs_spec[0],
        dn.rhs_spec[1],
        dn.out_spec[0],
        dn.out_spec[1],
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
    c = _Conv(recipe, tuple(sorted((k, _hashable(v)) for k, v in kwargs.items())), axes)
    return _qconv(c, lhs, rhs, key)
