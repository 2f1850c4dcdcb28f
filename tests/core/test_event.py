"""Specification of training-loop events: Composer's names, host or traced, before/after pairs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core.event import HOST_EVENTS, TRACED_EVENTS, TRAIN_STEP_EVENTS, Event

# composer/core/event.py, in declaration order.
COMPOSER_EVENTS = (
    "INIT",
    "BEFORE_LOAD",
    "AFTER_LOAD",
    "FIT_START",
    "ITERATION_START",
    "EPOCH_START",
    "BEFORE_DATALOADER",
    "AFTER_DATALOADER",
    "BATCH_START",
    "BEFORE_TRAIN_BATCH",
    "BEFORE_FORWARD",
    "AFTER_FORWARD",
    "BEFORE_LOSS",
    "AFTER_LOSS",
    "BEFORE_BACKWARD",
    "AFTER_BACKWARD",
    "AFTER_TRAIN_BATCH",
    "BATCH_END",
    "BATCH_CHECKPOINT",
    "EPOCH_END",
    "EPOCH_CHECKPOINT",
    "ITERATION_END",
    "ITERATION_CHECKPOINT",
    "FIT_END",
    "EVAL_BEFORE_ALL",
    "EVAL_START",
    "EVAL_BATCH_START",
    "EVAL_BEFORE_FORWARD",
    "EVAL_AFTER_FORWARD",
    "EVAL_BATCH_END",
    "EVAL_END",
    "EVAL_AFTER_ALL",
    "EVAL_STANDALONE_START",
    "EVAL_STANDALONE_END",
    "PREDICT_START",
    "PREDICT_BATCH_START",
    "PREDICT_BEFORE_FORWARD",
    "PREDICT_AFTER_FORWARD",
    "PREDICT_BATCH_END",
    "PREDICT_END",
)

# Composer's _BEFORE_EVENTS and _AFTER_EVENTS, partner by partner.
COMPOSER_PAIRS = (
    ("BEFORE_LOAD", "AFTER_LOAD"),
    ("FIT_START", "FIT_END"),
    ("ITERATION_START", "ITERATION_END"),
    ("EPOCH_START", "EPOCH_END"),
    ("BEFORE_DATALOADER", "AFTER_DATALOADER"),
    ("BATCH_START", "BATCH_END"),
    ("BEFORE_TRAIN_BATCH", "AFTER_TRAIN_BATCH"),
    ("BEFORE_FORWARD", "AFTER_FORWARD"),
    ("BEFORE_LOSS", "AFTER_LOSS"),
    ("BEFORE_BACKWARD", "AFTER_BACKWARD"),
    ("EVAL_BEFORE_ALL", "EVAL_AFTER_ALL"),
    ("EVAL_START", "EVAL_END"),
    ("EVAL_BATCH_START", "EVAL_BATCH_END"),
    ("EVAL_BEFORE_FORWARD", "EVAL_AFTER_FORWARD"),
    ("PREDICT_START", "PREDICT_END"),
    ("PREDICT_BATCH_START", "PREDICT_BATCH_END"),
    ("PREDICT_BEFORE_FORWARD", "PREDICT_AFTER_FORWARD"),
    ("EVAL_STANDALONE_START", "EVAL_STANDALONE_END"),
)

# DESIGN.md §3: what runs inside the compiled step, and what the host runs between steps.
DESIGNED_TRACED = {
    "AFTER_DATALOADER",
    "BEFORE_FORWARD",
    "AFTER_FORWARD",
    "BEFORE_LOSS",
    "AFTER_LOSS",
    "BEFORE_BACKWARD",
    "AFTER_BACKWARD",
    "AFTER_TRAIN_BATCH",
    "AFTER_OPTIMIZER_STEP",
}
DESIGNED_HOST = {
    "INIT",
    "FIT_START",
    "EPOCH_START",
    "BATCH_START",
    "BATCH_END",
    "EPOCH_END",
    "BATCH_CHECKPOINT",
    "EPOCH_CHECKPOINT",
    "ITERATION_CHECKPOINT",
    "FIT_END",
    "EVAL_BEFORE_ALL",
    "EVAL_START",
    "EVAL_BATCH_START",
    "EVAL_BATCH_END",
    "EVAL_END",
    "EVAL_AFTER_ALL",
    "PREDICT_START",
    "PREDICT_BATCH_START",
    "PREDICT_BATCH_END",
    "PREDICT_END",
}

events = st.sampled_from(list(Event))


def test_events_are_composers_forty_plus_after_optimizer_step() -> None:
    assert len(COMPOSER_EVENTS) == 40
    assert len(Event) == 41
    assert {e.name for e in Event} == set(COMPOSER_EVENTS) | {"AFTER_OPTIMIZER_STEP"}


def test_composers_events_keep_their_declaration_order() -> None:
    assert [e.name for e in Event if e is not Event.AFTER_OPTIMIZER_STEP] == list(COMPOSER_EVENTS)


def test_after_optimizer_step_runs_between_the_train_batch_and_batch_end() -> None:
    names = [e.name for e in Event]
    assert names.index("AFTER_TRAIN_BATCH") < names.index("AFTER_OPTIMIZER_STEP") < names.index("BATCH_END")
    assert TRAIN_STEP_EVENTS[-1] is Event.AFTER_OPTIMIZER_STEP
    assert Event.AFTER_OPTIMIZER_STEP.traced


@given(events)
def test_an_events_value_is_its_lower_case_name(event: Event) -> None:
    assert event.value == event.name.lower()
    assert Event(event.value) is event
    assert event == event.value


@given(events)
def test_every_event_is_either_traced_or_host(event: Event) -> None:
    assert (event in TRACED_EVENTS) != (event in HOST_EVENTS)
    assert event.traced == (event in TRACED_EVENTS)


def test_traced_and_host_events_partition_all_events() -> None:
    assert TRACED_EVENTS | HOST_EVENTS == frozenset(Event)
    assert not TRACED_EVENTS & HOST_EVENTS


@pytest.mark.parametrize("name", sorted(DESIGNED_TRACED))
def test_the_designed_step_events_are_traced(name: str) -> None:
    assert Event[name].traced


@pytest.mark.parametrize("name", sorted(DESIGNED_HOST))
def test_the_designed_bookkeeping_events_run_on_the_host(name: str) -> None:
    assert not Event[name].traced


def test_the_train_step_events_are_traced_and_in_declaration_order() -> None:
    assert all(e.traced for e in TRAIN_STEP_EVENTS)
    declared = [e for e in Event if e in TRAIN_STEP_EVENTS]
    assert list(TRAIN_STEP_EVENTS) == declared


@pytest.mark.parametrize(("before", "after"), COMPOSER_PAIRS)
def test_composers_pairs_are_partners(before: str, after: str) -> None:
    opener, closer = Event[before], Event[after]
    assert opener.partner is closer and closer.partner is opener
    assert opener.is_before and not opener.is_after
    assert closer.is_after and not closer.is_before


@given(events)
def test_partners_are_symmetric(event: Event) -> None:
    partner = event.partner
    if partner is None:
        assert not event.is_before and not event.is_after
    else:
        assert partner.partner is event
        assert partner is not event
        assert event.is_before == partner.is_after
        assert event.is_after == partner.is_before
        assert event.is_before != event.is_after
        assert event.canonical_name == partner.canonical_name


def test_unpaired_events_are_init_the_checkpoints_and_after_optimizer_step() -> None:
    unpaired = {e.name for e in Event if e.partner is None}
    assert unpaired == {
        "INIT",
        "BATCH_CHECKPOINT",
        "EPOCH_CHECKPOINT",
        "ITERATION_CHECKPOINT",
        "AFTER_OPTIMIZER_STEP",
    }


@pytest.mark.parametrize(
    ("event", "canonical"),
    [
        (Event.INIT, "init"),
        (Event.BEFORE_FORWARD, "forward"),
        (Event.AFTER_FORWARD, "forward"),
        (Event.BEFORE_DATALOADER, "dataloader"),
        (Event.FIT_START, "fit"),
        (Event.BATCH_END, "batch"),
        (Event.BATCH_CHECKPOINT, "batch_checkpoint"),
        (Event.EVAL_BEFORE_FORWARD, "eval_forward"),
        (Event.EVAL_BATCH_START, "eval_batch"),
        (Event.EVAL_AFTER_ALL, "eval_all"),
        (Event.EVAL_STANDALONE_END, "eval_standalone"),
        (Event.PREDICT_AFTER_FORWARD, "predict_forward"),
        (Event.AFTER_OPTIMIZER_STEP, "optimizer_step"),
    ],
)
def test_canonical_name_strips_the_before_after_start_end_markers(event: Event, canonical: str) -> None:
    assert event.canonical_name == canonical


@given(events)
def test_eval_and_predict_events_are_named_by_their_prefix(event: Event) -> None:
    assert event.is_eval == event.name.startswith("EVAL_")
    assert event.is_predict == event.name.startswith("PREDICT_")
    assert not (event.is_eval and event.is_predict)
