"""Quantized dot_general: Fprop, Dgrad and Wgrad with their own operand specs.

`qdot_general(lhs, rhs, dimension_numbers, recipe)` is a drop-in for `lax.dot_general`. A
custom VJP runs the three GEMMs of ARCHITECTURE §3:

    Fprop  y  = Q(x) . Q(w)          quantized along the contraction axis K
    Dgrad  dx = Q(dy) . Q(w)^T       quantized along the output-feature axis N
    Wgrad  dw = Q(x)^T . Q(dy)       quantized along the token axis M

Operands are quantized in a canonical layout, lhs -> (B, M, K) and rhs -> (B, N, K), with the
batch, free and contracting dimensions of `dimension_numbers` merged, so any dimension numbers
that flax layers use work. The quantized values are mapped back to the original layout and
the GEMMs are the ones `jax.vjp(lax.dot_general)` runs, so a recipe without quantization is
bit-identical to `lax.dot_general` in values and gradients.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from fp4lab import recipes as R
from fp4lab import telemetry
from fp4lab import transforms as T
from fp4lab.quantize import QuantSpec, quantize_dequantize

__all__ = ["qdot_general", "Layout", "operand_keys"]

_OPERAND_INDEX = {
    "fprop_x": 0,
    "fprop_w": 1,
    "dgrad_dy": 2,
    "dgrad_w": 3,
    "wgrad_x": 4,
    "wgrad_dy": 5,
}
_GEMM_INDEX = {"fprop": 100, "dgrad": 101, "wgrad": 102}


def operand_keys(key: jax.Array) -> dict[str, jax.Array]:
    """Independent keys for the six operands and the three GEMM rotations of one call."""
    ks = {name: jax.random.fold_in(key, i) for name, i in _OPERAND_INDEX.items()}
    ks |= {f"{g}_transform": jax.random.fold_in(key, i) for g, i in _GEMM_INDEX.items()}
    return ks


@dataclasses.dataclass(frozen=True)
class Layout:
    """Maps dot_general operands to the canonical (B, M, K) / (B, N, K) / (B, M, N) layout."""

    lhs_shape: tuple
    rhs_shape: tuple
    dimension_numbers: tuple

    @classmethod
    def of(cls, lhs_shape, rhs_shape, dimension_numbers) -> Layout:
        (lc, rc), (lb, rb) = dimension_numbers
        dn = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
        return cls(tuple(lhs_shape), tuple(rhs_shape), dn)

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


def _operand(a3, spec: QuantSpec | None, axis: int, transform, key, tkey, stats: bool, amax=None):
    """Quantize-dequantize a canonical operand along `axis`, rotated by the GEMM's transform.

    Returns (x_hat, statistics or None); statistics are zeros for an unquantized operand.
    """
    none = jnp.zeros(len(telemetry.STATS), jnp.float32) if stats else None
    if spec is None and transform is None:
        return a3, none
    if spec is None:  # unquantized operand of a rotated GEMM: rotate only
        moved = jnp.moveaxis(a3, axis, -1)
        return jnp.moveaxis(T.rotate(moved, transform, tkey), -1, axis).astype(a3.dtype), none
    spec = spec.replace(axis=axis, transform=transform)
    amax = amax if spec.amax_history else None  # delayed scaling only where the spec asks
    if stats:
        x_hat, s = telemetry.operand_stats(a3, spec, key=key, transform_key=tkey, amax=amax)
        return x_hat, s
    return (
        quantize_dequantize(a3, spec, key=key, transform_key=tkey, amax=amax, rotated=True),
        None,
    )


@dataclasses.dataclass(frozen=True)
class _Config:
    recipe: R.GemmRecipe
    dimension_numbers: tuple
    precision: object
    preferred_element_type: object
    backend: str = "simulated"  # resolved: "simulated" | "native"
    telemetry: bool = False  # measure operand statistics (forward output, backward probe)

    def replace(self, **changes) -> _Config:
        return dataclasses.replace(self, **changes)


def _dot(cfg: _Config, a, b):
    return lax.dot_general(
        a,
        b,
        cfg.dimension_numbers,
        precision=cfg.precision,
        preferred_element_type=cfg.preferred_element_type,
    )


def _fprop_operands(cfg: _Config, lhs, rhs, keys, amax, *, rotated: bool):
    """Dequantized Fprop operands in the original layout (rotated domain if `rotated`), and
    their statistics (None without telemetry)."""
    r = cfg.recipe
    lay = Layout.of(lhs.shape, rhs.shape, cfg.dimension_numbers)
    t = r.transform("fprop")
    tkey = keys["fprop_transform"]
    on = cfg.telemetry
    x3, sx = _operand(lay.lhs_to(lhs), r.fprop_x, 2, t, keys["fprop_x"], tkey, on, amax.get("x"))
    w3, sw = _operand(lay.rhs_to(rhs), r.fprop_w, 2, t, keys["fprop_w"], tkey, on, amax.get("w"))
    if t is not None and not rotated:
        x3 = T.unrotate(x3, t, tkey).astype(lhs.dtype)
        w3 = T.unrotate(w3, t, tkey).astype(rhs.dtype)
    stats = jnp.stack([sx, sw]) if cfg.telemetry else None
    return lay.lhs_from(x3), lay.rhs_from(w3), stats


def _forward(cfg: _Config, lhs, rhs, aux):
    key, amax = aux
    """y, and the forward statistics (2, len(STATS)) with telemetry."""
    if cfg.backend == "native":
        from fp4lab.backends import native_fprop  # backends builds on this module's Layout

        y = native_fprop(
            lhs,
            rhs,
            cfg.dimension_numbers,
            cfg.recipe.fprop_x,
            cfg.recipe.fprop_w,
            preferred_element_type=cfg.preferred_element_type,
        )
        if cfg.telemetry:  # the native operands are the simulated ones, bit for bit
            _, _, stats = _fprop_operands(cfg, lhs, rhs, operand_keys(key), amax, rotated=True)
            return y, stats
        return y
    x_hat, w_hat, stats = _fprop_operands(cfg, lhs, rhs, operand_keys(key), amax, rotated=True)
    y = _dot(cfg, x_hat, w_hat)
    return (y, stats) if cfg.telemetry else y


def _backward_operands(cfg: _Config, lhs, rhs, g, keys, amax):
    """(w for Dgrad, dy for Dgrad, x for Wgrad, dy for Wgrad) in the original layouts, and the
    backward statistics (4, len(STATS)) with telemetry (zeros where nothing is quantized)."""
    r = cfg.recipe
    zeros = jnp.zeros((4, len(telemetry.STATS)), jnp.float32) if cfg.telemetry else None
    if r.backward == "high_precision":
        return (rhs, g, lhs, g), zeros
    if r.backward == "dequantized":
        x_hat, w_hat, _ = _fprop_operands(
            cfg.replace(telemetry=False), lhs, rhs, keys, amax, rotated=False
        )
        return (w_hat, g, x_hat, g), zeros
    lay = Layout.of(lhs.shape, rhs.shape, cfg.dimension_numbers)
    dy3 = lay.dy_to(g)
    td, tw = r.transform("dgrad"), r.transform("wgrad")
    kd, kw = keys["dgrad_transform"], keys["wgrad_transform"]
    on = cfg.telemetry
    # Dgrad contracts N: dy3 (B, M, N) along axis 2, w3 (B, N, K) along axis 1.
    dy_d, s0 = _operand(dy3, r.dgrad_dy, 2, td, keys["dgrad_dy"], kd, on)
    w_d, s1 = _operand(lay.rhs_to(rhs), r.dgrad_w, 1, td, keys["dgrad_w"], kd, on, amax.get("w"))
    # Wgrad contracts M: x3 (B, M, K) along axis 1, dy3 (B, M, N) along axis 1.
    x_w, s2 = _operand(lay.lhs_to(lhs), r.wgrad_x, 1, tw, keys["wgrad_x"], kw, on, amax.get("x"))
    dy_w, s3 = _operand(dy3, r.wgrad_dy, 1, tw, keys["wgrad_dy"], kw, on)
    operands = (lay.rhs_from(w_d), dy_d.reshape(g.shape), lay.lhs_from(x_w), dy_w.reshape(g.shape))
    return operands, (jnp.stack([s0, s1, s2, s3]) if on else None)


def _grads(cfg: _Config, lhs, rhs, g, aux):
    key, amax = aux
    (w_d, dy_d, x_w, dy_w), stats = _backward_operands(cfg, lhs, rhs, g, operand_keys(key), amax)
    _, vjp_lhs = jax.vjp(lambda a: _dot(cfg, a, w_d), lhs)
    _, vjp_rhs = jax.vjp(lambda b: _dot(cfg, x_w, b), rhs)
    (dx,) = vjp_lhs(dy_d.astype(g.dtype))
    (dw,) = vjp_rhs(dy_w.astype(g.dtype))
    return dx, dw, stats


# Each GEMM's quantize-dot-dequantize is one compiled computation per config and shape, also
# when called eagerly (op-by-op dispatch of the quantizer's many small ops is slow).
_forward = jax.jit(_forward, static_argnums=0)
_grads = jax.jit(_grads, static_argnums=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _qdot(cfg: _Config, lhs, rhs, aux):
    return _forward(cfg, lhs, rhs, aux)


def _qdot_fwd(cfg, lhs, rhs, aux):
    return _forward(cfg, lhs, rhs, aux), (lhs, rhs, aux)


def _qdot_bwd(cfg, res, g):
    lhs, rhs, aux = res
    dx, dw, _ = _grads(cfg, lhs, rhs, g, aux)
    return dx, dw, None


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _qdot_probed(cfg: _Config, lhs, rhs, aux, probe):
    """_qdot with telemetry: returns (y, forward stats); probe's cotangent = backward stats."""
    del probe
    return _forward(cfg, lhs, rhs, aux)


