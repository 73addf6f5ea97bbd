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
The ratio is +inf when g_q == g exactly (the documented sentinel for "no noise"). A parameter of
layers stacked under nnx.scan is measured per layer, under the unscanned model's names.
With `noise_keys=K` (K >= 2) the shadow also splits the noise g_q - g into its zero-mean part
and its bias, from K more draws of the quantization keys at the same parameters and batch
(`fp4lab.nnx.noise`; gbar the mean of the draws g^(1..K)):

    grad/<layer>/noise_zm     sqrt( sum_k ||g^(k) - gbar||^2 / (K - 1) )
    grad/<layer>/noise_bias   sqrt( max(||gbar - g||^2 - noise_zm^2 / K, 0) )
    grad/<layer>/gnr_zm       ||g|| / noise_zm   (+inf where noise_zm == 0)

The draws are K more quantized backward passes, on copies: the model, its keys and its
gradients are the same as without them.

Accumulated drift (`value_and_grad(..., shadow=True)`): where the statistics above measure the
error each GEMM adds to its own inputs, the drift measures what has accumulated by the time a
layer is reached. The shadow is the same model, parameters, batch and keys with every quantized
op computing in high precision, each op fed by its own previous layers. Per quantized op:

    acc/<layer>/fwd/rel_drift   ||y_q - y|| / ||y||     the op's output, quantized model vs shadow
    acc/<layer>/fwd/local       ||q(y) - y|| / ||y||    the error the op alone adds when fed the
                                                        shadow's input (its recipe, the same key)
    acc/<layer>/bwd/rel_drift   ||dy_q - dy|| / ||dy||  the cotangent arriving at the output
    acc/<layer>/bwd/cos         cos(dy_q, dy)

