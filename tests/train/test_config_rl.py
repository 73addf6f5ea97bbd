"""The RL configs check the type, finiteness and range of their numeric fields."""

import math

import pytest

pytest.importorskip("gymnax")
from fp4lab.rl import grpo, ppo  # noqa: E402


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(gamma="0.9"), "PPOConfig.gamma='0.9' (str); allowed: a float >= 0 and <= 1"),
        (dict(lr=math.inf), "PPOConfig.lr=inf; allowed: a float > 0"),
        (dict(ent_coef=math.nan), "PPOConfig.ent_coef=nan; allowed: a float >= 0"),
        (dict(num_envs=True), "PPOConfig.num_envs=True (bool); allowed: an int >= 1"),
        (dict(env="CartPole-v2"), "did you mean 'CartPole-v1'?"),
        (dict(anneal_lr="yes"), "PPOConfig.anneal_lr='yes'; allowed: True or False"),
    ],
)
def test_ppo_config(change, message):
    with pytest.raises(ValueError) as e:
        ppo.PPOConfig(**change)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(lr=-1.0), "GRPOConfig.lr=-1.0; allowed: a float > 0"),
        (dict(spike_factor=math.nan), "GRPOConfig.spike_factor=nan; allowed: a float > 1"),
        (dict(max_grad_norm=math.inf), "GRPOConfig.max_grad_norm=inf; allowed: a float > 0"),
        (dict(warmup_steps=1.5), "GRPOConfig.warmup_steps=1.5 (float); allowed: an int >= 0"),
        (dict(optimizer="adamw"), "did you mean 'adam'?"),
        (dict(group=True), "GRPOConfig.group=True"),
    ],
)
def test_grpo_config(change, message):
    with pytest.raises(ValueError) as e:
        grpo.GRPOConfig(**change)
    assert message in str(e.value)
