"""Plumbing shared by the RL trainers: key streams, rule lists, nnx models as pure functions.

A trainer builds its model inside `train(keys)` (so seeds can be a vmapped axis), puts it under
fp4lab rules, and splits it into a static graph, the parameters and the mutable rest (the
quantization stream's call counters):

    graphdef, params, qstate = split(model)
    out, qstate = apply(graphdef, params, qstate, lambda m: m(x))   # pure

Bit-exact seeds on XLA:CPU: a seed run alone and the same seed inside a vmapped batch agree bit
for bit only if XLA sums every reduction in the same order in both programs. By default it does
not (jax 0.10): XLA:CPU's fusion emitters vectorize a reduction to a scalar differently from the
same reduction done row by row once a seed axis is added (e.g. the bias gradient of a minibatch),
and it hands some batched reductions to YNNPACK fusions with yet another order. The results then
differ in the last bit of a few gradients, and training amplifies that. Compiling with
`EXACT_CPU` (`jax.jit(f, compiler_options=EXACT_CPU)`) makes both programs use XLA's elemental
emitters, which order a reduction the same way in both: PPO and GRPO are then bit-identical
alone and vmapped (checked in the tests), at a cost in speed (`python benchmarks/rl.py`;
docs/performance.md). Two more sources are avoided in the code. XLA's algebraic simplifier turns a
division by a broadcast scalar (optax.clip_by_global_norm's `g / ||g||`) into a multiplication
by the reciprocal in some programs and not in others, so the trainers use `clip_by_global_norm`
below, one multiplication. A reduction over several axes of a vmapped array may be emitted with
its axes in another order (another summation order), so `global_norm` flattens each leaf first.
One known exception remains: GRPO's logged warm-start loss, whose gather XLA turns into a masked
sum over the vocabulary in the vmapped program only (differs in the last bit; the GRPO metrics
after the warm start agree bit for bit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.nnx.rules import Rule

__all__ = [
    "Keys",
    "as_keys",
    "build_rules",
    "check_recipe",
    "check_rules",
    "sequential_under_vmap",
    "split",
    "apply",
    "EXACT_CPU",
    "clip_by_global_norm",
    "global_norm",
]

# XLA:CPU compiler options under which a reduction's summation order does not depend on whether
# a seed axis was vmapped in: elemental emitters instead of the fusion emitters, no YNNPACK
# fusions, and LLVM's default optimization level (3) pinned against an XLA_FLAGS that lowers it
# (at level 0 a run alone and the same run in a batch were seen to differ in the last bit).
EXACT_CPU = {
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_experimental_ynn_fusion_type": "",
    "xla_backend_optimization_level": 3,
}

_SPECS = schema.OPERAND_NAMES


class Keys(NamedTuple):
    """The independent random streams of one run (a seed)."""

    init: jax.Array  # parameter initialization
    data: jax.Array  # environments / prompts, action and token sampling, minibatch order
    quant: jax.Array  # stochastic rounding and random Hadamard signs (fp4lab.nnx.op)


def as_keys(key_or_keys: jax.Array | Keys | Mapping[str, jax.Array]) -> Keys:
    """Keys as given (also a {"init", "data", "quant"} dict, as fp4lab.train.make_keys makes),
    or three independent streams split from one PRNG key."""
    if isinstance(key_or_keys, Keys):
        return key_or_keys
    if isinstance(key_or_keys, Mapping):
        return Keys(*(key_or_keys[name] for name in Keys._fields))
    init, data, quant = jax.random.split(key_or_keys, 3)
    return Keys(init, data, quant)


def check_recipe(owner: str, field: str, value: Any) -> None:
    """Raises a ValueError naming `owner.field` unless `value` is a recipe name, a GemmRecipe
    or None."""
    if value is None or isinstance(value, recipes.GemmRecipe):
        return
    if not isinstance(value, str) or value not in recipes.names():
        raise ValueError(
            f"{owner}.{field}={value!r}; allowed: a GemmRecipe, None or one of "
            f"{', '.join(recipes.names())}"
        )


def check_rules(owner: str, field: str, value: Any) -> None:
    """Raises a ValueError naming `owner.field` unless `value` is a tuple of fl.Rule."""
    if not isinstance(value, tuple) or not all(isinstance(r, Rule) for r in value):
        raise ValueError(f"{owner}.{field}={value!r}; allowed: a tuple of fp4lab.Rule")


def _padded(recipe: recipes.GemmRecipe | None) -> recipes.GemmRecipe | None:
    if recipe is None:
        return None
    specs = {f: getattr(recipe, f) for f in _SPECS if getattr(recipe, f) is not None}
    return recipe.replace(**{f: s.replace(pad=True) for f, s in specs.items()})


def build_rules(
    recipe: recipes.GemmRecipe | str | None,
    rules: tuple[Rule, ...] = (),
    *,
    backward: str | None = None,
    pad: bool = False,
) -> list[Rule]:
    """The rule list `[*rules, Rule(".*", recipe)]` with recipes resolved.

    Args:
      recipe: the catch-all recipe (name, GemmRecipe or None = high precision).
      rules: exceptions tried first; first match wins.
      backward: if given, every recipe's backward mode is replaced by it.
      pad: zero-pad dimensions the block tiles do not divide (QuantSpec.pad) instead of raising;
        small RL networks have them (4 observations, 2 actions).
    """
    out = []
    for rule in (*rules, Rule(r".*", recipe)):
        r = recipes.get(rule.recipe)
        if r is not None and backward is not None:
            r = r.replace(backward=backward)
        if r is not None and pad:
            r = _padded(r)
        out.append(dataclasses.replace(rule, recipe=r))
    return out


def sequential_under_vmap(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn`, but computed one batch element after another (jax.lax.map) when it is vmapped.

    For parameter initialization under vmapped seeds. jaxlib 0.10's CPU LAPACK kernels split a
    batched QR (the orthogonal initializer's) over XLA's intra-op thread pool and block a pool
    thread until the pieces are done; when several batched QRs run at once they can hold every
    pool thread and wait forever (seen on a 2-core machine within a few hundred calls). Unbatched
    QRs do not wait on the pool. fn's inputs and outputs are pytrees of arrays.
    """

    @jax.custom_batching.custom_vmap
    def wrapped(x):
        return fn(x)

    @wrapped.def_vmap
    def rule(axis_size, in_batched, x):
        (batched,) = in_batched
        if not any(jax.tree.leaves(batched)):
            out = fn(x)
            return out, jax.tree.map(lambda _: False, out)
        x = jax.tree.map(
            lambda a, b: a if b else jnp.broadcast_to(a, (axis_size, *a.shape)), x, batched
        )
        out = jax.lax.map(wrapped, x)  # `wrapped` again: an outer vmap is made sequential too
        return out, jax.tree.map(lambda _: True, out)

    return wrapped


