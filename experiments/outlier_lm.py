"""A model file: the project's LM on the Markov language, with outlier channels in its
residual stream. `mxfp4_ladder_lm_outliers.py` names it as its task (`task_file`); any
experiment may. Its content hash enters the run ids, so it is kept apart from the studies
that use it: their docstrings can change without making their runs new runs.

How the outliers are made: the project's Llama-style Transformer (`fp4lab.models.Transformer`,
pre-norm blocks), whose token embedding multiplies its output channels 0..OUTLIERS-1 by
OUTLIER_SCALE. Nothing else changes. The residual stream then carries those channels at about
OUTLIER_SCALE times the others through every block (each block adds its update to them), and
each RMSNorm hands the GEMMs an input whose outlier channels are about that many times the
rest: every 32-element MX block of a row that holds an outlier takes its E8M0 scale from it,
and its other elements fall near or below E2M1's smallest step. This is the structure of the
residual-stream outliers of large LMs (a few channels, every token, every layer), put in by
hand rather than grown by training; training may shrink them (the embedding's entries and the
norms' gains are learned).

The data: `fp4lab.data.MarkovLM` (vocab 64, order 1, branching 4, seed 0), the built-in
"markov" task's language at those settings; its entropy rate is the exact floor. A batch is
`config.batch_size` sequences of `config.seq_len + 1` tokens; the loss predicts every token
after the first. With OUTLIERS = 0 the model computes what the built-in one does.
"""

import jax.numpy as jnp
import optax
from flax import nnx

from fp4lab.data import MarkovLM
from fp4lab.models import Transformer, TransformerConfig

OUTLIERS, OUTLIER_SCALE = 4, 30.0  # residual channels 0..3, scaled by 30 at the embedding
LANG = MarkovLM(vocab=64, order=1, branching=4, seed=0)
FLOOR = LANG.entropy_rate
TOKENS_PER_STEP = lambda config: config.batch_size * config.seq_len  # noqa: E731


class OutlierEmbed(nnx.Module):
    """The embedding of `fp4lab.models.Transformer` with channels 0..k-1 of its output scaled."""

    def __init__(self, embed: nnx.Embed, outliers: int, scale: float):
        self.embed = embed  # the Transformer's own, as it drew it
        self.outliers, self.scale = outliers, scale

    def __call__(self, tokens_BxT):
        x_BxTxD = self.embed(tokens_BxT)
        channel_D = jnp.arange(x_BxTxD.shape[-1])
        return x_BxTxD * jnp.where(channel_D < self.outliers, self.scale, 1.0)


def model(config, rngs):
    tcfg = TransformerConfig(
        vocab=LANG.vocab,
        d_model=config.d_model,
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        d_ff=config.d_ff,
        max_len=config.seq_len,
        scan_layers=config.scan_layers,
    )
    lm = Transformer(tcfg, rngs=rngs)
    lm.embed = OutlierEmbed(lm.embed, OUTLIERS, OUTLIER_SCALE)
    return lm


def loss(model, tokens_BxT1):
    logits_BxTxV = model(tokens_BxT1[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, tokens_BxT1[:, 1:]).mean()


def batch(config, key, step):
    return LANG.sample(key, config.batch_size, config.seq_len + 1)
