"""The face of `fp4lab.sweep` (read by type checkers; loaded lazily by its `__init__`)."""

from fp4lab.sweep.compute import clear_cache as clear_cache
from fp4lab.sweep.compute import compute_cell as compute_cell
from fp4lab.sweep.experiment import Cell as Cell
from fp4lab.sweep.experiment import Experiment as Experiment
from fp4lab.sweep.experiment import ExperimentError as ExperimentError
from fp4lab.sweep.experiment import load_experiment as load_experiment
from fp4lab.sweep.experiment import parse_overrides as parse_overrides
from fp4lab.sweep.experiment import seed_triples as seed_triples
from fp4lab.sweep.fresh import replicate as replicate
from fp4lab.sweep.records import CorruptRecord as CorruptRecord
from fp4lab.sweep.records import StoreError as StoreError
from fp4lab.sweep.reproduction import ReproductionError as ReproductionError
from fp4lab.sweep.reproduction import reproduce as reproduce
from fp4lab.sweep.runner import EXECUTORS as EXECUTORS
from fp4lab.sweep.runner import FolderTaken as FolderTaken
from fp4lab.sweep.runner import pending as pending
from fp4lab.sweep.runner import run_experiment as run_experiment
from fp4lab.sweep.store import NUMERICS_VERSION as NUMERICS_VERSION
