"""Which GEMMs run quantized, as data: a gate per op and GEMM in front of every quantized op.

`gate_model(model)` puts a `GatedOp` in front of every quantized op of a model that
`fp4lab.quantize_model` has quantized (dot_general, einsum and conv seams). A gated op runs
both its quantized op and the plain op on the same operands and keeps, per GEMM,

    Fprop   y  = where(gate[0], y_q, y)            the output
    Dgrad   dx = where(gate[1], dx_q, dx)          the gradient of the lhs (activations)
    Wgrad   dw = where(gate[2], dw_q, dw)          the gradient of the rhs (weights)

where y_q, dx_q, dw_q are the quantized op's (its recipe, its keys) and y, dx, dw the plain
op's. Both get the whole cotangent of the output, so a GEMM's choice does not change the other
GEMMs' inputs: one-hot gates measure one GEMM alone, all-ones the quantized model, all-zeros the
high-precision shadow. The gates are `Gate` variables of the model's state (an op standing for
L stacked layers holds (L, 3), one row per layer), so every variant of which GEMMs are
quantized is one compiled program fed other numbers (`set_gates`). Both results are computed
in every variant: a gated model costs about twice the quantized one.

With `measure(model, True)` a gated op also keeps its output (`Seen`) and adds zero taps to
its operands and output (`Tap`), whose cotangents are dx, dw and dy: the drift of every layer,
forward and backward, against the shadow. The taps' shapes come from one abstract trace
(`attach`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.nnx.op import QuantizedOp, einsum_dimension_numbers
from fp4lab.schema import GEMMS

__all__ = [
    "Gate",
    "Seen",
    "Tap",
    "GatedOp",
    "Site",
    "gate_model",
    "gated_ops",
    "sites",
    "set_gates",
    "measure",
    "attach",
    "tracing",
]

SEAMS = ("dot_general", "einsum_op", "conv_general_dilated")  # attributes quantize_model sets
_PLAIN = {"dot_general": jax.lax.dot_general, "einsum": jnp.einsum}
_PLAIN["conv"] = jax.lax.conv_general_dilated
_TRACE: list[dict] = []  # `tracing`: {op path: [(call order, flops, shapes), ...]}


class Gate(nnx.Variable):
    """1 = the GEMM runs quantized, 0 = in high precision; (..., 3) in `GEMMS` order."""


class Seen(nnx.Variable):
    """A gated op's output of its latest call (with `measure` on)."""


class Tap(nnx.Variable):
    """A zero added to an operand or the output; its cotangent is that tensor's gradient."""


@jax.custom_vjp
def _pass(v, on):
    """v; its cotangent passes where `on` holds and is zero elsewhere."""
    del on
    return v


def _pass_fwd(v, on):
    return v, on


def _pass_bwd(on, g):
    return jnp.where(on > 0, g, jnp.zeros_like(g)), jnp.zeros_like(on)


_pass.defvjp(_pass_fwd, _pass_bwd)


@jax.custom_vjp
def _pick(y_q, y, on):
    """y_q where `on` holds, else y; the whole cotangent reaches both."""
    return jnp.where(on > 0, y_q, y)


def _pick_fwd(y_q, y, on):
    return _pick(y_q, y, on), on


def _pick_bwd(on, g):
    return g, g, jnp.zeros_like(on)


_pick.defvjp(_pick_fwd, _pick_bwd)


def _tap(v, tap):
    """v + tap, tap zeros shaped like v: the cotangent of `tap` is the cotangent of v."""
    return v + tap.astype(v.dtype)


@contextlib.contextmanager
def tracing():
    """Inside the block, gated ops record their calls as they are traced: {path: [(order,
    flops of one of its GEMMs for one layer, {"tap_x", "tap_w", "tap_y", "seen": the shape of
    lhs, rhs, output})]} (an op of stacked layers once per trace of its body, one layer's)."""
    _TRACE.append({})
    try:
        yield _TRACE[-1]
    finally:
        _TRACE.pop()


class GatedOp(nnx.Module):
    """A quantized op behind per-GEMM gates (module docstring)."""

    def __init__(self, op: QuantizedOp):
        if op.op not in _PLAIN:
            allowed = ", ".join(_PLAIN)
            raise ValueError(f"{op.path}: a {op.op} op cannot be gated; diagnose gates {allowed}")
        self.op = nnx.data(op)
        self.path = op.path
        self.kind = op.op
        self.layer_paths = tuple(p for p, _ in op.layers) or (op.path,)
        self.stacked = bool(op.layers)
        lead = (len(op.layers),) if op.layers else ()
        self.gate = Gate(jnp.ones((*lead, len(GEMMS)), jnp.float32))
        self.measuring = False  # static: keep the output, tap operands and output

    def __call__(self, *args, **kwargs):
        i = 1 if self.kind == "einsum" else 0
        lhs, rhs = args[i], args[i + 1]
        g = self.gate[...]
        if self.measuring:
            lhs, rhs = _tap(lhs, self.tap_x[...]), _tap(rhs, self.tap_w[...])
        quantized = (*args[:i], _pass(lhs, g[1]), _pass(rhs, g[2]), *args[i + 2 :])
        plain = (*args[:i], _pass(lhs, 1 - g[1]), _pass(rhs, 1 - g[2]), *args[i + 2 :])
        y_q = self.op(*quantized, **kwargs)
        y = (self.op.original or _PLAIN[self.kind])(*plain, **kwargs)
        y = _pick(y_q, y, g[0])
        if _TRACE:
            shapes = {"tap_x": args[i], "tap_w": args[i + 1], "tap_y": y, "seen": y}
            shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in shapes.items()}
            order = sum(len(c) for c in _TRACE[-1].values())
            _TRACE[-1].setdefault(self.path, []).append((order, _flops(self.kind, args, y), shapes))
        if not self.measuring:
            return y
        self.seen.set_value(y)
        return _tap(y, self.tap_y[...])


