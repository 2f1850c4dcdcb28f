"""Specification of the default passes: placement first/last, FILO on AFTER_* events, loss-interpolation check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core.algorithm import Algorithm, Capabilities
from composer_fn.core.event import Event
from composer_fn.core.passes import (
    DEFAULT_CHECKS,
    DEFAULT_PASSES,
    check_multiple_loss_interpolation,
    set_filo_order,
    sort_placement_first,
    sort_placement_last,
    sort_rewrites_after,
    sort_to_back,
    sort_to_front,
)


@dataclass(frozen=True)
class _Placed(Algorithm):
    """A test-only algorithm with no hooks; subclasses below differ by name and placement."""

    interpolate_loss: bool = False

    def capabilities(self) -> Capabilities:
        return Capabilities(interpolates_loss=self.interpolate_loss)


def _placed(label: str, placement: Literal["any", "first", "last"] = "any") -> type[_Placed]:
    namespace = {"algorithm_name": f"passes_spec_{label}", "placement": placement}
    return dataclass(frozen=True)(type(f"PassesSpec{label.title()}", (_Placed,), namespace))


ANY = [_placed(label)() for label in ("a", "b", "c", "d", "e")]
FIRST = [_placed(label, "first")() for label in ("first_1", "first_2")]
LAST = [_placed(label, "last")() for label in ("last_1", "last_2")]

algorithm_lists = st.lists(st.sampled_from(ANY + FIRST + LAST), unique=True, max_size=9)
events = st.sampled_from(list(Event))
AFTER_EVENTS = [e for e in Event if e.name.startswith("AFTER_")]


def names(algorithms: Sequence[Algorithm]) -> list[str]:
    return [a.name for a in algorithms]


def apply_default_passes(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    for apply_pass in DEFAULT_PASSES:
        algorithms = apply_pass(algorithms, event)
    return list(algorithms)


@given(algorithm_lists, st.sets(st.sampled_from(ANY + FIRST + LAST)))
def test_sort_to_front_is_a_stable_partition(algorithms: list[Algorithm], chosen: set[Algorithm]) -> None:
    result = sort_to_front(algorithms, lambda a: a in chosen)
    front = [a for a in algorithms if a in chosen]
    assert result == front + [a for a in algorithms if a not in chosen]


@given(algorithm_lists, st.sets(st.sampled_from(ANY + FIRST + LAST)))
def test_sort_to_back_is_a_stable_partition(algorithms: list[Algorithm], chosen: set[Algorithm]) -> None:
    result = sort_to_back(algorithms, lambda a: a in chosen)
    assert result == [a for a in algorithms if a not in chosen] + [a for a in algorithms if a in chosen]


@given(algorithm_lists, events)
def test_algorithms_placed_first_move_to_the_front_in_their_order(
    algorithms: list[Algorithm], event: Event
) -> None:
    result = list(sort_placement_first(algorithms, event))
    count = sum(a.placement == "first" for a in algorithms)
    assert all(a.placement == "first" for a in result[:count])
    assert [a for a in result if a.placement != "first"] == [a for a in algorithms if a.placement != "first"]
    assert sorted(names(result)) == sorted(names(algorithms))


@given(algorithm_lists, events)
def test_algorithms_placed_last_move_to_the_back_in_their_order(
    algorithms: list[Algorithm], event: Event
) -> None:
    result = list(sort_placement_last(algorithms, event))
    count = sum(a.placement == "last" for a in algorithms)
    assert all(a.placement == "last" for a in result[len(result) - count :])
    assert [a for a in result if a.placement != "last"] == [a for a in algorithms if a.placement != "last"]
    assert sorted(names(result)) == sorted(names(algorithms))


@given(algorithm_lists, events)
def test_filo_reverses_exactly_the_after_events(algorithms: list[Algorithm], event: Event) -> None:
    result = list(set_filo_order(algorithms, event))
    if event in AFTER_EVENTS:
        assert result == algorithms[::-1]
    else:
        assert result == algorithms


def test_filo_covers_composers_after_events_and_ours_but_not_eval_or_predict() -> None:
    assert {e.name for e in AFTER_EVENTS} == {
        "AFTER_LOAD",
        "AFTER_DATALOADER",
        "AFTER_FORWARD",
        "AFTER_LOSS",
        "AFTER_BACKWARD",
        "AFTER_TRAIN_BATCH",
        "AFTER_OPTIMIZER_STEP",
    }
    assert list(set_filo_order(ANY[:3], Event.EVAL_AFTER_FORWARD)) == ANY[:3]


@given(algorithm_lists, st.sampled_from([e for e in Event if e.is_before]))
def test_default_passes_run_after_events_in_the_reverse_of_their_before_partner(
    algorithms: list[Algorithm], before: Event
) -> None:
    after = before.partner
    assert after is not None
    opening = apply_default_passes(algorithms, before)
    closing = apply_default_passes(algorithms, after)
    if after not in AFTER_EVENTS:
        assert closing == opening
        return
    # Stack order for the unplaced ones; placement ("first", "last") holds on every event.
    unplaced = [a for a in opening if a.placement == "any"]
    assert [a for a in closing if a.placement == "any"] == unplaced[::-1]
    for placement in ("first", "last"):
        placed = [a for a in closing if a.placement == placement]
        assert sorted(a.name for a in placed) == sorted(a.name for a in opening if a.placement == placement)
        if placed:
            where = closing[: len(placed)] if placement == "first" else closing[len(closing) - len(placed) :]
            assert where == placed


@given(algorithm_lists, st.sampled_from([e for e in Event if e not in AFTER_EVENTS]))
def test_default_passes_put_first_placed_first_and_last_placed_last(
    algorithms: list[Algorithm], event: Event
) -> None:
    ordered = apply_default_passes(algorithms, event)
    placements = [a.placement for a in ordered]
    rank = {"first": 0, "any": 1, "last": 2}
    assert placements == sorted(placements, key=rank.__getitem__)
    for placement in rank:
        assert [a for a in ordered if a.placement == placement] == [
            a for a in algorithms if a.placement == placement
        ]


def test_the_default_passes_are_composers_with_placement_applied_after_filo() -> None:
    assert DEFAULT_PASSES == (set_filo_order, sort_placement_first, sort_placement_last, sort_rewrites_after)
    assert DEFAULT_CHECKS == (check_multiple_loss_interpolation,)


@given(algorithm_lists, events, st.data())
def test_loss_interpolation_check_speaks_only_when_two_or_more_interpolate(
    algorithms: list[Algorithm], event: Event, data: st.DataObject
) -> None:
    flags = data.draw(st.lists(st.booleans(), min_size=len(algorithms), max_size=len(algorithms)))
    algorithms = [type(a)(interpolate_loss=flag) for a, flag in zip(algorithms, flags, strict=True)]
    interpolating = [a.name for a in algorithms if a.capabilities().interpolates_loss]
    messages = check_multiple_loss_interpolation(algorithms, event)
    if len(interpolating) < 2:
        assert messages == ()
    else:
        assert len(messages) == 1
        assert event.name in messages[0]
        assert all(name in messages[0] for name in interpolating)


@pytest.mark.parametrize("event", [Event.BEFORE_FORWARD, Event.AFTER_LOSS])
def test_passes_keep_every_algorithm(event: Event) -> None:
    algorithms = ANY + FIRST + LAST
    assert sorted(names(apply_default_passes(algorithms, event))) == sorted(names(algorithms))
