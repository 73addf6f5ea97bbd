"""Gradient-flow telemetry: where quantization error enters and how it accumulates.

Per quantized operand of every GEMM (forward and backward), per logged step:

    rel_err     ||x_hat - x|| / ||x||                      (0 for an all-zero operand)
    bias        mean(x_hat - x) / mean|x|                  signed; RNE on E2M1 shrinks (< 0)
    flush       #(x != 0 and x_hat == 0) / #(x != 0)       elements flushed to zero
    saturated   #(clipped to the largest code of their block) / #elements
    underflow   #(blocks with nonzero input and all-zero output) / #blocks
    map4        #(blocks that chose map-to-4) / #blocks    four-over-six only (else 0)

computed in the domain the GEMM sees (after any Hadamard rotation). Forward statistics are kept
in an `OpStats` variable of each quantized op; backward statistics leave the custom VJP through
the gradient channel: a zero `GradProbe` input whose cotangent carries them, so model code does
not change. `value_and_grad` differentiates the model's Params and probes together and returns
the Param gradients and the flat metrics separately.

Per layer, `shadow_metrics` compares the quantized gradient g_q with the exact gradient g at the
same parameters and batch: cosine, relative norm ||g_q|| / ||g||, and the gradient-to-noise
ratio ||g|| / ||g_q - g|| (Chmiel et al. 2025, arXiv 2505.19115: training stalls below sqrt(3)).
The ratio is +inf when g_q == g exactly (the documented sentinel for "no noise").

Metrics are flat dicts with "/"-separated keys, `quant/<layer>/<gemm>/<operand>/<stat>` and
`grad/<layer>/<stat>`; `to_frame` turns them into tidy rows (step, layer, gemm, operand, stat,
value).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from flax import nnx

from fp4lab import formats as F
from fp4lab import scaling as S
from fp4lab.quantize import QuantSpec, _dequantize_blocks, _grid_values, _quantize_blocks, _restore

__all__ = [
    "STATS",
    "FWD_OPERANDS",
    "BWD_OPERANDS",
    "SQRT3",
    "GradProbe",
    "OpStats",
    "operand_stats",
    "value_and_grad",
    "collect",
    "set_enabled",
    "exact_grads",
    "shadow_metrics",
    "to_frame",
]

STATS = ("rel_err", "bias", "flush", "saturated", "underflow", "map4")
FWD_OPERANDS = (("fprop", "x"), ("fprop", "w"))
BWD_OPERANDS = (("dgrad", "dy"), ("dgrad", "w"), ("wgrad", "x"), ("wgrad", "dy"))
SQRT3 = math.sqrt(3.0)


class GradProbe(nnx.Variable):
    """A zero input of a quantized op whose cotangent carries its backward statistics."""


class OpStats(nnx.Variable):
    """Forward statistics of a quantized op's latest call."""


@functools.partial(jax.jit, static_argnames="spec")
def operand_stats(a: jax.Array, spec: QuantSpec, *, key=None, transform_key=None, amax=None):
    """Quantizes `a` under `spec` and measures the error.

    Returns (x_hat, stats): x_hat as `quantize(...).dequantize(rotated=True)` gives it, and a
    float32 vector with the entries of `STATS`.
    """
    a = jnp.asarray(a)
    xb, scaled, scope, transform_key = _quantize_blocks(a, spec, key, transform_key, amax)
    fmt = F.get_format(spec.elem)
    vals_b = _grid_values(scaled.q, fmt)
    xhat_b = _dequantize_blocks(scaled, fmt, scope)
    err = xhat_b - xb
    norm_x = jnp.sqrt(jnp.sum(xb * xb))
    rel = jnp.where(norm_x > 0, jnp.sqrt(jnp.sum(err * err)) / jnp.where(norm_x > 0, norm_x, 1), 0)
    mean_abs = jnp.mean(jnp.abs(xb))
    bias = jnp.where(mean_abs > 0, jnp.mean(err) / jnp.where(mean_abs > 0, mean_abs, 1), 0)
    nonzero = xb != 0
    flush = jnp.sum(nonzero & (xhat_b == 0)) / jnp.maximum(jnp.sum(nonzero), 1)
    top = jnp.abs(vals_b) == jnp.float32(fmt.max)
    saturated = jnp.mean(top & (jnp.abs(xb) > jnp.abs(xhat_b)))
    live = S.block_amax(xb) > 0
    dead = S.block_amax(xhat_b) == 0
    underflow = jnp.mean(live & dead)
    map4 = jnp.float32(0.0) if scaled.map4 is None else jnp.mean(scaled.map4)
    stats = jnp.stack([rel, bias, flush, saturated, underflow, map4]).astype(jnp.float32)
    x_hat = _restore(S.unblock(xhat_b), spec, a.shape, a.dtype, transform_key, rotated=True)
    return x_hat, stats


# ---------------------------------------------------------------------------------------------
# Collection from a model.


def _ops(model):
    from fp4lab.inject import QuantizedOp  # inject builds on this module

    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.probe is not None and m.measure:
            yield m


def _flatten(layer: str, table: jax.Array, operands) -> dict[str, jax.Array]:
    out = {}
    for i, (gemm, operand) in enumerate(operands):
        for j, stat in enumerate(STATS):
            out[f"quant/{layer}/{gemm}/{operand}/{stat}"] = table[i, j]
    return out


