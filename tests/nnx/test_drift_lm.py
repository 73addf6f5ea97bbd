"""Accumulated-drift telemetry on the Llama-style LM, scanned and unscanned (a file of its own,
so that its compiles run beside tests/nnx/test_drift.py's)."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.nnx import telemetry


@nnx.jit
def _measure(model, tokens):
    return telemetry.value_and_grad(_lm_loss, shadow=True)(model, tokens)


CFG = dict(vocab=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 9), 0, 16)
RULES = [fl.Rule(r"lm_head", None), fl.Rule(r"blocks\.1\..*", "bf16"), fl.Rule(r".*", "nvfp4")]


def _lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def _lm(scan: bool):
    model = Transformer(TransformerConfig(**CFG, scan_layers=scan), rngs=nnx.Rngs(0))
    return fl.quantize_model(model, RULES, key=jax.random.key(1), telemetry=True)


def test_scanned_and_unscanned_models_report_the_same_drift_per_layer():
    _, _, ma = _measure(_lm(False), TOKENS)
    _, _, mb = _measure(_lm(True), TOKENS)
    acc = {k for k in ma if k.startswith("acc/")}
    assert acc == {k for k in mb if k.startswith("acc/")}
    assert {k.split("/")[1] for k in acc} >= {f"blocks.{i}.mlp.down" for i in range(2)}
    for k in acc:
        np.testing.assert_allclose(mb[k], ma[k], rtol=2e-3, atol=1e-5, err_msg=k)
    # depth: the forward's order of the ops, the same scanned or not (lm_head: no op)
    block = ["attn.query", "attn.key", "attn.value", "attn.out", "mlp.gate", "mlp.up", "mlp.down"]
    expected = [f"blocks.{i}.{name}" for i in range(2) for name in block]
    for m in (ma, mb):
        depth = {k.removeprefix("depth/"): float(v) for k, v in m.items() if k.startswith("depth/")}
        assert sorted(depth, key=depth.get) == expected
    # the residual stream carries error upward: the last block's input has drifted
    assert float(ma["acc/blocks.1.attn.query/fwd/rel_drift"]) > 0
    assert float(ma["acc/blocks.0.attn.query/fwd/rel_drift"]) == pytest.approx(
        float(ma["acc/blocks.0.attn.query/fwd/local"]), rel=1e-6
    )


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
