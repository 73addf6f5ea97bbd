"""GRPO: advantages, mismatch metrics, batch invariance, 2-update runs, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_checks import assert_seed_equals_batch_row

import fp4lab as fl
from fp4lab.core import recipes
from fp4lab.models import Transformer, TransformerConfig
from fp4lab.rl import EXACT_CPU, grpo

TINY = TransformerConfig(vocab=16, d_model=16, n_layers=1, n_heads=1, d_ff=32, max_len=8)
ROW = recipes.get("nvfp4-rl")  # per-row (per-token) outer scale for activations
TENSOR = ROW.replace(fprop_x=fl.nvfp4(four_over_six="mae"), name="nvfp4-rl per-tensor")
SMALL = grpo.GRPOConfig(
    model=TINY, prompt_len=3, warmup_steps=2, warmup_batch=16, updates=2, prompts=4, group=8
)


def test_task_targets_and_sequences():
    prompts = jnp.array([[3, 1, 2], [9, 9, 0]])
    np.testing.assert_array_equal(grpo.targets("sort", prompts), [[1, 2, 3], [0, 9, 9]])
    np.testing.assert_array_equal(grpo.targets("sum", prompts), [[6], [8]])
    p = grpo.make_prompts(jax.random.key(0), 64, 5)
    assert p.shape == (64, 5) and p.dtype == jnp.int32 and 0 <= p.min() and p.max() <= 9


def test_group_advantages_standardise_within_groups():
    r = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    a = np.asarray(grpo.group_advantages(r))
    np.testing.assert_allclose(a[0], [1, -1, -1, 1], rtol=1e-5)
    np.testing.assert_array_equal(a[1], 0.0)  # equal rewards carry no signal


def test_mismatch_metrics_on_a_hand_made_example():
    logp_s = jnp.log(jnp.array([[[0.5, 0.5, 0.0]], [[0.25, 0.25, 0.5]]]))  # B=2, A=1, V=3
    logp_t = jnp.log(jnp.array([[[0.25, 0.75, 0.0]], [[0.25, 0.25, 0.5]]]))
    m = grpo.mismatch_metrics(logp_s, logp_t, jnp.array([[0], [2]]))
    np.testing.assert_allclose(m["mismatch/abs_logp"], np.log(2.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch/max_abs_logp"], np.log(2.0), rtol=1e-6)
    kl0 = 0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75)  # zero-probability token skipped
    np.testing.assert_allclose(m["mismatch/kl"], kl0 / 2, rtol=1e-5)
    same = grpo.mismatch_metrics(logp_s, logp_s, jnp.array([[1], [0]]))
    assert all(float(v) == 0.0 for v in same.values())


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(task="copy"), "task"),
        (dict(group=1), "group"),
        (dict(optimizer="lion"), "optimizer"),
        (dict(backward="exact"), "backward"),
        (dict(sampler_recipe="nvfp5"), "sampler_recipe"),
        (dict(trainer_rules=[fl.Rule(".*", None)]), "trainer_rules"),
        (dict(tis_cap=0.5), "tis_cap"),
        (dict(model=TransformerConfig(vocab=10)), r"model\.vocab"),
        (dict(prompt_len=8, model=TINY), r"model\.max_len"),
    ],
)
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{field}="):
        grpo.GRPOConfig(**change)


def test_a_rule_that_quantizes_nothing_is_an_error_naming_its_field():
    with pytest.raises(ValueError, match=r"GRPOConfig\.sampler_rules: '.*mlp' matches no layer"):
        grpo.make_train(SMALL.replace(sampler_rules=(fl.Rule(r".*mlp", "bf16"),)))  # not whole
    shadowed = (fl.Rule(r".*", "bf16"), fl.Rule(r".*lm_head", None))
    with pytest.raises(ValueError, match=r"GRPOConfig\.trainer_rules: '\.\*lm_head'"):
        grpo.make_train(SMALL.replace(trainer_rules=shadowed))
    grpo.make_train(SMALL.replace(sampler_rules=(fl.Rule(r".*mlp\..*", "bf16"),)))


def _model(recipe) -> nnx.Module:
    model = Transformer(TINY, rngs=nnx.Rngs(0))
    fl.quantize_model(model, [fl.Rule(r".*", recipe)])
    return model


def _tokens():
    k1, k2 = jax.random.split(jax.random.key(1))
    return jax.random.randint(k1, (8, 7), 0, 12), jax.random.randint(k2, (8, 7), 0, 12)


@nnx.jit
def _gaps(model, tokens_BxS, others_BxS):
    """(batch gap, prefix gap): max |delta log p| of the first 4 sequences when the other 4 are
    replaced; of the first 3 predictions when the later tokens are PAD, as the sampler sees them."""
    batch = grpo.batch_invariance_gap(model, tokens_BxS, others_BxS, rows=4)
    padded_BxS = tokens_BxS.at[:, 4:].set(grpo.PAD)
    a = grpo.token_logprobs(model, tokens_BxS)[:, :3]
    b = grpo.token_logprobs(model, padded_BxS)[:, :3]
    return batch, jnp.max(jnp.abs(a - b))


@pytest.mark.parametrize("recipe", ["fp32", ROW])
def test_log_probs_exactly_batch_and_prefix_invariant_with_per_row_scales(recipe):
    batch, prefix = _gaps(_model(recipe), *_tokens())
    assert float(batch) == 0.0 and float(prefix) == 0.0


def test_log_probs_depend_on_the_batch_and_later_tokens_with_per_tensor_scales():
    batch, prefix = _gaps(_model(TENSOR), *_tokens())
    assert float(batch) > 1e-4 and float(prefix) > 1e-4  # the tensor amax couples the rows


def _on_mlp_down(recipe) -> tuple:
    """One quantized GEMM per view keeps the compiled program (and the test) small."""
    return (fl.Rule(r".*mlp\.down", recipe),)


@pytest.fixture(scope="module")
def equal_views():
    """Sampler and trainer both per-row nvfp4-rl (deterministic)."""
    rules = _on_mlp_down(ROW)
    cfg = SMALL.replace(sampler_rules=rules, trainer_rules=rules)
    train = jax.jit(grpo.make_train(cfg))
    return train, train(jax.random.key(0))


def test_equal_sampler_and_trainer_recipes_give_zero_mismatch(equal_views):
    _, out = equal_views
    for k in ("mismatch/abs_logp", "mismatch/max_abs_logp", "mismatch/kl"):
        np.testing.assert_array_equal(np.asarray(out.metrics[k]), 0.0, err_msg=k)
    np.testing.assert_array_equal(np.asarray(out.metrics["is/ratio_max"]), 1.0)
    assert out.warmup["warmup/loss"].shape == (2,) and np.isfinite(out.warmup["warmup/loss"]).all()


def test_same_keys_give_bit_identical_runs(equal_views):
    train, out = equal_views
    again = train(jax.random.key(0))
    for k, v in out.metrics.items():
        np.testing.assert_array_equal(np.asarray(again.metrics[k]), np.asarray(v), err_msg=k)
    jax.tree.map(np.testing.assert_array_equal, again.params, out.params)


# sampler bf16, trainer fp32: a real mismatch; truncated IS, SGD, a high-precision backward
MIXED_VIEWS = SMALL.replace(
    warmup_steps=0,
    sampler_recipe="bf16",
    tis_cap=1.001,
    optimizer="sgd",
    lr=0.1,
    backward="high_precision",
)


@pytest.fixture(scope="module")
def mixed_views():
    keys = jax.random.split(jax.random.key(0), 2)
    single = jax.jit(grpo.make_train(MIXED_VIEWS), compiler_options=EXACT_CPU)
    batched = jax.jit(jax.vmap(grpo.make_train(MIXED_VIEWS)), compiler_options=EXACT_CPU)
    return single(keys[1]), batched(keys)


def test_two_update_run_with_different_views(mixed_views):
    out, _ = mixed_views
    m = {k: np.asarray(v) for k, v in out.metrics.items()}
    assert all(v.shape == (2,) for v in m.values())
    for k, v in m.items():
        assert np.isfinite(v[1:] if k == "grad/median" else v).all(), k
    assert np.isnan(m["grad/median"][0])  # no history before the first update
    assert not m["grad/spike"].any()
    assert ((m["reward/mean"] >= 0) & (m["reward/mean"] <= 1)).all()
    assert (m["mismatch/abs_logp"] > 0).all() and (m["mismatch/kl"] > 0).all()
    assert (m["tis/truncated"] > 0).all() and (m["tis/weight_mean"] <= 1.001).all()


def test_a_seed_alone_equals_the_same_seed_in_a_vmapped_batch(mixed_views):
    """Bit for bit under EXACT_CPU (see fp4lab.rl.common)."""
    out, batch = mixed_views
    assert_seed_equals_batch_row(out, batch, 1)


def test_grad_spikes_are_flagged_against_the_running_median():
    norms = [1.0, 1.2, 0.8, 10.0, 1.0, 6.0, 1.1, 0.9]
    buf, spikes, medians = jnp.full((4,), jnp.nan), [], []
    for i, n in enumerate(norms):
        spike, median, buf = grpo.grad_spike(buf, jnp.int32(i), jnp.float32(n), 5.0)
        spikes.append(bool(spike))
        medians.append(float(median))
    assert spikes == [False, False, False, True, False, True, False, False]
    assert np.isnan(medians[0]) and medians[3] == 1.0 and medians[5] == pytest.approx(1.1)
    np.testing.assert_array_equal(buf, np.float32([1.0, 6.0, 1.1, 0.9]))  # ring order
