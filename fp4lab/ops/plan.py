"""The per-GEMM operand plan, shared by every quantized op (dot_general, einsum, conv).

A linear op's training step runs three GEMMs (docs/architecture.md §3):

    Fprop  y  = Q(x) . Q(w)          both quantized along the contraction axis
    Dgrad  dx = Q(dy) . Q(w)^T       along the output-feature axis
    Wgrad  dw = Q(x)^T . Q(dy)       along the token (batch) axis

`Gemm` is the static description of one quantized op (its recipe and its underlying GEMM);
its `forward` and `grads` quantize the operands that the recipe and the backward mode choose,
in the op's layout (`fp4lab.ops.layout`), and run the GEMMs that `jax.vjp` of the plain op
runs on them, so a recipe without quantization is bit-identical to the plain op in values and
gradients. With telemetry, each quantized operand also yields the statistics of
`fp4lab.core.stats` (zeros for an operand left unquantized).

One quantized weight for Fprop and Dgrad: where both GEMMs quantize w under the same spec up
to its axis, with square tiles (NVIDIA's 16x16 weight blocks) or one scale per tensor, round to
nearest and no rotation, Fprop's and Dgrad's blocks of w are the same elements and x_hat is the
same array bit for bit (`Gemm.shares_weight`). The forward then keeps Fprop's w_hat for the
backward instead of quantizing w again, as hardware recipes do with 2D weight scaling. With
the fused statistics, Dgrad's w statistics are then Fprop's: the statistics of the same blocks
of the same values (the reference statistics measure Dgrad's w on its own, as they did).

Token padding: the Wgrad GEMM contracts over tokens, whose count the data decides. Where the
Wgrad operands' tiles or Hadamard size do not divide it (and the quantizer would otherwise
raise), `grads` zero-pads the token axis of x and dy to the least common multiple of the two
operands' tile widths and Hadamard sizes, quantizes the padded operands and contracts them at
the padded length (`fp4lab.ops.layout`); the result is exact (padded rows add nothing, the
rotation is orthogonal). The statistics of a padded operand include its zero rows. A token
count that divides takes the unpadded path, bit for bit as before. Any other shape error names
the GEMM, the operand and the axis.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from fp4lab.core import hadamard, prng, recipes
from fp4lab.core.quantize import quantize_dequantize
from fp4lab.core.spec import QuantSpec
from fp4lab.core.stats import operand_stats, operand_stats_deferred
from fp4lab.ops import layout
from fp4lab.schema import BWD_OPERANDS, FWD_OPERANDS, OPERAND_NAMES, STATS

__all__ = ["Gemm", "operand_keys", "quantize_operand", "resolve_recipe"]

_TRANSFORM_INDEX = {"fprop": 100, "dgrad": 101, "wgrad": 102}


def operand_keys(key: jax.Array) -> dict[str, jax.Array]:
    """Independent keys for the six operands and the three GEMM rotations of one call:
    operand i of `OPERAND_NAMES` gets fold_in(key, i), GEMM g's rotation `<g>_transform`."""
    names = [*OPERAND_NAMES, *(f"{g}_transform" for g in _TRANSFORM_INDEX)]
    data = jnp.asarray([*range(len(OPERAND_NAMES)), *_TRANSFORM_INDEX.values()], jnp.uint32)
    # the keys of nine fold_ins, bit for bit, from one Threefry hash over the nine counters
    # (every quantized call derives them; prng compiles no while loop for it)
    ks = prng.fold_in(key, data)
    return {name: ks[i] for i, name in enumerate(names)}


def resolve_recipe(recipe, key) -> tuple[recipes.GemmRecipe, jax.Array]:
    """(GemmRecipe, key) for a quantized op: names looked up, None = no quantization; a key is
    required where the recipe draws random numbers, and a fixed unused one stands in elsewhere."""
    recipe = recipes.get(recipe) or recipes.GemmRecipe()
    if recipe.needs_key and key is None:
        raise ValueError(
            f"recipe {recipe.name or recipe} needs a PRNG key (stochastic rounding "
            "or random Hadamard signs); pass key=..."
        )
    if key is None:
        key = jax.random.key(0)  # never consumed: the recipe is deterministic
    return recipe, key


