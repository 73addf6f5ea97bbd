"""The proxy task, the LM's qk-norm and z-loss, and the per-step signals, in the real trainer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.models import ResidualMLP, Transformer, TransformerConfig
from fp4lab.train.config import Config, ConfigError
from fp4lab.train.summary import summarize
from fp4lab.train.tasks import make_task, train_batch
from fp4lab.train.trainer import make_keys, make_train

PROXY = dict(task="proxy", din=32, dout=32, teacher_hidden=(32,), d_model=32, d_ff=64,
             n_layers=2, batch_size=16, steps=30, lr=3e-3, warmup=0, eval_batches=1)  # fmt: skip


def test_the_proxy_learns_its_teacher_and_its_runs_carry_the_spike_columns():
    cfg = Config(**PROXY, recipe="mxfp4", gemms={"norms": fl.mxfp4()})
    arrays = jax.jit(make_train(cfg))(make_keys(0, 0, 0))
    loss = np.asarray(arrays["loss"])
    assert np.all(np.isfinite(loss)) and loss[-5:].mean() < loss[:5].mean()
    row = summarize(cfg, jax.tree.map(np.asarray, arrays))
    assert row["spikes"] == 0 and row["spike_events"] == "" and row["loss_floor"] == 0.0
    assert row["initial_loss"] == pytest.approx(float(loss[0]))
    model = make_task(cfg).model(nnx.Rngs(0))
    assert isinstance(model, ResidualMLP) and len(model.blocks) == 2
    swiglu = make_task(cfg.replace(activation="swiglu")).model(nnx.Rngs(0))
    assert swiglu.blocks[0].mlp.gate is not None and model.blocks[0].mlp.gate is None
    with pytest.raises(ConfigError, match="activation"):
        Config(**PROXY, activation="relu")


def test_z_loss_adds_its_term_to_the_lm_s_cross_entropy():
    base = Config(task="markov", vocab=16, d_model=32, n_layers=1, d_ff=32, seq_len=8,
                  batch_size=2, steps=1)  # fmt: skip
    plain, with_z = make_task(base), make_task(base.replace(z_loss=1e-2))
    model = plain.model(nnx.Rngs(0))
    tokens = train_batch(plain, make_keys(0, 0, 0), 0)
    logits = model(tokens[:, :-1])[:, base.order - 1 :]
    z = jax.nn.logsumexp(logits, axis=-1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, base.order :]).mean()
    np.testing.assert_allclose(plain.loss(model, tokens), ce, rtol=1e-6)
    np.testing.assert_allclose(with_z.loss(model, tokens), ce + 1e-2 * jnp.mean(z**2), rtol=1e-6)
    with pytest.raises(ConfigError, match="qk_norm / z_loss"):
        Config(**PROXY, z_loss=1e-4)


def test_qk_norm_normalizes_each_head_s_queries_and_keys():
    cfg = TransformerConfig(vocab=16, d_model=32, n_heads=2, n_layers=1, qk_norm=True)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    attn = model.blocks[0].attn
    assert attn.q_norm.scale[...].shape == (16,) and attn.k_norm.scale[...].shape == (16,)
    # the reference: the same attention with RMSNorm written out on q and k
    x = jax.random.normal(jax.random.key(1), (1, 5, 32))
    q = attn.query(x)
    rms = q / jnp.sqrt(jnp.mean(q**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(attn.q_norm(q), rms, rtol=1e-5, atol=1e-6)
    plain = Transformer(TransformerConfig(vocab=16, d_model=32, n_heads=2, n_layers=1),
                        rngs=nnx.Rngs(0))  # fmt: skip
    assert plain.blocks[0].attn.q_norm is None
    # qk-norm adds modules but draws no more keys: the other parameters are the plain model's
    np.testing.assert_array_equal(plain.blocks[0].attn.query.kernel[...], attn.query.kernel[...])


def test_signals_are_the_update_to_weight_ratio_and_the_largest_norm_scale():
    cfg = Config(**PROXY, recipe="bf16", schedule="constant", clip_norm=0.0, signals=True)
    arrays = jax.jit(make_train(cfg))(make_keys(0, 0, 0))
    assert np.all(np.isfinite(arrays["update_ratio"])) and arrays["update_ratio"].shape == (30,)
    assert float(arrays["norm_max"][0]) == 1.0  # LayerNorm scales start at ones
    assert "attn_logit_max" not in arrays and "logit_z" not in arrays  # the LMs' own only
    # Adam's first update is -lr * g / (|g| + eps): its norm is lr * sqrt(#nonzero gradients)
    model = make_task(cfg).model(nnx.Rngs(params=make_keys(0, 0, 0)["init"]))
    params = nnx.state(model, nnx.Param)
    n = sum(x.size for x in jax.tree.leaves(params))
    want = cfg.lr * np.sqrt(n) / float(optax.tree.norm(params))
    assert float(arrays["update_ratio"][0]) == pytest.approx(want, rel=1e-2)
    off = jax.jit(make_train(cfg.replace(signals=False)))(make_keys(0, 0, 0))
    assert "update_ratio" not in off
    np.testing.assert_array_equal(off["loss"], arrays["loss"])  # the signals change no number


LM = dict(task="markov", vocab=32, d_model=32, n_layers=2, n_heads=2, d_ff=32, seq_len=8,
          batch_size=4, steps=6, warmup=0, eval_batches=1, clip_norm=0.0)  # fmt: skip


def _attention_logits(model, tokens_BxT):
    """The blocks' attention logits written out from the parameters (RoPE from fp4lab's
    `rope`, checked against the paper's formula in tests/models), valid positions only."""
    from fp4lab.models.transformer import rope

    x = model.embed(tokens_BxT)
    T, out = tokens_BxT.shape[1], []
    for block in model.blocks:
        h = block.attn_norm(x)
        q = jnp.einsum("btd,dnh->btnh", h, block.attn.query.kernel[...])
        k = jnp.einsum("btd,dnh->btnh", h, block.attn.key.kernel[...])
        q, k = rope(q, jnp.arange(T)), rope(k, jnp.arange(T))
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
        out.append(np.asarray(s)[..., np.tril(np.ones((T, T), bool))])
        x = block(x)
    return out


