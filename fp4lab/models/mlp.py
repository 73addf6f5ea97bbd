"""A multilayer perceptron of nnx.Linear layers (paths "layers.0", "layers.1", ...)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
from flax import nnx

__all__ = ["MLP"]

_default_init = nnx.initializers.lecun_normal()


class MLP(nnx.Module):
    """x -> Linear -> act -> ... -> Linear, with hidden widths `hidden` (no activation at the end).

    Args:
      din: input width.
      hidden: widths of the hidden layers, in order (may be empty: one Linear layer).
      dout: output width.
      activation: elementwise nonlinearity between layers.
      use_bias: whether the Linear layers carry a bias.
      dtype: computation dtype of the Linear layers (parameters stay float32); None keeps the
        input's dtype.
      kernel_init: initializer of the hidden layers' kernels.
      out_kernel_init: initializer of the last layer's kernel (default: `kernel_init`).
      rngs: the nnx random streams used for initialization.
    """

    def __init__(
        self,
        din: int,
        hidden: Sequence[int],
        dout: int,
        activation: Callable[[jax.Array], jax.Array] = jax.nn.gelu,
        *,
        use_bias: bool = True,
        dtype=None,
        kernel_init=_default_init,
        out_kernel_init=None,
        rngs: nnx.Rngs,
    ):
        widths = (din, *hidden, dout)
        if any(int(w) < 1 for w in widths):
            raise ValueError(
                f"MLP widths must be positive, got din={din}, hidden={hidden}, dout={dout}"
            )
        out_kernel_init = kernel_init if out_kernel_init is None else out_kernel_init
        n = len(widths) - 1
        self.layers = nnx.List(
            [
                nnx.Linear(
                    widths[i],
                    widths[i + 1],
                    use_bias=use_bias,
                    dtype=dtype,
                    kernel_init=out_kernel_init if i == n - 1 else kernel_init,
                    rngs=rngs,
                )
                for i in range(n)
            ]
        )
        self.activation = activation

    def __call__(self, x_BxI: jax.Array) -> jax.Array:
        """Apply the network to the last axis of `x_BxI` (any leading axes); returns ...xdout."""
        h = x_BxI
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h
