"""When the quantizer runs as one CPU kernel call, and that call: x_hat of `quantize_dequantize`
where the kernel has it (`enabled`, `supports`, `rotates`, `dequantized_blocks`).

XLA compiles the reference quantizer (`fp4lab.core.scaling`, written in jnp) into about a
dozen fusions per operand shape: the block and tensor amaxes, the scalar chain of the outer
scale, the per-block scales and the element pass, and, below 2**-126, the exact arithmetic
of `fp4lab.core.subnormal`. A model that is not scanned holds one copy per GEMM operand, and
most of its first call is XLA compiling them (`benchmarks/step.py --model user`). On the CPU backend
the same x_hat comes from one call of the C++ kernel of `fp4lab.core.cpu_kernels`
(quantize.cc), bit for bit: the same float32 operations in the same order, in XLA's own
floating-point environment (tests/core/test_fused.py holds the two paths to the same bits over
every rule, format, tile, scope, rounding and the inputs at the edges of the range).

The kernel takes the block-scaled rules without a search across elements:

    block_scale "e4m3", convention "te", no four-over-six   NVFP4, outer "none" / "tensor" /
                                                             "row" (a given amax: "tensor")
    block_scale "e8m0"                                       MX, scale_rounding floor / ceil

over the float element formats (E2M1, E2M3, E3M2, E4M3, E5M2), RNE or stochastic rounding
(the threefry stream of `fp4lab.core.prng`, drawn in the kernel). A Hadamard rotation runs
in the kernel too where its blocks are the in-place view's block rows (`rotates`: a tile
(1, n) along an inner axis and a Hadamard of size n, as the NVFP4 recipe's Wgrad operands):
the operations of `fp4lab.core.hadamard` in its order (the signs, the power of two applied
to the bits, the butterflies), so the same bits, which are the written operations' at every
optimization level. Any other rotation runs in jnp before the kernel. The kernel's operand
and result travel as 2-D arrays (`cpu_kernels.quantize_blocks`), so the transposes XLA
places beside it stay tiled.
Everything else, and every backend but the CPU, runs the reference.

Which path runs by default is chosen per CPU class (the clone the CPU runs) from the measured
figures of `MEASURED`, the kernel's time over the jnp path's (the same bits either way): the
kernel where it measured no slower, else the jnp path (`choice()` says which and why; `fp4lab
run --verbose` and a run's provenance print it). FP4LAB_QUANTIZER=reference in the environment
makes the quantizers traced from then on run the reference, FP4LAB_QUANTIZER=kernel the
kernel, and FP4LAB_CPU_CLONE=baseline|avx2|avx512f the kernel's clone of that name (a forced
clone runs the kernel); `enabled()` says which, and keys the traces fp4lab keeps (the ops'
and fake_quant's), so a program traced after the change holds the other quantizer. A program
already compiled keeps its own. FP4LAB_TEST_JNP_FASTER=f divides the jnp path's figures by f
(a test switch: the default then picks the jnp path where the kernel is not f times faster).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fp4lab.core import cpu_kernels, formats, hadamard, prng
from fp4lab.core.spec import QuantSpec

__all__ = ["MEASURED", "enabled", "choice", "supports", "rotates", "dequantized_blocks"]

# The kernel's time over the jnp path's, per clone, and where it was measured: nvfp4 1x16
# fake-quant of 4096 x 4096 (`benchmarks/quantizer.py`, medians of interleaved rounds in one
# process, 2 cores; docs/performance.md has the tables, their loads and the step figures)
MEASURED = {
    "baseline": (1.01, "AMD EPYC, forced baseline clone: 0.98x, 1.03x in two runs, 2026-12-07"),
    "avx2": (0.83, "AMD EPYC (AVX2): 0.77x, 0.89x in two runs at load 9-10, 2026-12-07"),
    "avx512f": (0.78, "Intel Xeon (AVX-512), the user-model step, 2026-12-06"),
}

_RULES = {"e4m3": 0, ("e8m0", "floor"): 1, ("e8m0", "ceil"): 2}
_SCOPES = {"none": 0, "tensor": 1, "row": 2}


def enabled() -> str:
    """Which kernel quantizers traced now run: the clone of its element loops
    (`cpu_kernels.clone()`, FP4LAB_CPU_CLONE where set) on the CPU backend with the kernels
    built where `choice()` picks the kernel, else "" (the reference). The traces fp4lab keeps
    are keyed by it, so a change of the variables `choice` reads takes effect."""
    pick, _ = choice()
    return cpu_kernels.clone() if pick == "kernel" else ""


def choice() -> tuple[str, str]:
    """("kernel" or "reference", why in one line): the quantizer that quantizers traced now
    run. Forced by FP4LAB_QUANTIZER (reference or kernel) or FP4LAB_CPU_CLONE (its clone of
    the kernel); else on the CPU with the kernels, per CPU class (the clone this CPU runs) from
    `MEASURED`: the kernel where its time measured no more than the jnp path's (the jnp
    path's figure divided by FP4LAB_TEST_JNP_FASTER, a test switch, where set). Another
    backend, or no kernels here: the reference, saying why."""
    mode = os.environ.get("FP4LAB_QUANTIZER", "")
    if mode == "reference":
        return "reference", "the jnp quantizer: FP4LAB_QUANTIZER=reference"
    if jax.default_backend() != "cpu":
        return "reference", f"the jnp quantizer: the {jax.default_backend()} backend"
    if not cpu_kernels.available():
        return "reference", f"the jnp quantizer: no CPU kernels ({cpu_kernels.build_error()})"
    clone = cpu_kernels.clone()
    forced = os.environ.get("FP4LAB_CPU_CLONE", "")
    if mode == "kernel" or forced:
        how = f"FP4LAB_CPU_CLONE={forced}" if forced else "FP4LAB_QUANTIZER=kernel"
        return "kernel", f"the CPU kernel, its {clone} clone: {how}"
    ratio, where = MEASURED.get(clone, (float("inf"), "not measured"))
    faster = _faster(os.environ.get("FP4LAB_TEST_JNP_FASTER", ""))
    ratio *= faster  # the jnp path's time divided by `faster`
    said = f", FP4LAB_TEST_JNP_FASTER={faster:g}" if faster != 1.0 else ""
    if ratio <= 1.0:
        return "kernel", (
            f"the CPU kernel, its {clone} clone: it measured {ratio:.2f}x the jnp path's time "
            f"on this CPU class ({where}{said})"
        )
    return "reference", (
        f"the jnp quantizer: the kernel's {clone} clone measured {ratio:.2f}x its time on this "
        f"CPU class ({where}{said})"
    )


def _faster(text: str) -> float:
    """FP4LAB_TEST_JNP_FASTER's factor (1 where unset), a clear error where it is not > 0."""
    try:
        faster = float(text or 1.0)
    except ValueError:
        faster = 0.0
    if not faster > 0:
        raise ValueError(f"FP4LAB_TEST_JNP_FASTER={text!r}: give a number > 0, e.g. 100")
    return faster


