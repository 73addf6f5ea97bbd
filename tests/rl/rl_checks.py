"""Checks shared by the RL tests (imported by them; pytest collects nothing here)."""

import jax
import numpy as np


def assert_seed_equals_batch_row(alone, batch, row: int) -> None:
    """A run's metrics and parameters equal row `row` of a vmapped batch's, bit for bit."""
    for k, v in alone.metrics.items():
        np.testing.assert_array_equal(np.asarray(batch.metrics[k][row]), np.asarray(v), err_msg=k)
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(b[row]), np.asarray(a)),
        alone.params,
        batch.params,
    )
