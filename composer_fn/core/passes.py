"""Passes: pure functions that order the algorithms matched at an event, and checks that diagnose them.

A pass is ``(algorithms, event) -> algorithms``. The default passes reproduce Composer's order: algorithms
placed ``"first"`` (selective backprop) go first, those placed ``"last"`` (low-precision LayerNorm) go last,
and on ``AFTER_*`` events the order is otherwise reversed (FILO), so an algorithm that changed something at a
``BEFORE_*`` event undoes it after the ones that ran inside it. Placement wins over FILO.

A check is ``(algorithms, event) -> messages``; the engine stores what checks say in the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from composer_fn.core.algorithm import Algorithm
from composer_fn.core.event import Event

__all__ = [
    "Pass",
    "Check",
    "sort_to_front",
    "sort_to_back",
    "sort_placement_first",
    "sort_placement_last",
    "set_filo_order",
    "sort_rewrites_after",
    "check_multiple_loss_interpolation",
    "DEFAULT_PASSES",
    "DEFAULT_CHECKS",
]

Pass = Callable[[Sequence[Algorithm], Event], Sequence[Algorithm]]
Check = Callable[[Sequence[Algorithm], Event], tuple[str, ...]]


def sort_to_front(algorithms: Sequence[Algorithm], predicate: Callable[[Algorithm], bool]) -> list[Algorithm]:
    """Returns the algorithms with those satisfying ``predicate`` first, each group in its original order."""
    return [a for a in algorithms if predicate(a)] + [a for a in algorithms if not predicate(a)]


def sort_to_back(algorithms: Sequence[Algorithm], predicate: Callable[[Algorithm], bool]) -> list[Algorithm]:
    """Returns the algorithms with those satisfying ``predicate`` last, each group in its original order."""
    return [a for a in algorithms if not predicate(a)] + [a for a in algorithms if predicate(a)]


def sort_placement_first(algorithms: Sequence[Algorithm], event: Event) -> Sequence[Algorithm]:
    """Returns the algorithms with those placed ``"first"`` moved to the front."""
    return sort_to_front(algorithms, lambda a: a.placement == "first")


def sort_placement_last(algorithms: Sequence[Algorithm], event: Event) -> Sequence[Algorithm]:
    """Returns the algorithms with those placed ``"last"`` moved to the back."""
    return sort_to_back(algorithms, lambda a: a.placement == "last")


def set_filo_order(algorithms: Sequence[Algorithm], event: Event) -> Sequence[Algorithm]:
    """Returns the algorithms reversed on ``AFTER_*`` events (stack order), unchanged otherwise."""
    return tuple(reversed(algorithms)) if event.name.startswith("AFTER_") else algorithms


def sort_rewrites_after(algorithms: Sequence[Algorithm], event: Event) -> Sequence[Algorithm]:
    """Returns the algorithms with each surgery moved after those it names in ``Capabilities.rewrites_after``.

    Only at INIT, where surgeries run: composing surgeries then build one model whatever order they were given in.
    """
    if event is not Event.INIT:
        return algorithms
    ordered = list(algorithms)
    for _ in range(len(ordered) ** 2):
        position = {a.name: i for i, a in enumerate(ordered)}
        late = next(
            (
                (i, max(position[n] for n in a.capabilities().rewrites_after if n in position))
                for i, a in enumerate(ordered)
                if any(position.get(n, -1) > i for n in a.capabilities().rewrites_after)
            ),
            None,
        )
        if late is None:
            break
        index, target = late
        ordered.insert(target, ordered.pop(index))
    return ordered


def check_multiple_loss_interpolation(algorithms: Sequence[Algorithm], event: Event) -> tuple[str, ...]:
    """Returns a diagnostic when more than one algorithm interpolates the loss at ``event``."""
    interpolating = [a.name for a in algorithms if a.capabilities().interpolates_loss]
    if len(interpolating) > 1:
        return (
            f"{event.name}: {', '.join(interpolating)} each interpolate the loss; the second interpolates "
            "an already interpolated loss, which is rarely intended",
        )
    return ()


# FILO runs before the placements, so "first" means first on AFTER_* events too. Composer sorts selective
# backprop first and then reverses AFTER_* events, which puts it last at AFTER_DATALOADER, its own event.
DEFAULT_PASSES: tuple[Pass, ...] = (set_filo_order, sort_placement_first, sort_placement_last, sort_rewrites_after)
DEFAULT_CHECKS: tuple[Check, ...] = (check_multiple_loss_interpolation,)
