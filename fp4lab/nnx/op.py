"""Quantized op modules: what `quantize_model` puts at a flax seam.

    QuantizedDot        lax.dot_general of nnx.Linear / LinearGeneral (and so the projections
                        of nnx.MultiHeadAttention)
    QuantizedEinsum     einsum_op of nnx.Einsum
    QuantizedConv       conv_general_dilated of nnx.Conv
    QuantizedAttention  attention_fn of nnx.MultiHeadAttention: the score and value matmuls

Each is an nnx.Module holding the op's state (`fp4lab.nnx.state`): the quantization stream
(a base key folded from the model key and the op's path, and a call counter: the key of a
call is fold_in(base, counter), split per GEMM operand by the plan), delayed-scaling
histories, and the telemetry probe and forward statistics.

Stacked layers (a module built with nnx.vmap and applied with nnx.scan, e.g. the Transformer
with `scan_layers=True`): one op stands for L layers. Its state gets a leading layer axis, so
the scan hands each layer its own slice: its index, its keys (folded from the layer's own
path "blocks.<i>.attn.query", as in the unscanned model), its histories and statistics. Each
layer has its own recipe; inside the scan the op selects it with lax.switch over the distinct
recipes, so the compiled program holds each recipe once, whatever the depth.

Accumulated-drift telemetry (`fp4lab.nnx.telemetry`) works on copies of the model: with `drift`
on, an op keeps each call's output in a `DriftCapture` and passes it through a `DriftTap` whose
cotangent is the cotangent arriving at the output; a `shadow` op computes its GEMMs in high
precision and, with `drift`, also the error its recipe alone would add on the shadow's input.
"""

from __future__ import annotations

import contextlib
import functools
import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from fp4lab.core import prng, recipes
from fp4lab.core.stats import check_method, relative_drift
from fp4lab.nnx.state import AmaxHistory, GradProbe, LayerIndex, OpStats, QuantKey
from fp4lab.ops import custom_vjp
from fp4lab.ops.conv import qconv_general_dilated
from fp4lab.ops.dot_general import qdot_general
from fp4lab.schema import BWD_OPERANDS, FWD_OPERANDS, STATS

__all__ = [
    "QuantizedOp",
    "QuantizedDot",
    "QuantizedEinsum",
    "QuantizedConv",
    "QuantizedAttention",
    "einsum_dimension_numbers",
    "record_calls",
    "measuring",
]


# Trace-time contexts, both stacks whose top is what the ops see (blocks may nest):
_CALLS: list[list[str]] = []  # `record_calls`: the paths of the ops called, in order
_WHEN: list = [None]  # `measuring(flag)`: the traced flag the ops measure under (None: always)


@contextlib.contextmanager
def measuring(flag):
    """Inside the block, ops with telemetry measure where the traced boolean `flag` holds (a
    lax.cond in each op; zero statistics elsewhere) instead of on every call, so one traced step
    serves the steps with statistics and those without. None: every call (the default)."""
    _WHEN.append(flag)
    try:
        yield
    finally:
        _WHEN.pop()


@contextlib.contextmanager
def record_calls():
    """Records the paths of the quantized ops called inside the block, in call order, as
    they are traced (an op standing for stacked layers once per trace of the scanned body):
    the forward's order, which telemetry turns into each layer's depth."""
    _CALLS.append([])
    try:
        yield _CALLS[-1]
    finally:
        _CALLS.pop()


def _measure_flag(probe):
    """When an op with this probe measures: the innermost `measuring` flag; None without
    telemetry (the probe is None) or outside `measuring` (every call)."""
    return _WHEN[-1] if probe is not None else None


def _history(choices, names: tuple[str, ...]) -> tuple[int, str]:
    """(longest amax history, its algorithm) of the operands `names` over the recipes."""
    specs = [s for r in choices for n, s in r.used_specs().items() if n in names and s is not None]
    delayed = [s for s in specs if s.amax_history]
    if not delayed:
        return 0, "max"
    return max(s.amax_history for s in delayed), delayed[0].amax_algo


