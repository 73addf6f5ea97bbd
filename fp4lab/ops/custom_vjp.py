"""The one custom VJP every quantized op runs under.

    y = apply(gemm, lhs, rhs, aux)                  # gemm: an `fp4lab.ops.plan.Gemm`
    y, fwd_stats = apply(gemm, lhs, rhs, aux, probe)   # with telemetry (gemm.telemetry=True)

The forward runs `gemm.forward_saving` (the output, and what the backward keeps of it: Fprop's
quantized w where Dgrad can take it), the backward `gemm.grads`, each one compiled computation
per (gemm, shapes), also when called eagerly (op-by-op dispatch of the quantizer's many small
ops is slow); the primal and the forward rule share that one trace. The gradient channel: with
telemetry the op takes a zero `probe` input, and the probe's cotangent is the backward
statistics, so they leave the VJP like any gradient and model code does not change
(docs/architecture.md §5). A recipe's `outputs` spec then rounds the output, outside the VJP,
through `fake_quant` (straight-through: the backward GEMMs get the cotangent unchanged).

Errors name the layer: an op module (`fp4lab.nnx.op`) calls under `calling(path, recipe)`, and a
shape error of its forward, or of a backward traced later (outside the call), is raised again
by `at_layer` with the layer's path and the one-line fix (`recipe.replace(pad=True)`, or
`fp4lab run --set pad=true`).
"""

from __future__ import annotations

import contextlib
import functools

import jax

from fp4lab.core import kernel_route, recipes
from fp4lab.core.quantize import fake_quant

__all__ = ["apply", "at_layer", "calling", "named_layer"]

_CALLER: list = [None]  # (layer path, recipe name) of the op module calling, while it calls
_SEEN: dict = {}  # (gemm, lhs shape, rhs shape) -> {layer path: recipe name} that ran it


@contextlib.contextmanager
def calling(path: str, recipe: str):
    """While an op module at `path` runs under the recipe named `recipe`: its GEMMs' backward
    errors name it (`at_layer`)."""
    previous, _CALLER[0] = _CALLER[0], (path, recipe)
    try:
        yield
    finally:
        _CALLER[0] = previous


def named_layer(call):
    """An op module's __call__ (an object with `path` and `recipe`, `fp4lab.nnx.op`) whose
    errors name its layer and the fix (`at_layer`), also those of the backward, traced after
    the call."""

    @functools.wraps(call)
    def named(op, *args, **kwargs):
        name = op.recipe.name or ""
        try:
            with calling(op.path, name):
                return call(op, *args, **kwargs)
        except ValueError as e:
            raise at_layer({op.path: name}, e) from e

    return named


def at_layer(layers: dict[str, str], error: ValueError) -> ValueError:
    """`error` again, naming the layers ({path: recipe name}) it arose in and, for a shape the
    blocks do not divide, the one-line fix; unchanged when it names a layer already."""
    text = str(error)
    if not layers or text.startswith("layer "):
        return error
    paths = " or ".join(repr(p) for p in layers)
    out = f"layer {paths}: {text}"
    if "pad=True" in text:
        name = next(iter(layers.values()))
        value = f'fl.recipes.get("{name}")' if name in recipes.names() else None
        value = value or f"<your GemmRecipe {name!r}>" if name else "<your GemmRecipe>"
        out += (
            f"; the one-line fix: recipe={value}.replace(pad=True) (every operand zero-padded "
            "to whole blocks), or `fp4lab run ... --set pad=true`; or keep the layer in high "
            f"precision with the rule ({paths.split(' or ')[0]}, None)"
        )
    return ValueError(out)


# `kernel` (`kernel_route.enabled()` when the op is traced) only keys the traces: the quantizers
# inside read it themselves, and a trace kept from before FP4LAB_QUANTIZER changed would
# otherwise hold the other quantizer.
def _forward(gemm, kernel, lhs, rhs, aux):
    del kernel
    return gemm.forward_saving(lhs, rhs, aux)


def _grads(gemm, kernel, lhs, rhs, g, aux, saved):
    del kernel
    return gemm.grads(lhs, rhs, g, aux, saved)


_forward = jax.jit(_forward, static_argnums=(0, 1))
_grads = jax.jit(_grads, static_argnums=(0, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _vjp(gemm, kernel, lhs, rhs, aux, probe):
    del probe
    return _forward(gemm, kernel, lhs, rhs, aux)[0]  # one trace with the forward rule's


def _vjp_fwd(gemm, kernel, lhs, rhs, aux, probe):
    del probe
    y, saved = _forward(gemm, kernel, lhs, rhs, aux)
    return y, (lhs, rhs, aux, saved)


def _vjp_bwd(gemm, kernel, res, cotangent):
    lhs, rhs, aux, saved = res
    g = cotangent[0] if gemm.telemetry else cotangent
    try:
        dx, dw, stats = _grads(gemm, kernel, lhs, rhs, g, aux, saved)
    except ValueError as e:  # traced outside the op's call: name its layer from `_SEEN`
        raise at_layer(_SEEN.get((gemm, lhs.shape, rhs.shape), {}), e) from e
    return dx, dw, None, stats


_vjp.defvjp(_vjp_fwd, _vjp_bwd)


def apply(gemm, lhs, rhs, aux, probe=None):
    """Runs `gemm` on (lhs, rhs) under the custom VJP.

    Args:
      gemm: a static `Gemm`; `gemm.telemetry` must be True exactly when `probe` is given.
      lhs, rhs: the op's operands.
      aux: (key, amax dict, when), not differentiated; `when` (telemetry): None measures every
        call, a traced boolean only the calls where it holds (`fp4lab.ops.plan`).
      probe: telemetry's zero input of shape (len(BWD_OPERANDS), len(STATS)), or None.
    Returns:
      y, or (y, forward statistics) with telemetry; the probe's cotangent carries the backward
      statistics. y is rounded through `gemm.recipe.outputs` where that is set.
    """
    if gemm.telemetry != (probe is not None):
        raise ValueError("apply: pass a probe exactly when gemm.telemetry is True")
    if _CALLER[0] is not None:
        path, recipe = _CALLER[0]
        _SEEN.setdefault((gemm, lhs.shape, rhs.shape), {})[path] = recipe
    out = _vjp(gemm, kernel_route.enabled(), lhs, rhs, aux, probe)
    spec = gemm.recipe.outputs
    if spec is None:
        return out
    y = out[0] if gemm.telemetry else out
    width, block = y.shape[spec.axis], spec.tile[-1] if spec.tile is not None else 1
    if width % block and not spec.pad:
        raise ValueError(
            f"the GEMM's output {tuple(y.shape)}: its axis {spec.axis} is not a multiple of the "
            f"outputs spec's block {block} ({spec.summary()}); zero-pad with an outputs spec "
            "whose pad is True, or keep this layer's outputs unquantized"
        )
    y = fake_quant(y, spec)
    return (y, out[1]) if gemm.telemetry else y
