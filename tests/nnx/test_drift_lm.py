"""Accumulated-drift telemetry on the Llama-style LM (a file of its own, so that its compiles run
beside tests/nnx/test_drift.py's). Scanned against unscanned drift per layer is checked in
tests/nnx/test_scan.py, with one pair of compiles for all the per-layer telemetry."""

import jax
import optax
from flax import nnx

import fp4lab as fl
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.nnx import telemetry


@nnx.jit
def _measure(model, tokens):
    return telemetry.value_and_grad(_lm_loss, shadow=True)(model, tokens)


CFG = dict(vocab=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16)


def _lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def test_bf16_ops_round_their_operands_inside_the_compiled_step():
    """Every BF16 op's own error is its operands' BF16 rounding (about 2**-9 relative), also for
    ops whose input comes straight from another op (attn.out, mlp.down, lm_head). A cast to
    bf16 and back, which XLA's excess-precision rewrites may drop once the GEMMs are large
    enough to leave the fusion (here 512 rows), read exactly 0 at those three."""
    cfg = dict(CFG, vocab=64, d_model=64, n_heads=4, d_ff=128, max_len=32, n_layers=1)
    model = Transformer(TransformerConfig(**cfg, scan_layers=True), rngs=nnx.Rngs(0))
    model = fl.quantize_model(
        model, [fl.Rule(r".*", "bf16")], key=jax.random.key(1), telemetry=True
    )
    tokens = jax.random.randint(jax.random.key(0), (16, 33), 0, 64)
    _, _, m = _measure(model, tokens)
    local = {k: float(v) for k, v in m.items() if k.endswith("/fwd/local")}
    assert {"acc/lm_head/fwd/local", "acc/blocks.0.attn.out/fwd/local"} <= set(local)
    for k, v in local.items():
        assert 1e-3 < v < 1e-2, (k, v)