class QuantizedOp(nnx.Module):
    """The state and the quantized GEMM call shared by the op modules below."""

    op = ""  # the seam's op name ("dot_general", "einsum", "conv", "attention")
    calls = 1  # GEMM calls per op call (attention: scores and values)
    delayed_scaling = True  # whether amax_history specs are supported here
    stackable = False  # whether one op may stand for stacked layers under nnx.scan

    def __init__(
        self,
        recipe: recipes.GemmRecipe,
        path: str,
        key: jax.Array | None,
        original=None,
        backend: str = "simulated",
        telemetry: bool | str = False,
        *,
        layers: tuple[tuple[str, recipes.GemmRecipe | None], ...] = (),
    ):
        """recipe, path: the op's; `layers`, for an op standing for stacked layers: one
        (layer path, recipe or None) per layer, in stack order (`recipe` is then any of them)."""
        if layers and not self.stackable:
            raise ValueError(
                f"{path}: a {self.op} op over stacked (scanned) layers is not supported; "
                "quantize dot_general or einsum seams there"
            )
        self.recipe = recipe
        self.path = path
        self.backend = backend
        self.original = original  # the callable it replaced (restored by unquantize)
        self.layers = tuple(layers)  # static: ((path, recipe or None), ...) or ()
        choices = [r for _, r in self.layers if r is not None] or [recipe]
        self.branches = tuple(dict.fromkeys(r for _, r in self.layers)) if layers else ()
        self._delayed = {
            "x": _history(choices, ("fprop_x", "wgrad_x")),
            "w": _history(choices, ("fprop_w", "dgrad_w")),
        }
        if _history(choices, ("dgrad_dy", "wgrad_dy"))[0]:
            raise ValueError(
                f"{path}: delayed scaling (amax_history) applies to the forward "
                "tensors x and w; gradients use current scaling"
            )
        if not self.delayed_scaling and any(n for n, _ in self._delayed.values()):
            raise ValueError(
                f"{path}: delayed scaling is supported for dot_general and einsum ops, "
                f"not {self.op}"
            )
        lead = (len(self.layers),) if self.layers else ()  # the stacked layer axis
        for name, (length, _) in self._delayed.items():
            hist = AmaxHistory(jnp.zeros((*lead, length), jnp.float32)) if length else None
            setattr(self, f"amax_{name}", hist)
        self.layer = LayerIndex(jnp.arange(len(self.layers), dtype=jnp.int32)) if lead else None
        # telemetry: the gradient channel and the latest forward statistics
        self.measure = bool(telemetry)  # static: telemetry.set_enabled switches it per step
        # static: how the statistics are computed (True: the default method)
        self.stats_method = check_method("fused" if telemetry in (True, False) else telemetry)
        if telemetry:
            n, c = len(STATS), self.calls
            self.probe = GradProbe(jnp.zeros((*lead, c, len(BWD_OPERANDS), n), jnp.float32))
            self.fstats = OpStats(jnp.zeros((*lead, c, len(FWD_OPERANDS), n), jnp.float32))
        else:
            self.probe = self.fstats = None
        # accumulated-drift telemetry, switched on in copies only (fp4lab.nnx.telemetry)
        self.drift = False  # static: keep outputs (DriftCapture), tap cotangents (DriftTap)
        self.shadow = False  # static: compute in high precision (the drift's reference)
        if any(r.needs_key for r in choices):
            if key is None:
                raise ValueError(
                    f"recipe {recipe.name or recipe} at {path!r} needs a key: "
                    "pass quantize_model(..., key=...)"
                )
            paths = [p for p, _ in self.layers] or [path]
            # fold_in(key, crc32(path)) of every path, as one Threefry hash (bit for bit)
            crcs = jnp.asarray([zlib.crc32(p.encode()) for p in paths], jnp.uint32)
            bases = prng.fold_in(key, crcs)
            self.qbase = QuantKey(bases if lead else bases[0])
            self.qcount = QuantKey(jnp.zeros(lead, jnp.uint32))
        else:
            self.qbase = self.qcount = None

    def stat_layers(self) -> list[str]:
        """Telemetry layer names of this op's GEMM calls (stacked: of each layer's)."""
        if self.layers:
            return [p for p, _ in self.layers]
        return [self.path]

    def next_key(self) -> jax.Array | None:
        """The quantization key of this call (None for a deterministic recipe); every call of
        the op draws one, first thing, so this is also where a call is recorded."""
        if _CALLS:
            _CALLS[-1].append(self.path)
        if self.qbase is None:
            return None
        count = self.qcount[...]
        self.qcount[...] = count + 1
        return prng.fold_in(self.qbase[...], count)  # = jax.random.fold_in, no while loop

    def _delayed_amax(self, name: str, operand) -> jax.Array:
        """The amax to scale with this step (from the history), and the history updated with
        this step's amax: TransformerEngine's DelayedScaling, AQT's delayed calibration."""
        var = getattr(self, f"amax_{name}")
        hist = var[...]
        current = jnp.max(jnp.abs(operand)).astype(jnp.float32)
        algo = self._delayed[name][1]
        stored = jnp.max(hist) if algo == "max" else hist[0]
        use = jnp.where(jnp.any(hist > 0), stored, current)  # first step: current scaling
        var[...] = jnp.concatenate([current[None], hist[:-1]])
        return use

    def _probe(self, call: int):
        return self.probe[...][call] if self.probe is not None and self.measure else None

    def _record(self, out, probe, call: int):
        """The op's output; with telemetry, keeps the forward statistics of `call`."""
        if probe is not None:
            out, stats = out
            self.fstats[...] = self.fstats[...].at[call].set(stats)
        return self._drift(out, call)

    def _drift(self, y, call: int):
        """With drift on: keeps the output of `call` and taps its cotangent (when tapped)."""
        if not self.drift:
            return y
        getattr(self, f"drift_y{call}").set_value(y)
        tap = getattr(self, f"drift_dy{call}", None)
        return y if tap is None else _tapped(y, tap[...])

    def _shadow(self, y, quantized, call: int):
        """A shadow op's output: the high-precision `y`; with drift, keeps the local error,
        ||q(x) - y|| / ||y||, of `quantized()` (the recipe's output on the same inputs)."""
        if self.drift:
            err = relative_drift(jax.lax.stop_gradient(quantized()), y)
            self.drift_local[...] = self.drift_local[...].at[call].set(err)
        return self._drift(y, call)

    def dot_general(
        self,
        lhs,
        rhs,
        dimension_numbers,
        precision=None,
        preferred_element_type=None,
        out_sharding=None,
        *,
        key=None,
        call: int = 0,
    ):
        """qdot_general under this op's recipe, backend, delayed scaling and telemetry."""
        probe = self._probe(call)
        amax = {}
        for name, operand in (("x", lhs), ("w", rhs)):
            if self._delayed[name][0]:
                amax[name] = self._delayed_amax(name, operand)
        dot = functools.partial(
            self._dot,
            dimension_numbers=dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
        )
        if self.shadow:
            inputs = jax.lax.stop_gradient((lhs, rhs))
            quantized = functools.partial(self._dispatch, dot, *inputs, key, None, amax)
            return self._shadow(dot(None, lhs, rhs, None, None, {}), quantized, call)
        return self._record(self._dispatch(dot, lhs, rhs, key, probe, amax), probe, call)

    def _dispatch(self, dot, lhs, rhs, key, probe, amax):
        """`dot` under this op's recipe (a stacked op: under this layer's)."""
        if not self.layers:
            return dot(self.recipe, lhs, rhs, key, probe, amax)
        if len(self.branches) == 1:
            return dot(self.branches[0], lhs, rhs, key, probe, amax)
        # this layer's recipe: one branch per distinct recipe of the stack
        which = jnp.asarray([self.branches.index(r) for _, r in self.layers], jnp.int32)
        fns = [functools.partial(dot, r) for r in self.branches]
        return jax.lax.switch(which[self.layer[...]], fns, lhs, rhs, key, probe, amax)

    def _dot(self, recipe, lhs, rhs, key, probe, amax, **dot_args):
        """qdot_general under `recipe`; None: the plain dot_general (zero statistics)."""
        if recipe is None:
            plain = self.original if self.op == "dot_general" else None
            plain = plain or jax.lax.dot_general  # flax leaves the attribute None by default
            y = plain(lhs, rhs, **dot_args)
            if probe is None:
                return y
            return y, jnp.zeros((len(FWD_OPERANDS), len(STATS)), jnp.float32)
        kw = dict(key=key, backend=self.backend, probe=probe, amax=amax, stats=self.stats_method)
        kw["measure"] = _measure_flag(probe)
        return qdot_general(lhs, rhs, recipe=recipe, **kw, **dot_args)

    def einsum(
        self,
        spec,
        lhs,
        rhs,
        precision=None,
        preferred_element_type=None,
        out_sharding=None,
        *,
        key=None,
        call: int = 0,
    ):
        """A two-operand einsum as a quantized dot_general and a transpose."""
        dn, perm = einsum_dimension_numbers(spec, lhs.shape, rhs.shape)
        y = self.dot_general(
            lhs, rhs, dn, precision, preferred_element_type, out_sharding, key=key, call=call
        )
        return jnp.transpose(y, perm)


