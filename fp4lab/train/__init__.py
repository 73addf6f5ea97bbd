"""Training runs: config, tasks, loss scaling, divergence, the trainer and run summaries.

    config         Config: everything a run depends on except its seeds (validated, JSON-able)
    tasks          tasks with a known optimum; what each seed stream feeds
    loss_scaling   loss scaling as pure state-in / state-out functions
    divergence     divergence detection as pure state-in / state-out functions
    trainer        make_keys, make_train(config) -> train(keys), pure and vmap-able over seeds
    summary        one seed's arrays -> the numbers of its row in a runs table

Only `config` is imported with the package (host-side code validates configs without loading
flax); the names of the other modules are resolved when first used.
"""

import importlib

from fp4lab.train.config import Config, ConfigError

_LAZY = {
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
