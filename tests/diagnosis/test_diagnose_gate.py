"""Gates per layer and GEMM: data, not program structure; each GEMM chosen on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.diagnosis import gate, probe
from fp4lab.models import MLP, Transformer, TransformerConfig
from fp4lab.train.config import Config
from fp4lab.train.tasks import eval_batch, make_task
from fp4lab.train.trainer import make_keys

X = jax.random.normal(jax.random.key(1), (32, 16))
Y = jax.random.normal(jax.random.key(2), (32, 16))


def loss_fn(model, batch):
    return jnp.mean((model(batch[0]) - batch[1]) ** 2)


def _mlp(gated: bool):
    model = MLP(16, (32,), 16, rngs=nnx.Rngs(params=jax.random.key(0)))
    fl.quantize_model(model, [fl.Rule(".*", "nvfp4")], key=jax.random.key(3))
    return gate.gate_model(model) if gated else model


def _grads(model, gates=None):
    def run(m):
        if gates is not None:
            gate.set_gates(m, gates)
        return nnx.value_and_grad(loss_fn)(m, (X, Y))

    loss, grads = nnx.jit(run)(model)
    return float(loss), {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(grads)}


def test_all_ones_is_the_quantized_model_and_all_zeros_the_plain_one():
    loss_q, g_q = _grads(_mlp(False))
    loss_1, g_1 = _grads(_mlp(True), jnp.ones(6))
    assert loss_1 == loss_q
    for k in g_q:
        if k[-1] == "kernel":
            np.testing.assert_array_equal(g_1[k], g_q[k])
        np.testing.assert_allclose(g_1[k], g_q[k], rtol=1e-6, atol=1e-7)
    plain = MLP(16, (32,), 16, rngs=nnx.Rngs(params=jax.random.key(0)))
    loss_p, g_p = _grads(plain)
    loss_0, g_0 = _grads(_mlp(True), jnp.zeros(6))
    assert loss_0 == pytest.approx(loss_p, rel=1e-6)
    for k in g_p:
        np.testing.assert_allclose(g_0[k], g_p[k], rtol=1e-5, atol=1e-7)
    assert abs(loss_q - loss_p) > 1e-4  # the quantized model differs: the checks above bite


@pytest.mark.parametrize("gemm", [0, 1, 2])
def test_one_gemm_alone_changes_only_what_it_computes(gemm):
    # gates [layer 0: f d w, layer 1: f d w]; quantize one GEMM of the last layer (1)
    _, shadow = _grads(_mlp(True), jnp.zeros(6))
    one = jnp.zeros(6).at[3 + gemm].set(1.0)
    _, g = _grads(_mlp(True), one)
    first = [k for k in g if k[1] == 0]
    last_kernel = [k for k in g if k[1] == 1 and k[-1] == "kernel"][0]
    if gemm == 2:  # Wgrad: only the last layer's weight gradient
        for k in first:
            np.testing.assert_array_equal(g[k], shadow[k])
        assert not np.array_equal(g[last_kernel], shadow[last_kernel])
    elif gemm == 1:  # Dgrad: the gradient reaching layer 0, not the last layer's own
        np.testing.assert_array_equal(g[last_kernel], shadow[last_kernel])
        assert not np.array_equal(g[first[0]], shadow[first[0]])
    else:  # Fprop: the output, so the loss and every gradient after it
        assert not np.array_equal(g[last_kernel], shadow[last_kernel])


def test_one_compile_serves_every_variant_checkpoint_batch_and_quant_seed():
    cfg = Config(task="teacher", din=16, dout=16, hidden=(32,), teacher_hidden=(16,),
                 batch_size=16, steps=4)  # fmt: skip
    task, keys = make_task(cfg), make_keys(0, 0, 0)
    p = probe.Probe(task, "nvfp4", keys)
    gates = probe.variants(len(p.sites))
    assert gates.shape == (1 + 2 * 6, 6)
    weights = probe.checkpoints(task, cfg, "nvfp4", keys, (0, 2, 4))
    rests = [p.rest_for(keys, k) for k in probe.quant_keys([0, 1])]
    seen = []
    for params in weights:
        for b in range(2):
            for rest in rests:
                out, _ = p.measure(params, rest, eval_batch(task, keys, b), gates)
                seen.append(out["grad_rel"])
    assert p.compiles() == 1
    assert len(p._compiled) == 1 and p.compile_s > 0
    # a call leaves no trace in the state it is given: the same call again gives the same
    # numbers, and a variant of all zeros is the shadow itself
    rows = np.concatenate([gates, np.zeros((1, 6), np.float32)])
    batch = eval_batch(task, keys, 0)
    first, shadow = p.measure(weights[1], rests[0], batch, rows)
    again, shadow_again = p.measure(weights[1], rests[0], batch, rows)
    assert shadow == shadow_again
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    assert first["loss"][-1] == shadow["loss"]
    assert first["step_loss"][-1] == pytest.approx(shadow["step"], rel=1e-4, abs=1e-7)
    assert shadow["step"] < 0  # one Adam step on the batch lowers its loss
    for k in ("y", "dx", "dw", "dy", "grad_rel"):  # float rounding of the batched program
        assert np.all(first[k][-1] < 1e-6), k
    assert p.compiles() == 2  # one more: the variants' count is part of the program's shape
    # and the variants did differ: all-FP4 has a gradient error, each Wgrad alone another
    assert all(s[0] > 1e-3 for s in seen)
    assert len({round(float(s[0]), 7) for s in seen}) == len(seen)  # checkpoints x batches x seeds


def test_a_scanned_transformer_is_gated_per_layer():
    tcfg = TransformerConfig(vocab=16, d_model=16, n_layers=2, n_heads=1, d_ff=32, max_len=16,
                             scan_layers=True)  # fmt: skip
    model = Transformer(tcfg, rngs=nnx.Rngs(params=jax.random.key(0)))
    fl.quantize_model(model, [fl.Rule(".*", "nvfp4")], key=jax.random.key(1))
    gate.gate_model(model)
    toks = jax.random.randint(jax.random.key(2), (2, 17), 0, 16)

    def lm_loss(m, t):
        logits = m(t[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), t[:, 1:, None], -1))

    trace = gate.attach(model, lm_loss, toks)
    sites = gate.sites(model, trace)
    layers = [s.layer for s in sites]
    assert "blocks.0.mlp.up" in layers and "blocks.1.mlp.up" in layers
    by_layer = {s.layer: s.depth for s in sites}
    assert by_layer["blocks.1.mlp.up"] > by_layer["blocks.0.mlp.down"]
    assert sorted(s.depth for s in sites) == list(range(len(sites)))