class QuantizedDot(QuantizedOp):
    """Stands in for lax.dot_general."""

    op = "dot_general"
    stackable = True

    @custom_vjp.named_layer
    def __call__(self, *args, **kwargs):
        return self.dot_general(*args, key=self.next_key(), **kwargs)


class QuantizedEinsum(QuantizedOp):
    """Stands in for jnp.einsum (nnx.Einsum's einsum_op)."""

    op = "einsum"
    stackable = True

    @custom_vjp.named_layer
    def __call__(self, *args, **kwargs):
        return self.einsum(*args, key=self.next_key(), **kwargs)


class QuantizedConv(QuantizedOp):
    """Stands in for lax.conv_general_dilated."""

    op = "conv"
    delayed_scaling = False

    @custom_vjp.named_layer
    def __call__(self, *args, **kwargs):
        key = self.next_key()
        if self.shadow:
            plain = self.original or jax.lax.conv_general_dilated
            inputs = jax.lax.stop_gradient(args[:2])
            conv = functools.partial(qconv_general_dilated, recipe=self.recipe, key=key)
            quantized = functools.partial(conv, *inputs, *args[2:], **kwargs)
            return self._shadow(plain(*args, **kwargs), quantized, 0)
        probe = self._probe(0)
        when = _measure_flag(probe)
        out = qconv_general_dilated(
            *args,
            recipe=self.recipe,
            key=key,
            probe=probe,
            stats=self.stats_method,
            measure=when,
            **kwargs,
        )
        return self._record(out, probe, 0)