def _along(a, axis: int, fn):
    """fn applied with `axis` moved last (Hadamard rotations act on the last axis)."""
    return jnp.moveaxis(fn(jnp.moveaxis(a, axis, -1)), -1, axis)


def quantize_operand(
    a,
    spec: QuantSpec | None,
    axis: int,
    transform,
    key,
    tkey,
    stats: bool,
    amax=None,
    name="",
    method="fused",
):
    """Quantize-dequantize one operand along `axis`, rotated by its GEMM's transform.

    Returns (x_hat in the rotated domain, statistics or None); the statistics (computed by
    `method`, see `fp4lab.core.stats`) are zeros for an unquantized operand. With
    `stats="deferred"` the second element is a function of no arguments that gives them
    (`fp4lab.core.stats.operand_stats_deferred`: the fused method measures the blocks of this
    quantization), for a caller that measures only on some steps. `amax` (delayed
    scaling) is used only where the spec asks for it. A shape the tile or rotation cannot block
    raises a ValueError that names the operand `name` (e.g. "wgrad_x": the Wgrad GEMM's x), the
    axis and the shape in the op's layout.
    """
    try:
        return _quantize_operand(a, spec, axis, transform, key, tkey, stats, amax, method)
    except ValueError as e:
        if not name:
            raise
        gemm, operand = name.split("_", 1)
        raise ValueError(
            f"{gemm.capitalize()} GEMM, operand {operand} ({name}), blocked along axis {axis} of "
            f"its layout shape {tuple(a.shape)}: {e}"
        ) from e


