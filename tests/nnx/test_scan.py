"""Stacked (scanned) layers: one quantized op per seam, rules and telemetry still per layer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import fp4lab as fl
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.nnx import telemetry
from fp4lab.nnx.op import QuantizedOp

CFG = dict(vocab=32, d_model=32, n_layers=3, n_heads=2, d_ff=64, max_len=16)
TOKENS = jax.random.randint(jax.random.key(0), (2, 17), 0, 32)
RULES = [
    fl.Rule(r"lm_head", None),
    fl.Rule(r"blocks\.1\..*", "bf16"),
    fl.Rule(r"blocks\.2\..*", None),
    fl.Rule(r".*", "nvfp4"),  # stochastic rounding and random Hadamard signs: keys per layer
]


def _model(scan: bool, rules=RULES, measure=True):
    model = Transformer(TransformerConfig(**CFG, scan_layers=scan), rngs=nnx.Rngs(0))
    return fl.quantize_model(model, rules, key=jax.random.key(1), telemetry=measure)


def _loss(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def test_scanned_transformer_starts_from_the_unscanned_parameters_stacked():
    a, b = (Transformer(TransformerConfig(**CFG, scan_layers=s), rngs=nnx.Rngs(0)) for s in (0, 1))
    for i in range(CFG["n_layers"]):
        np.testing.assert_array_equal(
            b.blocks.mlp.down.kernel[...][i], a.blocks[i].mlp.down.kernel[...]
        )
    np.testing.assert_array_equal(b.lm_head.kernel[...], a.lm_head.kernel[...])
    np.testing.assert_allclose(b(TOKENS[:, 1:]), a(TOKENS[:, 1:]), rtol=1e-5, atol=1e-5)


def test_one_op_per_seam_with_a_recipe_per_layer():
    model = _model(True)
    op = model.blocks.attn.query.dot_general
    assert isinstance(op, QuantizedOp)
    assert [p for p, _ in op.layers] == [f"blocks.{i}.attn.query" for i in range(3)]
    names = [None if r is None else r.name for _, r in op.layers]
    assert names == ["nvfp4", "bf16", None]
    assert op.probe[...].shape[0] == 3 and op.qbase[...].shape == (3,)


def test_describe_lists_every_layer_as_for_the_unscanned_model():
    a, b = (fl.describe(_model(s)).sort_values("path").reset_index(drop=True) for s in (0, 1))
    assert len(b) == 3 * 7 + 1
    assert b.equals(a)
    assert set(b[b.path.str.startswith("blocks.2.")].recipe) == {"-"}


@nnx.jit
def _shadow_step(model):
    return telemetry.value_and_grad(_loss, shadow=True)(model, TOKENS)


def test_stacked_layers_finds_the_stack_of_a_scanned_model_only():
    assert telemetry.stacked_layers(_model(True)) == {("blocks",): 3}
    assert telemetry.stacked_layers(_model(False)) == {}


def test_rules_telemetry_drift_and_gradients_per_layer_match_the_unscanned_model():
    """One pair of compiles for everything per layer: operand statistics, the shadow's gradient
    statistics and accumulated drift, depth, and the gradients themselves."""
    (la, ga, ma), (lb, gb, mb) = _shadow_step(_model(False)), _shadow_step(_model(True))
    np.testing.assert_allclose(lb, la, rtol=1e-5)
    # the shadow's grad/ statistics of a stacked parameter are per block, as unscanned
    assert "grad/blocks.2.mlp.up.kernel/cos" in mb and "grad/blocks.0.mlp_norm.scale/gnr" in mb
    assert not any(k.startswith("grad/blocks.mlp") for k in mb)
    assert set(mb) == set(ma)  # the same layer names, unstacked
    assert not any(k.startswith("quant/blocks.2.") for k in mb)  # block 2: high precision
    assert any(k.startswith("quant/blocks.1.") for k in mb)  # block 1: bf16
    counts = ("/flush", "/saturated", "/underflow", "/map4")
    for k in ma:
        tol = 1e-4 if k.startswith("quant/") else 2e-3  # shadow statistics: ratios of sums
        atol = 1e-5 if tol > 1e-4 else 1e-6
        if k.startswith("quant/") and k.endswith(counts):
            # fractions of counts: a gradient a last bit apart (summation order) can round
            # one element of a 1024-element operand the other way under stochastic rounding
            atol = 2.5e-3
        np.testing.assert_allclose(mb[k], ma[k], rtol=tol, atol=atol, err_msg=k)
    for i in range(3):
        np.testing.assert_allclose(
            gb["blocks"]["mlp"]["up"]["kernel"][...][i],
            ga["blocks"][i]["mlp"]["up"]["kernel"][...],
            rtol=1e-4,
            atol=1e-6,
        )
    # drift: every quantized op of blocks 0 and 1 reports it, in the forward's order
    seams = ["attn.query", "attn.key", "attn.value", "attn.out", "mlp.gate", "mlp.up", "mlp.down"]
    acc = {k.split("/")[1] for k in ma if k.startswith("acc/")}
    assert acc == {f"blocks.{i}.{name}" for i in range(2) for name in seams}
    for m in (ma, mb):
        depth = {k.removeprefix("depth/"): float(v) for k, v in m.items() if k.startswith("depth/")}
        ordered = [k for k in sorted(depth, key=depth.get) if k in acc]
        assert ordered == [f"blocks.{i}.{name}" for i in range(2) for name in seams]
    # the residual stream carries error upward: block 1's input has drifted; the first op's
    # drift is its own error
    assert float(ma["acc/blocks.1.attn.query/fwd/rel_drift"]) > 0
    assert float(ma["acc/blocks.0.attn.query/fwd/rel_drift"]) == pytest.approx(
        float(ma["acc/blocks.0.attn.query/fwd/local"]), rel=1e-6
    )


@nnx.jit
def _twice(model):  # the second trace reuses jax's trace of the scanned blocks
    first = telemetry.value_and_grad(_loss)(model, TOKENS)[2]
    return first, telemetry.value_and_grad(_loss)(model, TOKENS)[2]


def test_a_rule_naming_one_block_quantizes_only_that_block_and_a_second_trace_measures_it_too():
    """One compile for both: the step's statistics, and a step traced twice in one program
    reports every depth both times."""
    rules = [fl.Rule(r"blocks\.1\..*", "nvfp4-rl"), fl.Rule(".*", None)]
    model = _model(True, rules)
    metrics, second = _twice(model)
    layers = {k.split("/")[1] for k in metrics}
    seams = ("attn.query", "attn.key", "attn.value", "attn.out", "mlp.gate", "mlp.up", "mlp.down")
    assert layers == {f"blocks.1.{m}" for m in seams}
    assert isinstance(model.blocks.mlp.up.dot_general, QuantizedOp)
    assert set(metrics) == set(second)
    assert {k for k in metrics if k.startswith("depth/blocks.1.")}
    for k in metrics:
        if k.startswith("depth/"):
            assert metrics[k] == second[k]


def test_quantization_keys_advance_per_layer_and_differ_between_layers():
    model = _model(True, [fl.Rule(".*", "nvfp4")], measure=False)
    op = model.blocks.mlp.up.dot_general
    bases = np.asarray(jax.random.key_data(op.qbase[...]))
    assert len({tuple(b.ravel()) for b in bases}) == 3
    nnx.jit(lambda m: _loss(m, TOKENS))(model)
    np.testing.assert_array_equal(op.qcount[...], np.ones(3, np.uint32))


def test_conv_and_attention_seams_cannot_be_stacked_silently():
    class Stacked(nnx.Module):
        def __init__(self):
            @nnx.split_rngs(splits=3)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return nnx.Conv(4, 4, (3,), rngs=rngs)

            self.convs = make(nnx.Rngs(0))

    with pytest.raises(ValueError, match="stacked .scanned. layers is not supported"):
        fl.quantize_model(Stacked(), [fl.Rule(".*", "nvfp4")], key=jax.random.key(0))


def test_scanned_model_runs_under_vmap_over_seeds():
    def loss_at(key):
        model = Transformer(TransformerConfig(**CFG, scan_layers=True), rngs=nnx.Rngs(key))
        fl.quantize_model(model, [fl.Rule(".*", "nvfp4")], key=key)
        return _loss(model, TOKENS)

    keys = jax.random.split(jax.random.key(3), 2)
    batched = jax.jit(jax.vmap(loss_at))(keys)
    alone = jnp.stack([jax.jit(loss_at)(k) for k in keys])
    np.testing.assert_allclose(batched, alone, rtol=1e-5)


def test_trainer_runs_a_scanned_model_with_rules_and_telemetry_per_layer():
    from fp4lab import sweep
    from fp4lab.train import Config

    cfg = Config(task="markov", vocab=16, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                 seq_len=16, batch_size=4, steps=3, eval_batches=1, recipe="bf16",
                 rules=((r"blocks\.1\..*", "nvfp4-rl"),), telemetry_every=2, seed_batch=1,
                 scan_layers=True)  # fmt: skip
    # steps 0 and 2 are logged, step 2 as a last, partial chunk: the measured step is traced
    # twice in one program, the second time on jax's cached trace of the scanned blocks
    ((run,),) = [sweep.compute_cell(cfg.to_dict(), [(0, 1, 2)])]
    assert np.isfinite(run["series"]["loss"]).all() and np.isfinite(run["summary"]["eval_hp"])
    layers = {k.split("/")[1] for k in run["telemetry"]["metrics"] if k.startswith("quant/")}
    seams = ("attn.query", "attn.key", "attn.value", "attn.out", "mlp.gate", "mlp.up", "mlp.down")
    assert layers == {f"blocks.{i}.{m}" for i in (0, 1) for m in seams} | {"lm_head"}
    depth = {k[len("depth/") :]: v for k, v in run["telemetry"]["metrics"].items() if "depth/" in k}
    assert set(depth) == layers  # every layer's depth, at both logged steps
    assert all(np.shape(v) == (2,) and v[0] == v[1] for v in depth.values())
    order = sorted(depth, key=lambda k: depth[k][0])
    assert order[:7] == [f"blocks.0.{m}" for m in seams] and order[-1] == "lm_head"
