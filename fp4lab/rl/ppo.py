"""PPO on gymnax environments, with the actor-critic under fp4lab rules.

    import fp4lab.rl as rl
    train = rl.ppo.make_train(rl.PPOConfig(env="CartPole-v1", recipe="nvfp4-rl"))
    out = jax.jit(jax.vmap(train))(jax.random.split(jax.random.key(0), 8))   # 8 seeds
    out.metrics["episode/return"]                                            # (8, n_updates)

PPO (Schulman et al. 2017, arXiv 1707.06347) in the single-file style of purejaxrl
(luchris429/purejaxrl, ppo.py): `make_train(config)` returns a pure `train(keys)`, rollout and
update inside `lax.scan`, seeds batched by `jax.vmap`. Hyperparameters default to purejaxrl's
CartPole settings: 4 envs x 128 steps per update, 4 epochs of 4 minibatches, Adam 2.5e-4
annealed linearly, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, global norm 0.5.

Time limits: gymnax >= 1.0 returns (obs, state, reward, terminated, truncated, info) and resets
on either. A terminated episode has no future (the value of its last state is 0); a truncated
one does, so its advantage bootstraps from the value of the final observation,
info["final_observation"], not from the reset observation (Pardo et al. 2018, "Time Limits in
Reinforcement Learning", arXiv 1712.00378).

Measured with the defaults (fp32, CartPole-v1, 5e5 steps per seed; 8 seeds,
jax.random.split(jax.random.key(0), 8), vmapped in one jit; jax 0.10.2 on 2 shared CPU cores):
8 of 8 seeds solve it, `first_solved(metrics, 475)` (the mean return of the episodes ending in
10 consecutive updates reaches 475) after 130k-184k steps (median 149k), and all 8 end at 500.
Compile 12 s, run 38 s for the 8 seeds together. `python experiments/rl_ppo.py` repeats it
(results/rl/ppo_cartpole_fp32.json) next to bf16, nvfp4 and nvfp4-rl and Acrobot-v1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import rlax
from flax import nnx

from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.models.policy import ActorCritic
from fp4lab.nnx.rules import Rule, check_rules, quantize_model
from fp4lab.rl import common

__all__ = [
    "PPOConfig",
    "PPOResult",
    "make_train",
    "gae",
    "successor_values",
    "windowed_return",
    "first_solved",
    "ENVS",
]

ENVS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0")  # gymnax, discrete actions


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """One PPO run (per seed). Defaults: purejaxrl's CartPole settings, all GEMMs in fp32."""

    env: str = "CartPole-v1"  # gymnax environment id (ENVS)
    total_steps: int = 500_000  # environment steps per seed, all envs together
    num_envs: int = 4  # parallel environments N
    num_steps: int = 128  # rollout length T per update
    update_epochs: int = 4  # passes over each rollout
    num_minibatches: int = 4  # minibatches per pass; must divide N * T
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    clip_eps: float = 0.2  # PPO ratio clip (also clips the value update)
    ent_coef: float = 0.01  # entropy bonus weight
    vf_coef: float = 0.5  # value loss weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    lr: float = 2.5e-4  # Adam learning rate
    anneal_lr: bool = True  # linear decay to 0 over training
    hidden: tuple[int, ...] = (64, 64)  # torso widths of actor and critic
    recipe: recipes.GemmRecipe | str | None = "fp32"  # every GEMM no rule below matches
    rules: tuple[Rule, ...] = ()  # per-layer exceptions, tried first; first match wins
    pad: bool = True  # zero-pad dims block tiles do not divide (4 observations, 2 actions)
    backend: str = "simulated"  # fp4lab.ops.native: "simulated" | "native" | "auto"
    max_episode_steps: int | None = None  # time limit (truncation); None: the env's own

    def __post_init__(self):
        name = type(self).__name__
        schema.check_choice(name, "env", self.env, ENVS)
        for field in ("total_steps", "num_envs", "num_steps", "update_epochs", "num_minibatches"):
            schema.check_number(name, field, getattr(self, field), integer=True, low=1)
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            raise ValueError(
                f"{name}.num_minibatches={self.num_minibatches}; allowed: a divisor of "
                f"num_envs * num_steps = {batch}"
            )
        if self.total_steps < batch:
            raise ValueError(
                f"{name}.total_steps={self.total_steps}; allowed: >= num_envs * num_steps = "
                f"{batch} (one update)"
            )
        for field in ("gamma", "gae_lambda"):
            schema.check_number(name, field, getattr(self, field), low=0, high=1)
        for field in ("clip_eps", "max_grad_norm", "lr"):
            schema.check_number(name, field, getattr(self, field), low=0, low_open=True)
        for field in ("ent_coef", "vf_coef"):
            schema.check_number(name, field, getattr(self, field), low=0)
        if not isinstance(self.anneal_lr, bool):
            raise ValueError(f"{name}.anneal_lr={self.anneal_lr!r}; allowed: True or False")
        hidden = tuple(self.hidden)
        if not hidden or any(not isinstance(w, int) or w < 1 for w in hidden):
            raise ValueError(f"{name}.hidden={self.hidden!r}; allowed: a tuple of ints >= 1")
        object.__setattr__(self, "hidden", hidden)
        common.check_recipe(name, "recipe", self.recipe)
        common.check_rules(name, "rules", self.rules)
        schema.check_choice(name, "backend", self.backend, schema.BACKENDS)
        limit = self.max_episode_steps
        schema.check_number(name, "max_episode_steps", limit, integer=True, low=1, optional=True)

    @property
    def num_updates(self) -> int:
        return self.total_steps // (self.num_envs * self.num_steps)

    def replace(self, **changes) -> PPOConfig:
        return dataclasses.replace(self, **changes)


