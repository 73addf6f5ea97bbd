"""Gradient-flow telemetry of a model: where quantization error enters, per layer and GEMM.

Per quantized operand of every GEMM (forward and backward), per logged step, the statistics of
`fp4lab.core.stats` (`fp4lab.schema.STATS`), in the domain the GEMM sees. Forward statistics are
kept in an `OpStats` variable of each quantized op; backward statistics leave the custom VJP
through the gradient channel: a zero `GradProbe` input whose cotangent carries them, so model
code does not change. `value_and_grad` differentiates the model's Params and probes together
and returns the Param gradients and the flat metrics separately.

Per layer, `shadow_metrics` compares the quantized gradient g_q with the exact gradient g at the
same parameters and batch: cosine, relative norm ||g_q|| / ||g||, and the gradient-to-noise
ratio ||g|| / ||g_q - g|| (Chmiel et al. 2025, arXiv 2505.19115: training stalls below sqrt(3)).
The ratio is +inf when g_q == g exactly (the documented sentinel for "no noise").

Metrics are flat dicts with the keys of `fp4lab.schema` (`quant/<layer>/<gemm>/<operand>/<stat>`,
`grad/<layer>/<stat>`); `fp4lab.analysis.to_frame` turns them into tidy rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.core.stats import operand_stats
from fp4lab.nnx.op import QuantizedOp
from fp4lab.nnx.rules import unquantize
from fp4lab.nnx.state import GradProbe, OpStats
from fp4lab.schema import (
    BWD_OPERANDS,
    FWD_OPERANDS,
    GRAD_STATS,
    SQRT3,
    STATS,
    grad_key,
    quant_key,
)

__all__ = [
    "STATS",
    "FWD_OPERANDS",
    "BWD_OPERANDS",
    "GRAD_STATS",
    "SQRT3",
    "GradProbe",
    "OpStats",
    "operand_stats",
    "value_and_grad",
    "collect",
    "set_enabled",
    "exact_grads",
    "shadow_metrics",
]


def _ops(model):
    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.probe is not None and m.measure:
            yield m


def _flatten(layer: str, table: jax.Array, operands) -> dict[str, jax.Array]:
    out = {}
    for i, (gemm, operand) in enumerate(operands):
        for j, stat in enumerate(STATS):
            out[quant_key(layer, gemm, operand, stat)] = table[i, j]
    return out


def set_enabled(model, on: bool):
    """Switches measurement of a model's telemetry-enabled ops on or off, in place.

    Log every k steps with `set_enabled(model, step % k == 0)` before a jitted step: the flag is
    static, so nnx.jit compiles the step once with and once without statistics, and steps
    without them cost exactly what a model without telemetry costs.
    """
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
        # one table per GEMM call; a stacked op's layers come first (layer, call) -> row
        fwd = op.fstats[...].reshape(-1, len(FWD_OPERANDS), len(STATS))
        bwd = probes.get(tuple(paths[id(op)]))
        if bwd is not None:
            bwd = bwd.reshape(-1, len(BWD_OPERANDS), len(STATS))
        high = {p for p, r in op.layers if r is None}  # stacked layers left unquantized
        for row, layer in enumerate(op.stat_layers()):
            if layer in high:
                continue
            metrics |= _flatten(layer, fwd[row], FWD_OPERANDS)
            if bwd is not None:
                metrics |= _flatten(layer, bwd[row], BWD_OPERANDS)
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
        values = dict(zip(GRAD_STATS, (cos, rel, gnr, gnr < SQRT3), strict=True))
        metrics |= {grad_key(layer, stat): v for stat, v in values.items()}
    return metrics