def _flops(kind: str, args, y) -> int:
    """Multiply-adds x 2 of one GEMM of the call (Fprop, Dgrad and Wgrad cost the same)."""
    if kind == "conv":  # y (N, ..., C_out), kernel (..., C_in/groups, C_out): flax's layout
        lhs, rhs = args[0], args[1]
        return 2 * math.prod(y.shape) * math.prod(rhs.shape) // rhs.shape[-1]
    if kind == "einsum":
        spec, lhs, rhs = args[0], args[1], args[2]
        (contract, _), _ = einsum_dimension_numbers(spec, lhs.shape, rhs.shape)
    else:
        lhs, rhs = args[0], args[1]
        (contract, _), _ = args[2]
    return 2 * math.prod(y.shape) * math.prod(lhs.shape[a] for a in contract)


def gate_model(model: nnx.Module) -> nnx.Module:
    """Puts a `GatedOp` in front of every quantized op of `model` (quantized with
    `fp4lab.quantize_model`), in place; all gates start at 1 (the quantized model)."""
    found = []
    for _, module in nnx.iter_modules(model):
        for attr in SEAMS:
            op = getattr(module, attr, None)
            if isinstance(op, QuantizedOp):
                found.append((module, attr, op))
    if not found:
        raise ValueError(
            "diagnose: the model has no quantized op (nothing for the rules to reach: build "
            "it from nnx.Linear, LinearGeneral, Einsum or Conv)"
        )
    for module, attr, op in found:
        setattr(module, attr, nnx.data(GatedOp(op)))
    return model


def gated_ops(model: nnx.Module) -> list[GatedOp]:
    """The gated ops of `model`, in graph order."""
    return [m for _, m in nnx.iter_modules(model) if isinstance(m, GatedOp)]


@dataclasses.dataclass(frozen=True)
class Site:
    """One layer of one gated op: where its three gates sit in the flat gate vector."""

    layer: str  # dotted path of the layer ("blocks.2.mlp.up")
    op: int  # index of its gated op in `gated_ops` order
    row: int  # its row in a stacked op (0 otherwise)
    depth: int  # position in the forward's order of layers
    flops: int  # of one of its GEMMs, one forward call of the model


def sites(model: nnx.Module, trace: dict) -> list[Site]:
    """One `Site` per layer of every gated op, in `gated_ops` order (the flat gate vector's),
    with depths from the forward's call order `trace` (`tracing`): layers of stacked ops called
    one after another (one scanned body) follow each other in stack order, each with the
    body's ops in call order."""
    ops = gated_ops(model)
    missing = [op.path for op in ops if op.path not in trace]
    if missing:
        raise ValueError(f"diagnose: the loss never calls the quantized ops {missing}")
    order = {}
    body = -1
    calls = sorted((n, op_i) for op_i, op in enumerate(ops) for n, _, _ in trace[op.path])
    for n, op_i in calls:
        stacked = ops[op_i].stacked
        body = (body if body >= 0 else n) if stacked else -1
        for row in range(len(ops[op_i].layer_paths)):
            order.setdefault((op_i, row), (body, row, n) if stacked else (n, 0, 0))
    ranked = {k: d for d, k in enumerate(sorted(order, key=order.get))}
    out = []
    for op_i, op in enumerate(ops):
        flops = sum(f for _, f, _ in trace[op.path])
        for row, layer in enumerate(op.layer_paths):
            out.append(Site(layer, op_i, row, ranked[(op_i, row)], flops))
    return out


def set_gates(model: nnx.Module, gates) -> None:
    """Sets every gate of `model` from a flat vector (len(sites) * 3,), `sites` order; traced
    values are fine (one program serves every vector)."""
    start = 0
    for op in gated_ops(model):
        shape = op.gate[...].shape
        n = math.prod(shape)
        op.gate[...] = jnp.reshape(gates[start : start + n], shape).astype(jnp.float32)
        start += n
    if start != gates.shape[-1]:
        raise ValueError(f"set_gates: {gates.shape[-1]} gates for a model with {start}")


def measure(model: nnx.Module, on: bool) -> nnx.Module:
    """Switches the outputs and taps of every gated op on or off (static), in place."""
    for op in gated_ops(model):
        op.measuring = bool(on)
    return model


def attach(model: nnx.Module, loss_fn, batch) -> dict:
    """Gives every gated op its output and tap variables, shaped by an abstract trace of
    `loss_fn(model, batch)` (nothing is computed), and switches `measure` on. Returns the
    trace's calls (`tracing`). An op called more than once per step is measured at its last
    call."""
    box = {}

    def run():
        with tracing() as trace:
            loss_fn(nnx.clone(model), batch)
        box["trace"] = trace

    jax.eval_shape(run)
    trace = box["trace"]
    for op in gated_ops(model):
        if op.path not in trace:
            raise ValueError(f"diagnose: the loss never calls the quantized op {op.path!r}")
        lead = (len(op.layer_paths),) if op.stacked else ()
        for name, shape in trace[op.path][-1][2].items():
            kind = Seen if name == "seen" else Tap
            setattr(op, name, kind(jnp.zeros((*lead, *shape.shape), shape.dtype)))
    measure(model, True)
    return trace
