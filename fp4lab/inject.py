"""Unmodified Flax NNX models under per-layer quantization rules.

    rules = [fl.Rule(r".*lm_head.*", None),            # first match wins; None = high precision
             fl.Rule(r".*blocks\\.(6|7)\\..*", "bf16"),
             fl.Rule(r".*", "nvfp4")]
    fl.quantize_model(model, rules, key=jax.random.key(0))   # in place
    print(fl.describe(model))                                 # path, op, recipe

Injection uses flax's own seams: `dot_general` of nnx.Linear and nnx.LinearGeneral (and so the
query/key/value/out projections of nnx.MultiHeadAttention), `einsum_op` of nnx.Einsum,
`conv_general_dilated` of nnx.Conv, and, for the op "attention" that rules must opt into,
`attention_fn` of nnx.MultiHeadAttention (the score and value matmuls). Module paths are the
dotted nnx graph paths ("blocks.0.mlp.up").

Stochastic rounding and random Hadamard signs draw keys from a dedicated quantization stream:
each quantized op holds a base key folded from the model key and its path, and a call counter;
the key of a call is fold_in(base, counter), split per GEMM operand by `qdot_general`.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
import zlib

import jax
import jax.numpy as jnp
import pandas as pd
from flax import nnx

from fp4lab import recipes as R
from fp4lab import telemetry as T
from fp4lab.qconv import qconv_general_dilated
from fp4lab.qdot import qdot_general

__all__ = [
    "Rule",
    "quantize_model",
    "describe",
    "QuantizedOp",
    "QuantKey",
    "OPS",
    "einsum_dimension_numbers",
]

OPS = ("dot_general", "einsum", "conv", "attention")
_DEFAULT_OPS = ("dot_general", "einsum", "conv")


@dataclasses.dataclass(frozen=True)
class Rule:
    """Quantize modules whose dotted path fully matches `path` with `recipe`.

    recipe: a GemmRecipe, a recipe name or None (keep high precision).
    ops: which seams the rule applies to; "attention" (the score and value matmuls inside
    nnx.MultiHeadAttention) is opt-in.
    """

    path: str  # regular expression, matched against the whole dotted path
    recipe: R.GemmRecipe | str | None  # what to run the matched GEMMs with
    ops: tuple[str, ...] = _DEFAULT_OPS  # seams this rule covers

    def __post_init__(self):
        try:
            re.compile(self.path)
        except re.error as e:
            raise ValueError(f"Rule.path {self.path!r} is not a valid regex: {e}") from e
        R.get(self.recipe)  # unknown names raise, listing the known ones
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        bad = [o for o in ops if o not in OPS]
        if bad:
            raise ValueError(f"Rule.ops has unknown ops {bad}; allowed: {', '.join(OPS)}")
        object.__setattr__(self, "ops", ops)

    def matches(self, path: str, op: str) -> bool:
        return op in self.ops and re.fullmatch(self.path, path) is not None


class QuantKey(nnx.Variable):
    """Quantization-stream state of one op: base key and call counter."""


class AmaxHistory(nnx.Variable):
    """Delayed scaling: the last n amaxes of an operand, most recent first (zeros: none yet)."""


def _history(recipe: R.GemmRecipe, names: tuple[str, ...]) -> tuple[int, str]:
    specs = [s for n, s in recipe.used_specs().items() if n in names and s is not None]
    delayed = [s for s in specs if s.amax_history]
    if not delayed:
        return 0, "max"
    return max(s.amax_history for s in delayed), delayed[0].amax_algo


class QuantizedOp(nnx.Module):
    """A quantized stand-in for lax.dot_general / jnp.einsum / conv / attention in one module."""

    def __init__(
        self,
        recipe: R.GemmRecipe,
        op: str,
        path: str,
        key: jax.Array | None,
        original=None,
        backend: str = "simulated",
        telemetry: bool = False,
    ):
        self.recipe = recipe
        self.op = op
        self.path = path
        self.backend = backend
        self.original = original  # the callable it replaced (restored by unquantize)
        calls, n = len(self.stat_layers()), len(T.STATS)
        self._delayed = {
            "x": _history(recipe, ("fprop_x", "wgrad_x")),
            "w": _history(recipe, ("fprop_w", "dgrad_w")),
        }
        if _history(recipe, ("dgrad_dy", "wgrad_dy"))[0]:
            raise ValueError(
                f"{path}: delayed scaling (amax_history) applies to the forward "
                "tensors x and w; gradients use current scaling"
            )
        if op in ("attention", "conv") and any(n for n, _ in self._delayed.values()):
            raise ValueError(
                f"{path}: delayed scaling is supported for dot_general and einsum ops, not {op}"
            )
        for name, (length, _) in self._delayed.items():
            hist = AmaxHistory(jnp.zeros((length,), jnp.float32)) if length else None
            setattr(self, f"amax_{name}", hist)
        # telemetry: the gradient channel and the latest forward statistics (not for convs yet)
        self.measure = telemetry and op != "conv"  # static: set_enabled switches it per step
        if telemetry and op != "conv":
            self.probe = T.GradProbe(jnp.zeros((calls, len(T.BWD_OPERANDS), n), jnp.float32))
            self.fstats = T.OpStats(jnp.zeros((calls, len(T.FWD_OPERANDS), n), jnp.float32))
        else:
            self.probe = self.fstats = None
        if recipe.needs_key:
            if key is None:
                raise ValueError(
                    f"recipe {recipe.name or recipe} at {path!r} needs a key: "
                    "pass quantize_model(..., key=...)"
                )
            self.qbase = QuantKey(jax.random.fold_in(key, zlib.crc32(path.encode())))
            self.qcount = QuantKey(jnp.zeros((), jnp.uint32))
        else:
            self.qbase = self.qcount = None

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

    def stat_layers(self) -> list[str]:
        """Telemetry layer names of this op's GEMM calls."""
        if self.op == "attention":
            return [f"{self.path}.scores", f"{self.path}.values"]
        return [self.path]

    def next_key(self) -> jax.Array | None:
        if self.qbase is None:
            return None
        count = self.qcount[...]
        self.qcount[...] = count + 1
        return jax.random.fold_in(self.qbase[...], count)

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
        probe = self.probe[...][call] if self.probe is not None and self.measure else None
        amax = {}
        for name, operand in (("x", lhs), ("w", rhs)):
            if self._delayed[name][0]:
                amax[name] = self._delayed_amax(name, operand)
        out = qdot_general(
            lhs,
            rhs,
            dimension_numbers,
            self.recipe,
            key=key,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            backend=self.backend,
            probe=probe,
            amax=amax,
        )
        if probe is None:
            return out
        y, stats = out
        self.fstats[...] = self.fstats[...].at[call].set(stats)
        return y

    def __call__(self, *args, **kwargs):
        key = self.next_key()
        if self.op == "dot_general":
            return self.dot_general(*args, key=key, **kwargs)
        if self.op == "einsum":
            return self._einsum(*args, key=key, **kwargs)
        if self.op == "conv":
            return qconv_general_dilated(*args, recipe=self.recipe, key=key, **kwargs)
        return self._attention(*args, key=key, **kwargs)

    def _einsum(
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
        dn, perm = einsum_dimension_numbers(spec, lhs.shape, rhs.shape)
        y = self.dot_general(
            lhs, rhs, dn, precision, preferred_element_type, out_sharding, key=key, call=call
        )
        return jnp.transpose(y, perm)

    def _attention(
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
        *,
        key=None,
        **unused,
    ):
        """dot_product_attention with quantized score (q.k) and value (p.v) matmuls."""
        if unused:
            raise ValueError(f"quantized attention got unsupported arguments {sorted(unused)}")
        k_s = k_v = None
        if key is not None:
            k_s, k_v = jax.random.split(key)
        dtype = dtype or query.dtype
        q_heads, k_heads = query.shape[-2], key_.shape[-2]
        if q_heads != k_heads:  # grouped-query attention: repeat the key/value heads
            key_ = jnp.repeat(key_, q_heads // k_heads, axis=-2)
            value = jnp.repeat(value, q_heads // k_heads, axis=-2)
        query = query / jnp.sqrt(query.shape[-1]).astype(dtype)
        w = self._einsum("...qhd,...khd->...hqk", query, key_, precision, key=k_s, call=0)
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
        return self._einsum("...hqk,...khd->...qhd", w, value, precision, key=k_v, call=1)


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


_SEAMS = {
    nnx.Linear: ("dot_general", "dot_general"),
    nnx.LinearGeneral: ("dot_general", "dot_general"),
    nnx.Einsum: ("einsum", "einsum_op"),
    nnx.Conv: ("conv", "conv_general_dilated"),
    nnx.MultiHeadAttention: ("attention", "attention_fn"),
}


def _seam(module) -> tuple[str, str] | None:
    for cls, seam in _SEAMS.items():
        if type(module) is cls:
            return seam
    for cls, seam in _SEAMS.items():
        if isinstance(module, cls):
            return seam
    return None


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


def quantize_model(
    model: nnx.Module,
    rules,
    *,
    key: jax.Array | None = None,
    backend: str = "simulated",
    telemetry: bool = False,
) -> nnx.Module:
    """Puts every matching GEMM of an unmodified nnx model under its rule's recipe, in place.

    Args:
      model: an nnx.Module built from nnx.Linear, LinearGeneral, Einsum, Conv and
        MultiHeadAttention (any nesting).
      rules: ordered fl.Rule list; for each module and op the first matching rule wins.
        Modules that no rule matches, or whose rule says None, stay in high precision.
      key: the quantization stream's key; required when a recipe uses stochastic rounding or
        random Hadamard signs.
      backend: "simulated", "native" or "auto" for the forward GEMMs (fp4lab.backends).
      telemetry: measure operand statistics of every quantized GEMM (fp4lab.telemetry); off,
        it costs nothing.
    Returns:
      The same model. A rule that matches nothing triggers a warning.
    """
    rules = [r if isinstance(r, Rule) else Rule(*r) for r in rules]
    used = [False] * len(rules)
    targets = []
    for path, module in nnx.iter_modules(model):
        seam = _seam(module)
        if seam is None:
            continue
        op, attr = seam
        dotted = _dotted(path)
        for i, rule in enumerate(rules):
            if rule.matches(dotted, op):
                used[i] = True
                targets.append((module, attr, op, dotted, R.get(rule.recipe)))
                break
    for module, attr, op, dotted, recipe in targets:
        current = getattr(module, attr)
        original = current.original if isinstance(current, QuantizedOp) else current
        if recipe is None:
            setattr(module, attr, nnx.static(original))
        else:  # a submodule holding the op's state; nnx.data marks it as a child node
            qop = QuantizedOp(recipe, op, dotted, key, original, backend, telemetry)
            setattr(module, attr, nnx.data(qop))
    for rule, u in zip(rules, used, strict=True):
        if not u:
            warnings.warn(f"quantize_model: rule {rule.path!r} matched no module", stacklevel=2)
    return model


def describe(model: nnx.Module) -> pd.DataFrame:
    """One row per quantizable seam: module path, op, recipe name ("-" = high precision)."""
    rows = []
    for path, module in nnx.iter_modules(model):
        seam = _seam(module)
        if seam is None:
            continue
        op, attr = seam
        current = getattr(module, attr)
        name = "-"
        if isinstance(current, QuantizedOp):
            name = current.recipe.name or "custom"
        rows.append({"path": _dotted(path), "op": op, "recipe": name})
    return pd.DataFrame(rows, columns=["path", "op", "recipe"])


def unquantize(model: nnx.Module) -> nnx.Module:
    """Restores every seam quantize_model replaced, in place."""
    for _, module in nnx.iter_modules(model):
        seam = _seam(module)
        if seam is not None and isinstance(getattr(module, seam[1]), QuantizedOp):
            setattr(module, seam[1], nnx.static(getattr(module, seam[1]).original))
    return model
