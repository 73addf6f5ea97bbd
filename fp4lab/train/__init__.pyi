"""The face of `fp4lab.train` (read by type checkers; loaded lazily by its `__init__`)."""

from fp4lab.train.config import Config as Config
from fp4lab.train.config import ConfigError as ConfigError
from fp4lab.train.divergence import DIVERGENCE_KINDS as DIVERGENCE_KINDS
from fp4lab.train.summary import summarize as summarize
from fp4lab.train.summary import target_of as target_of
from fp4lab.train.summary import tokens_to_target as tokens_to_target
from fp4lab.train.tasks import Task as Task
from fp4lab.train.tasks import eval_batch as eval_batch
from fp4lab.train.tasks import init_model as init_model
from fp4lab.train.tasks import make_task as make_task
from fp4lab.train.tasks import train_batch as train_batch
from fp4lab.train.trainer import log_steps as log_steps
from fp4lab.train.trainer import make_keys as make_keys
from fp4lab.train.trainer import make_optimizer as make_optimizer
from fp4lab.train.trainer import make_train as make_train
from fp4lab.train.trainer import phase_rules as phase_rules
