"""Training runs: config, tasks, loss scaling, divergence, the trainer and run summaries.

    config         Config: everything a run depends on except its seeds (validated, JSON-able)
    tasks          tasks with a known optimum; what each seed stream feeds
    loss_scaling   loss scaling as pure state-in / state-out functions
    divergence     divergence detection as pure state-in / state-out functions
    trainer        make_keys, make_train(config) -> train(keys), pure and vmap-able over seeds
    summary        one seed's arrays -> the numbers of its row in a runs table

Nothing is imported with the package: each name of `__init__.pyi` is loaded from its module when
first used (`Config` loads jax's numerics for its checks, not flax; a reader of results that
imports `fp4lab.train.own` loads neither).
"""

from fp4lab.lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
del attach_stub
