"""GRPO on a toy task with a verifiable reward; the sampler and the trainer quantize differently.

    import fp4lab.rl as rl
    cfg = rl.GRPOConfig(sampler_recipe="nvfp4-rl", trainer_recipe="bf16", tis_cap=2.0)
    out = jax.jit(rl.grpo.make_train(cfg))(jax.random.key(0))
    out.metrics["mismatch/abs_logp"]          # mean |log pi_trainer - log pi_sampler|, per update

Task: a prompt of L random digits, a separator, then the answer: the digits sorted ("sort", L
answer tokens) or their sum mod 10 ("sum", one token). Reward: the fraction of answer tokens
that are right (exact match is logged as well). The policy is a tiny fp4lab Transformer, first
trained for a few supervised steps on correct answers (a warm start, so that rewards vary),
then by GRPO (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300): G samples per prompt,
advantages normalised within each group,

    A_i = (r_i - mean_g r) / (std_g r + 1e-6),
    loss = -mean_tokens min(rho A, clip(rho, 1 - eps, 1 + eps) A),   rho = pi_theta / pi_old,

one optimizer step per batch of samples, no KL penalty.

Two views of one set of parameters: the sampler (rollout) and the trainer are the same
Transformer put under different rules (`sampler_recipe`/`sampler_rules`, `trainer_recipe`/
`trainer_rules`); as in RL systems whose inference engine and trainer run different kernels,
the sampler's log-probs (recorded while sampling) and the trainer's recomputed ones (pi_old)
differ. Per update this logs the mean |delta log-prob| and the exact KL(pi_sampler || pi_trainer)
over the vocabulary at the sampled positions (The 4-bitter Lesson, humans& 2026: BF16 0.0103,
MXFP8 0.0203, NVFP4 0.0328, NVFP4 + four-over-six 0.0313 on Qwen3-30B-A3B). Truncated
importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training") reweights each token by w = min(pi_old / pi_sampler, tis_cap).

Batch invariance: the sampler scores token j of a sequence while the later positions still hold
padding, and every sequence shares the batch with others. An outer scale per row (per token,
`nvfp4(scope="row")`) makes a row's quantization independent of everything else, so its
log-probs do not depend on the rest of the batch; a per-tensor scale takes the amax over the
whole batch, so they do (`batch_invariance_gap`). With identical, deterministic, per-row
sampler and trainer recipes the mismatch is exactly zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
import rlax
from flax import nnx

from fp4lab import schema
from fp4lab.core import recipes
from fp4lab.models.transformer import Transformer, TransformerConfig
from fp4lab.nnx.rules import Rule, check_rules, quantize_model
from fp4lab.rl import common

__all__ = [
    "GRPOConfig",
    "GRPOResult",
    "make_train",
    "make_prompts",
    "targets",
    "group_advantages",
    "grad_spike",
    "mismatch_metrics",
    "token_logprobs",
    "batch_invariance_gap",
    "TASKS",
    "SEP",
    "PAD",
]

TASKS = ("sort", "sum")
OPTIMIZERS = ("adam", "sgd")
SEP, PAD = 10, 11  # token ids after the digits 0..9
_MIN_VOCAB = 12


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """One GRPO run (per seed): task, model, warm start, GRPO, sampler and trainer rules."""

    task: str = "sort"  # "sort": the digits in order | "sum": their sum mod 10
    prompt_len: int = 4  # digits per prompt L
    model: TransformerConfig = TransformerConfig(
        vocab=16, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=16
    )  # vocab >= 12 (digits, SEP, PAD); 16 keeps the head divisible by 16-blocks
    warmup_steps: int = 100  # supervised steps on correct answers before GRPO
    warmup_batch: int = 64  # sequences per warm-start step
    warmup_lr: float = 3e-3  # Adam learning rate of the warm start
    updates: int = 50  # GRPO updates
    prompts: int = 16  # prompts per update P
    group: int = 8  # samples per prompt G
    optimizer: str = "adam"  # GRPO optimizer: "adam" | "sgd"
    lr: float = 3e-4  # GRPO learning rate
    max_grad_norm: float | None = 1.0  # global-norm clip (None: off); spikes are measured before
    clip_eps: float = 0.2  # ratio clip of the surrogate
    tis_cap: float | None = None  # truncated importance sampling cap C (None: off)
    spike_factor: float = 5.0  # a gradient-norm spike: norm > factor x running median
    spike_window: int = 32  # updates in the running median
    sampler_recipe: recipes.GemmRecipe | str | None = (
        "fp32"  # rollout GEMMs no sampler rule matches
    )
    sampler_rules: tuple[Rule, ...] = ()  # rollout exceptions, first match wins
    trainer_recipe: recipes.GemmRecipe | str | None = (
        "fp32"  # training GEMMs no trainer rule matches
    )
    trainer_rules: tuple[Rule, ...] = ()  # training exceptions, first match wins
    backward: str | None = None  # replaces the trainer recipes' backward mode (None: keep)
    pad: bool = True  # zero-pad dims block tiles do not divide instead of raising
    backend: str = "simulated"  # fp4lab.ops.native: "simulated" | "native" | "auto"

    def __post_init__(self):
        name = type(self).__name__
        schema.check_choice(name, "task", self.task, TASKS)
        for field in ("prompt_len", "warmup_batch", "updates", "prompts", "spike_window"):
            schema.check_number(name, field, getattr(self, field), integer=True, low=1)
        schema.check_number(name, "warmup_steps", self.warmup_steps, integer=True, low=0)
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 2:
            raise ValueError(
                f"{name}.group={self.group!r}; allowed: an int >= 2 (advantages are "
                "normalised within a group)"
            )
        if not isinstance(self.model, TransformerConfig):
            raise ValueError(f"{name}.model={self.model!r}; allowed: a TransformerConfig")
        if self.model.vocab < _MIN_VOCAB:
            raise ValueError(
                f"{name}.model.vocab={self.model.vocab}; allowed: >= {_MIN_VOCAB} "
                "(digits 0-9, SEP, PAD)"
            )
        if self.model.max_len < self.seq_len - 1:
            raise ValueError(
                f"{name}.model.max_len={self.model.max_len}; allowed: >= {self.seq_len - 1} "
                f"(prompt_len + 1 + answer length - 1)"
            )
        schema.check_choice(name, "optimizer", self.optimizer, OPTIMIZERS)
        for field in ("warmup_lr", "lr", "clip_eps"):
            schema.check_number(name, field, getattr(self, field), low=0, low_open=True)
        schema.check_number(name, "spike_factor", self.spike_factor, low=1, low_open=True)
        schema.check_number(
            name, "max_grad_norm", self.max_grad_norm, low=0, low_open=True, optional=True
        )
        schema.check_number(name, "tis_cap", self.tis_cap, low=1, optional=True)
        for field in ("sampler_recipe", "trainer_recipe"):
            common.check_recipe(name, field, getattr(self, field))
        for field in ("sampler_rules", "trainer_rules"):
            common.check_rules(name, field, getattr(self, field))
        schema.check_choice(name, "backward", self.backward, (None, *schema.BACKWARD_MODES))
        schema.check_choice(name, "backend", self.backend, schema.BACKENDS)

    @property
    def answer_len(self) -> int:
        return self.prompt_len if self.task == "sort" else 1

    @property
    def seq_len(self) -> int:
        """Prompt, separator, answer."""
        return self.prompt_len + 1 + self.answer_len

    @property
    def batch(self) -> int:
        return self.prompts * self.group

    def replace(self, **changes) -> GRPOConfig:
        return dataclasses.replace(self, **changes)


class GRPOResult(NamedTuple):
    params: Any  # nnx.State of the final Transformer parameters
    metrics: dict[str, jax.Array]  # per GRPO update
    warmup: dict[str, jax.Array]  # per warm-start step


def _mean(x: jax.Array) -> jax.Array:
    """Mean over all elements of a flattened x. (A multi-axis reduction of a vmapped array may
    be emitted with its axes in another order on XLA:CPU, summing in another order; a flat one
    is summed the same way alone and vmapped.)"""
    return jnp.mean(x.reshape(-1))


# --- the task ------------------------------------------------------------------------------


def make_prompts(key: jax.Array, n: int, prompt_len: int) -> jax.Array:
    """n prompts of uniformly random digits, shape (n, prompt_len), int32."""
    return jax.random.randint(key, (n, prompt_len), 0, 10, dtype=jnp.int32)


def targets(task: str, prompts_BxL: jax.Array) -> jax.Array:
    """The correct answers: (B, L) sorted digits, or (B, 1) the sum mod 10."""
    if task == "sort":
        return jnp.sort(prompts_BxL, axis=-1)
    return jnp.sum(prompts_BxL, axis=-1, keepdims=True) % 10


def _sequence(prompts_BxL: jax.Array, answers_BxA: jax.Array) -> jax.Array:
    sep_Bx1 = jnp.full((prompts_BxL.shape[0], 1), SEP, jnp.int32)
    return jnp.concatenate([prompts_BxL, sep_Bx1, answers_BxA.astype(jnp.int32)], axis=1)


def group_advantages(r_PxG: jax.Array, eps: float = 1e-6) -> jax.Array:
    """GRPO advantages: rewards standardised within each group of G samples of one prompt,
    A = (r - mean_g r) / (std_g r + eps) (Shao et al. 2024, arXiv 2402.03300, §4.1.2)."""
    mean_Px1 = r_PxG.mean(axis=1, keepdims=True)
    std_Px1 = r_PxG.std(axis=1, keepdims=True)
    return (r_PxG - mean_Px1) / (std_Px1 + eps)


def mismatch_metrics(
    logp_s_BxAxV: jax.Array, logp_t_BxAxV: jax.Array, answers_BxA: jax.Array
) -> dict[str, jax.Array]:
    """Sampler-trainer mismatch on the sampled tokens.

    abs_logp: mean over sampled tokens of |log pi_t(a) - log pi_s(a)|;
    max_abs_logp: its maximum;
    kl: mean over sampled positions of KL(pi_s || pi_t) = sum_v pi_s(v) (log pi_s(v) - log pi_t(v)).
    """
    idx = answers_BxA[..., None]
    logp_s_BxA = jnp.take_along_axis(logp_s_BxAxV, idx, axis=-1)[..., 0]
    logp_t_BxA = jnp.take_along_axis(logp_t_BxAxV, idx, axis=-1)[..., 0]
    delta_BxA = jnp.abs(logp_t_BxA - logp_s_BxA)
    p_s = jnp.exp(logp_s_BxAxV)
    kl_BxA = jnp.sum(jnp.where(p_s > 0, p_s * (logp_s_BxAxV - logp_t_BxAxV), 0.0), axis=-1)
    return {
        "mismatch/abs_logp": _mean(delta_BxA),
        "mismatch/max_abs_logp": delta_BxA.max(),
        "mismatch/kl": _mean(kl_BxA),
    }


def grad_spike(
    norms_W: jax.Array, i: jax.Array, norm: jax.Array, factor: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Is step i's gradient norm a spike: norm > factor x median of the last W norms?

    Args:
      norms_W: ring buffer of the previous W norms (NaN where not filled yet).
      i: the step; its norm goes to slot i mod W.
      norm: this step's gradient norm.
      factor: the spike threshold (5 in the brief's convention).
    Returns:
      (spike, median of the previous norms (NaN at the first step: no spike), updated buffer).
    """
    sorted_W = jnp.sort(norms_W)  # NaN (unfilled) last
    n = jnp.sum(jnp.isfinite(norms_W))
    # (not jnp.nanmedian: its interpolation compiles differently alone and vmapped on XLA:CPU)
    median = 0.5 * (sorted_W[jnp.maximum(n - 1, 0) // 2] + sorted_W[n // 2])
    spike = norm > factor * median
    return spike, median, norms_W.at[i % norms_W.shape[0]].set(norm)


# --- log-probs and batch invariance --------------------------------------------------------


def token_logprobs(model: nnx.Module, tokens_BxS: jax.Array) -> jax.Array:
    """log p(token_{t+1} | tokens_{<=t}) for t = 0..S-2, shape (B, S-1)."""
    logp_BxTxV = jax.nn.log_softmax(model(tokens_BxS[:, :-1]))
    return jnp.take_along_axis(logp_BxTxV, tokens_BxS[:, 1:, None], axis=-1)[..., 0]


def batch_invariance_gap(
    model: nnx.Module, tokens_BxS: jax.Array, others_BxS: jax.Array, *, rows: int
) -> jax.Array:
    """How much the first `rows` sequences' log-probs depend on the rest of the batch.

    Scores `tokens_BxS`, then the batch [tokens[:rows]; others[rows:]] (same shape, so the same
    GEMM shapes), and returns max |delta log p| over the first `rows` sequences. Zero, exactly,
    when every quantizer's scale is per row (per token); use deterministic recipes (with
    stochastic rounding the two calls draw different keys).
    """
    mixed_BxS = jnp.concatenate([tokens_BxS[:rows], others_BxS[rows:]], axis=0)
    a_RxT = token_logprobs(model, tokens_BxS)[:rows]
    b_RxT = token_logprobs(model, mixed_BxS)[:rows]
    return jnp.max(jnp.abs(a_RxT - b_RxT))


# --- training ------------------------------------------------------------------------------


def _optimizer(config: GRPOConfig) -> optax.GradientTransformation:
    opt = optax.adam(config.lr) if config.optimizer == "adam" else optax.sgd(config.lr)
    if config.max_grad_norm is None:
        return opt
    return optax.chain(common.clip_by_global_norm(config.max_grad_norm), opt)


def make_train(config: GRPOConfig):
    """`train(keys) -> GRPOResult`: pure and jit-able; vmap it over keys for several seeds.

    keys: a PRNG key (split into the init, data and quant streams) or a `common.Keys`. The
    sampler and the trainer draw their quantization keys from separate halves of `quant`.
    """
    L, A = config.prompt_len, config.answer_len
    P, G, B = config.prompts, config.group, config.batch
    sampler_rules = common.build_rules(config.sampler_recipe, config.sampler_rules, pad=config.pad)
    trainer_rules = common.build_rules(
        config.trainer_recipe, config.trainer_rules, backward=config.backward, pad=config.pad
    )
    shapes = nnx.eval_shape(lambda: Transformer(config.model, rngs=nnx.Rngs(0)))
    check_rules(shapes, sampler_rules, what="GRPOConfig.sampler_rules")  # none quantizing nothing
    check_rules(shapes, trainer_rules, what="GRPOConfig.trainer_rules")
    warm_tx = optax.adam(config.warmup_lr)
    tx = _optimizer(config)

    def train(keys) -> GRPOResult:
        keys = common.as_keys(keys)
        k_quant_s, k_quant_t = jax.random.split(keys.quant)
        k_warm, k_grpo = jax.random.split(keys.data)
        trainer = Transformer(config.model, rngs=nnx.Rngs(keys.init))
        sampler = nnx.clone(trainer)
        quantize_model(sampler, sampler_rules, key=k_quant_s, backend=config.backend)
        quantize_model(trainer, trainer_rules, key=k_quant_t, backend=config.backend)
        graph_s, _, qstate_s = common.split(sampler)
        graph_t, params, qstate_t = common.split(trainer)

        def answer_logp(graphdef, params, qstate, tokens_BxS):
            """log pi(. | prefix) at the A answer positions, (B, A, V), and the new qstate."""
            logits_BxTxV, qstate = common.apply(
                graphdef, params, qstate, lambda m: m(tokens_BxS[:, :-1])
            )
            return jax.nn.log_softmax(logits_BxTxV)[:, L : L + A], qstate

        # warm start: supervised cross-entropy on correct answers, trainer view
        def warm_loss(params, qstate, tokens_BxS):
            logp_BxAxV, qstate = answer_logp(graph_t, params, qstate, tokens_BxS)
            answers_BxA = tokens_BxS[:, L + 1 :]
            logp_BxA = jnp.take_along_axis(logp_BxAxV, answers_BxA[..., None], axis=-1)[..., 0]
            correct = jnp.argmax(logp_BxAxV, axis=-1) == answers_BxA
            return -_mean(logp_BxA), (qstate, _mean(correct))

        def warm_step(carry, key):
            params, opt_state, qstate = carry
            prompts_BxL = make_prompts(key, config.warmup_batch, L)
            tokens_BxS = _sequence(prompts_BxL, targets(config.task, prompts_BxL))
            (loss, (qstate, acc)), grads = jax.value_and_grad(warm_loss, has_aux=True)(
                params, qstate, tokens_BxS
            )
            updates, opt_state = warm_tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state, qstate), {"warmup/loss": loss, "warmup/accuracy": acc}

        (params, _, qstate_t), warm_metrics = jax.lax.scan(
            warm_step,
            (params, warm_tx.init(params), qstate_t),
            jax.random.split(k_warm, config.warmup_steps),
        )

        # rollout: the sampler view, one answer token at a time, later positions still PAD
        def sample(params, qstate, prompts_BxL, key):
            pad_BxA = jnp.full((B, A), PAD, jnp.int32)
            tokens_BxS = _sequence(prompts_BxL, pad_BxA)

            def step(carry, j):
                tokens_BxS, qstate, key = carry
                key, k_tok = jax.random.split(key)
                logits_BxTxV, qstate = common.apply(
                    graph_s, params, qstate, lambda m: m(tokens_BxS[:, :-1])
                )
                # the same ops as the trainer's scoring (log_softmax over the whole B x T x V),
                # so that equal deterministic per-row recipes give bit-equal log-probs
                logp_BxTxV = jax.nn.log_softmax(logits_BxTxV)
                logp_BxV = jax.lax.dynamic_index_in_dim(logp_BxTxV, L + j, 1, keepdims=False)
                token_B = jax.random.categorical(k_tok, logp_BxV).astype(jnp.int32)
                tokens_BxS = jax.lax.dynamic_update_index_in_dim(tokens_BxS, token_B, L + 1 + j, 1)
                return (tokens_BxS, qstate, key), logp_BxV

            (tokens_BxS, qstate, _), logp_AxBxV = jax.lax.scan(
                step, (tokens_BxS, qstate, key), jnp.arange(A)
            )
            return tokens_BxS, jnp.swapaxes(logp_AxBxV, 0, 1), qstate

        def grpo_loss(params, qstate, tokens_BxS, logp_old_BxA, adv_BxA):
            logp_BxAxV, qstate = answer_logp(graph_t, params, qstate, tokens_BxS)
            answers_BxA = tokens_BxS[:, L + 1 :]
            logp_BxA = jnp.take_along_axis(logp_BxAxV, answers_BxA[..., None], axis=-1)[..., 0]
            ratio_BxA = jnp.exp(logp_BxA - logp_old_BxA)
            loss = rlax.clipped_surrogate_pg_loss(
                ratio_BxA.reshape(-1), adv_BxA.reshape(-1), config.clip_eps
            )
            entropy = -_mean(jnp.sum(jnp.exp(logp_BxAxV) * logp_BxAxV, axis=-1))
            return loss, (qstate, entropy)

        def update(carry, key):
            params, opt_state, qstate_s, qstate_t, norms_W, i = carry
            k_prompt, k_sample = jax.random.split(key)
            prompts_PxL = make_prompts(k_prompt, P, L)
            prompts_BxL = jnp.repeat(prompts_PxL, G, axis=0)  # groups are consecutive rows
            tokens_BxS, logp_s_BxAxV, qstate_s = sample(params, qstate_s, prompts_BxL, k_sample)
            answers_BxA = tokens_BxS[:, L + 1 :]
            correct_BxA = answers_BxA == targets(config.task, prompts_BxL)
            reward_B = correct_BxA.mean(axis=-1)
            # pi_old: the trainer view's log-probs of the sampled tokens, before the update
            logp_t_BxAxV, qstate_t = answer_logp(graph_t, params, qstate_t, tokens_BxS)
            logp_old_BxA = jnp.take_along_axis(logp_t_BxAxV, answers_BxA[..., None], -1)[..., 0]
            logp_s_BxA = jnp.take_along_axis(logp_s_BxAxV, answers_BxA[..., None], -1)[..., 0]
            is_BxA = jnp.exp(logp_old_BxA - logp_s_BxA)  # pi_old / pi_sampler
            w_BxA = (
                jnp.ones_like(is_BxA)
                if config.tis_cap is None
                else jnp.minimum(is_BxA, config.tis_cap)
            )
            adv_B = group_advantages(reward_B.reshape(P, G)).reshape(B)
            adv_BxA = jax.lax.stop_gradient(w_BxA * adv_B[:, None])
            (loss, (qstate_t, entropy)), grads = jax.value_and_grad(grpo_loss, has_aux=True)(
                params, qstate_t, tokens_BxS, logp_old_BxA, adv_BxA
            )
            norm = common.global_norm(grads)
            spike, median, norms_W = grad_spike(norms_W, i, norm, config.spike_factor)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = {
                "reward/mean": reward_B.mean(),
                "reward/exact": correct_BxA.all(axis=-1).mean(),
                "loss/policy": loss,
                "policy/entropy": entropy,
                "grad/norm": norm,
                "grad/median": median,
                "grad/spike": spike,
                "is/ratio_mean": _mean(is_BxA),
                "is/ratio_max": is_BxA.max(),
                "tis/weight_mean": _mean(w_BxA),
                "tis/truncated": _mean(w_BxA < is_BxA) if config.tis_cap else 0.0,
            } | mismatch_metrics(logp_s_BxAxV, logp_t_BxAxV, answers_BxA)
            return (params, opt_state, qstate_s, qstate_t, norms_W, i + 1), metrics

        norms_W = jnp.full((config.spike_window,), jnp.nan, jnp.float32)
        carry = (params, tx.init(params), qstate_s, qstate_t, norms_W, jnp.zeros((), jnp.int32))
        carry, metrics = jax.lax.scan(update, carry, jax.random.split(k_grpo, config.updates))
        return GRPOResult(params=carry[0], metrics=metrics, warmup=warm_metrics)

    return train
