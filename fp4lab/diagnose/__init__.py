"""Which layers and GEMMs of a model to keep in high precision: ranked, explained, verified.

    import fp4lab as fl
    d = fl.diagnose(model, loss, batch, config=fl.Config(steps=200), out="results/diag")
    d = fl.diagnose(experiment="experiments/own_model.py", verify=True, out="results/diag")
    print(d.summary); fl.quantize_model(model, d.rules, key=key)

    fp4lab diagnose EXPERIMENT.py [--time-budget 10m] [--verify] [--out DIR]

The package is callable: `fl.diagnose(...)` is `fl.diagnose.diagnose(...)` (`study`).

gate     a gate per layer and GEMM in front of every quantized op: which GEMMs run quantized
         is data, so one compiled program serves every variant
probe    stage 1's program: the shadow and every variant at fixed weights; the checkpoints
stage1   the samples in rounds within a time budget, with progress and an estimate
scores   per layer x GEMM scores, their intervals, their rank agreement, ties at the top
choose   sets within a FLOP budget (top, random, last layers), what the budget skipped, the
         cheapest set reaching a predicted share, and the rules that keep them
verify   stage 2: the sets trained through the sweep, the share of the FP4 gap each closes
report   the summary in words
study    `diagnose` and its `Diagnosis`; command: `fp4lab diagnose`
Nothing heavy is imported with the package: each name loads its module on first use.
"""

import importlib
import sys
import types

_API = {
    "diagnose": ("fp4lab.diagnose.study", "diagnose"),
    "Diagnosis": ("fp4lab.diagnose.study", "Diagnosis"),
    "SCORES": ("fp4lab.diagnose.scores", "SCORES"),
    "parse_overrides": ("fp4lab.sweep.experiment", "parse_overrides"),  # `--set FIELD=VALUE`
}

__all__ = [*_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'fp4lab.diagnose' has no attribute {name!r}")
    module, attr = _API[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


class _CallableModule(types.ModuleType):
    """The package, callable as its `diagnose` function (`fl.diagnose(...)`)."""

    def __call__(self, *args, **kwargs):
        return self.diagnose(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
