"""The dry run: which algorithm runs at which event and step of a whole run, without training.

It walks the trainer's own schedule (``composer_fn.core.schedule.run_schedule``), plans each tick as the
trainer does, and groups identical batches and epochs into spans.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import make_plan
from composer_fn.core.event import TRAIN_STEP_EVENTS, Event
from composer_fn.core.passes import DEFAULT_PASSES, Pass
from composer_fn.core.schedule import Action, run_schedule
from composer_fn.core.state import BatchMeta
from composer_fn.core.time import Time, Timestamp, TimeUnit, to_steps

__all__ = ["dry_run", "DryRun", "DryRunRow"]


@dataclass(frozen=True)
class DryRunRow:
    """Which algorithms run at an event over a span of the schedule (``when`` names the span)."""

    when: str
    event: Event
    algorithms: tuple[str, ...]
    span: tuple[str, int, int] | None = None
    """``(unit, first, last)`` of a span of epochs (``'ep'``) or batches (``'ba'``); None at the start and end."""


@dataclass(frozen=True)
class DryRun:
    """The whole schedule of a run as rows, and how many distinct traced steps it compiles."""

    rows: tuple[DryRunRow, ...]
    compiled_steps: int
    total_steps: int
    diagnostics: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """Why the table has no row for an algorithm (or none at all): what the algorithm does instead."""

    def format(self) -> str:
        """Returns the schedule as an aligned text table, nearby spans of the same event and algorithms folded into
        one row (``ba 35-62, 15 of 28``: the algorithms run at 15 of the 28 batches from 35 to 62)."""
        header = ("when", "event", "algorithms (in order)")
        table = [header] + [(when, r.event.name, ", ".join(r.algorithms)) for when, r in _folded(self.rows)]
        widths = [max(len(row[i]) for row in table) for i in range(2)]
        lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip() for row in table]
        lines.insert(1, "-" * max(len(line) for line in lines))
        lines.append(f"{self.total_steps} steps; {self.compiled_steps} distinct traced step(s) to compile")
        lines.extend(f"warning: {d}" for d in self.diagnostics)
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


_GAP = 8
"""Spans of one event and algorithms at most this many epochs or batches apart are shown as one row."""


def _folded(rows: Sequence[DryRunRow]) -> Iterator[tuple[str, DryRunRow]]:
    """Yields ``(when, row)`` with the spans of each (event, algorithms) that lie close together folded into one
    row, in the order of their first span: ``ba 35-62, 15 of 28`` runs at 15 of the 28 batches from 35 to 62."""
    folds: list[tuple[DryRunRow, list[int]]] = []  # the first row, and [first, last, count] of its fold
    latest: dict[tuple[str, Event, tuple[str, ...]], int] = {}
    for row in rows:
        if row.span is None:
            folds.append((row, []))
            continue
        unit, first, last = row.span
        key = (unit, row.event, row.algorithms)
        index = latest.get(key)
        if index is not None and first - folds[index][1][1] - 1 <= _GAP:
            fold = folds[index][1]
            fold[1], fold[2] = last, fold[2] + last - first + 1
        else:
            latest[key] = len(folds)
            folds.append((row, [first, last, last - first + 1]))
    for row, fold in folds:
        if not fold:
            yield row.when, row
            continue
        unit, (first, last, count) = row.span[0], fold  # type: ignore[index]
        span = f"{unit} {first}" if first == last else f"{unit} {first}-{last}"
        yield (span if count == last - first + 1 else f"{span}, {count} of {last - first + 1}"), row


_EPOCH_EVENTS = frozenset({Event.EPOCH_START, Event.EPOCH_END, Event.EPOCH_CHECKPOINT})
_BEFORE_BATCH = frozenset({Event.BEFORE_DATALOADER, Event.BATCH_START, Action.STEP})
_BEFORE_BATCH = frozenset({Event.BEFORE_DATALOADER, Event.BATCH_START, Action.STEP})
_Names = tuple[tuple[Event, tuple[str, ...]], ...]


def _spans(labels: Iterable[tuple[int, Hashable]]) -> Iterator[tuple[int, int, Hashable]]:
    start = last = -1
    current: Hashable = None
    for index, label in labels:
        if start >= 0 and label == current and index == last + 1:
            last = index
            continue
        if start >= 0:
            yield start, last, current
        start = last = index
        current = label
    if start >= 0:
        yield start, last, current


def dry_run(
    algorithms: Sequence[Algorithm],
    max_duration: Time | str,
    steps_per_epoch: int,
    *,
    batch_size: int = 1,
    input_shape: tuple[int, ...] = (),
    passes: Sequence[Pass] = DEFAULT_PASSES,
) -> DryRun:
    """Returns which algorithm fires at which event and step over a whole run, without training.

    ``input_shape`` (the shape of one batch's input) lets shape-dependent plan keys, and so the count of
    distinct compiled steps, come out as in training.
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch={steps_per_epoch!r} must be a positive number of batches")
    total = to_steps(max_duration, steps_per_epoch=steps_per_epoch, max_steps=0)
    origin = Timestamp().with_max_duration(Time(total, TimeUnit.BATCH))
    meta = BatchMeta(batch_size, tuple(input_shape))
    opening = make_plan(algorithms, passes, origin)
    ends: dict[str, list[DryRunRow]] = {"start": [DryRunRow("start", Event.INIT, opening.names(Event.INIT))], "end": []}
    per_batch: dict[int, _Names] = {}
    per_epoch: dict[int, _Names] = {}
    diagnostics = list(opening.diagnostics)
    step_keys = set()
    for what, timestamp in run_schedule(total, steps_per_epoch, batch_size=batch_size):
        if what is Action.STEP:
            plan = make_plan(algorithms, passes, timestamp, meta=meta)
            step_keys.add(plan.step_key)
            diagnostics.extend(plan.diagnostics)
            names: _Names = tuple((e, plan.names(e)) for e in TRAIN_STEP_EVENTS)
        elif isinstance(what, Event):
            plan = make_plan(algorithms, passes, timestamp, meta=meta if what is Event.BATCH_START else None)
            names = ((what, plan.names(what)),)
        else:
            continue
        if what is Event.FIT_START or what is Event.FIT_END:
            when = "start" if what is Event.FIT_START else "end"
            ends[when].append(DryRunRow(when, what, plan.names(what)))
        elif what in _EPOCH_EVENTS:
            # EPOCH_CHECKPOINT comes once the timestamp has moved on to the next epoch.
            epoch = timestamp.epoch - 1 if what is Event.EPOCH_CHECKPOINT else timestamp.epoch
            per_epoch[epoch] = per_epoch.get(epoch, ()) + names
        else:
            index = timestamp.batch - (0 if what in _BEFORE_BATCH else 1)
            per_batch[index] = per_batch.get(index, ()) + names
    rows = ends["start"]
    for unit, labels in (("ep", per_epoch), ("ba", per_batch)):
        for first, last, span_names in _spans(sorted(labels.items())):
            when = f"{unit} {first}" if first == last else f"{unit} {first}-{last}"
            rows.extend(DryRunRow(when, e, n, (unit, first, last)) for e, n in span_names)  # type: ignore[attr-defined]
    rows = [r for r in rows + ends["end"] if r.algorithms]
    named = {name for row in rows for name in row.algorithms}
    notes = tuple(_unlisted(a, total) for a in algorithms if a.name not in named)
    if not algorithms:
        notes = ("no algorithm given: no event runs an algorithm's hook, so the table is empty",)
    return DryRun(tuple(rows), max(len(step_keys), 1), total, tuple(dict.fromkeys(diagnostics)), notes)


def _unlisted(algorithm: Algorithm, total: int) -> str:
    """Returns why ``algorithm`` has no row: what it does outside the events' hooks, or that it never acts."""
    capabilities = algorithm.capabilities()
    if capabilities.freezes is not None:
        does = "it freezes layers as training goes (the trainer asks it before each step), outside the events' hooks"
    elif capabilities.stops is not None:
        does = "it ends the run when its rule holds, read after each evaluation or log step, outside the events' hooks"
    elif capabilities.lr_multiplier is not None:
        does = "it reshapes the learning-rate schedule once, when training starts, outside the events' hooks"
    else:
        does = f"it runs at no event of this {total}-step run"
    return f"{algorithm.name} has no row: {does}"