def split(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graphdef, params, qstate): the static graph, the nnx.Param leaves and everything else
    (the quantization stream's base keys and call counters)."""
    return nnx.split(model, nnx.Param, ...)


def apply(
    graphdef: nnx.GraphDef, params: nnx.State, qstate: nnx.State, fn: Callable[[nnx.Module], Any]
) -> tuple[Any, nnx.State]:
    """`fn(model)` on the model rebuilt from its states, and the updated qstate (pure)."""
    model = nnx.merge(graphdef, params, qstate, copy=True)
    out = fn(model)
    return out, nnx.state(model, nnx.Not(nnx.Param))


def global_norm(tree) -> jax.Array:
    """sqrt(sum of squares) over all leaves of a pytree. Each leaf is flattened first: XLA:CPU
    may emit a multi-axis reduction of a vmapped leaf (a LinearGeneral kernel) with its axes in
    another order, i.e. another summation order; a flat reduction is summed the same way."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.reshape(-1))) for x in jax.tree.leaves(tree)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Scales updates by min(1, max_norm / ||g||) (optax.clip_by_global_norm up to rounding).

    Written as one multiplication by a scalar so that XLA compiles it the same way with or
    without a vmapped seed axis: XLA's algebraic simplifier turns optax's `g / ||g||` (a
    division by a broadcast scalar) into a multiplication by the reciprocal in some programs and
    not in others, which changes the last bit.
    """

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        scale = jnp.minimum(1.0, max_norm / norm)  # 1 where the norm is 0 (max_norm / 0 = inf)
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(init, update)
