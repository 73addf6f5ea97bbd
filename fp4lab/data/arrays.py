"""Data you already have, as the `batch(key, step)` of a task of your own.

    rows(arrays, batch_size)             random rows of in-memory arrays (features and labels)
    windows(tokens, batch_size, length)  random windows of a 1-D array of token ids (as nanoGPT)
    load_tokens(path)                    token ids from a .npy file or a raw binary file
    stack(iterator, n)                   the first n items of an iterator, stacked into arrays

Each sampler draws from its `key` only: in a run that key is the data stream folded with the
step (`fp4lab.train.tasks.train_batch`), so the data seed alone decides which rows or windows a
step sees, and every seed of a vmapped call draws its own. The draws are uniform with
replacement, as grain's and tfds's samplers shuffle with a seed: the order is a function of the
seed, never of a file position or an iterator's state. An iterator is not seedable: `stack`
reads it once into memory, and the data stream then chooses among its items.

The arrays become constants of the compiled training program (keep them to some MB). What enters
a run's id: in an experiment file, the file's source (arrays the code makes) and the files named
in its `DATA_FILES` (arrays it loads, `load_tokens`); from Python (`fp4lab.own`), the bytes of
the arrays the functions hold, and the `data` it is given.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["rows", "windows", "load_tokens", "stack"]


def rows(arrays: Any, batch_size: int) -> Callable[[jax.Array, Any], Any]:
    """batch(key, step): `batch_size` rows drawn uniformly with replacement, the same rows of
    every array of the pytree `arrays` (all with the same leading length)."""
    leaves = jax.tree.leaves(arrays)
    if not leaves:
        raise ValueError("rows: arrays is empty")
    n = len(leaves[0])
    if any(len(a) != n for a in leaves):
        raise ValueError(f"rows: arrays of different lengths {[len(a) for a in leaves]}")
    data = jax.tree.map(jnp.asarray, arrays)

    def batch(key, step):
        i_B = jax.random.randint(key, (batch_size,), 0, n)
        return jax.tree.map(lambda a: a[i_B], data)

    return batch


def windows(tokens, batch_size: int, length: int) -> Callable[[jax.Array, Any], jax.Array]:
    """batch(key, step): (batch_size, length) windows of the 1-D token array, each starting at a
    uniformly drawn position (nanoGPT's get_batch); a language model's loss reads inputs
    [:, :-1] and targets [:, 1:]."""
    tokens = jnp.asarray(np.asarray(tokens).astype(np.int32))
    if tokens.ndim != 1 or len(tokens) < length:
        raise ValueError(f"windows: tokens of shape {tokens.shape}; need 1-D, >= {length} long")
    offsets_L = jnp.arange(length)

    def batch(key, step):
        start_B = jax.random.randint(key, (batch_size,), 0, len(tokens) - length + 1)
        return tokens[start_B[:, None] + offsets_L[None, :]]

    return batch


def load_tokens(path: str | Path, dtype: str = "uint16") -> np.ndarray:
    """Token ids from `path`: a .npy file (its own dtype), else raw binary ids of `dtype`
    (nanoGPT's train.bin is uint16). List the file in the experiment's `DATA_FILES` so that its
    content enters the run ids."""
    path = Path(path)
    if path.suffix == ".npy":
        return np.load(path)
    return np.fromfile(path, dtype=dtype)


def stack(iterator: Iterable, n: int) -> Any:
    """The first `n` items of `iterator` (pytrees of arrays of one structure), stacked along a
    new leading axis: arrays for `rows` (one item per row)."""
    items = list(itertools.islice(iter(iterator), n))
    if len(items) < n:
        raise ValueError(f"stack: the iterator gave {len(items)} items; asked for {n}")
    return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *items)