def test_the_lm_s_own_signals_are_its_largest_attention_logit_and_log_z():
    cfg = Config(**LM, recipe="mxfp4", signals=True)  # quantized: its keys stay untouched
    keys = make_keys(0, 0, 0)
    arrays = jax.jit(make_train(cfg))(keys)
    for name in ("attn_logit_max", "logit_z"):
        assert arrays[name].shape == (6,) and np.all(np.isfinite(arrays[name]))
    # step 0: the initial weights on the first batch, under a high-precision forward
    model = make_task(cfg).model(nnx.Rngs(params=keys["init"]))
    tokens = train_batch(make_task(cfg), keys, 0)
    want = max(s.max() for s in _attention_logits(model, tokens[:, :-1]))
    assert float(arrays["attn_logit_max"][0]) == pytest.approx(want, rel=1e-5)
    z = jax.nn.logsumexp(model(tokens[:, :-1])[:, cfg.order - 1 :], axis=-1)
    assert float(arrays["logit_z"][0]) == pytest.approx(float(jnp.sqrt(jnp.mean(z**2))), rel=1e-5)
    off = jax.jit(make_train(cfg.replace(signals=False)))(keys)
    assert "attn_logit_max" not in off
    np.testing.assert_array_equal(off["loss"], arrays["loss"])  # the signals change no number
    scanned = jax.jit(make_train(cfg.replace(scan_layers=True)))(keys)
    np.testing.assert_allclose(scanned["attn_logit_max"], arrays["attn_logit_max"], rtol=1e-4)