captured at the op seam on copies of the model: outputs are kept in `DriftCapture` variables and
cotangents leave through `DriftTap` inputs (zeros added to the output by an identity whose
cotangent is the output's), whose shapes a `jax.eval_shape` of the forward finds first. The
model's own step is the same computation with or without it (bit for bit).

When to measure: `set_enabled(model, on)` is static (a step compiled with statistics and one
without); `value_and_grad(..., when=flag)` takes a traced boolean instead, and each op computes
its statistics behind a `lax.cond` on it (zeros where it is false, the same keys,
`metric_keys`), measured on the operands its GEMMs take, which are those of a run without
telemetry (the fused statistics then read the blocks of that one quantization; the reference
statistics quantize again in their own layout), and one compiled step serves the steps that
measure and those that do not.

Metrics are flat dicts with the keys of `fp4lab.schema` (`quant/<layer>/<gemm>/<operand>/<stat>`,
`grad/<layer>/<stat>`, `acc/<layer>/<direction>/<stat>`, and `depth/<layer>`: each layer's
position in the forward's order of quantized ops, recorded as the step is traced, so figures can
order layers by depth); `fp4lab.analysis.to_frame` turns them into tidy rows.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.core.stats import cosine, operand_stats, relative_drift
from fp4lab.nnx import noise
from fp4lab.nnx.op import QuantizedOp, measuring, record_calls
from fp4lab.nnx.rules import unquantize
from fp4lab.nnx.state import DriftCapture, DriftTap, GradProbe, OpStats
from fp4lab.schema import (
    ACC_STATS,
    BWD_OPERANDS,
    FWD_OPERANDS,
    GRAD_STATS,
    SQRT3,
    STATS,
    acc_key,
    depth_key,
    grad_key,
    quant_key,
)

__all__ = [
    "STATS",
    "FWD_OPERANDS",
    "BWD_OPERANDS",
    "GRAD_STATS",
    "ACC_STATS",
    "SQRT3",
    "GradProbe",
    "OpStats",
    "operand_stats",
    "value_and_grad",
    "collect",
    "depths",
    "metric_keys",
    "set_enabled",
    "exact_grads",
    "shadow_metrics",
    "stacked_layers",
    "layer_arrays",
]


def _ops(model):
    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.probe is not None and m.measure:
            yield m


def _measured(op) -> list[tuple[int, str]]:
    """(row, layer) of each layer `op` measures: its stat rows less the stacked layers left
    unquantized (a None rule)."""
    high = {p for p, r in op.layers if r is None}
    return [(i, layer) for i, layer in enumerate(op.stat_layers()) if layer not in high]


def _flatten(layer: str, flat: jax.Array, row: int, operands) -> dict[str, jax.Array]:
    """{metric: value} of table `row` of `flat`, an op's (rows, operands, stats) tables
    raveled. Taken in raveled order, one element at a time: XLA merges these slices back into
    one, where slices of a 2-D table each stay a fusion to compile (hundreds in a small LM)."""
    first = row * len(operands) * len(STATS)
    keys = [quant_key(layer, g, o, stat) for g, o in operands for stat in STATS]
    return {k: flat[first + i] for i, k in enumerate(keys)}


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
        fwd = op.fstats[...].reshape(-1)
        bwd = probes.get(tuple(paths[id(op)]))
        if bwd is not None:
            bwd = bwd.reshape(-1)
        for row, layer in _measured(op):
            metrics |= _flatten(layer, fwd, row, FWD_OPERANDS)
            if bwd is not None:
                metrics |= _flatten(layer, bwd, row, BWD_OPERANDS)
    return metrics


def metric_keys(model) -> list[str]:
    """The keys of the metrics `value_and_grad` (without the shadow) returns for `model`, in
    order, known before a step is traced: quant/ keys of every measured layer's operands, and
    its depth/ key."""
    keys = []
    for op in _ops(model):
        for _, layer in _measured(op):
            for operands in (FWD_OPERANDS, BWD_OPERANDS):
                keys += [quant_key(layer, g, o, stat) for g, o in operands for stat in STATS]
            keys.append(depth_key(layer))
    return keys


def depths(model, calls) -> dict[str, jax.Array]:
    """depth/<layer> of every measured layer: its position in the forward's order, from the
    op paths `calls` (`fp4lab.nnx.op.record_calls`). Ops standing for stacked layers that are
    called one after the other are one scanned body: its layers follow each other in stack
    order, each with the body's ops in call order."""
    return {k: jnp.float32(d) for k, d in _depth_order(model, calls).items()}


def _depth_order(model, calls) -> dict[str, int]:
    """depth key -> position, as `depths` (Python ints: they are fixed while tracing)."""
    ops = {op.path: op for op in _ops(model)}
    order: dict[str, tuple[int, int, int]] = {}
    body = -1  # the first call of the scanned body being read
    for n, path in enumerate(calls):
        op = ops.get(path)
        stacked = op is not None and bool(op.layers)
        body = (body if body >= 0 else n) if stacked else -1
        if op is None:
            continue
        for i, layer in _measured(op):
            order.setdefault(layer, (body, i, n) if stacked else (n, i, 0))
    ranked = sorted(order, key=order.get)
    return {depth_key(layer): d for d, layer in enumerate(ranked)}


_DEPTHS: dict = {}  # hash of repr(graphdef) -> the depth order of a trace that saw every layer


def _step_depths(model, calls) -> dict[str, jax.Array]:
    """`depths(model, calls)` of one traced step, complete also when a stacked body's calls
    went unseen: a step traced a second time in one program (a last, partial telemetry chunk
    of a run) reuses jax's trace of the scanned body, whose ops then record no calls. Such a
    trace takes the depths of the last complete trace of a model of the same structure (the
    same graphdef: the same forward, so the same order)."""
    found = _depth_order(model, calls)
    wanted = {depth_key(layer) for op in _ops(model) for _, layer in _measured(op)}
    # a graphdef's static attributes may be unhashable: its repr, hashed, is the key
    key = hashlib.sha256(repr(nnx.graphdef(model)).encode()).hexdigest()
    if wanted <= set(found):
        _DEPTHS.pop(key, None)
        _DEPTHS[key] = found
        while len(_DEPTHS) > 64:  # the structures seen last
            del _DEPTHS[next(iter(_DEPTHS))]
    return {k: jnp.float32(d) for k, d in _DEPTHS.get(key, found).items()}


def value_and_grad(
    loss_fn, *, has_aux: bool = False, shadow: bool = False, when=None, noise_keys: int = 0
):
    """Like nnx.value_and_grad(loss_fn) on the model (first argument), with telemetry.

    Returns a function (model, *args) -> (value, param_grads, metrics): the Param gradients
    only (feed them to the optimizer) and the flat telemetry metrics. With `shadow`, the
    metrics also hold the shadow gradients' statistics (`shadow_metrics`; they are
    scale-invariant, so a loss scale in `loss_fn` leaves them unchanged) and the accumulated
    drift of every measured op (module docstring); the model, its state updates and the
    gradients are the same as without it.

    `when`: a traced boolean scalar (e.g. `step % k == 0` inside a scanned loop): the ops
    measure only where it holds (`fp4lab.nnx.op.measuring`) and the metrics are zeros
    elsewhere, with the same keys (`metric_keys`), so one compiled step serves the steps with
    statistics and those without. Not with `shadow`, whose second, high-precision pass is not
    switched off.

    `noise_keys` (with `shadow`): 0, or K >= 2 draws of the quantization keys whose spread
    gives grad/<layer>/{noise_zm, noise_bias, gnr_zm} (module docstring; `fp4lab.nnx.noise`).
    """
    if shadow and when is not None:
        raise ValueError("telemetry.value_and_grad: `when` does not apply with shadow=True")
    noise.check_keys(noise_keys, "telemetry.value_and_grad: noise_keys")
    if noise_keys and not shadow:
        raise ValueError("telemetry.value_and_grad: noise_keys needs shadow=True")

    def wrapped(model, *args, **kwargs):
        if shadow:
            return _with_shadow(loss_fn, has_aux, model, args, kwargs, noise_keys)
        diff = nnx.DiffState(0, nnx.Any(nnx.Param, GradProbe))
        with record_calls() as calls, measuring(when):
            value, grads = nnx.value_and_grad(loss_fn, argnums=diff, has_aux=has_aux)(
                model, *args, **kwargs
            )
        param_grads, probe_grads = nnx.split_state(grads, nnx.Param, GradProbe)
        return value, param_grads, collect(model, probe_grads) | _step_depths(model, calls)

    return wrapped


def _with_shadow(loss_fn, has_aux, model, args, kwargs, noise_keys=0):
    """value_and_grad with the shadow: the step runs on a copy of `model` that keeps outputs and
    taps cotangents, and the copy's state (less those) is written back into `model`; with
    `noise_keys`, the noise draws run on copies of `model` as it is before the step."""
    draws = None
    if noise_keys:
        draws = noise.draw_gradients(loss_fn, model, args, kwargs, keys=noise_keys, has_aux=has_aux)
    shapes = _output_shapes(loss_fn, model, args, kwargs)
    quantized = _attach(nnx.clone(model), shapes)
    reference = nnx.clone(quantized)  # before the step: the same keys and amax histories
    for _, m in nnx.iter_modules(reference):
        if isinstance(m, QuantizedOp):
            m.shadow, m.measure = True, False
    diff = nnx.DiffState(0, nnx.Any(nnx.Param, GradProbe, DriftTap))
    with record_calls() as calls:
        value, grads = nnx.value_and_grad(loss_fn, argnums=diff, has_aux=has_aux)(
            quantized, *args, **kwargs
        )
    param_grads, probe_grads, taps = nnx.split_state(grads, nnx.Param, GradProbe, DriftTap)
    metrics = collect(quantized, probe_grads) | _step_depths(quantized, calls)
    nnx.update(model, nnx.state(quantized, nnx.Not(nnx.Any(DriftTap, DriftCapture))))
    nnx.update(quantized, taps)  # the taps now hold the cotangents of the outputs

    diff = nnx.DiffState(0, nnx.Any(nnx.Param, DriftTap))
    exact = nnx.grad(loss_fn, argnums=diff, has_aux=has_aux)(reference, *args, **kwargs)
    exact, ref_taps = nnx.split_state(exact[0] if has_aux else exact, nnx.Param, DriftTap)
    nnx.update(reference, ref_taps)
    metrics |= shadow_metrics(param_grads, exact, stacked_layers(quantized), draws)
    return value, param_grads, metrics | _drift_metrics(quantized, reference)


def _output_shapes(loss_fn, model, args, kwargs) -> dict[str, list[jax.ShapeDtypeStruct]]:
    """{op path: the shape of each call's output (stacked ops: with the layer axis)} of every
    measured op, from a trace of the loss on a copy (nothing is computed)."""

    def outputs():
        copy = _attach(nnx.clone(model), None)
        loss_fn(copy, *args, **kwargs)
        return {
            op.path: [_var(op, "drift_y", c)[...] for c in range(op.calls)] for op in _ops(copy)
        }

    return jax.eval_shape(outputs)


def _var(op, name: str, call: int):
    return getattr(op, f"{name}{call}")


def _attach(model, shapes):
    """Switches drift on in the measured ops of `model` (a copy) and gives them its variables:
    outputs, and with `shapes` the taps (without: placeholders whose shape the trace sets)."""
    for op in _ops(model):
        lead = (len(op.layers),) if op.layers else ()
        for c in range(op.calls):
            if shapes is None:
                setattr(op, f"drift_y{c}", DriftCapture(jnp.zeros(lead, jnp.float32)))
                continue
            out = shapes[op.path][c]
            setattr(op, f"drift_y{c}", DriftCapture(jnp.zeros(out.shape, out.dtype)))
            setattr(op, f"drift_dy{c}", DriftTap(jnp.zeros(out.shape, out.dtype)))
        op.drift_local = DriftCapture(jnp.zeros((*lead, op.calls), jnp.float32))
        op.drift = True
    return model


def _rows(op, name: str) -> list[jax.Array]:
    """The variable `name` of each of the op's GEMM calls, in `stat_layers` order."""
    per_call = [_var(op, name, c)[...] for c in range(op.calls)]
    if not op.layers:
        return per_call
    return [a[i] for i in range(len(op.layers)) for a in per_call]


def _drift_metrics(quantized, reference) -> dict[str, jax.Array]:
    """acc/ metrics of every measured op: the quantized copy against the shadow copy."""
    metrics = {}
    shadows = {op.path: op for op in _ops_with_drift(reference)}
    for op in _ops(quantized):
        ref = shadows[op.path]
        high = {p for p, r in op.layers if r is None}  # stacked layers left unquantized
        layers = op.stat_layers()
        rows = zip(
            layers,
            _rows(op, "drift_y"),
            _rows(ref, "drift_y"),
            _rows(op, "drift_dy"),
            _rows(ref, "drift_dy"),
            ref.drift_local[...].reshape(-1),
            strict=True,
        )
        for layer, y_q, y, dy_q, dy, local in rows:
            if layer in high:
                continue
            values = {
                ("fwd", "rel_drift"): relative_drift(y_q, y),
                ("fwd", "local"): local,
                ("bwd", "rel_drift"): relative_drift(dy_q, dy),
                ("bwd", "cos"): cosine(dy_q, dy),
            }
            metrics |= {acc_key(layer, d, stat): v for (d, stat), v in values.items()}
    return metrics


def _ops_with_drift(model):
    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.drift:
            yield m


def exact_grads(loss_fn, model, *args, **kwargs):
    """The shadow: Param gradients of `loss_fn` at the same parameters and batch, with every
    quantized op of `model` bypassed (a clone; the model is not changed)."""
    shadow = unquantize(nnx.clone(model))
    return nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(shadow, *args, **kwargs)


def stacked_layers(model) -> dict[tuple[str, ...], int]:
    """{path of a stacked module: its number of layers} for the layers stacked under nnx.scan
    that a quantized op stands for (e.g. {("blocks",): 4} for the scanned Transformer)."""
    roots = {}
    for _, m in nnx.iter_modules(model):
        if isinstance(m, QuantizedOp) and m.layers:
            op, first = m.path.split("."), m.layers[0][0].split(".")
            # the layer index sits where the paths part; after the op's own path when the
            # stacked module is the seam itself ("lin" -> "lin.0")
            pairs = enumerate(zip(op, first, strict=False))
            cut = next((i for i, (a, b) in pairs if a != b), len(op))
            roots[tuple(op[:cut])] = len(m.layers)
    return roots


def shadow_metrics(grads_q, grads_exact, stacked=None, draws=None) -> dict[str, jax.Array]:
    """Per parameter: cosine, relative norm and gradient-to-noise ratio of g_q against g; with
    `draws` (`fp4lab.nnx.noise.draw_gradients`), also noise_zm, noise_bias and gnr_zm.

    `stacked` ({module path: number of layers}, `stacked_layers(model)`): a parameter under
    one of these paths whose leading axis has that length is measured per layer, under each
    layer's own name ("blocks.2.mlp.up.kernel", as for the unscanned model), not as one
    statistic over the stack.
    """
    metrics = {}
    exact, quant = layer_arrays(grads_exact, stacked), layer_arrays(grads_q, stacked)
    trees = () if draws is None else (draws.first, draws.shift_sum, draws.shift_sq)
    parts = [layer_arrays(t, stacked) for t in trees]
    for layer, g in exact.items():
        metrics |= _grad_stats(layer, g, quant[layer])
        if draws is not None:
            metrics |= noise.noise_stats(layer, g, *(p[layer] for p in parts), draws.keys)
    return metrics


def layer_arrays(tree, stacked=None) -> dict[str, jax.Array]:
    """{layer name: array} of a Param-state tree (e.g. gradients), in its flat order: a
    parameter stacked under a path of `stacked` (`stacked_layers`) whose leading axis has its
    length is split per layer ("blocks.2.mlp.up.kernel"); any other keeps its dotted path."""
    out = {}
    stacked = stacked or {}
    for path, v in nnx.to_flat_state(tree):
        v = v[...] if hasattr(v, "get_value") else v
        names = tuple(str(p) for p in path)
        root = next((r for r in stacked if names[: len(r)] == r), None)
        if root is not None and v.ndim and v.shape[0] == stacked[root]:
            for i in range(v.shape[0]):
                out[".".join((*root, str(i), *names[len(root) :]))] = v[i]
        else:
            out[".".join(names)] = v
    return out


def _grad_stats(layer: str, g, gq) -> dict[str, jax.Array]:
    g32, gq32 = g.astype(jnp.float32).ravel(), gq.astype(jnp.float32).ravel()
    n, nq, noise = (jnp.linalg.norm(v) for v in (g32, gq32, gq32 - g32))
    cos = cosine(g32, gq32)
    rel = jnp.where(n > 0, nq / jnp.where(n > 0, n, 1.0), jnp.where(nq == 0, 1.0, jnp.inf))
    gnr = jnp.where(noise > 0, n / jnp.where(noise > 0, noise, 1.0), jnp.inf)
    values = dict(zip(GRAD_STATS, (cos, rel, gnr, gnr < SQRT3), strict=True))
    return {grad_key(layer, stat): v for stat, v in values.items()}
