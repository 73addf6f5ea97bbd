"""Models: shapes, causality, RoPE, plain-nnx paths, and a 2-step training run."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fp4lab.models import MLP, ActorCritic, Transformer, TransformerConfig, mlp, policy, rope
from fp4lab.models import transformer as transformer_module

CFG = TransformerConfig(vocab=13, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_len=16)


def _tokens(key=0, batch=2, length=12, vocab=CFG.vocab):
    return jax.random.randint(jax.random.key(key), (batch, length), 0, vocab, dtype=jnp.int32)


@pytest.fixture(scope="module")
def model():
    """One Transformer shared by the read-only tests (initialization is the slow part on CPU)."""
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def actor_critic():
    return ActorCritic(6, 4, hidden=16, rngs=nnx.Rngs(0))


_forward = nnx.jit(lambda model, tokens: model(tokens))


def _paths(model):
    return {".".join(map(str, p)): m for p, m in nnx.iter_modules(model)}


# --- shapes and configs ---------------------------------------------------------------------


def test_transformer_shapes(model):
    logits = _forward(model, _tokens())
    assert logits.shape == (2, 12, CFG.vocab) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_transformer_bfloat16_compute():
    cfg = dataclasses.replace(CFG, n_layers=1, dtype="bfloat16")
    bf16_model = Transformer(cfg, rngs=nnx.Rngs(0))
    logits = _forward(bf16_model, _tokens())
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    assert bf16_model.blocks[0].mlp.up.kernel[...].dtype == jnp.float32  # params stay float32


def test_jit_matches_eager(model):
    t = _tokens()
    np.testing.assert_allclose(_forward(model, t), model(t), atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(d_model=12, n_heads=4), "d_model"),  # odd head width
        (dict(n_layers=0), "n_layers"),
        (dict(dtype="float8"), "dtype"),
    ],
)
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=f"TransformerConfig.{field}"):
        TransformerConfig(vocab=13, **kwargs)


def test_too_long_sequence_raises(model):
    with pytest.raises(ValueError, match="max_len"):
        model(_tokens(length=CFG.max_len + 1))


def test_mlp_and_actor_critic_shapes(actor_critic):
    x = jnp.ones((4, 5))
    assert _forward(MLP(5, (16, 8), 3, rngs=nnx.Rngs(0)), x).shape == (4, 3)
    assert _forward(MLP(5, (), 3, rngs=nnx.Rngs(0)), x).shape == (4, 3)
    logits, value = _forward(actor_critic, jnp.ones((7, 6)))
    assert logits.shape == (7, 4) and value.shape == (7,)
    # small policy head at init: near-uniform policy
    assert float(jnp.abs(logits).max()) < 0.5


# --- causality and positions ----------------------------------------------------------------


@pytest.mark.parametrize("j", [1, 5, 11])
def test_causal_future_token_does_not_change_earlier_logits(model, j):
    t = _tokens()
    t2 = t.at[:, j].set((t[:, j] + 1) % CFG.vocab)
    a, b = _forward(model, t), _forward(model, t2)
    np.testing.assert_array_equal(a[:, :j], b[:, :j])  # exactly
    assert not np.allclose(a[:, j], b[:, j])


def test_rope_is_a_position_dependent_rotation():
    key_q, key_k = jax.random.split(jax.random.key(0))
    T, H = 8, 16
    q_1x1x1xH = jax.random.normal(key_q, (1, 1, 1, H))
    k_1x1x1xH = jax.random.normal(key_k, (1, 1, 1, H))
    rotate = jax.jit(lambda v: rope(jnp.broadcast_to(v, (1, T, 1, H)), jnp.arange(T))[0, :, 0])
    q_TxH, k_TxH = np.asarray(rotate(q_1x1x1xH)), np.asarray(rotate(k_1x1x1xH))
    q_H = np.asarray(q_1x1x1xH).reshape(H)
    np.testing.assert_allclose(q_TxH[0], q_H, rtol=1e-6)  # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(q_TxH, axis=-1), np.linalg.norm(q_H), rtol=1e-5)
    assert all(not np.allclose(q_TxH[i], q_TxH[j]) for i in range(T) for j in range(i))
    # <rope(q, m), rope(k, n)> depends on m - n only
    s_TxT = q_TxH @ k_TxH.T
    np.testing.assert_allclose(s_TxT[5, 2], s_TxT[3, 0], rtol=1e-4)
    np.testing.assert_allclose(np.diag(s_TxT), s_TxT[0, 0], rtol=1e-4)
    assert not np.isclose(s_TxT[5, 2], s_TxT[2, 5])


def test_model_sees_token_order(model):
    # Without position information causal attention is permutation-invariant over the prefix,
    # so swapping the first two tokens would leave the last position's logits unchanged.
    t = _tokens().at[:, 0].set(1).at[:, 1].set(2)
    swapped = t.at[:, 0].set(2).at[:, 1].set(1)
    a, b = _forward(model, t), _forward(model, swapped)
    assert not np.allclose(a[:, -1], b[:, -1], atol=1e-6)


# --- plain nnx --------------------------------------------------------------------------------


def test_transformer_paths_are_plain_nnx_layers(model):
    paths = _paths(model)
    for i in range(CFG.n_layers):
        for name in ("query", "key", "value", "out"):
            assert isinstance(paths[f"blocks.{i}.attn.{name}"], nnx.LinearGeneral)
        for name in ("gate", "up", "down"):
            assert isinstance(paths[f"blocks.{i}.mlp.{name}"], nnx.Linear)
        assert isinstance(paths[f"blocks.{i}.attn_norm"], nnx.RMSNorm)
    assert isinstance(paths["lm_head"], nnx.Linear)
    assert isinstance(paths["embed"], nnx.Embed)
    assert paths["blocks.0.mlp.up"].bias is None


def test_mlp_and_policy_paths(actor_critic):
    assert {"layers.0", "layers.1", "layers.2"} <= set(_paths(MLP(5, (16, 8), 3, rngs=nnx.Rngs(0))))
    paths = _paths(actor_critic)
    for torso in ("actor", "critic"):
        for i in range(3):
            assert isinstance(paths[f"{torso}.layers.{i}"], nnx.Linear)


@pytest.mark.parametrize("module", [mlp, policy, transformer_module])
def test_model_code_does_not_import_fp4lab(module):
    source = inspect.getsource(module)
    assert "import fp4lab" not in source and "from fp4lab" not in source


# --- training -------------------------------------------------------------------------------


def _two_steps(model, loss_fn, batch):
    opt = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch):
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
        opt.update(model, grads)
        return loss

    # the third call returns the loss after two updates
    return [float(step(model, opt, batch)) for _ in range(3)]


def test_transformer_two_adamw_steps_reduce_loss():
    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    cfg = dataclasses.replace(CFG, n_layers=1)
    losses = _two_steps(Transformer(cfg, rngs=nnx.Rngs(1)), loss_fn, _tokens(length=16))
    assert np.isfinite(losses).all() and losses[2] < losses[1] < losses[0]


def test_mlp_two_adamw_steps_reduce_loss():
    x = jax.random.normal(jax.random.key(1), (32, 5))
    y = jnp.sin(x[:, :3])

    def loss_fn(model, batch):
        return jnp.mean((model(batch[0]) - batch[1]) ** 2)

    losses = _two_steps(MLP(5, (16, 8), 3, rngs=nnx.Rngs(0)), loss_fn, (x, y))
    assert np.isfinite(losses).all() and losses[2] < losses[0]
