"""Training runs: config, tasks, loss scaling, divergence, the trainer and run summaries.

    config         Config: everything a run depends on except its seeds (validated, JSON-able)
    tasks          tasks with a known optimum; what each seed stream feeds
    loss_scaling   loss scaling as pure state-in / state-out functions
    divergence     divergence detection as pure state-in / state-out functions
    trainer        make_keys, make_train(config) -> train(keys), pure and vmap-able over seeds
    summary        one seed's arrays -> the numbers of its row in a runs table

Nothing is imported with the package: each name is resolved from its module when first used
(`Config` loads jax's numerics for its checks, not flax; a reader of results that imports
`fp4lab.train.own` loads neither).
"""

import importlib

_LAZY = {
    "Config": "config",
    "ConfigError": "config",
    "Task": "tasks",
    "make_task": "tasks",
    "init_model": "tasks",
    "train_batch": "tasks",
    "eval_batch": "tasks",
    "make_keys": "trainer",
    "make_optimizer": "trainer",
    "make_train": "trainer",
    "phase_rules": "trainer",
    "log_steps": "trainer",
    "summarize": "summary",
    "target_of": "summary",
    "tokens_to_target": "summary",
    "DIVERGENCE_KINDS": "divergence",
}

__all__ = ["Config", "ConfigError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"fp4lab.train.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fp4lab.train' has no attribute {name!r}")
