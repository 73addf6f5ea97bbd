"""Cheap per-step signals of instability (`Config.signals`): computed every step from what the
step already holds, no shadow and no operand statistics.

    update_ratio   ||update|| / ||parameters||, the global update-to-weight ratio (Wortsman
                   et al. 2023: an update too large for the weights precedes instabilities)
    norm_max       the largest |scale| entry of the model's norm layers (nnx.LayerNorm,
                   nnx.RMSNorm; NaN without one): the affine vector whose quantization
                   Su et al. 2025 (arXiv 2506.20752) tie to MX training's spikes

The built-in LMs add their own (`Task.signals`), read from the high-precision model at the
step's weights on the step's batch (one more forward pass; the quantized model and its keys
are not touched, so the run's other series are the same with and without them):

    attn_logit_max the largest attention logit q.k / sqrt(H) over the blocks, heads and batch
                   (Wortsman et al. 2023: attention-logit growth precedes the attention
                   entropy's collapse; qk-layernorm bounds it)
    logit_z        the RMS over the predicted positions of log Z, the output logits'
                   log-partition (Wortsman et al.'s output-logit divergence; z-loss holds it
                   near 0)

With grad_norm and the loss (always recorded) they are the per-step series that
`fp4lab.analysis.instability.predictive` scores for lead time and AUC before spike events.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fp4lab.nnx.norms import NORM_TYPES
from fp4lab.schema import SIGNALS

__all__ = ["SIGNALS", "step_signals"]


def step_signals(model: nnx.Module, params, updates) -> dict[str, jax.Array]:
    """{signal: float32 scalar} of one step (`SIGNALS`), given the model at the step's weights,
    its Params and the optimizer's update."""
    scales = [
        jnp.max(jnp.abs(m.scale[...]))
        for _, m in nnx.iter_modules(model)
        if isinstance(m, NORM_TYPES) and isinstance(getattr(m, "scale", None), nnx.Param)
    ]
    norm_max = jnp.max(jnp.stack(scales)) if scales else jnp.float32(jnp.nan)
    ratio = optax.tree.norm(updates) / optax.tree.norm(params)
    return {"update_ratio": ratio.astype(jnp.float32), "norm_max": norm_max.astype(jnp.float32)}
