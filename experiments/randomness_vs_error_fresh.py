"""The randomness-vs-error experiment again with fresh seed values (100-111 in every stream).

    fp4lab run experiments/randomness_vs_error_fresh.py --out results/randomness_vs_error_fresh

A finding that holds only for seeds 0-11 is a finding about those seeds: this rerun checks that
the verdict words of experiments/randomness_vs_error.py (seeds 0-11) survive other draws of
every stream.
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "randomness_vs_error", Path(__file__).with_name("randomness_vs_error.py")
)
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

FIRST_SEED = 100
get_config = base.get_config
analyze = base.analyze


def sweep(add):
    base.sweep(add, first=FIRST_SEED)