class PPOResult(NamedTuple):
    params: Any  # nnx.State of the final actor-critic parameters
    metrics: dict[str, jax.Array]  # one entry per update, flat "/"-separated keys


class Transition(NamedTuple):
    """One environment step of N envs (time-major stacks of these are T x N)."""

    obs_NxO: jax.Array
    action_N: jax.Array
    logp_N: jax.Array  # log pi_old(a | s)
    value_N: jax.Array  # V_old(s)
    reward_N: jax.Array
    terminated_N: jax.Array
    truncated_N: jax.Array
    final_obs_NxO: jax.Array  # the observation the step reached (before any auto-reset)
    return_N: jax.Array  # episodic return, where an episode ended at this step
    length_N: jax.Array  # episode length, where an episode ended at this step


class Runner(NamedTuple):
    params: Any
    opt_state: Any
    qstate: Any
    env_state: Any
    obs_NxO: jax.Array
    ep_return_N: jax.Array
    ep_length_N: jax.Array
    key: jax.Array


def gae(
    r_t: jax.Array,
    v_tm1: jax.Array,
    v_t: jax.Array,
    terminated_t: jax.Array,
    truncated_t: jax.Array,
    gamma: float,
    lambda_: float,
) -> jax.Array:
    """Generalized advantage estimates of one stream with terminations and truncations.

    Transitions t = 1..T: (s_{t-1}, a_{t-1}, r_t, s_t), where s_t is the state the step reached
    (the final observation of an episode, not the auto-reset one):

        delta_t = r_t + gamma (1 - terminated_t) V(s_t) - V(s_{t-1})
        A_t     = delta_t + gamma lambda (1 - done_t) A_{t+1},   done_t = terminated_t | truncated_t

    A truncated step bootstraps from V(s_t); a terminated one does not; neither carries the trace
    of the next episode. Without done flags this is rlax.truncated_generalized_advantage_estimation
    (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", arXiv 1506.02438).

    Args:
      r_t: rewards, shape (T,).
      v_tm1: V(s_{t-1}), the values of the states acted in, shape (T,).
      v_t: V(s_t), the values of the states reached, shape (T,).
      terminated_t, truncated_t: bool episode ends, shape (T,).
      gamma: discount; lambda_: GAE mixing parameter.
    Returns:
      Advantages A_t, shape (T,). (Value targets: A_t + v_tm1.)
    """
    chex.assert_rank([r_t, v_tm1, v_t, terminated_t, truncated_t], 1)
    chex.assert_equal_shape([r_t, v_tm1, v_t, terminated_t, truncated_t])
    not_terminated_t = 1.0 - terminated_t.astype(r_t.dtype)
    continues_t = 1.0 - jnp.logical_or(terminated_t, truncated_t).astype(r_t.dtype)
    delta_t = r_t + gamma * not_terminated_t * v_t - v_tm1

    def backward(acc, xs):
        delta, cont = xs
        acc = delta + gamma * lambda_ * cont * acc
        return acc, acc

    _, adv_t = jax.lax.scan(
        backward, jnp.zeros((), r_t.dtype), (delta_t, continues_t), reverse=True
    )
    return adv_t


