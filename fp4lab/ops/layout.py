"""Operand layouts: where each GEMM of a quantized op contracts each of its operands.

A quantized op quantizes its operands in a layout of its own and maps the quantized values back:

    dot_general   lhs -> (B, M, K), rhs -> (B, N, K), dy -> (B, M, N): the batch, free and
                  contracting dimensions of the dimension numbers merged (`DotLayout`)
    conv          the operands as they are, contracted along their feature and batch axes
                  (`ConvLayout`)

`axes[name]` is the axis along which the operand `name` (`fp4lab.schema.OPERAND_NAMES`) is
quantized in that layout: its own GEMM's contraction axis (Wgrad: the token axis).

The Wgrad GEMM contracts over tokens (dot_general: the merged free axes M of lhs; conv: the
batch), whose count is whatever the data gives (4 sequences of 31 predicted tokens: 124). Where
the Wgrad operands' blocks or Hadamard rotation do not divide it, the plan zero-pads the token
axis of both operands in this layout (`pad_tokens`) and contracts the padded operands
(`contract_tokens`). That is exact: a zero row changes no block amax, the rotation is orthogonal
(H^T H = I, so (H x)^T (H dy) = x^T dy at the padded length), and padded rows add nothing to the
product.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import lax

__all__ = ["DotLayout", "ConvLayout", "pad_tokens"]


def pad_tokens(a, axis: int, length: int):
    """`a` zero-padded at the end of `axis` to `length` entries."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, length - a.shape[axis])
    return jnp.pad(a, widths)


@dataclasses.dataclass(frozen=True)
class DotLayout:
    """Maps dot_general operands to the canonical (B, M, K) / (B, N, K) / (B, M, N) layout."""

    lhs_shape: tuple
    rhs_shape: tuple
    dimension_numbers: tuple

    @property
    def axes(self) -> dict[str, int]:
        # Fprop contracts K (x, w: axis 2); Dgrad N (dy: axis 2, w: 1); Wgrad M (x, dy: axis 1).
        return {
            "fprop_x": 2,
            "fprop_w": 2,
            "dgrad_dy": 2,
            "dgrad_w": 1,
            "wgrad_x": 1,
            "wgrad_dy": 1,
        }

    @classmethod
    def of(cls, lhs_shape, rhs_shape, dimension_numbers) -> DotLayout:
        """The layout of dot_general operands; contracting and batch dimensions whose sizes
        differ between lhs and rhs raise a ValueError naming them."""
        (lc, rc), (lb, rb) = dimension_numbers
        dn = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
        for what, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
            sizes_l = tuple(lhs_shape[d] for d in ld)
            sizes_r = tuple(rhs_shape[d] for d in rd)
            if len(ld) != len(rd) or sizes_l != sizes_r:
                raise ValueError(
                    f"dot_general {what} dimensions differ: lhs axes {tuple(ld)} of shape "
                    f"{tuple(lhs_shape)} have sizes {sizes_l}, rhs axes {tuple(rd)} of shape "
                    f"{tuple(rhs_shape)} have sizes {sizes_r}"
                )
        return cls(tuple(lhs_shape), tuple(rhs_shape), dn)

    @property
    def token_axes(self) -> tuple[int, int]:
        """The token axis of the Wgrad operands (x, dy): M of (B, M, K) and of (B, M, N)."""
        return 1, 1

    def contract_tokens(self, x3, dy3, rhs, precision=None, preferred_element_type=None):
        """Wgrad on (token-padded) canonical operands: dw (B, N, K) = dy^T . x over M, in the
        original rhs layout and dtype."""
        dw3 = lax.dot_general(
            dy3,
            x3,
            (((1,), (1,)), ((0,), (0,))),
            precision=precision,
            preferred_element_type=preferred_element_type,
        )
        return self.rhs_from(dw3.astype(rhs.dtype))

    @property
    def lhs_perm(self) -> tuple:
        (lc, _), (lb, _) = self.dimension_numbers
        lf = tuple(d for d in range(len(self.lhs_shape)) if d not in lc and d not in lb)
        return lb + lf + lc

    @property
    def rhs_perm(self) -> tuple:
        (_, rc), (_, rb) = self.dimension_numbers
        rf = tuple(d for d in range(len(self.rhs_shape)) if d not in rc and d not in rb)
        return rb + rf + rc

    @property
    def bmnk(self) -> tuple[int, int, int, int]:
        (lc, _), (lb, _) = self.dimension_numbers
        b = math.prod(self.lhs_shape[d] for d in lb)
        k = math.prod(self.lhs_shape[d] for d in lc)
        m = math.prod(self.lhs_shape) // max(b * k, 1) if b * k else 0
        n = math.prod(self.rhs_shape) // max(b * k, 1) if b * k else 0
        return b, m, n, k

    def lhs_to(self, x):
        b, m, _, k = self.bmnk
        return jnp.transpose(x, self.lhs_perm).reshape(b, m, k)

    def rhs_to(self, w):
        b, _, n, k = self.bmnk
        return jnp.transpose(w, self.rhs_perm).reshape(b, n, k)

    def dy_to(self, dy):
        b, m, n, _ = self.bmnk
        return dy.reshape(b, m, n)

    def lhs_from(self, x3):
        return _from(x3, self.lhs_perm, self.lhs_shape)

    def rhs_from(self, w3):
        return _from(w3, self.rhs_perm, self.rhs_shape)


def _from(a3, perm, shape):
    a = a3.reshape([shape[p] for p in perm])
    return jnp.transpose(a, [perm.index(d) for d in range(len(shape))])


@dataclasses.dataclass(frozen=True)
class ConvLayout:
    """A convolution's operands stay as they are; each GEMM contracts its own axes of them.

    Fprop contracts input channels (x: its feature axis, the kernel: its input-feature axis),
    Dgrad output channels (dy: its feature axis, the kernel: its output-feature axis), Wgrad the
    batch (x and dy: their batch axes). Convolution windows are not blocked.
    """

    lhs_batch: int
    lhs_feature: int
    rhs_out: int
    rhs_in: int
    out_batch: int
    out_feature: int

    @property
    def token_axes(self) -> tuple[int, int]:
        """The token axis of the Wgrad operands (x, dy): their batch axes."""
        return self.lhs_batch, self.out_batch

    @property
    def axes(self) -> dict[str, int]:
        return {
            "fprop_x": self.lhs_feature,
            "fprop_w": self.rhs_in,
            "dgrad_dy": self.out_feature,
            "dgrad_w": self.rhs_out,
            "wgrad_x": self.lhs_batch,
            "wgrad_dy": self.out_batch,
        }

    def lhs_to(self, x):
        return x

    def rhs_to(self, w):
        return w

    def dy_to(self, dy):
        return dy

    def lhs_from(self, x):
        return x

    def rhs_from(self, w):
        return w
