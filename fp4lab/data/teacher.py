"""Teacher-student regression: learn a fixed random MLP from its noise-free outputs.

y = teacher(x) exactly, so the optimum mean squared error is 0 and any floor a quantized student
reaches is the cost of its numerics (or capacity). Inputs are standard normal; a few input
channels can be scaled up (`outlier_channels`, `outlier_scale`) to create the channel outliers
that block scaling and Hadamard rotations react to.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Teacher"]

_ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "gelu": jax.nn.gelu}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Teacher:
    """A fixed random MLP din -> hidden... -> dout (hashable on its fields).

    Weights W_l ~ N(0, 1/fan_in), biases 0.1 * N(0, 1), float32, drawn with numpy from `seed`.
    teacher(x) = W_L act(... act(x W_1 + b_1) ...) + b_L.

    Attributes (derived, numpy): weights (tuple of float32 arrays), biases (tuple).
    """

    din: int  # input width
    dout: int  # output width
    hidden: tuple[int, ...] = (64,)  # hidden widths of the teacher
    seed: int = 0  # seeds the teacher's weights (not the inputs: those come from the key)
    activation: str = "tanh"  # "tanh" | "relu" | "gelu"
    outlier_channels: tuple[int, ...] = ()  # input channels multiplied by outlier_scale
    outlier_scale: float = 10.0  # factor applied to the outlier channels

    weights: tuple = dataclasses.field(init=False, repr=False, compare=False)
    biases: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(self.hidden))
        object.__setattr__(self, "outlier_channels", tuple(self.outlier_channels))
        for name in ("din", "dout"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Teacher.{name}={getattr(self, name)!r}; must be a positive int")
        if any(w < 1 for w in self.hidden):
            raise ValueError(f"Teacher.hidden={self.hidden}; widths must be positive")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"Teacher.activation={self.activation!r}; allowed: {sorted(_ACTIVATIONS)}"
            )
        bad = [c for c in self.outlier_channels if not 0 <= c < self.din]
        if bad or len(set(self.outlier_channels)) != len(self.outlier_channels):
            raise ValueError(
                f"Teacher.outlier_channels={self.outlier_channels}; must be distinct channels "
                f"in [0, din={self.din})"
            )
        rng = np.random.default_rng(self.seed)
        widths = (self.din, *self.hidden, self.dout)
        ws, bs = [], []
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            ws.append((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32))
            bs.append((0.1 * rng.standard_normal(b)).astype(np.float32))
        object.__setattr__(self, "weights", tuple(ws))
        object.__setattr__(self, "biases", tuple(bs))

    @property
    def input_scale(self) -> np.ndarray:
        """Per-channel input scale: outlier_scale on the outlier channels, 1 elsewhere."""
        s_I = np.ones(self.din, np.float32)
        s_I[list(self.outlier_channels)] = self.outlier_scale
        return s_I

    def __call__(self, x_BxI: jax.Array) -> jax.Array:
        """The teacher's output y_BxO for inputs x_BxI (float32)."""
        act = _ACTIVATIONS[self.activation]
        h = jnp.asarray(x_BxI, jnp.float32)
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ jnp.asarray(w) + jnp.asarray(b)[None, :]
            if i < len(self.weights) - 1:
                h = act(h)
        return h

    def sample(self, key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
        """A batch (x_BxI, y_BxO): x ~ N(0, 1) times the input scale, y = teacher(x).

        Args:
          key: PRNG key (the data stream).
          batch: number of examples B.
        Returns:
          x_BxI and y_BxO, float32.
        """
        x_BxI = jax.random.normal(key, (batch, self.din), jnp.float32)
        x_BxI = x_BxI * jnp.asarray(self.input_scale)[None, :]
        return x_BxI, self(x_BxI)
