"""GemmRecipe: the specs of the six operands of a linear layer's three GEMMs and the backward
mode, as one frozen, hashable value.

    Fprop  y  = x  . w        specs: fprop_x, fprop_w
    Dgrad  dx = dy . w^T      specs: dgrad_dy, dgrad_w
    Wgrad  dw = x^T . dy      specs: wgrad_x, wgrad_dy

The named recipes of the literature, the registry and `override` are `fp4lab.core.recipes`
(which re-exports this class); the meaning of each field and backward mode is said there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fp4lab import schema
from fp4lab.core.hadamard import Hadamard
from fp4lab.core.spec import QuantSpec
from fp4lab.schema import BACKWARD_MODES, GEMMS, OPERANDS

__all__ = ["GemmRecipe"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmRecipe:
    """Operand specs of the three GEMMs of a linear layer and the backward mode.

    `None` for a spec keeps that operand in the input precision. With backward="dequantized"
    or "high_precision" the Dgrad and Wgrad specs are not used.
    """

    fprop_x: QuantSpec | None = None  # activations in the forward GEMM
    fprop_w: QuantSpec | None = None  # weights in the forward GEMM
    dgrad_dy: QuantSpec | None = None  # output gradient in the input-gradient GEMM
    dgrad_w: QuantSpec | None = None  # weights in the input-gradient GEMM
    wgrad_x: QuantSpec | None = None  # activations in the weight-gradient GEMM
    wgrad_dy: QuantSpec | None = None  # output gradient in the weight-gradient GEMM
    backward: str = "quantized"  # "quantized" | "dequantized" | "high_precision"
    # the affine vectors (scale, bias) of the norm layers the recipe's rule reaches
    # (nnx.LayerNorm, nnx.RMSNorm), fake-quantized in the forward with a straight-through
    # gradient, as microxcaling's emulation does; None (the default): high precision
    norms: QuantSpec | None = None
    # the GEMM's output, the activation the element-wise ops after it read (the nonlinearity,
    # the residual add), fake-quantized in the forward along its last axis with a
    # straight-through gradient, as microxcaling's emulation rounds a linear layer's output;
    # None (the default): the GEMM's own output precision
    outputs: QuantSpec | None = None
    name: str = dataclasses.field(default="", compare=False)  # label for tables

    def __post_init__(self):
        schema.check_choice("GemmRecipe", "backward", self.backward, BACKWARD_MODES)
        for field, what in (("norms", "the norm vectors"), ("outputs", "the GEMM outputs")):
            spec = getattr(self, field)
            if spec is None:
                continue
            if not isinstance(spec, QuantSpec):
                raise ValueError(f"GemmRecipe.{field} must be a QuantSpec or None, got {spec!r}")
            if spec.needs_key or spec.transform is not None:
                raise ValueError(
                    f"GemmRecipe.{field}={spec.summary()}: {what} take a deterministic spec "
                    "(round to nearest, no Hadamard)"
                )
        for g in GEMMS:
            a, b = (self.spec(g, o) for o in OPERANDS[g])
            for o, s in zip(OPERANDS[g], (a, b), strict=True):
                if s is not None and not isinstance(s, QuantSpec):
                    raise ValueError(f"GemmRecipe.{g}_{o} must be a QuantSpec or None, got {s!r}")
            ta = a.transform if a is not None else None
            tb = b.transform if b is not None else None
            if ta is not None and tb is not None and ta != tb:
                raise ValueError(
                    f"GemmRecipe {g}: both operands must use the same Hadamard, got {ta} and {tb}"
                )

    def spec(self, gemm: str, operand: str) -> QuantSpec | None:
        """The spec of one operand of one GEMM, e.g. spec("wgrad", "dy")."""
        return getattr(self, schema.operand_name(gemm, operand))

    def transform(self, gemm: str) -> Hadamard | None:
        """The Hadamard applied to both operands of `gemm` (from either spec), or None."""
        for o in OPERANDS[gemm]:
            s = self.spec(gemm, o)
            if s is not None and s.transform is not None:
                return s.transform
        return None

    def used_specs(self) -> dict[str, QuantSpec | None]:
        """{"fprop_x": spec, ...} for the GEMM operands this backward mode quantizes."""
        gemms = GEMMS if self.backward == "quantized" else ("fprop",)
        return {schema.operand_name(g, o): self.spec(g, o) for g in gemms for o in OPERANDS[g]}

    @property
    def needs_key(self) -> bool:
        return any(s is not None and s.needs_key for s in self.used_specs().values())

    @property
    def is_identity(self) -> bool:
        return all(s is None for s in self.used_specs().values())

    def replace(self, **changes) -> GemmRecipe:
        """A copy with some fields changed, e.g. recipe.replace(wgrad_x=None, wgrad_dy=None).

        `pad` (True or False) is set on every operand spec, and on the norms' and outputs'
        (`QuantSpec.pad`: zero-pad an axis the tile or rotation does not divide to whole
        blocks, instead of raising), e.g.
        `fl.recipes.get("nvfp4").replace(pad=True)` for a layer of 3 input channels."""
        if "pad" in changes:
            pad = changes.pop("pad")
            if not isinstance(pad, bool):
                raise ValueError(f"GemmRecipe.replace: pad={pad!r}; allowed: True or False")
            for field in (*schema.OPERAND_NAMES, "norms", "outputs"):
                spec = changes.get(field, getattr(self, field))
                if isinstance(spec, QuantSpec):
                    changes[field] = spec.replace(pad=pad)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The six operand specs (`QuantSpec.to_dict`, None: unquantized), the backward mode
        and, where set, the norms' and the outputs' specs as plain JSON. The name, a label that
        takes no part in equality, is left out: equal recipes give equal dicts, and so equal run
        ids (a recipe without norms or outputs gives the dict it gave before those fields
        existed). `from_dict` inverts it."""
        d: dict[str, Any] = {}
        for field in schema.OPERAND_NAMES:
            s = getattr(self, field)
            d[field] = None if s is None else s.to_dict()
        d["backward"] = self.backward
        for field in ("norms", "outputs"):  # left out when None: earlier run ids stay
            if getattr(self, field) is not None:
                d[field] = getattr(self, field).to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GemmRecipe:
        """The recipe `to_dict` wrote. A missing operand is None (unquantized), a spec may be a
        QuantSpec or its dict, and "name" is accepted as a label.

        Raises:
          ValueError: not a dict, an unknown field (named, with the allowed ones) or a bad spec
            (the message names the operand and the spec's field).
        """
        allowed = [*schema.OPERAND_NAMES, "backward", "norms", "outputs", "name"]
        kw = schema.check_fields("GemmRecipe", d, allowed)
        for field in (*schema.OPERAND_NAMES, "norms", "outputs"):
            if isinstance(kw.get(field), dict):
                try:
                    kw[field] = QuantSpec.from_dict(kw[field])
                except ValueError as e:
                    raise ValueError(f"GemmRecipe.{field}: {e}") from e
        return cls(**kw)
