"""What a run tells: records handed to the loggers, the training throughput, the progress bar, and when
algorithms switch on and off.

``Reporter`` holds the side of reporting that has state of its own (the queue of records waiting for the
loggers, the throughput window, the bar); it is given values and never reads the trainer. The record builders
(``hparams_record``, ``schedule_table``) are functions of the run's settings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from composer_fn.core.dry_run import dry_run
from composer_fn.core.engine import Plan
from composer_fn.core.event import TRAIN_STEP_EVENTS, Event
from composer_fn.core.state import Static
from composer_fn.core.time import Time, TimeUnit
from composer_fn.loggers.base import Logger
from composer_fn.trainer.build import Run

__all__ = ["Reporter", "Switches", "SCHEDULE_STEPS", "hparams_record", "schedule_table"]

SCHEDULE_STEPS = 2000
"""How many steps of the run the schedule logged at its start covers (a dry run plans each of them)."""

_BATCH_EVENTS = frozenset((Event.BATCH_START, *TRAIN_STEP_EVENTS, Event.BATCH_END))


class Switches:
    """When algorithms switch on and off, for ``plan`` records: an algorithm is on from the first step it acts
    at until it has not acted for more than ``GAP`` steps, so one that acts every other batch
    (SelectiveBackprop) is on throughout, not switched at every step. An off switch is known ``GAP`` steps late
    and carries the step it happened at."""

    GAP = 8

    def __init__(self) -> None:
        self.on: set[str] = set()
        self.absent: dict[str, int] = {}  # an algorithm that is on, by the step it stopped acting at
        self.pending: list[tuple[int, str, list[str]]] = []

    def seen(self, acting: set[str], step: int) -> None:
        """Takes note of the algorithms acting from ``step`` on (called whenever they may have changed)."""
        for name in self.on - acting:
            self.absent.setdefault(name, step)
        for name in acting & self.absent.keys():
            del self.absent[name]
        if acting - self.on:
            self.pending.append((step, "on", sorted(acting - self.on)))
            self.on |= acting

    def due(self, step: int) -> list[tuple[int, str, list[str]]]:
        """Returns the switches known by ``step``, as ``(step, 'on' | 'off', names)``."""
        gone: dict[int, list[str]] = {}
        for name, since in list(self.absent.items()):
            if step - since >= self.GAP:
                del self.absent[name]
                self.on.discard(name)
                gone.setdefault(since, []).append(name)
        self.pending.extend((since, "off", sorted(names)) for since, names in sorted(gone.items()))
        due, self.pending = self.pending, []
        return due


class Reporter:
    """Hands records to ``loggers``: training records wait and reach them together, once a second at most, and
    before any other record (a logger that takes many records in a row runs warm, at a fraction of their cost one
    by one). Also counts the samples trained since the last training record (the throughput), draws the progress
    bar when ``progress_bar``, and follows which algorithms act at each step (``plan`` records, ``Switches``).

    ``checks_at`` gives, by algorithm name, the events at which its host hook only checks the run: it does not
    act there (``Algorithm.checks_at``).
    """

    def __init__(
        self, loggers: Sequence[Logger], progress_bar: bool, checks_at: Mapping[str, frozenset[Event]]
    ) -> None:
        self.loggers = tuple(loggers)
        self.progress_bar = progress_bar
        self._checks_at = checks_at
        self._queued: list[dict[str, Any]] = []
        self._handed = time.perf_counter()
        self._window: tuple[float, int] = (time.perf_counter(), 0)
        self._switches = Switches()
        self._logged_order: Any = None
        self._bar: Any = None
        self.started = time.perf_counter()
        """When the current ``fit`` started (``perf_counter``); records' ``wall_time`` counts from it."""

    def log(self, record: dict[str, Any]) -> None:
        """Queues ``record`` for the loggers; hands the queue over at a record that is not a training one, or a
        second after the last hand-over."""
        self._queued.append(record)
        if record["kind"] != "train" or time.perf_counter() - self._handed >= 1.0:
            self.hand_over()

    def hand_over(self) -> None:
        """Gives every queued record to every logger, in order."""
        records, self._queued, self._handed = self._queued, [], time.perf_counter()
        for logger in self.loggers:
            for record in records:
                logger.log(record)

    def start(self, total: int, initial: int) -> None:
        """Starts a ``fit`` of ``total`` steps at step ``initial``: the clock, the throughput window, the bar."""
        self.started = time.perf_counter()
        self._window = (self.started, 0)
        self._bar = tqdm(
            total=total,
            initial=initial,
            disable=not self.progress_bar,
            unit="ba",
            dynamic_ncols=True,
            file=sys.stderr,
            leave=True,
        )

    def stepped(self, samples: int) -> None:
        """Counts one step of ``samples`` samples (the throughput, the bar)."""
        if self.progress_bar:
            self._bar.update(1)
        window_start, seen = self._window
        self._window = (window_start, seen + samples)

    def throughput(self) -> float:
        """Returns the samples a second since the last call (or ``start``), and starts a new window."""
        now = time.perf_counter()
        window_start, samples = self._window
        self._window = (now, 0)
        return samples / max(now - window_start, 1e-9)

    def show(self, loss: float, samples_per_second: float) -> None:
        """Puts the loss and the throughput beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{samples_per_second:,.0f}", refresh=False)

    def train_record(self, step: int, epoch: int, loss: float, lr_multiplier: float) -> dict[str, Any]:
        """Returns the ``train`` record at ``step``: the loss, the learning-rate multiplier, the throughput since the
        last one (``throughput``) and the wall time."""
        return {
            "kind": "train",
            "step": step,
            "epoch": epoch,
            "loss": loss,
            "lr_multiplier": lr_multiplier,
            "samples_per_second": self.throughput(),
            "wall_time": self.wall_time(),
        }

    def wall_time(self) -> float:
        """Returns the seconds since the current ``fit`` started."""
        return time.perf_counter() - self.started

    def planned(self, plan: Plan, step: int) -> None:
        """Takes note of the algorithms acting from ``step`` on, where the run plans its steps with ``plan`` (called
        when the plan may have changed)."""
        if self.loggers and plan.order != self._logged_order:
            self._logged_order = plan.order
            acting = {
                name
                for event, names in plan.order
                if event in _BATCH_EVENTS
                for name in names
                if event not in self._checks_at.get(name, frozenset())
            }
            self._switches.seen(acting, step)

    def switched(self, step: int) -> None:
        """Logs the switches known by ``step`` (called at every step)."""
        if self.loggers and (self._switches.pending or self._switches.absent):
            for at, switch, names in self._switches.due(step):
                self.log({"kind": "plan", "step": at, switch: names})

    def finish(self, step: int) -> None:
        """Ends a ``fit`` at ``step``: closes the bar, logs what switched off in the last steps, hands records over."""
        if self._bar is not None:
            self._bar.close()
        # An algorithm that stopped acting in the last steps switched off for this run.
        for at, switch, names in self._switches.due(step + Switches.GAP):
            self.log({"kind": "plan", "step": at, switch: names})


def hparams_record(run: Run, static: Static) -> dict[str, Any]:
    """Returns the ``hparams`` record of ``run`` with the static part ``static``: its settings as plain values."""
    return {
        "kind": "hparams",
        "max_duration": str(run.max_duration),
        "scale_schedule_ratio": run.scale_schedule_ratio,
        "algorithms": [a.to_config() for a in run.algorithms],
        "precision": static.precision,
        "seed": static.seed,
        "compile": run.options.execution.compile,
    }


def schedule_table(run: Run) -> str:
    """Returns the plan of ``run``'s start as ``composer-fn plan`` prints it: after ``SCHEDULE_STEPS``, ``plan``
    records say as the run goes where algorithms switch on and off."""
    steps = min(run.max_steps, SCHEDULE_STEPS)
    table = dry_run(run.algorithms, Time(steps, TimeUnit.BATCH), run.steps_per_epoch, passes=run.passes).format()
    if steps < run.max_steps:
        table += f"\n(the first {steps} of {run.max_steps} steps)"
    return table
