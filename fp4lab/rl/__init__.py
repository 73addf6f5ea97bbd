"""Reinforcement learning under fp4lab rules.

ppo     PPO on gymnax environments (CartPole-v1, Acrobot-v1, ...) with an actor-critic
grpo    GRPO on a toy task with a verifiable reward, a tiny Transformer policy; the sampler and
        the trainer are two quantized views of the same parameters
common  key streams, rule lists, nnx models as pure functions

Both trainers follow `make_train(config) -> train(keys)`: pure, jit-able, seeds by jax.vmap.
"""

from fp4lab.rl import common, grpo, ppo
from fp4lab.rl.common import EXACT_CPU, Keys, as_keys
from fp4lab.rl.grpo import GRPOConfig
from fp4lab.rl.ppo import PPOConfig

__all__ = [
    "EXACT_CPU",
    "GRPOConfig",
    "Keys",
    "PPOConfig",
    "as_keys",
    "common",
    "grpo",
    "ppo",
]