def successor_values(
    v_tm1_TxN: jax.Array, v_final_TxN: jax.Array, done_TxN: jax.Array
) -> jax.Array:
    """V(s_t) of the states the steps reached, from a rollout with auto-resets.

    Where an episode goes on, s_t is the next row's observation, whose value the rollout already
    has (v_tm1 one row down); where it ended, s_t is the final observation (v_final). The last
    row has no next row: v_final (the reached state either way).
    """
    v_next_TxN = jnp.concatenate([v_tm1_TxN[1:], v_final_TxN[-1:]], axis=0)
    return jnp.where(done_TxN, v_final_TxN, v_next_TxN)


def _log_prob(logits_MxA: jax.Array, action_M: jax.Array) -> jax.Array:
    logp_MxA = jax.nn.log_softmax(logits_MxA)
    return jnp.take_along_axis(logp_MxA, action_M[:, None], axis=-1)[:, 0]


def _entropy(logits_MxA: jax.Array) -> jax.Array:
    logp_MxA = jax.nn.log_softmax(logits_MxA)
    return -jnp.sum(jnp.exp(logp_MxA) * logp_MxA, axis=-1)


def make_train(config: PPOConfig):
    """`train(keys) -> PPOResult`: pure and jit-able; vmap it over keys for several seeds.

    keys: a PRNG key (split into the init, data and quant streams) or a `common.Keys`.
    """
    env, env_params = gymnax.make(config.env)
    if config.max_episode_steps is not None:
        env_params = env_params.replace(max_steps_in_episode=config.max_episode_steps)
    obs_dim = int(np.prod(env.observation_space(env_params).shape))
    n_actions = int(env.action_space(env_params).n)
    N, T = config.num_envs, config.num_steps
    n_updates = config.num_updates
    M = N * T // config.num_minibatches  # minibatch size
    rules = common.build_rules(config.recipe, config.rules, pad=config.pad)
    steps_per_update = config.update_epochs * config.num_minibatches

    def lr_schedule(count):
        frac = 1.0 - (count // steps_per_update) / n_updates
        return config.lr * frac if config.anneal_lr else config.lr

    tx = optax.chain(
        common.clip_by_global_norm(config.max_grad_norm),
        optax.adam(lr_schedule, eps=1e-5),
    )

    def build(keys: common.Keys) -> nnx.Module:
        model = ActorCritic(obs_dim, n_actions, config.hidden, rngs=nnx.Rngs(keys.init))
        return quantize_model(model, rules, key=keys.quant, backend=config.backend)

    # the orthogonal initializer runs QRs: one seed at a time (see common.sequential_under_vmap)
    init = common.sequential_under_vmap(lambda keys: common.split(build(keys))[1:])
    shapes = nnx.eval_shape(
        lambda: ActorCritic(obs_dim, n_actions, config.hidden, rngs=nnx.Rngs(0))
    )
    check_rules(shapes, rules, what="PPOConfig.rules")  # one that quantizes nothing: an error
    graphdef = common.split(nnx.eval_shape(lambda: build(common.as_keys(jax.random.key(0)))))[0]

    def train(keys) -> PPOResult:
        keys = common.as_keys(keys)
        params, qstate = init(keys)

        def policy(params, qstate, obs_BxO):
            return common.apply(graphdef, params, qstate, lambda m: m(obs_BxO))

        def critic(params, qstate, obs_BxO):
            return common.apply(graphdef, params, qstate, lambda m: m.critic(obs_BxO)[..., 0])

        def env_step(runner: Runner, _):
            key, k_act, k_env = jax.random.split(runner.key, 3)
            (logits_NxA, value_N), qstate = policy(runner.params, runner.qstate, runner.obs_NxO)
            action_N = jax.random.categorical(k_act, logits_NxA)
            logp_N = _log_prob(logits_NxA, action_N)
            obs_NxO, env_state, reward_N, terminated_N, truncated_N, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(jax.random.split(k_env, N), runner.env_state, action_N, env_params)
            done_N = jnp.logical_or(terminated_N, truncated_N)
            ep_return_N = runner.ep_return_N + reward_N
            ep_length_N = runner.ep_length_N + 1
            step = Transition(
                obs_NxO=runner.obs_NxO,
                action_N=action_N,
                logp_N=logp_N,
                value_N=value_N,
                reward_N=reward_N,
                terminated_N=terminated_N,
                truncated_N=truncated_N,
                final_obs_NxO=info["final_observation"],
                return_N=jnp.where(done_N, ep_return_N, 0.0),
                length_N=jnp.where(done_N, ep_length_N, 0),
            )
            runner = runner._replace(
                qstate=qstate,
                env_state=env_state,
                obs_NxO=obs_NxO,
                ep_return_N=jnp.where(done_N, 0.0, ep_return_N),
                ep_length_N=jnp.where(done_N, 0, ep_length_N),
                key=key,
            )
            return runner, step

        def advantages(params, qstate, traj: Transition):
            """A_TxN and value targets; V(s_t) of every reached state in one batched pass."""
            final_TNxO = traj.final_obs_NxO.reshape(T * N, obs_dim)
            v_final_TxN, qstate = critic(params, qstate, final_TNxO)
            done_TxN = jnp.logical_or(traj.terminated_N, traj.truncated_N)
            v_t_TxN = successor_values(traj.value_N, v_final_TxN.reshape(T, N), done_TxN)
            adv_TxN = jax.vmap(gae, in_axes=(1, 1, 1, 1, 1, None, None), out_axes=1)(
                traj.reward_N,
                traj.value_N,
                v_t_TxN,
                traj.terminated_N,
                traj.truncated_N,
                config.gamma,
                config.gae_lambda,
            )
            return adv_TxN, adv_TxN + traj.value_N, qstate

        def loss_fn(params, qstate, mb):
            (logits_MxA, value_M), qstate = policy(params, qstate, mb["obs"])
            logp_M = _log_prob(logits_MxA, mb["action"])
            ratio_M = jnp.exp(logp_M - mb["logp"])
            adv_M = mb["adv"]
            adv_M = (adv_M - adv_M.mean()) / (adv_M.std() + 1e-8)
            policy_loss = rlax.clipped_surrogate_pg_loss(ratio_M, adv_M, config.clip_eps)
            v_clipped_M = mb["value"] + jnp.clip(
                value_M - mb["value"], -config.clip_eps, config.clip_eps
            )
            value_loss = 0.5 * jnp.mean(
                jnp.maximum(
                    jnp.square(value_M - mb["target"]), jnp.square(v_clipped_M - mb["target"])
                )
            )
            entropy = jnp.mean(_entropy(logits_MxA))
            total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
            stats = {
                "loss/total": total,
                "loss/policy": policy_loss,
                "loss/value": value_loss,
                "loss/entropy": entropy,
                "ppo/approx_kl": jnp.mean((ratio_M - 1.0) - jnp.log(ratio_M)),
                "ppo/clip_frac": jnp.mean(jnp.abs(ratio_M - 1.0) > config.clip_eps),
            }
            return total, (qstate, stats)

        def minibatch_step(carry, mb):
            params, opt_state, qstate = carry
            grads, (qstate, stats) = jax.grad(loss_fn, has_aux=True)(params, qstate, mb)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            stats["grad/norm"] = common.global_norm(grads)
            return (params, opt_state, qstate), stats

        def epoch(carry, key):
            params, opt_state, qstate, batch = carry
            perm = jax.random.permutation(key, N * T)
            mbs = jax.tree.map(
                lambda x: x[perm].reshape(config.num_minibatches, M, *x.shape[1:]), batch
            )
            (params, opt_state, qstate), stats = jax.lax.scan(
                minibatch_step, (params, opt_state, qstate), mbs
            )
            return (params, opt_state, qstate, batch), stats

        def update(runner: Runner, _):
            runner, traj = jax.lax.scan(env_step, runner, None, T)
            adv_TxN, target_TxN, qstate = advantages(runner.params, runner.qstate, traj)
            batch = {
                "obs": traj.obs_NxO,
                "action": traj.action_N,
                "logp": traj.logp_N,
                "value": traj.value_N,
                "adv": adv_TxN,
                "target": target_TxN,
            }
            batch = jax.tree.map(lambda x: x.reshape(T * N, *x.shape[2:]), batch)
            key, k_epochs = jax.random.split(runner.key)
            (params, opt_state, qstate, _), stats = jax.lax.scan(
                epoch,
                (runner.params, runner.opt_state, qstate, batch),
                jax.random.split(k_epochs, config.update_epochs),
            )
            done_TxN = jnp.logical_or(traj.terminated_N, traj.truncated_N)
            n_done = done_TxN.sum()
            metrics = {k: v.mean() for k, v in stats.items()}
            metrics |= {
                "episode/count": n_done,
                "episode/return": traj.return_N.sum() / jnp.where(n_done > 0, n_done, jnp.nan),
                "episode/length": traj.length_N.sum() / jnp.where(n_done > 0, n_done, jnp.nan),
                "episode/truncated": traj.truncated_N.sum(),
            }
            runner = runner._replace(params=params, opt_state=opt_state, qstate=qstate, key=key)
            return runner, metrics

        k_reset, k_run = jax.random.split(keys.data)
        obs_NxO, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, N), env_params
        )
        runner = Runner(
            params=params,
            opt_state=tx.init(params),
            qstate=qstate,
            env_state=env_state,
            obs_NxO=obs_NxO,
            ep_return_N=jnp.zeros((N,), jnp.float32),
            ep_length_N=jnp.zeros((N,), jnp.int32),
            key=k_run,
        )
        runner, metrics = jax.lax.scan(update, runner, None, n_updates)
        metrics["env/steps"] = (jnp.arange(n_updates) + 1) * (N * T)
        return PPOResult(params=runner.params, metrics=metrics)

    return train


