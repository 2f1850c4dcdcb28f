"""The engine: a plan of which algorithms run at which event, and a fold of their hooks over the state.

``make_plan`` asks every algorithm's ``match`` (host, Python values), orders the matches with the passes and
resolves the hooks once. The plan is hashable by what decides the traced step (the ordered names per traced
event and each algorithm's ``plan_key``), so the trainer keys its compiled steps by ``plan.step_key``.
``run_event`` is literally ``functools.reduce`` of the planned hooks over ``(state, ctx)``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_fn.core.algorithm import Algorithm, Hook, HostHook
from composer_fn.core.event import TRAIN_STEP_EVENTS, Event
from composer_fn.core.passes import DEFAULT_CHECKS, DEFAULT_PASSES, Check, Pass
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit, to_steps

__all__ = [
    "Plan",
    "Trace",
    "make_plan",
    "check_surgery_conflicts",
    "frozen_parameters",
    "run_event",
    "run_host_event",
    "dry_run",
    "DryRun",
    "DryRunRow",
    "BATCH_HOST_EVENTS_BEFORE",
    "BATCH_HOST_EVENTS_AFTER",
]

BATCH_HOST_EVENTS_BEFORE: tuple[Event, ...] = (Event.BEFORE_DATALOADER, Event.BATCH_START)
"""Host events of one batch that run before the traced step, matched at the timestamp before the batch."""

BATCH_HOST_EVENTS_AFTER: tuple[Event, ...] = (Event.BATCH_END, Event.BATCH_CHECKPOINT)
"""Host events of one batch that run after the step, matched at the timestamp after the batch."""

_EPOCH_START_EVENTS: tuple[Event, ...] = (Event.EPOCH_START,)


@dataclass(frozen=True)
class Trace:
    """One planned hook call: who runs, at which event, in which position, and where (host or traced)."""

    name: str
    event: Event
    order: int
    traced: bool


@dataclass(frozen=True, eq=False)
class Plan:
    """The ordered algorithm names per event, with their hooks resolved; hashable by what it decides."""

    order: tuple[tuple[Event, tuple[str, ...]], ...]
    keys: tuple[tuple[str, Hashable], ...]
    diagnostics: tuple[str, ...] = ()
    hooks: Mapping[Event, tuple[Hook, ...]] = field(default_factory=dict, repr=False)
    host: Mapping[Event, tuple[HostHook, ...]] = field(default_factory=dict, repr=False)

    def __hash__(self) -> int:
        return hash((self.order, self.keys))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and (self.order, self.keys) == (other.order, other.keys)

    @property
    def step_key(self) -> Hashable:
        """Returns what decides the traced step: the traced events' order and the plan keys."""
        return (tuple((e, names) for e, names in self.order if e.traced), self.keys)

    def names(self, event: Event) -> tuple[str, ...]:
        """Returns the names of the algorithms that run at ``event``, in order."""
        for planned, names in self.order:
            if planned is event:
                return names
        return ()

    def traces(self) -> tuple[Trace, ...]:
        """Returns every planned hook call as data."""
        return tuple(
            Trace(name, event, position, event.traced)
            for event, names in self.order
            for position, name in enumerate(names)
        )


@functools.lru_cache(maxsize=4096)
def _hooked_events(algorithm: Algorithm) -> tuple[Event, ...]:
    hooked = algorithm.events()
    return tuple(e for e in Event if e in hooked)


@functools.lru_cache(maxsize=64)
def _check_names(algorithms: tuple[Algorithm, ...]) -> None:
    seen: dict[str, Algorithm] = {}
    for algorithm in algorithms:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"algorithms holds {algorithm!r}: expected Algorithm records")
        if algorithm.name in seen:
            raise ValueError(
                f"two algorithms share the name {algorithm.name!r} ({seen[algorithm.name]!r} and {algorithm!r}); "
                "State.algos is keyed by name, so each algorithm may appear once"
            )
        seen[algorithm.name] = algorithm


def check_surgery_conflicts(algorithms: Sequence[Algorithm], module: Any) -> None:
    """Raises ``ValueError`` when two algorithms claim the same submodule of ``module`` for surgery."""
    claimed: dict[str, str] = {}
    for algorithm in algorithms:
        for target in sorted(algorithm.surgery_targets(module)):
            owner = claimed.get(target)
            if owner is None:
                owner = next((claimed[t] for t in claimed if _nested(t, target) or _nested(target, t)), None)
            if owner is not None and owner != algorithm.name:
                raise ValueError(
                    f"algorithms {owner!r} and {algorithm.name!r} both rewrite submodule {target!r}; "
                    "keep one of them, or restrict one to other modules"
                )
            claimed[target] = algorithm.name


