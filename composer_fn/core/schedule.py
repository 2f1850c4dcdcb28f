"""The run schedule: the one place that says in which order a training run's events and actions happen.

``run_schedule`` is a pure generator of ``(what, timestamp)`` ticks in Composer's order: ``what`` is an
``Event`` (the trainer runs its host hooks and callbacks) or an ``Action`` (the trainer's own work: the traced
step, logging, evaluation, a checkpoint). The consumer reports each batch's ``Progress`` by ``send`` at
``Action.STEP`` (a plain ``for`` loop sends nothing: each batch then counts ``batch_size`` samples). A consumer
that looks at no batch event may ask for runs of steps: the batches between two other ticks are then one tick,
``(Steps(n), timestamp)``, answered with the run's summed ``Progress``. ``Trainer.fit``, ``composer_fn.core.dry_run`` and the contract suite all drive it, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Collection, Generator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from composer_fn.core.event import Event
from composer_fn.core.time import Time, Timestamp, TimeUnit

__all__ = ["Action", "Progress", "Steps", "Tick", "run_schedule", "next_tick"]


class Action(str, Enum):
    """What the trainer does between events, when the schedule says.

    - ``STEP``: the traced step on the batch, AFTER_DATALOADER through AFTER_OPTIMIZER_STEP;
    - ``LOG``: log the training metrics, at the log interval and after the last batch;
    - ``EVALUATE``: evaluate, at the eval interval and at the end unless just done;
    - ``SAVE``: write a checkpoint, at the save interval and at the end unless just done;
    - ``STOP``: not a tick but a reply to LOG or EVALUATE: the run ends at this batch, as at ``max_steps``.
    """

    STEP = "step"
    LOG = "log"
    EVALUATE = "evaluate"
    SAVE = "save"
    STOP = "stop"


class Progress(NamedTuple):
    """What one batch (or a run of ``batches`` batches, in all) added to the run's counters."""

    samples: int
    tokens: int = 0
    seconds: float = 0.0
    batches: int = 1


@dataclass(frozen=True)
class Steps:
    """A tick of ``count`` steps in a row, with nothing between them (see ``run_schedule``'s ``runs``)."""

    count: int


Tick = tuple[Event | Action | Steps, Timestamp]


def _every(interval: Time | None, unit: TimeUnit) -> int:
    return int(interval.value) if interval is not None and interval.unit is unit else 0


