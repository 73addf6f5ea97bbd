"""Quantized norm vectors: the affine scale and bias of nnx.LayerNorm and nnx.RMSNorm.

fp4lab's GEMM seams leave the norm layers in high precision; microxcaling's emulation (which
Su et al. 2025, "Characterization and Mitigation of Training Instabilities in Microscaling
Formats", arXiv 2506.20752, train with) quantizes their affine vectors too, and Su et al.
trace MX training's loss spikes to the multiplicative gradient bias this gives. A recipe with
`GemmRecipe.norms` set (`Config.gemms={"norms": fl.mxfp4()}`) turns each norm layer its rule
reaches into one whose `scale` and `bias` read as

    fake_quant(v, spec)        (blocks along the feature axis; straight-through gradient)

The parameters stay float32 and are what the optimizer updates; only the forward reads the
quantized copy. The module's class is swapped for a subclass of its own (`quantized_class`)
whose call sets each vector to its quantized value, runs flax's own call and sets it back, so
the module's code and paths stay flax's, `nnx.state(model, nnx.Param)` is unchanged, and the
spec lives in the graph (static), not in the parameters. The spec must be deterministic
(round to nearest, no Hadamard): a norm vector draws no key.
"""

from __future__ import annotations

from flax import nnx

from fp4lab.core.quantize import fake_quant
from fp4lab.core.spec import QuantSpec

__all__ = ["NORM_TYPES", "quantized_class", "set_norm_spec", "norm_spec"]

NORM_TYPES = (nnx.LayerNorm, nnx.RMSNorm)
_VECTORS = ("scale", "bias")
_CLASSES: dict[type, type] = {}  # norm class -> its quantized subclass
_BASES: dict[type, type] = {}  # and back


def _quantized_call(base: type):
    """The call of `base`'s quantized subclass: scale and bias read through `norm_spec`."""

    def __call__(self, *args, **kwargs):
        saved = {}
        for name in _VECTORS:
            var = getattr(self, name, None)
            if isinstance(var, nnx.Param):
                saved[name] = var[...]
                var[...] = fake_quant(saved[name], self.norm_spec)  # straight-through
        try:
            return base.__call__(self, *args, **kwargs)
        finally:
            for name, value in saved.items():
                getattr(self, name)[...] = value

    return __call__


def quantized_class(cls: type) -> type:
    """The subclass of norm class `cls` whose call reads its vectors quantized (one per class;
    a plain subclass, so that a module's class can be swapped in place)."""
    if cls in _BASES:
        return cls
    if cls not in _CLASSES:
        attrs = {"__call__": _quantized_call(cls), "__module__": __name__}
        _CLASSES[cls] = type(f"Quantized{cls.__name__}", (cls,), attrs)
        _BASES[_CLASSES[cls]] = cls
    return _CLASSES[cls]


def norm_spec(module) -> QuantSpec | None:
    """The spec a norm module's vectors are read through (None: high precision)."""
    return module.norm_spec if type(module) in _BASES else None


def set_norm_spec(module, spec: QuantSpec | None, path: str) -> None:
    """Reads `module`'s scale and bias through `spec` from now on (None: plainly), in place.

    Raises:
      ValueError: the vectors' width is not a multiple of the spec's block (named with the
        layer's path), unless the spec pads.
    """
    if type(module) in _BASES:  # back to the plain class first
        module.__class__ = _BASES[type(module)]
        del module.norm_spec
    if spec is None:
        return
    block = spec.tile[1] if spec.tile is not None else 1
    for name in _VECTORS:
        var = getattr(module, name, None)
        if not isinstance(var, nnx.Param):
            continue
        width = var.get_value().shape[-1]
        if block > 1 and width % block and not spec.pad:
            raise ValueError(
                f"{path}.{name}: width {width} is not a multiple of the norms spec's block "
                f"{block} ({spec.summary()}); use a width that it divides or a spec with pad=True"
            )
    module.__class__ = quantized_class(type(module))
    module.norm_spec = nnx.static(spec)