def frozen_parameters(algorithms: Sequence[Algorithm], timestamp: Timestamp, module: Any) -> frozenset[str]:
    """Returns the parameters of ``module`` that the algorithms freeze for the step starting at ``timestamp``."""
    frozen: frozenset[str] = frozenset()
    for algorithm in algorithms:
        frozen |= algorithm.frozen_parameters(module, timestamp)
    return frozen


def _nested(outer: str, inner: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")


def make_plan(
    algorithms: Sequence[Algorithm],
    passes: Sequence[Pass] = DEFAULT_PASSES,
    timestamp: Timestamp | None = None,
    checks: Sequence[Check] = DEFAULT_CHECKS,
    meta: BatchMeta | None = None,
) -> Plan:
    """Returns the plan for ``timestamp``: for each event, the matching algorithms ordered by the passes.

    ``meta`` describes the coming batch, for algorithms whose plan key depends on its shape. Plans are
    memoized by the match results and plan keys, so calling this every step costs little.
    """
    algorithms = tuple(algorithms)
    _check_names(algorithms)
    now = timestamp if timestamp is not None else Timestamp()
    matched = tuple(tuple(e for e in _hooked_events(a) if a.match(e, now)) for a in algorithms)
    keys = tuple((a.name, a.plan_key(now, meta)) for a in algorithms)
    return _build_plan(algorithms, tuple(passes), tuple(checks), matched, keys)


@functools.lru_cache(maxsize=1024)
def _build_plan(
    algorithms: tuple[Algorithm, ...],
    passes: tuple[Pass, ...],
    checks: tuple[Check, ...],
    matched: tuple[tuple[Event, ...], ...],
    keys: tuple[tuple[str, Hashable], ...],
) -> Plan:
    order: list[tuple[Event, tuple[str, ...]]] = []
    diagnostics: list[str] = []
    hooks: dict[Event, tuple[Hook, ...]] = {}
    host: dict[Event, tuple[HostHook, ...]] = {}
    traced_hooks = {a.name: _traced_hooks_at(a, key) for a, (_, key) in zip(algorithms, keys, strict=True)}
    for event in Event:
        selected: Sequence[Algorithm] = [a for a, events in zip(algorithms, matched, strict=True) if event in events]
        if not selected:
            continue
        for apply_pass in passes:
            selected = apply_pass(selected, event)
        for check in checks:
            diagnostics.extend(check(selected, event))
        order.append((event, tuple(a.name for a in selected)))
        if event.traced:
            hooks[event] = tuple(_hook(a, event, traced_hooks[a.name], "traced_hooks") for a in selected)
        else:
            host[event] = tuple(_hook(a, event, a.host_hooks(), "host_hooks") for a in selected)
    return Plan(tuple(order), keys, tuple(dict.fromkeys(diagnostics)), hooks, host)


def _traced_hooks_at(algorithm: Algorithm, key: Hashable) -> Mapping[Event, Hook]:
    hooks = algorithm.traced_hooks_at(key)
    if frozenset(hooks) != frozenset(algorithm.traced_hooks()):
        raise ValueError(
            f"algorithm {algorithm.name!r}: traced_hooks_at({key!r}) hooks {sorted(e.name for e in hooks)} but "
            f"traced_hooks() hooks {sorted(e.name for e in algorithm.traced_hooks())}; a plan key may change how "
            "a hook works, not which events it hooks"
        )
    return hooks


def _hook(algorithm: Algorithm, event: Event, hooks: Mapping[Event, Any], where: str) -> Any:
    if event not in hooks:
        kind = "a traced" if event.traced else "a host"
        raise ValueError(
            f"algorithm {algorithm.name!r} hooks {event.name}, which is {kind} event, but not in {where}(); "
            f"traced events take (State, StepCtx) hooks in traced_hooks(), host events take host hooks in "
            "host_hooks()"
        )
    return hooks[event]


def _fold(pair: tuple[State, StepCtx], hook: Hook) -> tuple[State, StepCtx]:
    return hook(*pair)


def run_event(event: Event, plan: Plan, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
    """Returns ``(state, ctx)`` after folding the planned traced hooks of ``event`` over them."""
    return functools.reduce(_fold, plan.hooks.get(event, ()), (state, ctx))


def run_host_event(
    event: Event,
    plan: Plan,
    static: Static,
    state: State,
    timestamp: Timestamp,
    meta: BatchMeta | None = None,
) -> tuple[Static, State]:
    """Returns ``(static, state)`` after folding the planned host hooks of ``event`` over them."""
    for hook in plan.host.get(event, ()):
        static, state = hook(static, state, timestamp, meta)
    return static, state


@dataclass(frozen=True)
class DryRunRow:
    """Which algorithms run at an event over a span of the schedule (``when`` names the span)."""

    when: str
    event: Event
    algorithms: tuple[str, ...]


@dataclass(frozen=True)
class DryRun:
    """The whole schedule of a run as rows, and how many distinct traced steps it compiles."""

    rows: tuple[DryRunRow, ...]
    compiled_steps: int
    total_steps: int
    diagnostics: tuple[str, ...]

    def format(self) -> str:
        """Returns the schedule as an aligned text table."""
        header = ("when", "event", "algorithms (in order)")
        table = [header] + [(r.when, r.event.name, ", ".join(r.algorithms)) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(2)]
        lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip() for row in table]
        lines.insert(1, "-" * max(len(line) for line in lines))
        lines.append(f"{self.total_steps} steps; {self.compiled_steps} distinct traced step(s) to compile")
        lines.extend(f"warning: {d}" for d in self.diagnostics)
        return "\n".join(lines)


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
    start = make_plan(algorithms, passes, origin)
    rows = [DryRunRow("start", e, start.names(e)) for e in (Event.INIT, Event.FIT_START) if start.names(e)]
    per_batch: list[tuple[int, Hashable]] = []
    per_epoch: list[tuple[int, Hashable]] = []
    diagnostics = list(start.diagnostics)
    step_keys = set()
    timestamp = origin
    epoch_start_names: tuple[tuple[Event, tuple[str, ...]], ...] = ()
    names: tuple[tuple[Event, tuple[str, ...]], ...]
    for step in range(total):
        if timestamp.batch_in_epoch == 0:
            plan = make_plan(algorithms, passes, timestamp)
            epoch_start_names = tuple((e, plan.names(e)) for e in _EPOCH_START_EVENTS)
        before = make_plan(algorithms, passes, timestamp, meta=meta)
        timestamp = timestamp.advance(batch_size)
        after = make_plan(algorithms, passes, timestamp)
        diagnostics.extend(before.diagnostics)
        step_keys.add(before.step_key)
        names = tuple(
            [(e, before.names(e)) for e in BATCH_HOST_EVENTS_BEFORE + TRAIN_STEP_EVENTS]
            + [(e, after.names(e)) for e in BATCH_HOST_EVENTS_AFTER]
        )
        per_batch.append((step, names))
        epoch_done = timestamp.batch_in_epoch == steps_per_epoch
        if epoch_done or step == total - 1:
            # As in the trainer: EPOCH_END is matched at the epoch's last timestamp, EPOCH_CHECKPOINT at the
            # start of the next epoch, and a run that stops mid-epoch ends no epoch.
            epoch_end_names: tuple[tuple[Event, tuple[str, ...]], ...] = ()
            if epoch_done:
                following = timestamp.next_epoch()
                epoch_end_names = (
                    (Event.EPOCH_END, make_plan(algorithms, passes, timestamp).names(Event.EPOCH_END)),
                    (Event.EPOCH_CHECKPOINT, make_plan(algorithms, passes, following).names(Event.EPOCH_CHECKPOINT)),
                )
            per_epoch.append((timestamp.epoch, epoch_start_names + epoch_end_names))
            if epoch_done:
                timestamp = timestamp.next_epoch()
    for unit, labels in (("ep", per_epoch), ("ba", per_batch)):
        for first, last, span_names in _spans(labels):
            when = f"{unit} {first}" if first == last else f"{unit} {first}-{last}"
            rows.extend(DryRunRow(when, e, n) for e, n in span_names if n)  # type: ignore[attr-defined]
    end = make_plan(algorithms, passes, timestamp)
    rows.extend(DryRunRow("end", e, end.names(e)) for e in (Event.FIT_END,) if end.names(e))
    return DryRun(tuple(rows), max(len(step_keys), 1), total, tuple(dict.fromkeys(diagnostics)))
