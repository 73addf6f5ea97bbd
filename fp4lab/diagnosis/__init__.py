"""Which layers and GEMMs of a model to keep in high precision: ranked, explained, verified.

    import fp4lab as fl
    d = fl.diagnose(model, loss, batch, config=fl.Config(steps=200), out="results/diag")
    d = fl.diagnose(experiment="experiments/own_model.py", verify=True, out="results/diag")
    print(d.summary); fl.quantize_model(model, d.rules, key=key)

    fp4lab diagnose EXPERIMENT.py [--time-budget 10m] [--verify] [--out DIR]

`fl.diagnose` is this package's `diagnose` function (`study`); the package is
`fp4lab.diagnosis`, so that no submodule import can bind its name over the function.

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
Nothing heavy is imported with the package: each name of `__init__.pyi` loads its module on
first use.
"""

from fp4lab.lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
del attach_stub
