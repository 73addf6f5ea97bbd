"""Which parameters of a model a GEMM reads: found in the program, not guessed from shapes.

`unseamed` (`fp4lab.nnx.rules`) lists the modules that hold a 2D+ parameter of their own but
no seam; such a parameter may be a weight a custom `jnp.dot` multiplies (a GEMM that stays in
high precision) or a table that is only added (a position embedding). `gemm_params` tells the
two apart: it traces a call of the model (`jax.make_jaxpr`, shapes only, nothing computed) and
follows each parameter through the ops that only move or cast it (reshape, transpose, a cast,
a slice of stacked layers) into the operands of `dot_general` and `conv_general_dilated`,
inside nested programs too (jit, scan, cond, remat, custom derivatives).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx
from jax.extend import core as jax_core

__all__ = ["gemm_params"]

GEMMS = {"dot_general", "conv_general_dilated"}
# ops whose output is their input moved, cast or cut: a parameter passes through them
MOVES = {
    "reshape",
    "transpose",
    "convert_element_type",
    "broadcast_in_dim",
    "squeeze",
    "expand_dims",
    "copy",
    "copy_p",
    "reduce_precision",
    "slice",
    "dynamic_slice",
    "gather",
    "rev",
}


def gemm_params(model: nnx.Module, call: Callable[..., object], *args) -> set[str]:
    """Dotted paths of the Params of `model` that reach an operand of a GEMM in
    `call(model, *args)`.

    Args:
      model: an nnx module (its Params become the traced inputs; nothing is changed), arrays or
        shapes only (`nnx.eval_shape`).
      call: a function of the model and `args`, e.g. a loss(model, batch).
      args: its other inputs, arrays or `jax.ShapeDtypeStruct`s.
    Returns:
      {"fc.kernel", "blocks.0.w", ...}.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    paths = [".".join(map(str, p)) for p, _ in nnx.to_flat_state(params)]
    leaves, tree = jax.tree.flatten(params)

    def traced(values, args):
        return call(nnx.merge(graphdef, jax.tree.unflatten(tree, values), rest), *args)

    closed = jax.make_jaxpr(traced)(leaves, args)
    reached: set[int] = set()
    _walk(closed.jaxpr, [{i} for i in range(len(leaves))], reached)
    return {paths[i] for i in reached}


def _walk(jaxpr, inputs: list[set[int]], reached: set[int]) -> None:
    """Marks in `reached` the parameter indices that flow into a GEMM operand; `inputs` are the
    parameter indices each input variable of `jaxpr` carries."""
    carries: dict = {}
    for var, given in zip(jaxpr.invars, inputs, strict=False):
        if given:
            carries[var] = given

    def of(var) -> set[int]:
        return carries.get(var, set()) if not isinstance(var, jax_core.Literal) else set()

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [of(v) for v in eqn.invars]
        if name in GEMMS:
            for given in ins[:2]:
                reached.update(given)
        elif name in MOVES and ins and ins[0]:
            for out in eqn.outvars:
                carries[out] = set(ins[0])
        for sub, offset in _subprograms(eqn):
            _walk(sub, ins[offset:], reached)


def _subprograms(eqn):
    """(jaxpr, index of the eqn's first input its first input variable takes) of each program
    nested in an equation: jit, remat and custom-derivative calls take the inputs in order,
    scan its consts, carry and slices in order, cond its operands after the branch index, a
    while loop's body its own consts and the carry after the condition's consts (the
    condition itself is left out: it decides, it does not multiply)."""
    offsets = {"branches": 1, "body_jaxpr": eqn.params.get("cond_nconsts", 0)}
    for key, value in eqn.params.items():
        values = value if isinstance(value, tuple | list) else (value,)
        for v in values:
            inner = getattr(v, "jaxpr", v)
            if isinstance(inner, jax_core.Jaxpr) and key != "cond_jaxpr":
                yield inner, offsets.get(key, 0)
