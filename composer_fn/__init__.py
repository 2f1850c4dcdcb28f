"""composer_fn: faster training by composing speed-up methods as pure functions over immutable state.

The public surface: ``Trainer``; the records ``State``, ``StepCtx``, ``Static``; ``Event``, ``Time``,
``Timestamp``; the algorithm records; ``functional`` (the notebook API); ``optim``; ``random`` (keys).
"""

from composer_fn import algorithms, functional, optim
from composer_fn.algorithms import *  # noqa: F403 (the records, as algorithms.__all__ lists them)
from composer_fn.core import random
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import make_plan, run_event
from composer_fn.core.event import Event
from composer_fn.core.schedule import run_schedule
from composer_fn.core.state import State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.dry_run import dry_run
from composer_fn.trainer import Trainer

__all__ = [
    "Algorithm",
    "Event",
    "State",
    "Static",
    "StepCtx",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trainer",
    "dry_run",
    "functional",
    "make_plan",
    "optim",
    "random",
    "run_event",
    "run_schedule",
]
__all__ += algorithms.__all__
