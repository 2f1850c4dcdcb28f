"""The callback contract: one optional method per event name, called with a read-only ``RunView``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from composer_fn.core.event import Event
from composer_fn.core.state import State, Static
from composer_fn.core.time import Timestamp

__all__ = ["Callback", "RunView", "bind_callbacks", "logging_callbacks"]


@dataclass(frozen=True)
class RunView:
    """What a callback sees at an event: the current records, the latest logged metrics, and the optimizer's
    base learning rate (None when the optimizer does not say)."""

    event: Event
    static: Static
    state: State
    timestamp: Timestamp
    max_steps: int
    metrics: Mapping[str, float]
    base_learning_rate: float | None = None


class Callback:
    """Base class of observers: define a method named after an event's value (``batch_end``, ``fit_end``, ...).

    A callback may log, print or write files; it may not change training. Anything that changes the run is
    an algorithm. Numbers it returns from ``log_metrics`` join the training record of each log step (every
    ``log_interval``), which every logger receives: per-batch methods should only take note, cheaply.
    """

    step_norms: bool = False
    """Whether the step should compute its gradient and update norms for this callback (``OptimizerMonitor``):
    the trainer then adds them to ``RunView.metrics`` at each log step."""

    logs: tuple[str, ...] | None = None
    """The names ``log_metrics`` may return (``fnmatch`` patterns, ``'throughput/*'``); None: not said, any name.
    Stoppers watching the training record are checked against them when the trainer is built."""

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        """Returns numbers to add to this log step's training record (names with a ``/`` keep it)."""
        return {}

    def close(self) -> None:
        """Releases whatever the callback holds (files, bars); called once when training ends."""


def logging_callbacks(callbacks: tuple[Callback, ...]) -> tuple[Callable[[RunView], Mapping[str, float]], ...]:
    """Returns the ``log_metrics`` of the callbacks that define their own."""
    return tuple(c.log_metrics for c in callbacks if type(c).log_metrics is not Callback.log_metrics)


def bind_callbacks(callbacks: tuple[Callback, ...]) -> Mapping[Event, tuple[Callable[[RunView], Any], ...]]:
    """Returns, for every event, the callback methods that handle it (resolved once, not per event)."""
    bound: dict[Event, tuple[Callable[[RunView], Any], ...]] = {}
    for event in Event:
        handlers = tuple(getattr(c, event.value) for c in callbacks if callable(getattr(c, event.value, None)))
        if handlers:
            bound[event] = handlers
    return MappingProxyType(bound)