class QuantizedAttention(QuantizedOp):
    """Stands in for nnx.dot_product_attention: quantized score (q.k) and value (p.v) matmuls."""

    op = "attention"
    calls = 2
    delayed_scaling = False

    def stat_layers(self) -> list[str]:
        return [f"{self.path}.scores", f"{self.path}.values"]

    @custom_vjp.named_layer
    def __call__(
        self,
        query,
        key_,
        value,
        bias=None,
        mask=None,
        broadcast_dropout=True,
        dropout_rng=None,
        dropout_rate=0.0,
        deterministic=False,
        dtype=None,
        precision=None,
        module=None,
        is_causal=False,
        **unused,
    ):
        if unused:
            raise ValueError(f"quantized attention got unsupported arguments {sorted(unused)}")
        key = self.next_key()
        k_s = k_v = None
        if key is not None:
            k_s, k_v = prng.split(key)
        dtype = dtype or query.dtype
        q_heads, k_heads = query.shape[-2], key_.shape[-2]
        if q_heads != k_heads:  # grouped-query attention: repeat the key/value heads
            key_ = jnp.repeat(key_, q_heads // k_heads, axis=-2)
            value = jnp.repeat(value, q_heads // k_heads, axis=-2)
        query = query / jnp.sqrt(query.shape[-1]).astype(dtype)
        w = self.einsum("...qhd,...khd->...hqk", query, key_, precision, key=k_s, call=0)
        if bias is not None:
            w = w + bias
        if mask is not None or is_causal:
            masks = [] if mask is None else [mask]
            if is_causal:
                t, s = w.shape[-2:]
                masks.append(jnp.broadcast_to(jnp.tril(jnp.ones((t, s), bool)), w.shape))
            combined = masks[0].astype(bool)
            for m in masks[1:]:
                combined = combined & m.astype(bool)
            w = jnp.where(combined, w, jnp.finfo(dtype).min)
        w = jax.nn.softmax(w).astype(dtype)
        if module is not None:
            module.sow(nnx.Intermediate, "attention_weights", w)
        if not deterministic and dropout_rate > 0.0:
            keep = 1.0 - dropout_rate
            shape = list(w.shape)
            if broadcast_dropout:
                shape[:-2] = [1] * (len(shape) - 2)
            mask_d = jax.random.bernoulli(dropout_rng, keep, shape)
            w = jnp.where(mask_d, w / keep, 0.0).astype(dtype)
        return self.einsum("...hqk,...khd->...qhd", w, value, precision, key=k_v, call=1)


@jax.custom_vjp
def _tapped(y, tap):
    """y itself; the cotangent of `tap` (zeros shaped like y) is the cotangent of y."""
    del tap
    return y


def _tapped_fwd(y, tap):
    del tap
    return y, None


def _tapped_bwd(_, g):
    return g, g


_tapped.defvjp(_tapped_fwd, _tapped_bwd)


def einsum_dimension_numbers(spec: str, lhs_shape, rhs_shape):
    """dot_general dimension numbers and output permutation of a two-operand einsum.

    Supports batch letters (in both inputs and the output), contracted letters (in both
    inputs only), free letters and a leading/trailing '...'. Returns (dn, perm) such that
    einsum(spec, a, b) == transpose(dot_general(a, b, dn), perm).
    """
    s = spec.replace(" ", "")
    if "->" not in s:
        raise ValueError(f"einsum {spec!r} needs an explicit output ('->')")
    ins, out = s.split("->")
    a, b = ins.split(",")
    a, b, out = _expand_ellipsis(a, len(lhs_shape), b, len(rhs_shape), out)
    for name, t in (("lhs", a), ("rhs", b), ("output", out)):
        if len(set(t)) != len(t):
            raise ValueError(f"einsum {spec!r}: repeated index in the {name} is not supported")
    for c in a + b:
        if c not in out and not (c in a and c in b):
            raise ValueError(f"einsum {spec!r}: index {c!r} is summed in one operand only")
    batch = [c for c in a if c in b and c in out]
    contract = [c for c in a if c in b and c not in out]
    dn = (
        (tuple(a.index(c) for c in contract), tuple(b.index(c) for c in contract)),
        (tuple(a.index(c) for c in batch), tuple(b.index(c) for c in batch)),
    )
    result = batch + [c for c in a if c not in b] + [c for c in b if c not in a]
    return dn, tuple(result.index(c) for c in out)


def _expand_ellipsis(a, na, b, nb, out):
    if "..." not in a + b + out:
        return a, b, out
    used = set(a + b + out) - {"."}
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used)
    n = max(na - (len(a) - 3) if "..." in a else 0, nb - (len(b) - 3) if "..." in b else 0)
    fill = "".join(next(spare) for _ in range(n))

    def sub(t, nt):
        if "..." not in t:
            return t
        k = nt - (len(t) - 3)
        return t.replace("...", fill[n - k :])

    return sub(a, na), sub(b, nb), out.replace("...", fill)
