"""Backends for the three GEMMs: `simulated` (the reference, any device) and `native`.

native uses the hardware's block-scaled matmul where the operand specs match what it computes:

  kind    operand specs (both)                                       hardware
  nvfp4   e2m1, 1x16, E4M3 blocks, tensor/no outer, convention "jax"  compute capability >= 10
  mxfp8   e4m3, 1x32, E8M0 "ceil" (RCEIL)                             compute capability >= 10
  fp8     e4m3/e5m2 per-tensor FP32 scale (no blocks)                 compute capability >= 8.9

Each GEMM is judged on its own two operand specs: Fprop (x, w) contracting K, Dgrad (dy, w)
contracting N, Wgrad (x, dy) contracting the tokens M. `gemm_backends(recipe, backend)` says
for each where it runs and why; a GEMM without a native kind (other specs, stochastic rounding,
a Hadamard, 2D tiles, delayed scaling, or a backward mode that quantizes nothing) runs
simulated.

The native path quantizes with fp4lab's own quantizer (bit-identical to jax.nn's, see the
tests) along the GEMM's own contraction axis, lays the operands out as `jax.nn.scaled_matmul`
takes them, (B, M, K) values in the narrow dtype and (B, M, K / block) scales, and multiplies
the result by the two outer scales (`native_matmul`). On the same quantized operands it matches
the simulated backend within FP32 accumulation order. `auto` picks native where the device
supports it and says once what it chose.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fp4lab import schema
from fp4lab.core.quantize import QTensor, quantize
from fp4lab.core.recipes import GemmRecipe
from fp4lab.core.spec import QuantSpec
from fp4lab.ops.layout import DotLayout
from fp4lab.schema import GEMMS, OPERANDS

__all__ = [
    "Device",
    "current_device",
    "native_kind",
    "resolve",
    "Choice",
    "gemm_backends",
    "native_matmul",
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
        if s.amax_history:  # delayed scaling: the simulator's amax comes from model state
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


def _supported(kind: str, device: Device) -> bool:
    cc = device.compute_capability
    return device.platform == "gpu" and cc is not None and cc >= _MIN_CC[kind]


def _where(device: Device) -> str:
    """The device in words: "cpu", "gpu NVIDIA H100 (cc=9.0)"."""
    name = (
        device.platform
        if device.name in ("", device.platform)
        else f"{device.platform} {device.name}"
    )
    cc = device.compute_capability
    return name if cc is None else f"{name} (cc={cc})"


def _unsupported(kind: str, device: Device) -> str:
    return (
        f"{kind} needs a GPU with compute capability >= {_MIN_CC[kind]}, this is {_where(device)}"
    )


def resolve(
    lhs: QuantSpec | None, rhs: QuantSpec | None, backend: str, device: Device | None = None
) -> str:
    """ "simulated" or "native" for one GEMM with these operand specs under `backend`.

    "native" raises where no native kernel computes these specs (ValueError) or the device
    cannot run it (RuntimeError); "auto" falls back to simulated and says so once.
    """
    schema.check_choice("qdot_general", "backend", backend, schema.BACKENDS)
    if backend == "simulated":
        return "simulated"
    device = device or current_device()
    kind = native_kind(lhs, rhs)
    ok = kind is not None and _supported(kind, device)
    if backend == "native":
        if kind is None:
            raise ValueError(
                f"backend='native': no native kernel computes operands {lhs} x "
                f"{rhs}; native covers: {', '.join(_MIN_CC)} (see fp4lab.ops.native)"
            )
        if not ok:
            raise RuntimeError(
                f"backend='native': {_unsupported(kind, device)}; use backend='simulated' or 'auto'"
            )
        return "native"
    choice = "native" if ok else "simulated"
    if not ok:
        why = f" ({_unsupported(kind, device)})" if kind else " (no native kernel for these specs)"
    _announce(f"fp4lab backend='auto' chose {choice}" + ("" if ok else why))
    return choice


def _announce(message: str) -> None:
    if message not in _announced:
        _announced.add(message)
        warnings.warn(message, stacklevel=4)


class Choice(NamedTuple):
    """Where one GEMM of a quantized op runs, and why."""

    gemm: str  # "fprop" | "dgrad" | "wgrad"
    backend: str  # "simulated" | "native"
    kind: str | None  # the native kind its specs match (nvfp4, mxfp8, fp8), or None
    reason: str


def gemm_backends(
    recipe: GemmRecipe, backend: str, device: Device | None = None
) -> tuple[Choice, Choice, Choice]:
    """Fprop, Dgrad and Wgrad under `backend`: each runs natively where its two operand specs
    match a native kind the device runs, else simulated, with the reason.

    backend="native" raises RuntimeError where the device cannot run a GEMM's native kind, and
    ValueError where no GEMM of the recipe has one; "auto" falls back and says once what it
    chose. The Dgrad and Wgrad of backward modes other than "quantized" quantize nothing of
    their own and run simulated.
    """
    schema.check_choice("qdot_general", "backend", backend, schema.BACKENDS)
    if backend != "simulated":
        device = device or current_device()
    choices = []
    for gemm in GEMMS:
        if gemm != "fprop" and recipe.backward != "quantized":
            kind, why = None, f"backward={recipe.backward!r} quantizes no operand of its own"
        else:
            kind = native_kind(*(recipe.spec(gemm, o) for o in OPERANDS[gemm]))
            why = "no native kernel for these specs"
        if backend == "simulated":
            choices.append(Choice(gemm, "simulated", kind, "backend='simulated'"))
        elif kind is None:
            choices.append(Choice(gemm, "simulated", None, why))
        elif _supported(kind, device):
            choices.append(Choice(gemm, "native", kind, f"{kind} on {_where(device)}"))
        elif backend == "native":
            raise RuntimeError(
                f"backend='native': {gemm}: {_unsupported(kind, device)}; "
                "use backend='simulated' or 'auto'"
            )
        else:
            choices.append(Choice(gemm, "simulated", kind, _unsupported(kind, device)))
    if backend == "native" and all(c.kind is None for c in choices):
        raise ValueError(
            f"backend='native': no GEMM of recipe {recipe.name or recipe} matches a native "
            f"kernel; native covers: {', '.join(_MIN_CC)} (see fp4lab.ops.native)"
        )
    if backend == "auto":
        said = "; ".join(f"{c.gemm} {c.backend} ({c.reason})" for c in choices)
        _announce(f"fp4lab backend='auto' for {recipe.name or 'a custom recipe'}: {said}")
    return tuple(choices)


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


def native_matmul(a, b, a_spec: QuantSpec, b_spec: QuantSpec, *, matmul=None) -> jax.Array:
    """One native GEMM on canonical operands: (B, M, K) x (B, N, K) -> (B, M, N) float32.

    Quantizes both operands along their last axis (the contraction) with fp4lab's quantizer,
    runs the kind's hardware GEMM and multiplies by the two outer scales.
    matmul(a, b, a_scales, b_scales, preferred_element_type): default jax.nn.scaled_matmul for
    block-scaled kinds and an FP8 dot_general (which XLA maps to the FP8 GEMM on Hopper) for
    per-tensor FP8; tests pass a reference matmul to check the rest of the path on CPU.
    """
    kind = native_kind(a_spec, b_spec)
    if kind is None:
        raise ValueError(f"no native kernel for operand specs {a_spec} x {b_spec}")
    qa = quantize(a, a_spec.replace(axis=-1))
    qb = quantize(b, b_spec.replace(axis=-1))
    va, sa, ga = to_native(qa)
    vb, sb, gb = to_native(qb)
    if matmul is None:
        matmul = _fp8_matmul if kind == "fp8" else jax.nn.scaled_matmul
    out = matmul(va, vb, sa, sb, preferred_element_type=jnp.float32)
    return out * (ga * gb)


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
    """The forward GEMM of a dot_general on the native path (`native_matmul` in the canonical
    layout of `DotLayout`), in the output shape and dtype of lax.dot_general."""
    lay = DotLayout.of(lhs.shape, rhs.shape, dimension_numbers)
    out = native_matmul(lay.lhs_to(lhs), lay.rhs_to(rhs), lhs_spec, rhs_spec, matmul=matmul)
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
