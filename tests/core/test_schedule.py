"""The run schedule: Composer's order of a run's events and the trainer's actions, written once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn import optim
from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.event import TRAIN_STEP_EVENTS, Event
from composer_fn.core.schedule import Action, Progress, Steps, Tick, next_tick, run_schedule
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.testing import make_setup, train_steps
from composer_fn.trainer import Trainer

BATCH = (Event.BEFORE_DATALOADER, Event.BATCH_START, Action.STEP, Event.BATCH_END, Event.BATCH_CHECKPOINT)
lengths = st.integers(min_value=1, max_value=5)


def _intervals(draw: st.DrawFn) -> dict[str, Time | None]:
    def interval() -> Time | None:
        unit = draw(st.sampled_from([None, TimeUnit.BATCH, TimeUnit.EPOCH]))
        return None if unit is None else Time(draw(st.integers(1, 4)), unit)

    return {"eval_interval": interval(), "save_interval": interval(), "log_interval": interval()}


@st.composite
def runs(draw: st.DrawFn) -> dict[str, object]:
    steps_per_epoch = draw(lengths)
    return {
        "max_steps": draw(st.integers(min_value=1, max_value=4 * steps_per_epoch + 2)),
        "steps_per_epoch": steps_per_epoch,
        "final_eval": draw(st.booleans()),
        "final_save": draw(st.booleans()),
        **_intervals(draw),
    }


def _drained(ticks: object) -> tuple[list[Tick], Timestamp]:
    seen = []
    while True:
        try:
            seen.append(next(ticks))  # type: ignore[call-overload]
        except StopIteration as end:
            return seen, end.value


@given(runs(), st.sets(st.sampled_from(list(Event))))
def test_a_schedule_told_its_events_leaves_out_only_the_others(run: dict, events: set[Event]) -> None:
    whole, end = _drained(run_schedule(**run))
    shown, shown_end = _drained(run_schedule(**run, events=events))
    assert _where(shown) == _where([(what, t) for what, t in whole if isinstance(what, Action) or what in events])
    assert shown_end == end


@given(runs(), st.sets(st.sampled_from([e for e in Event if e not in BATCH])), st.integers(1, 3))
def test_runs_of_steps_are_the_steps_between_the_same_other_ticks(run: dict, events: set[Event], size: int) -> None:
    stepwise, stepwise_end = _drained(run_schedule(**run, events=events, batch_size=size))
    ticks = run_schedule(**run, events=events, batch_size=size, runs=True)
    expanded: list[tuple[object, int, int, int]] = []
    reply: Progress | None = None
    while True:
        try:
            what, t = ticks.send(reply)
        except StopIteration as stopped:
            end = stopped.value
            break
        reply = None
        if isinstance(what, Steps):
            assert what.count >= 1
            expanded += [(Action.STEP, t.epoch, t.batch + i, t.batch_in_epoch + i) for i in range(what.count)]
            reply = Progress(size * what.count, 0, 0.0, batches=what.count)
        else:
            expanded.append((what, t.epoch, t.batch, t.batch_in_epoch))
    assert expanded == _where(stepwise)
    assert end == stepwise_end


def test_a_run_answered_with_another_count_of_steps_is_refused() -> None:
    ticks = run_schedule(6, 3, runs=True, events=())
    what, _ = next(ticks)
    assert what == Steps(3)
    with pytest.raises(ValueError, match="a run of 3 steps was answered with the progress of 1"):
        ticks.send(Progress(8))


def test_a_schedule_with_a_batch_event_shown_has_no_runs() -> None:
    ticks = [what for what, _ in run_schedule(4, 2, runs=True, events={Event.BATCH_END})]
    assert ticks.count(Action.STEP) == 4 and not any(isinstance(what, Steps) for what in ticks)


def _where(ticks: list[Tick]) -> list[tuple[object, int, int, int]]:
    return [(what, t.epoch, t.batch, t.batch_in_epoch) for what, t in ticks]


@given(runs())
def test_every_batch_runs_its_events_in_composer_order(run: dict) -> None:
    ticks = list(run_schedule(**run))
    events = [what for what, _ in ticks if what in BATCH]
    assert events == list(BATCH) * run["max_steps"]
    steps = [t for what, t in ticks if what is Action.STEP]
    assert [t.batch for t in steps] == list(range(run["max_steps"]))
    assert ticks[0][0] is Event.FIT_START and Event.FIT_END in [what for what, _ in ticks[-3:]]


@given(runs())
def test_only_whole_epochs_end_and_every_epoch_that_starts_is_counted(run: dict) -> None:
    ticks = list(run_schedule(**run))
    whole, partial = divmod(run["max_steps"], run["steps_per_epoch"])
    assert [t.epoch for what, t in ticks if what is Event.EPOCH_END] == list(range(whole))
    assert [t.epoch for what, t in ticks if what is Event.EPOCH_CHECKPOINT] == list(range(1, whole + 1))
    assert [t.epoch for what, t in ticks if what is Event.EPOCH_START] == list(range(whole + (partial > 0)))
    # An epoch ends at its last batch's timestamp and checkpoints at the next epoch's start.
    for what, t in ticks:
        if what is Event.EPOCH_END:
            assert t.batch_in_epoch == run["steps_per_epoch"]
        if what is Event.EPOCH_CHECKPOINT:
            assert t.batch_in_epoch == 0


@given(runs())
def test_evaluation_saving_and_logging_fall_where_their_intervals_say(run: dict) -> None:
    ticks = list(run_schedule(**run))
    total, per_epoch = run["max_steps"], run["steps_per_epoch"]
    for action, interval, final in (
        (Action.EVALUATE, run["eval_interval"], run["final_eval"]),
        (Action.SAVE, run["save_interval"], run["final_save"]),
        (Action.LOG, run["log_interval"], True),
    ):
        expected: list[int] = []
        if interval is not None and interval.unit is TimeUnit.BATCH:
            expected = list(range(interval.value, total + 1, interval.value))
        elif interval is not None and action is not Action.LOG:
            expected = [e * per_epoch for e in range(interval.value, total // per_epoch + 1, interval.value)]
        if final and total not in expected:
            expected.append(total)
        assert [t.batch for what, t in ticks if what is action] == expected, action


@given(runs(), st.data())
def test_a_resumed_schedule_continues_the_uninterrupted_one(run: dict, data: st.DataObject) -> None:
    whole = list(run_schedule(**run))
    checkpoints = [
        index
        for index, (what, t) in enumerate(whole)
        if what in (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT) and t.batch < run["max_steps"]
    ]
    if not checkpoints:
        return
    index = data.draw(st.sampled_from(checkpoints))
    # A checkpoint written at that tick resumes right after it (its own SAVE is what wrote it).
    after = whole[index + 1 :]
    if after and after[0][0] is Action.SAVE:
        after = after[1:]
    resumed = list(run_schedule(**run, start=whole[index][1]))
    assert resumed[0][0] is Event.FIT_START
    assert _where(resumed[1:]) == _where(after)


def test_a_resumed_schedule_after_an_epochs_last_batch_goes_straight_to_its_end() -> None:
    start = Timestamp(epoch=0, batch=3, batch_in_epoch=3).with_max_duration(Time(6, TimeUnit.BATCH))
    names = [what for what, _ in run_schedule(6, 3, start=start)]
    assert names[:3] == [Event.FIT_START, Event.EPOCH_END, Event.EPOCH_CHECKPOINT]


def test_the_batch_progress_sent_back_advances_samples_and_tokens() -> None:
    ticks = run_schedule(4, 2)
    reply: Progress | None = None
    sizes = iter([(8, 100), (8, 90), (5, 40), (8, 0)])
    last = None
    while (tick := next_tick(ticks, reply)) is not None:
        what, last = tick
        reply = Progress(*next(sizes), seconds=0.5) if what is Action.STEP else None
    assert last is not None and (last.sample, last.token, last.batch) == (29, 230, 4)
    assert last.total_wct == pytest.approx(2.0)


@pytest.mark.parametrize("steps_per_epoch", [0, -1])
def test_a_non_positive_epoch_length_is_refused(steps_per_epoch: int) -> None:
    with pytest.raises(ValueError, match="steps_per_epoch"):
        next(run_schedule(3, steps_per_epoch))


class EventLog(Callback):
    """Records every event the trainer runs, by name, with the batch count it ran at."""

    def __init__(self) -> None:
        self.seen: list[tuple[Event, int]] = []
        for event in Event:
            setattr(self, event.value, self._record)

    def _record(self, view: RunView) -> None:
        self.seen.append((view.event, view.timestamp.batch))


@settings(max_examples=10, deadline=None)
@given(per_epoch=st.integers(1, 3), steps=st.integers(1, 7), eval_every=st.sampled_from(["1ep", "2ba", "3ba"]))
def test_the_trainer_runs_exactly_the_events_of_the_schedule(per_epoch: int, steps: int, eval_every: str) -> None:
    data = (torch.zeros(4 * per_epoch, 6), torch.zeros(4 * per_epoch, dtype=torch.int64))
    log = EventLog()
    trainer = Trainer(
        MLP(6, 2, hidden=(4,)),
        TensorLoader(data, batch_size=4, seed=0),
        TensorLoader(data, batch_size=8, shuffle=False),
        max_duration=f"{steps}ba",
        optimizer=optim.sgd(0.1),
        callbacks=[log],
        eval_interval=eval_every,
        progress_bar=False,
    )
    log.seen.clear()  # INIT ran at construction
    trainer.fit()
    ticks = run_schedule(
        steps,
        per_epoch,
        eval_interval=Time.from_timestring(eval_every),
        final_eval=True,
        start=Timestamp().with_max_duration(Time(steps, TimeUnit.BATCH)),
    )
    expected: list[tuple[Event, int]] = []
    for what, t in ticks:
        if isinstance(what, Event):
            expected.append((what, t.batch))
        elif what is Action.EVALUATE:
            expected += [(e, t.batch) for e in (Event.EVAL_BEFORE_ALL, Event.EVAL_START)]
            expected += [(Event.EVAL_BATCH_START, t.batch), (Event.EVAL_BATCH_END, t.batch)] * (per_epoch // 2 + per_epoch % 2)
            expected += [(e, t.batch) for e in (Event.EVAL_END, Event.EVAL_AFTER_ALL)]
    assert log.seen == expected


def test_the_step_runs_the_traced_events_in_the_order_train_step_events_lists() -> None:
    seen: list[Event] = []

    def recording(event: Event):
        def hook(state, ctx):
            seen.append(event)
            return state, ctx

        return hook

    @dataclass(frozen=True)
    class Order(Algorithm):
        algorithm_name = "schedule_spec_order"

        def traced_hooks(self, plan_key=()):
            return {event: recording(event) for event in TRAIN_STEP_EVENTS}

    train_steps(make_setup([Order()], steps=1))
    assert seen == list(TRAIN_STEP_EVENTS)