def _qdot_probed_fwd(cfg, lhs, rhs, aux, probe):
    del probe
    return _forward(cfg, lhs, rhs, aux), (lhs, rhs, aux)


def _qdot_probed_bwd(cfg, res, cotangents):
    lhs, rhs, aux = res
    g, _ = cotangents
    dx, dw, stats = _grads(cfg, lhs, rhs, g, aux)
    return dx, dw, None, stats


_qdot_probed.defvjp(_qdot_probed_fwd, _qdot_probed_bwd)


def resolve_recipe_and_key(recipe, key):
    """(GemmRecipe, key) for a quantized op: names looked up, None = no quantization; a key is
    required where the recipe draws random numbers, and a fixed unused one stands in elsewhere."""
    recipe = R.get(recipe) or R.GemmRecipe()
    if recipe.needs_key and key is None:
        raise ValueError(
            f"recipe {recipe.name or recipe} needs a PRNG key (stochastic rounding "
            "or random Hadamard signs); pass key=..."
        )
    if key is None:
        key = jax.random.key(0)  # never consumed: the recipe is deterministic
    return recipe, key


def qdot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    recipe: R.GemmRecipe | str | None,
    *,
    key: jax.Array | None = None,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    backend: str = "simulated",
    probe: jax.Array | None = None,
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
      probe: telemetry. A zero float32 array of shape (4, len(telemetry.STATS)); when given,
        returns (y, forward statistics (2, len(STATS))) and the probe's cotangent carries the
        backward statistics (Dgrad dy, Dgrad w, Wgrad x, Wgrad dy) of fp4lab.telemetry.
      amax: delayed scaling, {"x": amax, "w": amax}: the outer-scale amax to use for the
        lhs / rhs in every GEMM whose spec has amax_history > 0 (see fp4lab.inject, which
        keeps the histories); default: current scaling.
    Returns:
      dot_general(Q(lhs), Q(rhs)); its VJP runs Dgrad and Wgrad as the recipe's backward says.
    """
    if out_sharding is not None:
        raise ValueError("qdot_general does not support out_sharding")
    recipe, key = resolve_recipe_and_key(recipe, key)
    amax = {k: jnp.asarray(v, jnp.float32) for k, v in (amax or {}).items()}
    from fp4lab.backends import resolve  # backends builds on this module's Layout

    dn = Layout.of(lhs.shape, rhs.shape, dimension_numbers).dimension_numbers
    backend = resolve(recipe.fprop_x, recipe.fprop_w, backend)
    cfg = _Config(recipe, dn, precision, preferred_element_type, backend, probe is not None)
    if probe is None:
        return _qdot(cfg, lhs, rhs, (key, amax))
    return _qdot_probed(cfg, lhs, rhs, (key, amax), probe)
