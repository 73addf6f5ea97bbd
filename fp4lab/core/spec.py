"""QuantSpec: how one tensor is quantized, and the constructors of the standard formats.

    fl.nvfp4()                       E2M1, 1x16 tiles, E4M3 block scale, FP32 tensor scale, RNE
    fl.nvfp4(tile=(16, 16))          2D weight tiles;  fl.nvfp4(scope="row"): per-row outer scale
    fl.mxfp4(scale_rounding="ceil")  E2M1, 32-blocks, E8M0 scales (OCP floor or RCEIL ceil)
    fl.mxfp8(), fl.fp8("e5m2"), fl.cast_spec("bf16")

A spec is a frozen, hashable value (a static jit argument); `replace` makes validated variants.
The formulas each field selects are in docs/architecture.md §2 and `fp4lab.core.scaling`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fp4lab import schema
from fp4lab.core import formats
from fp4lab.core.hadamard import Hadamard

__all__ = ["QuantSpec", "nvfp4", "mxfp4", "mxfp8", "fp8", "cast_spec"]

_BLOCK_SCALES = ("e4m3", "e8m0", "fp32", None)
_OUTERS = ("none", "tensor", "row")
_ROUNDINGS = ("rne", "stochastic")
_SCALE_ROUNDINGS = ("floor", "ceil")
_FOUR_OVER_SIX = (None, "mae", "mse")
_CONVENTIONS = ("te", "jax")


_AMAX_ALGOS = ("max", "most_recent")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_tile(tile):
    """A tile as (ty, tx) of ints >= 1: an int n is (1, n); None stays None; anything else (a
    string, floats, three numbers) raises naming the value."""
    if tile is None:
        return None
    if _is_int(tile):
        tile = (1, tile)
    if (
        not isinstance(tile, tuple | list)
        or len(tile) != 2
        or not all(_is_int(t) and t >= 1 for t in tile)
    ):
        raise ValueError(
            f"QuantSpec.tile={tile!r}; allowed: an int n >= 1 (the tile (1, n)), a pair "
            "(ty, tx) of ints >= 1, or None"
        )
    return tuple(tile)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """How one tensor is quantized. Frozen and hashable: usable as a static jit argument."""

    elem: str = "e2m1"  # element format (formats.format_names())
    tile: tuple[int, int] | None = (1, 16)  # (ty, tx) along (axis-1, axis); None: no block scale
    block_scale: str | None = "e4m3"  # "e4m3" | "e8m0" | "fp32" | None
    outer: str = "tensor"  # second-level FP32 scale: "none" | "tensor" | "row"
    scale_rounding: str = "floor"  # E8M0 exponent: "floor" (OCP MX) | "ceil" (RCEIL)
    rounding: str = "rne"  # element rounding: "rne" | "stochastic"
    transform: Hadamard | None = None  # rotation applied along `axis` before quantizing
    four_over_six: str | None = None  # None | "mae" | "mse" (NVFP4 "te" only)
    convention: str = "te"  # NVFP4 two-level rule: "te" | "jax"
    axis: int = -1  # contraction axis; blocks run along it
    pad: bool = False  # zero-pad axes the tile does not divide instead of raising
    amax_history: int = 0  # delayed scaling: outer amax from the last n steps (0 = current)
    amax_algo: str = "max"  # delayed scaling: "max" of the history | "most_recent"

    def __post_init__(self):
        try:
            formats.get_format(self.elem)  # raises with the allowed names
        except ValueError as e:
            raise ValueError(f"QuantSpec.elem: {e}") from e
        object.__setattr__(self, "tile", _check_tile(self.tile))
        for field in ("axis", "amax_history"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"QuantSpec.{field}={value!r} ({type(value).__name__}); allowed: an int"
                )
        if not isinstance(self.pad, bool):
            raise ValueError(f"QuantSpec.pad={self.pad!r}; allowed: True or False")
        for field, allowed in [
            ("block_scale", _BLOCK_SCALES),
            ("outer", _OUTERS),
            ("rounding", _ROUNDINGS),
            ("scale_rounding", _SCALE_ROUNDINGS),
            ("four_over_six", _FOUR_OVER_SIX),
            ("convention", _CONVENTIONS),
        ]:
            schema.check_choice("QuantSpec", field, getattr(self, field), allowed)
        if self.transform is not None and not isinstance(self.transform, Hadamard):
            raise ValueError(f"QuantSpec.transform={self.transform!r}; allowed: Hadamard or None")
        if (self.tile is None) != (self.block_scale is None):
            raise ValueError(
                f"QuantSpec.tile={self.tile!r} with block_scale={self.block_scale!r}: a tile "
                "needs a block-scale format and a block-scale format needs a tile"
            )
        if self.block_scale in ("e8m0", "fp32") and self.outer != "none":
            raise ValueError(
                f"QuantSpec.outer={self.outer!r} with block_scale={self.block_scale!r}; "
                "allowed: 'none' (only E4M3 block scales take a second-level scale)"
            )
        if self.four_over_six is not None:
            if self.block_scale != "e4m3" or self.convention != "te" or self.elem != "e2m1":
                raise ValueError(
                    "QuantSpec.four_over_six needs elem='e2m1', block_scale='e4m3' and "
                    f"convention='te' (got {self.elem!r}, {self.block_scale!r}, "
                    f"{self.convention!r})"
                )
            if self.rounding != "rne":
                raise ValueError("QuantSpec.four_over_six works with rounding='rne' only")
            if self.tile not in ((1, 16), (16, 16)):
                raise ValueError(
                    f"QuantSpec.four_over_six needs tile (1, 16) or (16, 16), got {self.tile}"
                )
        if self.outer == "row" and self.tile is not None and self.tile[0] != 1:
            raise ValueError(
                f"QuantSpec.outer='row' with 2D tile {self.tile}: a tile spanning rows cannot "
                "share one per-row scale; use a 1D tile"
            )
        kind = formats.get_format(self.elem).kind
        if kind == "cast" and (self.tile is not None or self.outer != "none"):
            raise ValueError(
                f"pass-through format {self.elem!r} takes no scales: use "
                "tile=None, block_scale=None, outer='none' (fl.cast_spec)"
            )
        schema.check_choice("QuantSpec", "amax_algo", self.amax_algo, _AMAX_ALGOS)
        if self.amax_history < 0 or (self.amax_history and self.outer != "tensor"):
            raise ValueError(
                f"QuantSpec.amax_history={self.amax_history} with outer={self.outer!r}: delayed "
                "scaling needs amax_history >= 1 and outer='tensor' (0 = current scaling)"
            )
        if self.amax_history and self.transform is not None:
            raise ValueError(
                "QuantSpec.amax_history: delayed scaling of a rotated operand is "
                "not supported (its amax is taken after the rotation)"
            )

    def replace(self, **changes) -> QuantSpec:
        """A copy with some fields changed (validated like a new spec)."""
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        """A short label for tables: the element format, tile, block scale, a per-row scale,
        stochastic rounding and a Hadamard, e.g. "e2m1/1x16/e4m3/sr/h32" (`to_dict` has it all)."""
        parts = [self.elem]
        if self.tile is not None:
            parts += [f"{self.tile[0]}x{self.tile[1]}", str(self.block_scale)]
        if self.outer == "row":
            parts.append("row")
        if self.rounding == "stochastic":
            parts.append("sr")
        if self.transform is not None:
            parts.append(f"h{self.transform.size}")
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON (the tile a list, the transform `Hadamard.to_dict` or
        None): what a run record shows and its run id hashes. `from_dict` inverts it."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["tile"] = None if self.tile is None else list(self.tile)
        d["transform"] = None if self.transform is None else self.transform.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantSpec:
        """The spec `to_dict` wrote; a missing field takes its default, so
        {"rounding": "stochastic"} is NVFP4 with stochastic rounding.

        Raises:
          ValueError: not a dict, an unknown field (named, with the allowed ones) or a bad
            value (the field's own check names it).
        """
        kw = schema.check_fields("QuantSpec", d, [f.name for f in dataclasses.fields(cls)])
        if isinstance(kw.get("transform"), dict):
            try:
                kw["transform"] = Hadamard.from_dict(kw["transform"])
            except ValueError as e:
                raise ValueError(f"QuantSpec.transform: {e}") from e
        return cls(**kw)

    @property
    def needs_key(self) -> bool:
        return self.rounding == "stochastic" or (
            self.transform is not None and self.transform.needs_key
        )


def nvfp4(
    *, tile=(1, 16), scope: str = "tensor", four_over_six: str | None = None, **kw
) -> QuantSpec:
    """NVFP4: E2M1 elements, 16-element blocks, E4M3 block scales, an FP32 outer scale.

    scope: "tensor" or "row" (per-token outer scale, batch invariant). tile=(16, 16) gives the
    2D weight tiles of NVIDIA's pretraining recipe (arXiv 2509.25149). four_over_six: "mae" or
    "mse" (Cook et al. 2025; the outer scale then uses E4M3 max 256).
    """
    return QuantSpec(
        elem="e2m1", tile=tile, block_scale="e4m3", outer=scope, four_over_six=four_over_six, **kw
    )


def mxfp4(*, scale_rounding: str = "floor", tile=(1, 32), **kw) -> QuantSpec:
    """MXFP4 (OCP MX v1.0): E2M1 elements, 32-blocks, E8M0 scales ("floor" OCP, "ceil" RCEIL)."""
    return QuantSpec(
        elem="e2m1",
        tile=tile,
        block_scale="e8m0",
        outer="none",
        scale_rounding=scale_rounding,
        **kw,
    )


def mxfp8(*, scale_rounding: str = "floor", elem: str = "e4m3", tile=(1, 32), **kw) -> QuantSpec:
    """MXFP8: E4M3 (or E5M2) elements, 32-blocks, E8M0 scales."""
    return QuantSpec(
        elem=elem, tile=tile, block_scale="e8m0", outer="none", scale_rounding=scale_rounding, **kw
    )


def fp8(elem: str = "e4m3", *, scope: str = "tensor", **kw) -> QuantSpec:
    """FP8 with one FP32 scale per tensor (or per row): TransformerEngine's current scaling."""
    if elem not in ("e4m3", "e5m2"):
        raise ValueError(f"fp8 elem={elem!r}; allowed: 'e4m3', 'e5m2'")
    return QuantSpec(elem=elem, tile=None, block_scale=None, outer=scope, **kw)


def cast_spec(dtype: str) -> QuantSpec:
    """A pass-through cast, e.g. cast_spec("bf16"): round to the dtype and back."""
    return QuantSpec(elem=dtype, tile=None, block_scale=None, outer="none")
