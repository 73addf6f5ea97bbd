"""The face of `fp4lab.diagnosis` (read by type checkers; loaded lazily by its `__init__`)."""

from fp4lab.diagnosis.scores import SCORES as SCORES
from fp4lab.diagnosis.study import Diagnosis as Diagnosis
from fp4lab.diagnosis.study import diagnose as diagnose
from fp4lab.sweep.experiment import parse_overrides as parse_overrides
