"""Backends for the forward GEMM: `simulated` (the reference, any device) and `native`.

native uses the hardware's block-scaled matmul where the operand specs match what it computes:

  kind    operand specs (both)                                       hardware
  nvfp4   e2m1, 1x16, E4M3 blocks, tensor/no outer, convention "jax"  compute capability >= 10
  mxfp8   e4m3, 1x32, E8M0 "ceil" (RCEIL)                             compute capability >= 10
  fp8     e4m3/e5m2 per-tensor FP32 scale (no blocks)                 compute capability >= 8.9

The native path quantizes with fp4lab's own quantizer (bit-identical to jax.nn's, see the
tests), lays the operands out as `jax.nn.scaled_matmul` takes them, (B, M, K) values in the
narrow dtype and (B, M, K / block) scales, and multiplies the result by the two outer scales.
On the same quantized operands it matches the simulated backend within FP32 accumulation
order. `auto` picks native where the device supports it and says once which it chose.
Backward GEMMs always run simulated.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp

from fp4lab import schema
from fp4lab.core.quantize import QTensor, quantize
from fp4lab.core.spec import QuantSpec
from fp4lab.ops.layout import DotLayout

__all__ = [
    "Device",
    "current_device",
    "native_kind",
    "resolve",
    "native_fprop",
    "to_native",
    "reference_matmul",
    "reset_announcements",
]

_MIN_CC = {"nvfp4": 10.0, "mxfp8": 10.0, "fp8": 8.9}
_announced: set = set()


@dataclasses.dataclass(frozen=True)
class Device:
    platform: str  # "cpu", "gpu", "tpu"
    compute_capability: float | None = None  # CUDA compute capability, e.g. 9.0, 10.0
    name: str = ""


def current_device() -> Device:
    d = jax.devices()[0]
    cc = getattr(d, "compute_capability", None)
    return Device(d.platform, float(cc) if cc else None, getattr(d, "device_kind", ""))


def native_kind(lhs: QuantSpec | None, rhs: QuantSpec | None) -> str | None:
    """Which native kernel computes a GEMM with these operand specs, or None."""
    if lhs is None or rhs is None:
        return None
    for s in (lhs, rhs):
        if s.transform is not None or s.rounding != "rne" or s.four_over_six is not None:
            return None
    for kind, matches in (("nvfp4", _nvfp4), ("mxfp8", _mxfp8), ("fp8", _fp8)):
        if matches(lhs) and matches(rhs):
            return kind
    return None


def _nvfp4(s: QuantSpec) -> bool:
    return (
        s.elem == "e2m1"
        and s.tile == (1, 16)
        and s.block_scale == "e4m3"
        and s.outer in ("tensor", "none")
        and s.convention == "jax"
    )


def _mxfp8(s: QuantSpec) -> bool:
    return (
        s.elem == "e4m3"
        and s.tile == (1, 32)
        and s.block_scale == "e8m0"
        and s.scale_rounding == "ceil"
    )


def _fp8(s: QuantSpec) -> bool:
    return s.elem in ("e4m3", "e5m2") and s.tile is None and s.outer == "tensor"


def reset_announcements() -> None:
    """Forget which `auto` choices were announced, so the next one is said again."""
    _announced.clear()


def resolve(
    lhs: QuantSpec | None, rhs: QuantSpec | None, backend: str, device: Device | None = None
) -> str:
    """ "simulated" or "native" for a forward GEMM with these specs under `backend`."""
    schema.check_choice("qdot_general", "backend", backend, schema.BACKENDS)
    if backend == "simulated":
        return "simulated"
    device = device or current_device()
    kind = native_kind(lhs, rhs)
    cc = device.compute_capability
    ok = kind is not None and device.platform == "gpu" and cc is not None and cc >= _MIN_CC[kind]
    if backend == "native":
        if kind is None:
            raise ValueError(
                f"backend='native': no native kernel computes operands {lhs} x "
                f"{rhs}; native covers: {', '.join(_MIN_CC)} (see fp4lab.ops.native)"
            )
        if not ok:
            raise RuntimeError(
                f"backend='native': {kind} needs a GPU with compute capability >= "
                f"{_MIN_CC[kind]}, this is {device.platform} {device.name} (cc={cc}); "
                "use backend='simulated' or 'auto'"
            )
        return "native"
    choice = "native" if ok else "simulated"
    tag = (kind, device.platform, cc, choice)
    if tag not in _announced:
        _announced.add(tag)
        why = (
            ""
            if ok
            else (
                f" ({kind} not supported on {device.platform}, cc={cc})"
                if kind
                else " (no native kernel for these specs)"
            )
        )
        warnings.warn(f"fp4lab backend='auto' chose {choice}{why}", stacklevel=3)
    return choice


_NARROW = {"e2m1": jnp.float4_e2m1fn, "e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
_SCALE = {"e4m3": jnp.float8_e4m3fn, "e8m0": jnp.float8_e8m0fnu}


def to_native(q: QTensor) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(values in the narrow dtype (B, M, K), block scales (B, M, K/block), outer scalar).

    Exact: element values are on the narrow grid and block scales on the scale grid. Per-tensor
    FP8 has no block scales; it gets ones of shape (B, M, 1).
    """
    vals = q.values().astype(_NARROW[q.spec.elem])
    b, m, k = vals.shape
    if q.spec.block_scale is None:
        scales = jnp.ones((b, m, 1), jnp.float32)
    else:
        scales = q.scale.reshape(b, m, k // q.spec.tile[1]).astype(_SCALE[q.spec.block_scale])
    return vals, scales, jnp.asarray(q.outer, jnp.float32).reshape(-1)[0]


def native_fprop(
    lhs,
    rhs,
    dimension_numbers,
    lhs_spec: QuantSpec,
    rhs_spec: QuantSpec,
    *,
    preferred_element_type=None,
    matmul=None,
):
    """The forward GEMM on the native path.

    matmul(a, b, a_scales, b_scales, preferred_element_type) computes (B, M, N) from (B, M, K)
    and (B, N, K) operands; default: jax.nn.scaled_matmul for block-scaled kinds and an FP8
    dot_general (which XLA maps to the FP8 GEMM on Hopper) for per-tensor FP8. Tests pass a
    reference matmul to check the rest of the path on CPU.
    """
    kind = native_kind(lhs_spec, rhs_spec)
    if kind is None:
        raise ValueError(f"no native kernel for operand specs {lhs_spec} x {rhs_spec}")
    lay = DotLayout.of(lhs.shape, rhs.shape, dimension_numbers)
    qx = quantize(lay.lhs_to(lhs), lhs_spec.replace(axis=-1))
    qw = quantize(lay.rhs_to(rhs), rhs_spec.replace(axis=-1))
    a, sa, ga = to_native(qx)
    b, sb, gb = to_native(qw)
    if matmul is None:
        matmul = _fp8_matmul if kind == "fp8" else jax.nn.scaled_matmul
    out = matmul(a, b, sa, sb, preferred_element_type=jnp.float32)
    out = out * (ga * gb)
    (lc, _), (lb, _) = lay.dimension_numbers
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    (_, rc), (_, rb) = lay.dimension_numbers
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    shape = [lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf]
    dtype = preferred_element_type or jnp.result_type(lhs.dtype, rhs.dtype)
    return out.reshape(shape).astype(dtype)


def _fp8_matmul(a, b, sa, sb, preferred_element_type=jnp.float32):
    del sa, sb  # per-tensor FP8: scales are the outer factors, applied by the caller
    dn = (((2,), (2,)), ((0,), (0,)))
    return jax.lax.dot_general(a, b, dn, preferred_element_type=preferred_element_type)


def reference_matmul(a, b, sa, sb, preferred_element_type=jnp.float32):
    """What jax.nn.scaled_matmul computes, in FP32 on any device (jax.nn's docstring formula)."""
    a32 = a.astype(jnp.float32) * jnp.repeat(
        sa.astype(jnp.float32), a.shape[-1] // sa.shape[-1], axis=-1
    )
    b32 = b.astype(jnp.float32) * jnp.repeat(
        sb.astype(jnp.float32), b.shape[-1] // sb.shape[-1], axis=-1
    )
    out = jnp.einsum("bmk,bnk->bmn", a32, b32, precision=jax.lax.Precision.HIGHEST)
    return out.astype(preferred_element_type)
