"""PPO: GAE against rlax with truncations and terminations, a 2-update run, determinism."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from rl_checks import assert_seed_equals_batch_row

import fp4lab as fl
from fp4lab.rl import EXACT_CPU, Keys, as_keys, ppo

GAMMA, LAMBDA = 0.9, 0.8

# one stream of T = 8 steps: a termination at t = 2, a truncation at t = 5 (a new episode
# starts after each); v_t is V of the state each step reached (the final one where it ended)
R_T = np.array([1.0, 0.5, -1.0, 2.0, 0.0, 1.5, 0.3, -0.2], np.float32)
TERM_T = np.array([0, 0, 1, 0, 0, 0, 0, 0], bool)
TRUNC_T = np.array([0, 0, 0, 0, 0, 1, 0, 0], bool)
V_TM1 = np.array([0.3, -0.4, 1.1, 0.7, -0.9, 0.2, 0.6, -0.5], np.float32)
V_FINAL = np.array([9.0, 9.0, 5.0, 9.0, 9.0, 4.0, 9.0, 0.8], np.float32)  # 9: never used


def _v_t():
    done = TERM_T | TRUNC_T
    nxt = np.concatenate([V_TM1[1:], V_FINAL[-1:]])
    return np.where(done, V_FINAL, nxt).astype(np.float32)


def _loop_gae():
    """Plain float64 loop of the definition."""
    v_t, adv, acc = _v_t(), np.zeros(8), 0.0
    for t in reversed(range(8)):
        delta = R_T[t] + GAMMA * (1.0 - TERM_T[t]) * float(v_t[t]) - V_TM1[t]
        acc = delta + GAMMA * LAMBDA * (1.0 - (TERM_T[t] | TRUNC_T[t])) * acc
        adv[t] = acc
    return adv


def _rlax_gae():
    """rlax's GAE with the truncation bootstrap folded into the reward:
    r'_t = r_t + gamma V(s_t) at a truncation, discount_t = gamma (1 - done_t)."""
    done = TERM_T | TRUNC_T
    r = R_T + GAMMA * (TRUNC_T & ~TERM_T) * V_FINAL
    values = np.concatenate([V_TM1, V_FINAL[-1:]])  # values[t + 1] = V_tm1[t + 1] = V(s_t)
    return rlax.truncated_generalized_advantage_estimation(
        jnp.asarray(r), jnp.asarray(GAMMA * (1.0 - done), jnp.float32), LAMBDA, jnp.asarray(values)
    )


def _gae(*args):
    return ppo.gae(*args, GAMMA, LAMBDA)


@pytest.mark.parametrize("jit", [False, True])
def test_gae_matches_rlax_and_the_definition(jit):
    f = jax.jit(_gae) if jit else _gae
    args = [jnp.asarray(a) for a in (R_T, V_TM1, _v_t(), TERM_T, TRUNC_T)]
    adv = np.asarray(f(*args))
    np.testing.assert_allclose(adv, np.asarray(_rlax_gae()), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(adv, _loop_gae(), rtol=1e-6, atol=1e-6)


def test_gae_bootstraps_truncations_not_terminations():
    args = [jnp.asarray(a) for a in (R_T, V_TM1, _v_t(), TERM_T, TRUNC_T)]
    adv = np.asarray(_gae(*args))
    # a terminated step is r - V(s_tm1); a truncated one adds gamma V(final observation)
    assert adv[2] == np.float32(R_T[2] - V_TM1[2])
    np.testing.assert_allclose(adv[5], R_T[5] + GAMMA * V_FINAL[5] - V_TM1[5], rtol=1e-6)
    # treating the truncation as a termination would change the advantage there
    as_term = _gae(*[jnp.asarray(a) for a in (R_T, V_TM1, _v_t(), TERM_T | TRUNC_T, TRUNC_T)])
    assert abs(float(as_term[5]) - adv[5]) > 1.0
    # the trace is cut at both episode ends: earlier steps do not see later episodes
    r_later = R_T + 10.0 * (np.arange(8) >= 6)
    changed = np.asarray(_gae(*[jnp.asarray(a) for a in (r_later, V_TM1, _v_t(), TERM_T, TRUNC_T)]))
    np.testing.assert_array_equal(changed[:6], adv[:6])


def test_gae_vmaps_over_streams():
    args = [jnp.stack([jnp.asarray(a)] * 3, axis=1) for a in (R_T, V_TM1, _v_t(), TERM_T, TRUNC_T)]
    adv_TxN = jax.vmap(_gae, in_axes=1, out_axes=1)(*args)
    assert adv_TxN.shape == (8, 3)
    np.testing.assert_array_equal(
        np.asarray(adv_TxN[:, 1]), np.asarray(_gae(*[a[:, 0] for a in args]))
    )


def test_successor_values_use_the_final_observation_only_where_an_episode_ended():
    v_tm1 = jnp.asarray(V_TM1)[:, None]
    v_final = jnp.asarray(V_FINAL)[:, None]
    done = jnp.asarray(TERM_T | TRUNC_T)[:, None]
    np.testing.assert_array_equal(
        np.asarray(ppo.successor_values(v_tm1, v_final, done))[:, 0], _v_t()
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(env="Pong"), "env"),
        (dict(num_minibatches=3), "num_minibatches"),
        (dict(recipe="nvfp5"), "recipe"),
        (dict(rules=("x",)), "rules"),
        (dict(gamma=1.5), "gamma"),
        (dict(total_steps=8), "total_steps"),
        (dict(max_episode_steps=0), "max_episode_steps"),
    ],
)
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=rf"PPOConfig\.{field}="):
        ppo.PPOConfig(**change)


