"""The engine: a plan of which algorithms run at which event, and a fold of their hooks over the state.

``make_plan`` asks every algorithm's ``match`` (host, Python values), orders the matches with the passes and
resolves the hooks once. The plan is hashable by what decides the traced step (the ordered names per traced
event and each algorithm's ``plan_key``), so the trainer keys its compiled steps by ``plan.step_key``.
``run_event`` is literally ``functools.reduce`` of the planned hooks over ``(state, ctx)``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_fn.core.algorithm import Algorithm, Hook, HostHook
from composer_fn.core.event import Event
from composer_fn.core.passes import DEFAULT_CHECKS, DEFAULT_PASSES, Check, Pass
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp

__all__ = [
    "Plan",
    "Trace",
    "make_plan",
    "check_surgery_conflicts",
    "frozen_parameters",
    "run_event",
    "run_host_event",
]


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
def _hooked_events(algorithm: Algorithm, key: Hashable) -> tuple[Event, ...]:
    hooked = frozenset(algorithm.traced_hooks(key)) | frozenset(algorithm.host_hooks())
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
    """Raises ``ValueError`` when two algorithms claim the same submodule of ``module`` for surgery.

    Two surgeries may share submodules when one names the other in ``Capabilities.rewrites_after``: they
    compose, in that order.
    """
    claimed: dict[str, list[str]] = {}
    after = {a.name: a.capabilities().rewrites_after for a in algorithms}
    for algorithm in algorithms:
        rewrites = algorithm.capabilities().rewrites
        for target in sorted(rewrites(module) if rewrites is not None else ()):
            owners = [
                owner
                for claim, names in claimed.items()
                if claim == target or _nested(claim, target) or _nested(target, claim)
                for owner in names
            ]
            for owner in owners:
                if owner != algorithm.name and owner not in after[algorithm.name] and algorithm.name not in after[owner]:
                    raise ValueError(
                        f"algorithms {owner!r} and {algorithm.name!r} both rewrite submodule {target!r}; keep one "
                        f"of them, or restrict one to other modules (target_modules=(...) of module-name patterns)"
                    )
            claimed.setdefault(target, []).append(algorithm.name)


def frozen_parameters(algorithms: Sequence[Algorithm], timestamp: Timestamp, module: Any) -> frozenset[str]:
    """Returns the parameters of ``module`` that the algorithms freeze for the step starting at ``timestamp``."""
    freezing = (a.capabilities().freezes for a in algorithms)
    return frozenset().union(*(freezes(module, timestamp) for freezes in freezing if freezes is not None))


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
    keys, matched = [], []
    for algorithm in algorithms:
        key = algorithm.plan_key(now, meta)
        keys.append((algorithm.name, key))
        matched.append(tuple(e for e in _hooked_events(algorithm, key) if algorithm.match(e, now)))
    return _build_plan(algorithms, tuple(passes), tuple(checks), tuple(matched), tuple(keys))


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
    traced_hooks = {a.name: a.traced_hooks(key) for a, (_, key) in zip(algorithms, keys, strict=True)}
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
