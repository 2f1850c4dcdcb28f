"""composer_fn: faster training by composing speed-up methods as pure functions over immutable state.

The public surface: ``Trainer``; the records ``State``, ``StepCtx``, ``Static``; ``Event``, ``Time``,
``Timestamp``; the algorithm records; ``functional`` (the notebook API); ``optim``; ``random`` (keys).

Each name is imported on first use, so ``import composer_fn`` alone loads neither torch nor any algorithm and the
``composer-fn`` command answers ``--help`` at once. The algorithm registry
(``composer_fn.core.algorithm.REGISTRY``) fills when ``composer_fn.algorithms`` or an algorithm record is first
imported, when this package first gives one of the trainer's names (``Trainer``, ``load_model``, ...), and when
the trainer reads the algorithms a checkpoint names.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_fn import algorithms as algorithms
    from composer_fn import functional as functional
    from composer_fn import optim as optim
    from composer_fn.algorithms import *  # noqa: F403 (the records, as algorithms.__all__ lists them)
    from composer_fn.core import random as random
    from composer_fn.core.algorithm import Algorithm as Algorithm
    from composer_fn.core.dry_run import dry_run as dry_run
    from composer_fn.core.engine import make_plan as make_plan
    from composer_fn.core.engine import run_event as run_event
    from composer_fn.core.event import Event as Event
    from composer_fn.core.schedule import run_schedule as run_schedule
    from composer_fn.core.state import State as State
    from composer_fn.core.state import Static as Static
    from composer_fn.core.state import StepCtx as StepCtx
    from composer_fn.core.time import Time as Time
    from composer_fn.core.time import Timestamp as Timestamp
    from composer_fn.core.time import TimeUnit as TimeUnit
    from composer_fn.export import export_model as export_model
    from composer_fn.trainer import FSDP as FSDP
    from composer_fn.trainer import BatchLayout as BatchLayout
    from composer_fn.trainer import Checkpointing as Checkpointing
    from composer_fn.trainer import Evaluator as Evaluator
    from composer_fn.trainer import Execution as Execution
    from composer_fn.trainer import Reporting as Reporting
    from composer_fn.trainer import Resume as Resume
    from composer_fn.trainer import Trainer as Trainer
    from composer_fn.trainer import load_model as load_model

# public name: the module that defines it
_ORIGINS: dict[str, str] = {
    "Algorithm": "composer_fn.core.algorithm",
    "BatchLayout": "composer_fn.trainer",
    "Checkpointing": "composer_fn.trainer",
    "Evaluator": "composer_fn.trainer",
    "FSDP": "composer_fn.trainer",
    "Execution": "composer_fn.trainer",
    "Reporting": "composer_fn.trainer",
    "Resume": "composer_fn.trainer",
    "Event": "composer_fn.core.event",
    "State": "composer_fn.core.state",
    "Static": "composer_fn.core.state",
    "StepCtx": "composer_fn.core.state",
    "Time": "composer_fn.core.time",
    "TimeUnit": "composer_fn.core.time",
    "Timestamp": "composer_fn.core.time",
    "Trainer": "composer_fn.trainer",
    "dry_run": "composer_fn.core.dry_run",
    "export_model": "composer_fn.export",
    "load_model": "composer_fn.trainer",
    "make_plan": "composer_fn.core.engine",
    "run_event": "composer_fn.core.engine",
    "run_schedule": "composer_fn.core.schedule",
}
# public name: the module it stands for
_MODULES: dict[str, str] = {
    "algorithms": "composer_fn.algorithms",
    "functional": "composer_fn.functional",
    "optim": "composer_fn.optim",
    "random": "composer_fn.core.random",
}

_NAMES = (
    "Algorithm",
    "BatchLayout",
    "Checkpointing",
    "Evaluator",
    "Event",
    "FSDP",
    "Execution",
    "Reporting",
    "Resume",
    "State",
    "Static",
    "StepCtx",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trainer",
    "dry_run",
    "export_model",
    "functional",
    "load_model",
    "make_plan",
    "optim",
    "random",
    "run_event",
    "run_schedule",
)
"""The public names besides the algorithm records, which ``composer_fn.algorithms.__all__`` lists."""


def _algorithm_names() -> list[str]:
    names: list[str] = importlib.import_module("composer_fn.algorithms").__all__
    return names


def __getattr__(name: str) -> Any:
    """Returns the public name ``name`` (or the subpackage ``composer_fn.<name>``), importing it on first use."""
    if name == "__all__":
        # Read by ``from composer_fn import *``; it loads the algorithms, as the star asks for them.
        return [*_NAMES, *_algorithm_names()]
    if name in _MODULES:
        value: Any = importlib.import_module(_MODULES[name])
    elif name in _ORIGINS:
        value = getattr(importlib.import_module(_ORIGINS[name]), name)
        if _ORIGINS[name] == "composer_fn.trainer":
            # A trainer may resume from a checkpoint that names any algorithm.
            importlib.import_module("composer_fn.algorithms")
    elif name[:1].isupper() and name in _algorithm_names():
        value = getattr(importlib.import_module("composer_fn.algorithms"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Returns the names loaded so far and every public name."""
    return sorted(set(globals()) | set(_NAMES) | set(_algorithm_names()))
