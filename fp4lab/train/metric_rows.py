"""The metrics of a run's measured steps, kept in the training loop as rows of one array.

A scanned loop's outputs are each a fusion that XLA compiles on its own: a run's telemetry,
hundreds of scalar metrics per measured step, would cost as many. So the metrics of a measured
step are stacked into one column per dtype, in sorted name order, and the loop keeps or
outputs columns; at the end each metric is a row of one array, which a caller that stacks the
metrics again (`fp4lab.sweep`'s compute, which takes them out of the program as one array)
gets back as the array.

    one_body(...)             steps [start, stop) as one scanned body that measures every
                              `every` steps, its metrics in a (metrics, measured steps) buffer
    columns(metrics, groups)  a measured step's metrics as one column per dtype
    rows(pieces, groups)      {metric: values} from the columns of the measured steps

The values are moved, never computed: the same bits as the metrics dict (the trainer's tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fp4lab.nnx import telemetry

__all__ = ["one_body", "sorted_column", "columns", "rows"]


def one_body(every, step, state, start, stop, logs, graphdef, keys, scan, report):
    """Steps [start, stop) as one scanned body that measures where t % every == 0 (`logs`, the
    steps it measures): (carry, [per-step outputs], [telemetry]). The metrics of the measured
    steps go into a (metrics, len(logs)) buffer in the loop's state, one column per measured
    step (a per-step output would keep every step's zeros)."""
    carry, rest = state
    # sorted, the order of the run's telemetry dict (jax.tree.map sorts a dict's keys)
    names = sorted(telemetry.metric_keys(nnx.merge(graphdef, carry.params, rest)))
    first = logs[0]

    def body(state, t):
        (carry, rest), buf = state
        flag = True if every == 1 else t % every == 0  # every step: no lax.cond, no zeros
        carry, rest, out, metrics = step(carry, t, graphdef, rest, keys, flag)
        if sorted(metrics) != sorted(names) or any(metrics[k].dtype != buf.dtype for k in names):
            raise RuntimeError(  # telemetry.metric_keys and the metrics disagree: a bug
                "trainer: the step's metrics are not telemetry.metric_keys' float32 scalars"
            )
        if report is not None:
            report(t, keys, out)
        i = jnp.clip((t - first) // every, 0, len(logs) - 1)
        column = jnp.where(flag, sorted_column(metrics, names), buf[:, i])
        return ((carry, rest), jax.lax.dynamic_update_index_in_dim(buf, column, i, 1)), out

    # a metric's values are a row: a caller that stacks the metrics again (`fp4lab.sweep`'s
    # compute, which takes them out of the program as one array) gets this buffer back, where
    # columns would cost XLA a fusion per metric to compile
    buf = jnp.zeros((len(names), len(logs)), jnp.float32)
    (state, buf), o = scan(body, (state, buf), jnp.arange(start, stop))
    return state[0], [o], [{k: buf[j] for j, k in enumerate(names)}]


def sorted_column(metrics: dict, names: list[str]) -> jax.Array:
    """The scalars of `metrics` stacked in the order of `names`. They are stacked in the order
    the step made them, then permuted by one gather: consecutive elements of one table
    (`telemetry.collect`) stay one slice for XLA, where sorted they are hundreds of fusions."""
    made = {k: i for i, k in enumerate(metrics)}
    column = jnp.stack([metrics[k] for k in made])
    where = np.array([made[k] for k in names])  # the step's keys are `names` (checked)
    return column if np.array_equal(where, np.arange(len(made))) else column[where]


def columns(metrics: dict, groups: dict) -> tuple:
    """A measured step's metrics as one column per dtype, (metrics of the dtype,), in sorted
    order (`sorted_column`); `groups` ({dtype: names}) is filled on the first trace and must
    match on later ones. A metric's values then leave the loop as a row of one array, where
    one scan output per metric costs XLA a fusion each (hundreds, with the shadow)."""
    if any(jnp.shape(v) != () for v in metrics.values()):
        raise RuntimeError("trainer: a telemetry metric is not a scalar")  # a bug
    found: dict = {}
    for k in sorted(metrics):
        found.setdefault(jnp.dtype(metrics[k].dtype), []).append(k)
    if groups and found != groups:
        raise RuntimeError("trainer: the measured steps' metrics differ between traces")  # a bug
    groups.update(found)
    out = []
    for names in groups.values():
        mine = set(names)  # the dtype's metrics in the order the step made them
        out.append(sorted_column({k: v for k, v in metrics.items() if k in mine}, names))
    return tuple(out)


def rows(pieces: list[tuple], groups: dict) -> dict[str, jax.Array]:
    """{metric: its values over the measured steps} from `columns`' pieces, each (steps,
    metrics) per dtype: the pieces joined, then one row per metric (rows, not columns: a
    caller that stacks the metrics again, `fp4lab.sweep`'s compute, gets the array back)."""
    out = {}
    for g, names in enumerate(groups.values()):
        table = jnp.concatenate([p[g] for p in pieces]).T
        out |= {k: table[j] for j, k in enumerate(names)}
    return dict(sorted(out.items()))