def run_schedule(
    max_steps: int,
    steps_per_epoch: int,
    *,
    start: Timestamp | None = None,
    eval_interval: Time | None = None,
    save_interval: Time | None = None,
    log_interval: Time | None = None,
    final_eval: bool = False,
    final_save: bool = False,
    batch_size: int = 1,
    events: Collection[Event] | None = None,
    runs: bool = False,
) -> Generator[Tick, Progress | Action | None, Timestamp]:
    """Yields the ticks of a run of ``max_steps`` batches from ``start``; returns the final timestamp.

    Intervals are in batches or epochs (None: never). With ``final_eval``/``final_save`` the run also evaluates
    and saves at its end, unless it just did at that batch. A run that
    reaches ``max_steps`` mid-epoch ends that epoch without EPOCH_END, as Composer does; a run resumed after an
    epoch's last batch goes straight to that epoch's end.

    With ``events``, only those events are yielded (every action still is): a consumer that does nothing at the
    others skips their ticks, and sees the rest in the same order. With ``runs`` too, and no batch event among
    them, the steps up to the next tick that is not a step are one ``Steps`` tick, answered with their ``Progress``
    in all; the ticks after it are the same.
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r} must be a positive number of batches")
    timestamp = start if start is not None else Timestamp().with_max_duration(Time(max_steps, TimeUnit.BATCH))
    log_batches = _every(log_interval, TimeUnit.BATCH)
    eval_batches, eval_epochs = _every(eval_interval, TimeUnit.BATCH), _every(eval_interval, TimeUnit.EPOCH)
    save_batches, save_epochs = _every(save_interval, TimeUnit.BATCH), _every(save_interval, TimeUnit.EPOCH)
    evaluated = saved = -1
    shown = frozenset(Event) if events is None else frozenset(events)
    # The four events of every batch, looked up once.
    before_loader, batch_start, batch_end, batch_checkpoint = (
        e in shown for e in (Event.BEFORE_DATALOADER, Event.BATCH_START, Event.BATCH_END, Event.BATCH_CHECKPOINT)
    )
    runs = runs and not (before_loader or batch_start or batch_end or batch_checkpoint)
    stops = [every for every in (log_batches, eval_batches, save_batches) if every]
    if Event.FIT_START in shown:
        yield Event.FIT_START, timestamp
    while timestamp.batch < max_steps:
        if timestamp.batch_in_epoch == 0:
            if Event.EPOCH_START in shown:
                yield Event.EPOCH_START, timestamp
        while timestamp.batch_in_epoch < steps_per_epoch and timestamp.batch < max_steps:
            if runs:  # to the epoch's end, the run's, or the next batch something is done at
                count = min(
                    steps_per_epoch - timestamp.batch_in_epoch,
                    max_steps - timestamp.batch,
                    *(every - timestamp.batch % every for every in stops),
                )
                progress = yield Steps(count), timestamp
                done = progress if isinstance(progress, Progress) else Progress(batch_size * count, batches=count)
                if done.batches != count:
                    raise ValueError(f"a run of {count} steps was answered with the progress of {done.batches}")
            else:
                if before_loader:
                    yield Event.BEFORE_DATALOADER, timestamp
                if batch_start:
                    yield Event.BATCH_START, timestamp
                progress = yield Action.STEP, timestamp
                done = progress if isinstance(progress, Progress) else Progress(batch_size)
            timestamp = timestamp.advance(done.samples, done.tokens, done.seconds, done.batches)
            if (log_batches and timestamp.batch % log_batches == 0) or timestamp.batch == max_steps:
                if (yield Action.LOG, timestamp) is Action.STOP:
                    max_steps = timestamp.batch
            if batch_end:
                yield Event.BATCH_END, timestamp
            if eval_batches and timestamp.batch % eval_batches == 0:
                evaluated = timestamp.batch
                if (yield Action.EVALUATE, timestamp) is Action.STOP:
                    max_steps = timestamp.batch
            if batch_checkpoint:
                yield Event.BATCH_CHECKPOINT, timestamp
            if save_batches and timestamp.batch % save_batches == 0:
                saved = timestamp.batch
                yield Action.SAVE, timestamp
        if timestamp.batch >= max_steps and timestamp.batch_in_epoch < steps_per_epoch:
            break
        if Event.EPOCH_END in shown:
            yield Event.EPOCH_END, timestamp
        if eval_epochs and (timestamp.epoch + 1) % eval_epochs == 0:
            evaluated = timestamp.batch
            if (yield Action.EVALUATE, timestamp) is Action.STOP:
                max_steps = timestamp.batch
        timestamp = timestamp.next_epoch()
        if Event.EPOCH_CHECKPOINT in shown:
            yield Event.EPOCH_CHECKPOINT, timestamp
        if save_epochs and timestamp.epoch % save_epochs == 0:
            saved = timestamp.batch
            yield Action.SAVE, timestamp
    if Event.FIT_END in shown:
        yield Event.FIT_END, timestamp
    if final_eval and evaluated != timestamp.batch:
        yield Action.EVALUATE, timestamp
    if final_save and saved != timestamp.batch:
        yield Action.SAVE, timestamp
    return timestamp


def next_tick(ticks: Generator[Tick, Progress | Action | None, Timestamp], reply: Progress | Action | None) -> Tick | None:
    """Returns the schedule's next tick after sending it ``reply``, or None once the run is over."""
    try:
        return ticks.send(reply)
    except StopIteration:
        return None
