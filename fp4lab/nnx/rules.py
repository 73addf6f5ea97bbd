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

A recipe with `GemmRecipe.norms` also quantizes the affine vectors of the norm layers
(nnx.LayerNorm, nnx.RMSNorm) whose path its rule matches (`fp4lab.nnx.norms`); other recipes
leave them in high precision, as before. A recipe with `GemmRecipe.outputs` also rounds each
of its GEMMs' outputs, the activations the element-wise ops after it read (a GELU's input, a
residual branch), as microxcaling's emulation does (`fp4lab.ops.custom_vjp.apply`).

Stochastic rounding and random Hadamard signs draw keys from a dedicated quantization stream:
each quantized op (`fp4lab.nnx.op`) holds a base key folded from the model key and its path, and
a call counter; the key of a call is fold_in(base, counter), split per GEMM operand by the plan.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import jax
from flax import nnx

from fp4lab.core import recipes
from fp4lab.nnx import gemm_trace, norms
from fp4lab.nnx.op import (
    QuantizedAttention,
    QuantizedConv,
    QuantizedDot,
    QuantizedEinsum,
    QuantizedOp,
)
from fp4lab.ops import native

__all__ = [
    "Rule",
    "quantize_model",
    "unmatched_rules",
    "check_rules",
    "describe",
    "backend_report",
    "unquantize",
    "unseamed",
    "warn_unseamed",
    "NO_SEAM",
    "OPS",
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
    recipe: recipes.GemmRecipe | str | None  # what to run the matched GEMMs with
    ops: tuple[str, ...] = _DEFAULT_OPS  # seams this rule covers

    def __post_init__(self):
        try:
            re.compile(self.path)
        except re.error as e:
            raise ValueError(f"Rule.path {self.path!r} is not a valid regex: {e}") from e
        recipes.get(self.recipe)  # unknown names raise, listing the known ones
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        bad = [o for o in ops if o not in OPS]
        if bad:
            raise ValueError(f"Rule.ops has unknown ops {bad}; allowed: {', '.join(OPS)}")
        object.__setattr__(self, "ops", ops)

    def matches(self, path: str, op: str) -> bool:
        return op in self.ops and re.fullmatch(self.path, path) is not None


_SEAMS = {  # flax module -> (op name, the attribute holding the op)
    nnx.Linear: ("dot_general", "dot_general"),
    nnx.LinearGeneral: ("dot_general", "dot_general"),
    nnx.Einsum: ("einsum", "einsum_op"),
    nnx.Conv: ("conv", "conv_general_dilated"),
    nnx.MultiHeadAttention: ("attention", "attention_fn"),
}
# flax modules whose parameters no GEMM reads (a lookup table, the norms' scales)
_NO_GEMM = (nnx.Embed, nnx.LayerNorm, nnx.RMSNorm, nnx.BatchNorm, nnx.GroupNorm)
NO_SEAM = "not quantized (no seam)"  # `describe`'s recipe for a module `unseamed` lists
_TRACED: dict = {}  # (call, shapes) -> `warn_unseamed`'s traced answer
_OP_MODULES = {
    cls.op: cls for cls in (QuantizedDot, QuantizedEinsum, QuantizedConv, QuantizedAttention)
}


def _seam(module) -> tuple[str, str] | None:
    for cls, seam in _SEAMS.items():
        if type(module) is cls:
            return seam
    for cls, seam in _SEAMS.items():
        if isinstance(module, cls):
            return seam
    return None


def _seams(model):
    """(path, module, op, attribute) of every quantizable seam of `model`, in graph order."""
    for path, module in nnx.iter_modules(model):
        seam = _seam(module)
        if seam is not None:
            yield path, module, *seam


def unseamed(model: nnx.Module, call=None, *args) -> list[str]:
    """Dotted paths of the modules that hold a parameter of 2 or more dimensions of their own
    (not in a submodule) but no seam `quantize_model` can take (the model itself: the
    parameters' attribute names): a layer that multiplies with
    `jnp.dot` or `x @ w` on its own Param runs in high precision whatever the rules say.
    Flax's Embed and norm layers are left out (no GEMM reads their parameters; a tied
    `Embed.attend` head is such a GEMM and is not seen).

    With `call` (e.g. a loss(model, batch), given its other inputs `args`: arrays or shapes),
    only the modules one of whose parameters a GEMM of `call(model, *args)` reads
    (`fp4lab.nnx.gemm_trace.gemm_params`): a table that is only added, such as a position
    embedding, is then left out."""
    out = {}
    for path, module in nnx.iter_modules(model):
        if _seam(module) is not None or isinstance(module, (*_NO_GEMM, QuantizedOp)):
            continue
        own = [k for k, v in vars(module).items() if isinstance(v, nnx.Param)]
        own = [k for k in own if getattr(getattr(module, k).get_value(), "ndim", 0) >= 2]
        if own and path:
            out[_dotted(path)] = [_dotted((*path, k)) for k in own]
        elif own:  # the model itself: each parameter by its attribute (not the empty path)
            out |= {k: [k] for k in own}
    if call is not None and out:
        read = gemm_trace.gemm_params(model, call, *args)
        out = {m: ps for m, ps in out.items() if read.intersection(ps)}
    return list(out)


def warn_unseamed(model: nnx.Module, rules, call, *args) -> list[str]:
    """Warns (once per process and message) about the modules `unseamed(model, call, *args)`
    lists when `rules` quantize anything; returns them."""
    quantizing = any(r.recipe is not None and not recipes.get(r.recipe).is_identity for r in rules)
    missed = unseamed(model) if quantizing else []
    if missed:  # the loss traced once per process for each model, loss and input shapes
        shapes = jax.tree.map(lambda v: (v.shape, str(v.dtype)), (nnx.state(model), args))
        key = (call, repr(shapes))
        if key not in _TRACED:
            _TRACED[key] = unseamed(model, call, *args)
        missed = _TRACED[key]
    if missed:
        warnings.warn(
            f"{len(missed)} module(s) multiply their own parameters without a seam fp4lab can "
            f"quantize and stay in high precision: {', '.join(repr(m) for m in missed)} (a "
            "custom jnp.dot or @); build them from nnx.Linear, Einsum or Conv to quantize them "
            f"(fl.describe lists them as {NO_SEAM!r})",
            stacklevel=2,
        )
    return missed


def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


def quantize_model(
    model: nnx.Module,
    rules,
    *,
    key: jax.Array | None = None,
    backend: str = "simulated",
    telemetry: bool | str = False,
) -> nnx.Module:
    """Puts every matching GEMM of an unmodified nnx model under its rule's recipe, in place.

    Args:
      model: an nnx.Module built from nnx.Linear, LinearGeneral, Einsum, Conv and
        MultiHeadAttention (any nesting).
      rules: ordered fl.Rule list; for each module and op the first matching rule wins.
        Modules that no rule matches, or whose rule says None, stay in high precision.
      key: the quantization stream's key; required when a recipe uses stochastic rounding or
        random Hadamard signs.
      backend: "simulated", "native" or "auto" for the forward GEMMs (fp4lab.ops.native).
      telemetry: measure operand statistics of every quantized GEMM (fp4lab.nnx.telemetry); off,
        it costs nothing. True computes them by the default method ("fused"); a method's name
        ("fused", "reference": `fp4lab.core.stats.METHODS`) picks one.
    Returns:
      The same model. A rule that matches nothing triggers a warning. Modules whose own 2D+
      parameters no seam covers (`unseamed`: a custom `jnp.dot`) stay in high precision:
      `describe` lists them, and a training run warns once (`warn_unseamed`).
    """
    rules = _as_rules(rules)
    targets, used = _plan(model, rules)
    for module, attr, op, dotted, recipe, layers in targets:
        current = getattr(module, attr)
        original = current.original if isinstance(current, QuantizedOp) else current
        if recipe is None:
            setattr(module, attr, nnx.static(original))
        else:  # a submodule holding the op's state; nnx.data marks it as a child node
            qop = _OP_MODULES[op](recipe, dotted, key, original, backend, telemetry, layers=layers)
            setattr(module, attr, nnx.data(qop))
    for module, dotted, spec in _norm_plan(model, rules, used):
        norms.set_norm_spec(module, spec, dotted)
    for rule, u in zip(rules, used, strict=True):
        if not u:
            warnings.warn(f"quantize_model: rule {rule.path!r} matched no module", stacklevel=2)
    return model


def _norm_plan(model: nnx.Module, rules: list[Rule], used: list[bool]) -> list:
    """(module, dotted path, norms spec or None) of every norm layer (`norms.NORM_TYPES`):
    the `GemmRecipe.norms` of the first rule matching its path (a rule with such a spec is
    then used). Stacked layers (nnx.scan) must agree on one spec."""
    out = []
    for path, module in nnx.iter_modules(model):
        if not isinstance(module, norms.NORM_TYPES):
            continue
        dotted = _dotted(path)
        stack = _stack_of_norm(model, path, module)
        specs = set()
        for layer in _layer_paths(path, *stack) if stack else [dotted]:
            for i, rule in enumerate(rules):
                if re.fullmatch(rule.path, layer) is not None:
                    recipe = recipes.get(rule.recipe)
                    spec = recipe.norms if recipe is not None else None
                    used[i] = used[i] or spec is not None
                    specs.add(spec)
                    break
            else:
                specs.add(None)
        if len(specs) > 1:
            raise ValueError(
                f"{dotted}: the stacked (scanned) layers' rules give its norm vectors different "
                "specs; under nnx.scan every layer's norms take one spec"
            )
        out.append((module, dotted, specs.pop()))
    return out


def _stack_of_norm(model: nnx.Module, path, module) -> tuple[tuple, int] | None:
    """As `_stack_of`, for a norm layer: stacked when its scale has a leading layer axis."""
    scale = getattr(module, "scale", None)
    if not isinstance(scale, nnx.Param) or scale.get_value().ndim < 2:
        return None
    length = scale.get_value().shape[0]
    modules = dict((tuple(p), m) for p, m in nnx.iter_modules(model))
    root = tuple(path)
    for cut in range(len(path) - 1, 0, -1):
        leads = {v.shape[0] if v.ndim else None for v in _params(modules[tuple(path[:cut])])}
        if leads != {length}:
            break
        root = tuple(path[:cut])
    return root, length


def unmatched_rules(model: nnx.Module, rules) -> list[Rule]:
    """The rules that `quantize_model(model, rules)` would apply to no GEMM: their path matches
    no module's (or, in layers stacked for nnx.scan, no layer's) dotted path, or every module
    they match is taken by an earlier rule (first match wins). The model is left as it is."""
    rules = _as_rules(rules)
    _, used = _plan(model, rules)
    _norm_plan(model, rules, used)  # a rule that reaches only norm vectors is used too
    return [rule for rule, u in zip(rules, used, strict=True) if not u]


def check_rules(model: nnx.Module, rules, *, what: str = "rules", last_may_be_unused=True):
    """ValueError naming the first of `rules` that `quantize_model(model, rules)` would apply
    to no GEMM (`unmatched_rules`), with the model's layer paths; a configuration's catch-all
    last rule may match nothing (`last_may_be_unused`). `model` may hold shapes only
    (`nnx.eval_shape`)."""
    rules = _as_rules(rules)
    unused = unmatched_rules(model, rules)
    if last_may_be_unused and rules:
        unused = [r for r in unused if r is not rules[-1]]
    if unused:
        paths = list(dict.fromkeys(describe(model)["path"]))
        shown = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")
        raise ValueError(
            f"{what}: {unused[0].path!r} matches no layer of the model, or only layers an "
            "earlier rule takes (a module goes to the first rule that matches it; a path must "
            f"match the whole dotted path); the model's layers: {shown}"
        )


def _as_rules(rules) -> list[Rule]:
    return [r if isinstance(r, Rule) else Rule(*r) for r in rules]


def _plan(model: nnx.Module, rules: list[Rule]) -> tuple[list, list[bool]]:
    """(targets, used): each seam's (module, attr, op, dotted path, recipe, stacked layers),
    and for each rule whether some seam takes it."""
    used = [False] * len(rules)

    def recipe_of(dotted: str, op: str):
        for i, rule in enumerate(rules):
            if rule.matches(dotted, op):
                used[i] = True
                return True, recipes.get(rule.recipe)
        return False, None

    targets = []
    for path, module, op, attr in _seams(model):
        dotted = _dotted(path)
        stack = _stack_of(model, path, module)
        if stack is None:
            matched, recipe = recipe_of(dotted, op)
            if matched:
                targets.append((module, attr, op, dotted, recipe, ()))
            continue
        layers = tuple((p, recipe_of(p, op)[1]) for p in _layer_paths(path, *stack))
        recipe = next((r for _, r in layers if r is not None), None)
        targets.append((module, attr, op, dotted, recipe, layers))
    return targets, used


def _stack_of(model: nnx.Module, path, module) -> tuple[tuple, int] | None:
    """(path of the stacked module, L) when `module` is a seam inside layers stacked by
    nnx.vmap (for nnx.scan), else None.

    A seam is stacked when its kernel has one axis more than the layer declares (Linear: 2,
    LinearGeneral: its in + out features, Einsum: its kernel_shape, Conv: window + 2); the
    stacked module is its outermost ancestor whose Params all lead with the same L.
    """
    declared = _declared_ndim(module)
    kernel = getattr(module, "kernel", None)
    if declared is None or kernel is None or kernel.get_value().ndim != declared + 1:
        return None
    length = kernel.get_value().shape[0]
    modules = dict((tuple(p), m) for p, m in nnx.iter_modules(model))
    root = tuple(path)
    for cut in range(len(path) - 1, 0, -1):
        leads = {v.shape[0] if v.ndim else None for v in _params(modules[tuple(path[:cut])])}
        if leads != {length}:
            break
        root = tuple(path[:cut])
    return root, length


def _declared_ndim(module) -> int | None:
    if isinstance(module, nnx.Linear):
        return 2
    if isinstance(module, nnx.LinearGeneral):
        return len(module.in_features) + len(module.out_features)
    if isinstance(module, nnx.Einsum):
        return len(module.kernel_shape)
    if isinstance(module, nnx.Conv):
        return len(module.kernel_size) + 2
    return None


def _params(module) -> list:
    # get_value: arrays, or their shapes under nnx.eval_shape (`unmatched_rules`)
    return [v.get_value() for _, v in nnx.to_flat_state(nnx.state(module, nnx.Param))]


def _layer_paths(path, stack_path, length: int) -> list[str]:
    """The dotted path of each layer: the layer index inserted after the stacked module."""
    head, tail = tuple(path[: len(stack_path)]), tuple(path[len(stack_path) :])
    return [_dotted((*head, i, *tail)) for i in range(length)]


def describe(model: nnx.Module):
    """One row per quantizable seam: module path, op, recipe name ("-" = high precision), and
    one per module that `unseamed` lists (op "-", recipe "not quantized (no seam)").

    An op standing for stacked layers gives one row per layer ("blocks.3.attn.query").
    Returns a pandas DataFrame (pandas is imported here, so that training processes that never
    describe a model do not load it).
    """
    import pandas as pd

    rows = []
    for path, module, op, attr in _seams(model):
        current = getattr(module, attr)
        if isinstance(current, QuantizedOp) and current.layers:
            for layer, recipe in current.layers:
                name = "-" if recipe is None else _label(recipe)
                rows.append({"path": layer, "op": op, "recipe": name})
            continue
        stack = _stack_of(model, path, module)
        if stack is not None and not isinstance(current, QuantizedOp):
            rows += [{"path": p, "op": op, "recipe": "-"} for p in _layer_paths(path, *stack)]
            continue
        name = "-"
        if isinstance(current, QuantizedOp):
            name = _label(current.recipe)
        rows.append({"path": _dotted(path), "op": op, "recipe": name})
    for path, module in nnx.iter_modules(model):  # norm layers whose vectors are quantized
        spec = norms.norm_spec(module)
        if spec is not None:
            rows.append({"path": _dotted(path), "op": "norm", "recipe": f"norms={spec.summary()}"})
    rows += [{"path": p, "op": "-", "recipe": NO_SEAM} for p in unseamed(model)]
    return pd.DataFrame(rows, columns=["path", "op", "recipe"])


def _label(recipe: recipes.GemmRecipe) -> str:
    """A recipe's name in `describe`, with its outputs' spec where the name does not say it."""
    name = recipe.name or "custom"
    if recipe.outputs is not None and "outputs=" not in name:
        name += f"+outputs={recipe.outputs.summary()}"
    return name


def backend_report(model: nnx.Module):
    """One row per quantized op and GEMM: where it runs (simulated or native) and why.

    Columns: path, op, recipe, gemm, backend, kind (the native kind the GEMM's operand specs
    match, or None), reason. Resolved as `qdot_general` resolves it on this device
    (`fp4lab.ops.native.gemm_backends`); "auto" fallbacks are listed here, not warned about.
    Returns a pandas DataFrame.
    """
    import pandas as pd

    rows = []
    for _, module in nnx.iter_modules(model):
        if not isinstance(module, QuantizedOp):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            choices = native.gemm_backends(module.recipe, module.backend)
        name = module.recipe.name or "custom"
        for c in choices:
            rows.append(
                {"path": module.path, "op": module.op, "recipe": name, "gemm": c.gemm}
                | {"backend": c.backend, "kind": c.kind, "reason": c.reason}
            )
    columns = ["path", "op", "recipe", "gemm", "backend", "kind", "reason"]
    return pd.DataFrame(rows, columns=columns)


def unquantize(model: nnx.Module) -> nnx.Module:
    """Restores every seam quantize_model replaced (and every norm layer), in place."""
    for _, module, _, attr in _seams(model):
        if isinstance(getattr(module, attr), QuantizedOp):
            setattr(module, attr, nnx.static(getattr(module, attr).original))
    for path, module in nnx.iter_modules(model):
        if norms.norm_spec(module) is not None:
            norms.set_norm_spec(module, None, _dotted(path))
    return model