def windowed_return(metrics: dict, window: int = 10) -> np.ndarray:
    """Mean return of the episodes that ended in the last `window` updates, per update.

    metrics: PPOResult.metrics (host arrays), leading axes (..., n_updates).
    Returns: an array of the same shape; NaN where no episode ended in the window.
    """
    count = np.asarray(metrics["episode/count"], np.float64)
    total = np.nan_to_num(np.asarray(metrics["episode/return"], np.float64)) * count
    kernel = np.ones(window)

    def roll(x):
        return np.apply_along_axis(lambda r: np.convolve(r, kernel)[: r.shape[0]], -1, x)

    c, s = roll(count), roll(total)
    return np.where(c > 0, s / np.where(c > 0, c, 1.0), np.nan)


def first_solved(metrics: dict, threshold: float, window: int = 10) -> np.ndarray:
    """Environment steps at which the windowed mean return first reached `threshold` (NaN:
    never), per run. CartPole-v1 counts as solved at 475 (gymnasium's reward_threshold)."""
    ret = windowed_return(metrics, window)
    steps = np.asarray(metrics["env/steps"], np.float64)
    hit = np.nan_to_num(ret, nan=-np.inf) >= threshold
    first = np.argmax(hit, axis=-1)
    reached = hit.any(axis=-1)
    at = np.take_along_axis(np.broadcast_to(steps, hit.shape), first[..., None], -1)[..., 0]
    return np.where(reached, at, np.nan)