def test_a_rule_that_quantizes_nothing_is_an_error_naming_its_field():
    with pytest.raises(ValueError, match=r"PPOConfig\.rules: 'actor' matches no layer"):
        ppo.make_train(ppo.PPOConfig(rules=(fl.Rule(r"actor", "bf16"),)))


def test_config_is_frozen_and_hashable():
    cfg = ppo.PPOConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    assert hash(cfg) == hash(ppo.PPOConfig()) and cfg.replace(lr=1e-3) != cfg


def test_keys_are_three_independent_streams():
    keys = as_keys(jax.random.key(0))
    assert isinstance(keys, Keys) and as_keys(keys) is keys
    data = [jax.random.key_data(k) for k in keys]
    assert len({tuple(np.asarray(d).ravel()) for d in data}) == 3


# a short run: 4 envs x 16 steps, 2 updates of 2 epochs x 2 minibatches; one hidden layer of the
# actor in NVIDIA's NVFP4 recipe (stochastic rounding, random Hadamard: the quant stream), a
# 12-step time limit so that episodes are truncated
SMALL = ppo.PPOConfig(
    total_steps=2 * 4 * 16,
    num_steps=16,
    update_epochs=2,
    num_minibatches=2,
    hidden=(32, 32),
    rules=(fl.Rule(r"actor\.layers\.1", "nvfp4"),),
    max_episode_steps=12,
)


@pytest.fixture(scope="module")
def runs():
    """(single-seed jit, its result for seed 1, vmapped result for seeds 0 and 1)."""
    keys = jax.random.split(jax.random.key(0), 2)
    single = jax.jit(ppo.make_train(SMALL), compiler_options=EXACT_CPU)
    batched = jax.jit(jax.vmap(ppo.make_train(SMALL)), compiler_options=EXACT_CPU)
    return single, keys, single(keys[1]), batched(keys)


def test_two_update_run(runs):
    _, _, out, _ = runs
    m = {k: np.asarray(v) for k, v in out.metrics.items()}
    assert all(v.shape == (2,) for v in m.values())
    for k in ("loss/total", "loss/value", "grad/norm", "ppo/approx_kl"):
        assert np.isfinite(m[k]).all(), k
    np.testing.assert_array_equal(m["env/steps"], [64, 128])
    assert (m["episode/count"] > 0).all() and (m["episode/truncated"] > 0).all()
    assert (m["episode/length"] <= 12).all()
    np.testing.assert_allclose(m["loss/entropy"], np.log(2.0), rtol=1e-2)  # near-uniform start
    init = ppo.make_train(SMALL.replace(total_steps=64, update_epochs=1))
    assert jax.tree.structure(out.params) == jax.tree.structure(
        jax.eval_shape(init, jax.random.key(0)).params
    )


def test_same_keys_give_bit_identical_runs(runs):
    single, keys, out, _ = runs
    again = single(keys[1])
    for k, v in out.metrics.items():
        np.testing.assert_array_equal(np.asarray(again.metrics[k]), np.asarray(v), err_msg=k)
    jax.tree.map(np.testing.assert_array_equal, again.params, out.params)
    other = single(keys[0])
    assert not np.array_equal(
        np.asarray(other.metrics["loss/total"]), np.asarray(out.metrics["loss/total"])
    )


def test_a_seed_alone_equals_the_same_seed_in_a_vmapped_batch(runs):
    """Bit for bit under EXACT_CPU (see fp4lab.rl.common for why XLA:CPU needs it)."""
    _, _, out, batch = runs
    assert_seed_equals_batch_row(out, batch, 1)
