"""Character-level text: a vocabulary of the characters of a text, and random windows of it."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CharDataset"]


class CharDataset:
    """A text encoded as int32 character ids (ids in sorted character order).

    Build with `CharDataset.from_text(text)` or `CharDataset.from_file(path)`.
    """

    def __init__(self, data: np.ndarray, chars: str):
        self.chars = chars
        self.data = np.asarray(data, np.int32)
        self.data.setflags(write=False)
        self._index = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharDataset:
        """The dataset of `text`; the vocabulary is its distinct characters, sorted."""
        if len(text) < 2:
            raise ValueError(f"text must hold at least 2 characters, got {len(text)}")
        chars = "".join(sorted(set(text)))
        index = {ch: i for i, ch in enumerate(chars)}
        return cls(np.fromiter((index[ch] for ch in text), np.int32, count=len(text)), chars)

    @classmethod
    def from_file(cls, path: str | os.PathLike, encoding: str = "utf-8") -> CharDataset:
        """The dataset of the text file at `path`."""
        with open(path, encoding=encoding) as f:
            return cls.from_text(f.read())

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def encode(self, text: str) -> np.ndarray:
        """Character ids of `text` (int32); a character outside the vocabulary raises KeyError."""
        try:
            return np.fromiter((self._index[ch] for ch in text), np.int32, count=len(text))
        except KeyError as e:
            raise KeyError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        """The text of a sequence of character ids."""
        return "".join(self.chars[int(i)] for i in np.asarray(ids).ravel())

    def split(self, fraction: float) -> tuple[CharDataset, CharDataset]:
        """(first `fraction` of the text, the rest), sharing this vocabulary."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction={fraction}; must be in (0, 1)")
        n = int(round(fraction * len(self)))
        return CharDataset(self.data[:n], self.chars), CharDataset(self.data[n:], self.chars)

    def sample(self, key: jax.Array, batch: int, length: int) -> jax.Array:
        """`batch` windows of `length` consecutive characters, at uniformly random offsets.

        Pure jax on the encoded text: jit-able (batch and length static), vmap-able over keys.

        Args:
          key: PRNG key (the data stream).
          batch: number of windows B.
          length: characters per window T <= len(self).
        Returns:
          tokens_BxT, int32.
        """
        if not 1 <= length <= len(self):
            raise ValueError(f"length={length}; must be in [1, {len(self)}] (the text length)")
        data_N = jnp.asarray(self.data)
        start_B = jax.random.randint(key, (batch,), 0, len(self) - length + 1)
        return jax.vmap(lambda s: jax.lax.dynamic_slice(data_N, (s,), (length,)))(start_B)