def set_enabled(model, on: bool):
    """Switches measurement of a model's telemetry-enabled ops on or off, in place.

    Log every k steps with `set_enabled(model, step % k == 0)` before a jitted step: the flag is
    static, so nnx.jit compiles the step once with and once without statistics, and steps
    without them cost exactly what a model without telemetry costs.
    """
    from fp4lab.inject import QuantizedOp  # inject builds on this module

    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.probe is not None:
            m.measure = bool(on)
    return model


def collect(model, probe_grads=None) -> dict[str, jax.Array]:
    """Flat metrics of every telemetry-enabled op: forward stats, and backward stats from the
    probe gradients (`value_and_grad` passes them) when given."""
    metrics = {}
    probes = {}
    if probe_grads is not None:
        for path, v in nnx.to_flat_state(probe_grads):
            probes[tuple(path[:-1])] = v[...] if hasattr(v, "get_value") else v
    paths = {id(m): p for p, m in nnx.iter_modules(model)}
    for op in _ops(model):
        fwd = op.fstats[...]
        bwd = probes.get(tuple(paths[id(op)]))
        for call, layer in enumerate(op.stat_layers()):
            metrics |= _flatten(layer, fwd[call], FWD_OPERANDS)
            if bwd is not None:
                metrics |= _flatten(layer, bwd[call], BWD_OPERANDS)
    return metrics


def value_and_grad(loss_fn, *, has_aux: bool = False):
    """Like nnx.value_and_grad(loss_fn) on the model (first argument), with telemetry.

    Returns a function (model, *args) -> (value, param_grads, metrics): the Param gradients
    only (feed them to the optimizer) and the flat telemetry metrics.
    """

    def wrapped(model, *args, **kwargs):
        diff = nnx.DiffState(0, nnx.Any(nnx.Param, GradProbe))
        value, grads = nnx.value_and_grad(loss_fn, argnums=diff, has_aux=has_aux)(
            model, *args, **kwargs
        )
        param_grads, probe_grads = nnx.split_state(grads, nnx.Param, GradProbe)
        return value, param_grads, collect(model, probe_grads)

    return wrapped


def exact_grads(loss_fn, model, *args, **kwargs):
    """The shadow: Param gradients of `loss_fn` at the same parameters and batch, with every
    quantized op of `model` bypassed (a clone; the model is not changed)."""
    from fp4lab.inject import unquantize  # inject builds on this module

    shadow = unquantize(nnx.clone(model))
    return nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(shadow, *args, **kwargs)


def shadow_metrics(grads_q, grads_exact) -> dict[str, jax.Array]:
    """Per parameter: cosine, relative norm and gradient-to-noise ratio of g_q against g."""
    metrics = {}
    flat_q = dict(nnx.to_flat_state(grads_q))
    for path, g in nnx.to_flat_state(grads_exact):
        gq = flat_q[path]
        g = g[...] if hasattr(g, "get_value") else g
        gq = gq[...] if hasattr(gq, "get_value") else gq
        layer = ".".join(str(p) for p in path)
        g32, gq32 = g.astype(jnp.float32).ravel(), gq.astype(jnp.float32).ravel()
        n, nq, noise = (jnp.linalg.norm(v) for v in (g32, gq32, gq32 - g32))
        denom = jnp.where(n * nq > 0, n * nq, 1.0)
        cos = jnp.where(n * nq > 0, jnp.dot(g32, gq32) / denom, jnp.where(n == nq, 1.0, 0.0))
        rel = jnp.where(n > 0, nq / jnp.where(n > 0, n, 1.0), jnp.where(nq == 0, 1.0, jnp.inf))
        gnr = jnp.where(noise > 0, n / jnp.where(noise > 0, noise, 1.0), jnp.inf)
        metrics |= {
            f"grad/{layer}/cos": cos,
            f"grad/{layer}/rel_norm": rel,
            f"grad/{layer}/gnr": gnr,
            f"grad/{layer}/below_sqrt3": gnr < SQRT3,
        }
    return metrics


def to_frame(metrics: dict, step=None) -> pd.DataFrame:
    """Tidy rows (step, layer, gemm, operand, stat, value) from flat metrics.

    Values may be scalars (one step: `step` labels it) or arrays with a leading step axis
    (e.g. stacked by lax.scan; `step` then gives the step numbers, default 0..n-1).
    """
    rows = []
    for key, value in metrics.items():
        parts = key.split("/")
        if parts[0] == "quant" and len(parts) == 5:
            _, layer, gemm, operand, stat = parts
        elif parts[0] == "grad" and len(parts) == 3:
            _, layer, stat = parts
            gemm, operand = "wgrad", "grad"
        else:
            continue
        v = np.asarray(value, np.float64).reshape(-1)
        steps = np.arange(len(v)) if step is None else np.asarray(step).reshape(-1)
        if len(steps) == 1 and len(v) == 1:
            steps = [0 if step is None else int(np.asarray(step).reshape(-1)[0])]
        for s, x in zip(steps, v, strict=True):
            rows.append((int(s), layer, gemm, operand, stat, float(x)))
    return pd.DataFrame(rows, columns=["step", "layer", "gemm", "operand", "stat", "value"])