def _quantize_operand(a, spec, axis, transform, key, tkey, stats, amax, method):
    deferred = stats == "deferred"
    none = jnp.zeros(len(STATS), jnp.float32) if stats else None
    if deferred:
        none = _given(none)
    if spec is None and transform is None:
        return a, none
    if spec is None:  # unquantized operand of a rotated GEMM: rotate only
        rotated = _along(a, axis, lambda m: hadamard.rotate(m, transform, tkey))
        return rotated.astype(a.dtype), none
    spec = spec.replace(axis=axis, transform=transform)
    amax = amax if spec.amax_history else None
    if deferred:
        return operand_stats_deferred(
            a, spec, key=key, transform_key=tkey, amax=amax, method=method
        )
    if stats:
        return operand_stats(a, spec, key=key, transform_key=tkey, amax=amax, method=method)
    return quantize_dequantize(a, spec, key=key, transform_key=tkey, amax=amax, rotated=True), None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gemm:
    """One quantized op: a hashable, static value (the custom VJP's non-differentiable input).

    Subclasses say what the op computes (`gemm`) and how its operands are laid out for
    quantization (`layout`); the plan below is the same for all of them.
    """

    recipe: recipes.GemmRecipe
    telemetry: bool = False  # measure operand statistics (forward output, backward probe)
    stats: str = "fused"  # how: `fp4lab.core.stats.METHODS`

    def gemm(self, a, b):
        """The op on (dequantized) operands, e.g. lax.dot_general with fixed arguments."""
        raise NotImplementedError

    def layout(self, lhs_shape, rhs_shape):
        """The operand layout (`fp4lab.ops.layout`) for operands of these shapes."""
        raise NotImplementedError

    def fprop_operands(self, lhs, rhs, keys, amax, *, rotated: bool, stats: bool | str):
        """Dequantized Fprop operands in the original layout (in the rotated domain if
        `rotated`), and their statistics (2, len(STATS)) or None; with stats="deferred", a
        function of no arguments that gives them (`quantize_operand`)."""
        r = self.recipe
        lay = self.layout(lhs.shape, rhs.shape)
        t, tkey = r.transform("fprop"), keys["fprop_transform"]
        ax, aw = lay.axes["fprop_x"], lay.axes["fprop_w"]
        x, sx = quantize_operand(
            lay.lhs_to(lhs),
            r.fprop_x,
            ax,
            t,
            keys["fprop_x"],
            tkey,
            stats,
            amax.get("x"),
            "fprop_x",
            self.stats,
        )
        w, sw = quantize_operand(
            lay.rhs_to(rhs),
            r.fprop_w,
            aw,
            t,
            keys["fprop_w"],
            tkey,
            stats,
            amax.get("w"),
            "fprop_w",
            self.stats,
        )
        if t is not None and not rotated:
            x = _along(x, ax, lambda m: hadamard.unrotate(m, t, tkey)).astype(lhs.dtype)
            w = _along(w, aw, lambda m: hadamard.unrotate(m, t, tkey)).astype(rhs.dtype)
        if stats == "deferred":
            return lay.lhs_from(x), lay.rhs_from(w), lambda: jnp.stack([sx(), sw()])
        return lay.lhs_from(x), lay.rhs_from(w), (jnp.stack([sx, sw]) if stats else None)

    def fprop_stats(self, lhs, rhs, keys, amax, when=None):
        """The Fprop operands' statistics (2, len(STATS)) for a GEMM that quantizes its operands
        elsewhere (the native one): computed as they are quantized when `when` is None, else
        only where the traced flag `when` holds (a lax.cond whose other branch gives zeros),
        from a quantization of their own."""

        def stats():
            return self.fprop_operands(lhs, rhs, keys, amax, rotated=True, stats=True)[2]

        return stats() if when is None else _when(when, stats, (len(FWD_OPERANDS), len(STATS)))

    def shares_weight(self, lhs_shape, rhs_shape) -> bool:
        """Whether Dgrad's quantized w is Fprop's, bit for bit, so the backward can take it.

        Holds when both GEMMs quantize w of the canonical (B, N, K) dot layout (Fprop along K,
        Dgrad along N) under specs equal up to the axis, without the reference statistics
        (which measure Dgrad's w on its own; the fused ones take Fprop's), with
        - square tiles (ty == tx) that divide N and K, or no tiles (one scale per tensor): the
          blocks along K and along N are then the same sets of elements;
        - an outer scale per tensor or none (a per-row scale depends on the axis);
        - round to nearest even and no four-over-six (stochastic bits and four-over-six's
          error sums follow the layout);
        - no Hadamard on either GEMM.
        Everything else the quantizer computes from a block is elementwise or a max.
        """
        r = self.recipe
        a, b = r.fprop_w, r.dgrad_w
        if self.telemetry and self.stats == "reference":
            return False
        if r.backward != "quantized" or a is None or b is None:
            return False
        if a.replace(axis=0) != b.replace(axis=0) or r.transform("fprop") or r.transform("dgrad"):
            return False
        if a.rounding != "rne" or a.four_over_six is not None or a.outer == "row":
            return False
        lay = self.layout(lhs_shape, rhs_shape)
        if not isinstance(lay, layout.DotLayout):
            return False
        if a.tile is not None:
            ty, tx = a.tile
            _, _, n, k = lay.bmnk
            if ty != tx or n % tx or k % tx:
                return False
        return True

    def token_padding(self, lay, tokens: int) -> int:
        """The padded token count of the Wgrad operands: `tokens` when the quantizer can block
        it as it is (it divides, or a spec pads by itself without a rotation), else the next
        multiple of the least common multiple of both operands' tile widths and Hadamard size."""
        r = self.recipe
        if r.backward != "quantized":
            return tokens
        t = r.transform("wgrad")
        multiple, raises = 1, False
        for spec in (r.wgrad_x, r.wgrad_dy):
            if spec is None and t is None:
                continue
            tx = spec.tile[1] if spec is not None and spec.tile is not None else 1
            need = math.lcm(tx, t.size) if t is not None else tx
            multiple = math.lcm(multiple, need)
            self_padding = spec is not None and spec.pad and t is None
            raises = raises or (tokens % need != 0 and not self_padding)
        return -(-tokens // multiple) * multiple if raises else tokens

    def backward_operands(self, lhs, rhs, g, keys, amax, saved=None, when=None):
        """(w for Dgrad, dy for Dgrad, x for Wgrad, dy for Wgrad) in the original layouts, as
        the backward mode says, and the statistics (4, len(STATS)) of `BWD_OPERANDS` or None.
        `saved`: what `forward_saving` kept where `shares_weight` holds: Fprop's quantized w,
        taken as Dgrad's, and with telemetry its statistics. `when` (telemetry): None measures
        the operands as they are quantized; a traced flag measures them only where it holds
        (a lax.cond over the statistics of the operands the GEMMs take, which are those of a
        run without telemetry).
        Wgrad operands whose token axis needs padding (`token_padding`) come back padded, in
        the op's layout (`grads` contracts them there)."""
        if not self.telemetry or when is None or self.recipe.backward != "quantized":
            return self._backward_operands(lhs, rhs, g, keys, amax, saved, self.telemetry)
        operands, stats = self._backward_operands(lhs, rhs, g, keys, amax, saved, "deferred")
        return operands, _when(when, stats, (len(BWD_OPERANDS), len(STATS)))

    def _backward_operands(self, lhs, rhs, g, keys, amax, saved, on: bool | str):
        """`backward_operands` without its lax.cond; `on` as `quantize_operand`'s `stats`
        (True, False, or "deferred" with the quantized backward only)."""
        r = self.recipe
        zeros = jnp.zeros((len(BWD_OPERANDS), len(STATS)), jnp.float32) if on else None
        if r.backward == "high_precision":
            return (rhs, g, lhs, g), zeros
        if r.backward == "dequantized":
            x_hat, w_hat, _ = self.fprop_operands(lhs, rhs, keys, amax, rotated=False, stats=False)
            return (w_hat, g, x_hat, g), zeros
        lay = self.layout(lhs.shape, rhs.shape)
        dy = lay.dy_to(g)
        td, tw = r.transform("dgrad"), r.transform("wgrad")
        kd, kw = keys["dgrad_transform"], keys["wgrad_transform"]
        axes = lay.axes
        m = self.stats
        dy_d, s0 = quantize_operand(
            dy, r.dgrad_dy, axes["dgrad_dy"], td, keys["dgrad_dy"], kd, on, None, "dgrad_dy", m
        )
        if saved is None:
            w_d, s1 = quantize_operand(
                lay.rhs_to(rhs), r.dgrad_w, axes["dgrad_w"], td, keys["dgrad_w"], kd, on,
                amax.get("w"), "dgrad_w", m,
            )  # fmt: skip
            w_d = lay.rhs_from(w_d)
        else:
            w_d, s1 = saved  # Fprop's w and its statistics (`shares_weight`)
            if on == "deferred":
                s1 = _given(s1)
        x3 = lay.lhs_to(lhs)
        tx_axis, tdy_axis = lay.token_axes
        tokens = x3.shape[tx_axis]
        padded = self.token_padding(lay, tokens)
        if padded != tokens:
            x3 = layout.pad_tokens(x3, tx_axis, padded)
            dy = layout.pad_tokens(dy, tdy_axis, padded)
        x_w, s2 = quantize_operand(
            x3, r.wgrad_x, axes["wgrad_x"], tw, keys["wgrad_x"], kw, on, amax.get("x"), "wgrad_x", m
        )
        dy_w, s3 = quantize_operand(
            dy, r.wgrad_dy, axes["wgrad_dy"], tw, keys["wgrad_dy"], kw, on, None, "wgrad_dy", m
        )
        if padded != tokens:  # stays in the op's layout, padded: `grads` contracts it there
            x_w, dy_w = _Padded(x_w), _Padded(dy_w)
        else:
            x_w, dy_w = lay.lhs_from(x_w), dy_w.reshape(g.shape)
        operands = (w_d, dy_d.reshape(g.shape), x_w, dy_w)
        if on == "deferred":
            return operands, lambda: jnp.stack([s0(), s1(), s2(), s3()])
        return operands, (jnp.stack([s0, s1, s2, s3]) if on else None)

    def forward(self, lhs, rhs, aux):
        """y, or (y, forward statistics) with telemetry. aux = (key, amax, when): the
        quantization key, the delayed-scaling amaxes, and when to measure (telemetry: None
        always, or a traced flag, see `backward_operands`)."""
        return self._fprop(lhs, rhs, aux)[0]

    def forward_saving(self, lhs, rhs, aux):
        """(`forward`'s output, what the backward keeps of it): where `shares_weight` holds,
        (Fprop's w_hat, its statistics or None without telemetry), else None."""
        if not self.shares_weight(lhs.shape, rhs.shape):
            return self.forward(lhs, rhs, aux), None
        out, w_hat = self._fprop(lhs, rhs, aux)
        return out, (w_hat, out[1][1] if self.telemetry else None)

    def _fprop(self, lhs, rhs, aux):
        """(`forward`'s output, Fprop's w_hat) of the simulated Fprop."""
        key, amax, when = aux
        keys = operand_keys(key)
        # with telemetry, measured as quantized, every call (when is None) or behind a lax.cond
        mode = self.telemetry and (True if when is None else "deferred")
        x_hat, w_hat, stats = self.fprop_operands(lhs, rhs, keys, amax, rotated=True, stats=mode)
        if mode == "deferred":
            stats = _when(when, stats, (len(FWD_OPERANDS), len(STATS)))
        y = self.gemm(x_hat, w_hat)
        return ((y, stats) if self.telemetry else y), w_hat

    def grads(self, lhs, rhs, g, aux, saved=None):
        """(dx, dw, backward statistics or None): Dgrad and Wgrad on the chosen operands;
        `saved` is what `forward_saving` kept."""
        key, amax, when = aux
        keys = operand_keys(key)
        (w_d, dy_d, x_w, dy_w), stats = self.backward_operands(lhs, rhs, g, keys, amax, saved, when)
        _, vjp_lhs = jax.vjp(lambda a: self.gemm(a, w_d), lhs)
        (dx,) = vjp_lhs(dy_d.astype(g.dtype))
        if isinstance(x_w, _Padded):
            dw = self.contract_padded(lhs, rhs, x_w.value, dy_w.value.astype(g.dtype))
        else:
            _, vjp_rhs = jax.vjp(lambda b: self.gemm(x_w, b), rhs)
            (dw,) = vjp_rhs(dy_w.astype(g.dtype))
        return dx, dw, stats

    def contract_padded(self, lhs, rhs, x_w, dy_w):
        """Wgrad on token-padded operands in the op's layout: dot_general contracts the
        canonical (B, M, K) and (B, M, N) over M (with the op's precision arguments); an op
        whose layout is its own (conv) runs its own GEMM's weight gradient on them."""
        lay = self.layout(lhs.shape, rhs.shape)
        if isinstance(lay, layout.DotLayout):
            return lay.contract_tokens(
                x_w,
                dy_w,
                rhs,
                precision=getattr(self, "precision", None),
                preferred_element_type=getattr(self, "preferred_element_type", None),
            )
        _, vjp_rhs = jax.vjp(lambda b: self.gemm(x_w, b), rhs)
        return vjp_rhs(dy_w)[0]


def _given(value):
    """A function of no arguments that gives `value` (a deferred statistic already known)."""
    return lambda: value


def _when(flag, stats, shape):
    """stats() where the traced `flag` holds, else zeros of `shape` (float32): a lax.cond, so
    a step that does not measure runs none of the statistics' work."""
    return jax.lax.cond(flag, stats, lambda: jnp.zeros(shape, jnp.float32))


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _Padded:
    """A Wgrad operand left token-padded in the op's layout (see `Gemm.token_padding`)."""

    value: jax.Array

    def tree_flatten(self):
        return (self.value,), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(*children)