def supports(spec: QuantSpec, key, amax) -> bool:
    """Whether the kernel computes `spec` (see the module docstring); `key` and `amax` as
    `quantize_dequantize` takes them (a stochastic key must be a Threefry key whose bits
    `prng.random_bits` draws itself)."""
    fmt = formats.get_format(spec.elem)
    if fmt.kind != "float" or spec.tile is None:
        return False
    if spec.block_scale == "e4m3":
        if spec.convention != "te" or spec.four_over_six is not None:
            return False
    elif spec.block_scale != "e8m0":
        return False
    if amax is not None and (spec.outer == "row" or np.size(amax) != 1):
        return False  # the reference reads (or rejects) one amax per row
    return spec.rounding == "rne" or prng.stream_words(key) is not None


def rotates(spec: QuantSpec, view) -> bool:
    """Whether the kernel rotates the operand too: `spec`'s Hadamard is one block row of the
    in-place view (`blocks.in_place_view`'s sizes, or None), a tile (1, n) along an inner
    axis with n the Hadamard's size (the Wgrad operands of the NVFP4 recipe)."""
    if spec.transform is None or view is None:
        return False
    *_, ty, tx = view
    return ty == 1 and tx == spec.transform.size


def dequantized_blocks(
    xb: jax.Array,
    spec: QuantSpec,
    key,
    amax,
    *,
    in_place: bool,
    rotate: bool = False,
    transform_key=None,
    count: bool = False,
    keep_rotated: bool = False,
):
    """x_hat of the blocked view xb (`fp4lab.core.blocks`', rotated, float32), as
    `dequant.dequantize_blocks` computes it from the reference's scales.

    Args:
      xb: (..., A, t1, B, t2), the moved layout's view, or with `in_place` the in-place view
        (P, L/tx, tx, Q/ty, ty) of `fp4lab.core.blocks`.
      spec: a spec the kernel `supports`.
      key: the rounding key (the first of `prng.split`), for stochastic rounding.
      amax: a given scope amax (delayed scaling), or None.
      rotate: xb is the in-place view not yet rotated, and the kernel rotates it first as
        `hadamard.rotate` does (only where `rotates`); x_hat is then in the rotated domain.
      transform_key: the Hadamard's key (read for its "random" signs), with `rotate`.
      count: also return the fraction of saturated elements (`cpu_kernels.quantize_blocks`).
      keep_rotated: with `rotate`, also return the rotated view (for the statistics).
    """
    fmt = formats.get_format(spec.elem)
    sr = spec.rounding == "stochastic"
    words = prng.stream_words(key) if sr else None
    words = jnp.zeros(2, jnp.uint32) if words is None else words
    given = amax is not None and spec.outer != "none"
    a = jnp.asarray(amax, jnp.float32).reshape(1) if given else jnp.zeros(1, jnp.float32)
    if spec.block_scale == "e4m3":
        rule = _RULES["e4m3"]
    else:
        rule = _RULES[("e8m0", spec.scale_rounding)]
    rotation = None
    if rotate:
        signs = hadamard.signs(spec.transform, transform_key)
        rotation = (signs, *hadamard.scale_split(spec.transform.size))
    return cpu_kernels.quantize_blocks(
        xb,
        words,
        a,
        rotation,
        count,
        keep_rotated,
        rule=rule,
        scope=_SCOPES[spec.outer] if spec.block_scale == "e4m3" else 0,
        given=int(given),
        sr=int(sr),
        stream=int(in_place),
        kmin=fmt.emin + 127,
        mbits=fmt.mbits,
        emax=fmt.emax,
        vmax=np.float32(fmt.max),
        inv_max=np.float32(1.0) / np.float32(fmt.max),
    )
