"""Specification of the engine: plans (order, matching, memoization, step keys), the fold, traces, dry runs."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from composer_fn.core import random as rng
from composer_fn.core.algorithm import Algorithm, Capabilities, Hook, HostHook
from composer_fn.core.dry_run import DryRun, dry_run
from composer_fn.core.engine import Plan, make_plan, run_event, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp

# ----------------------------------------------------------------------------------------------- test algorithms


def _traced_recorder(name: str, salt: int) -> Hook:
    def hook(state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        # The new step depends on the order the hooks run in, as does the log.
        log = ctx.scratch.get("log", ())
        return state.replace(step=state.step * 3 + salt), ctx.replace(
            scratch={**ctx.scratch, "log": log + (name,)}
        )

    return hook


def _host_recorder(name: str, salt: int) -> HostHook:
    def hook(
        static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        entry = (name, timestamp.batch, None if meta is None else meta.batch_size)
        log = state.algos.get("host_log", ())
        return static.replace(seed=static.seed * 3 + salt), state.replace(
            algos={**state.algos, "host_log": log + (entry,)}
        )

    return hook


@dataclass(frozen=True)
class Recorder(Algorithm):
    """A test-only algorithm that logs its name at the events in ``hooked`` once the batch count reaches a bound.

    Traced events match from ``from_batch`` on, host events from ``host_from_batch`` on.
    """

    hooked: tuple[Event, ...] = (Event.BEFORE_FORWARD, Event.AFTER_FORWARD)
    from_batch: int = 0
    host_from_batch: int = 0
    interpolate_loss: bool = False

    @property
    def salt(self) -> int:
        return sum(self.name.encode()) % 97 + 1

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {e: _traced_recorder(self.name, self.salt) for e in self.hooked if e.traced}

    def capabilities(self) -> Capabilities:
        return Capabilities(interpolates_loss=self.interpolate_loss)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {e: _host_recorder(self.name, self.salt) for e in self.hooked if not e.traced}

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        return timestamp.batch >= (self.from_batch if event.traced else self.host_from_batch)


def recorder(label: str, placement: Literal["any", "first", "last"] = "any") -> type[Recorder]:
    namespace = {"algorithm_name": f"engine_spec_{label}", "placement": placement}
    return dataclass(frozen=True)(type(f"EngineSpec{label.title()}", (Recorder,), namespace))


@dataclass(frozen=True)
class Resizer(Recorder):
    """A test-only algorithm whose traced step changes shape from ``resize_from_batch`` on."""

    algorithm_name = "engine_spec_resizer"
    resize_from_batch: int = 0

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        return ("half_size", timestamp.batch >= self.resize_from_batch)


A, B, C, D, E = (recorder(label) for label in "abcde")
FIRST = recorder("first", "first")
LAST = recorder("last", "last")
FIVE = (A(), B(), C(), D(), E())


def make_state() -> State:
    return State(
        params={"w": torch.arange(3.0)},
        buffers={},
        opt=None,
        algos={},
        hparams={},
        step=torch.tensor(1, dtype=torch.int64),
        key=rng.key(0),
    )


def make_ctx() -> StepCtx:
    return StepCtx(
        batch=(torch.arange(4.0), torch.arange(4)),
        key=rng.key(1),
        loss_fn=lambda outputs, batch: outputs.sum(),
    )


def log_at(event: Event, plan: Plan) -> tuple[str, ...]:
    return run_event(event, plan, make_state(), make_ctx())[1].scratch.get("log", ())


# ----------------------------------------------------------------------------------------------- order


@given(st.permutations(FIVE), st.integers(min_value=1, max_value=5))
def test_after_forward_runs_in_the_reverse_order_of_before_forward(
    algorithms: list[Algorithm], count: int
) -> None:
    chosen = algorithms[:count]
    plan = make_plan(chosen)
    before = log_at(Event.BEFORE_FORWARD, plan)
    assert before == tuple(a.name for a in chosen)
    assert log_at(Event.AFTER_FORWARD, plan) == before[::-1]


@given(st.permutations(FIVE + (FIRST(), LAST())), st.integers(min_value=1, max_value=7))
def test_placement_first_and_last_are_honoured(algorithms: list[Algorithm], count: int) -> None:
    chosen = algorithms[:count]
    plan = make_plan(chosen)
    before = log_at(Event.BEFORE_FORWARD, plan)
    expected_middle = [a.name for a in chosen if a.placement == "any"]
    assert [n for n in before if n not in (FIRST().name, LAST().name)] == expected_middle
    if FIRST() in chosen:
        assert before[0] == FIRST().name
    if LAST() in chosen:
        assert before[-1] == LAST().name
    # On AFTER_* events the others run in reverse, but placement still wins.
    after = log_at(Event.AFTER_FORWARD, plan)
    assert [n for n in after if n not in (FIRST().name, LAST().name)] == expected_middle[::-1]
    if FIRST() in chosen:
        assert after[0] == FIRST().name
    if LAST() in chosen:
        assert after[-1] == LAST().name


@given(st.permutations(FIVE), st.integers(min_value=0, max_value=5), st.sampled_from(list(Event)))
def test_plan_names_are_the_algorithms_hooking_the_event(
    algorithms: list[Algorithm], count: int, event: Event
) -> None:
    chosen = algorithms[:count]
    plan = make_plan(chosen)
    expected = [a.name for a in chosen] if event in (Event.BEFORE_FORWARD, Event.AFTER_FORWARD) else []
    assert sorted(plan.names(event)) == sorted(expected)


# ----------------------------------------------------------------------------------------------- the fold


@given(
    st.permutations(FIVE + (FIRST(), LAST())),
    st.integers(min_value=0, max_value=7),
    st.sampled_from([Event.BEFORE_FORWARD, Event.AFTER_FORWARD]),
)
def test_run_event_applies_the_planned_hooks_one_after_another(
    algorithms: list[Algorithm], count: int, event: Event
) -> None:
    chosen = algorithms[:count]
    plan = make_plan(chosen)
    by_name = {a.name: a for a in chosen}
    state, ctx = make_state(), make_ctx()
    for name in plan.names(event):
        state, ctx = by_name[name].traced_hooks()[event](state, ctx)

    folded_state, folded_ctx = run_event(event, plan, make_state(), make_ctx())

    assert torch.equal(folded_state.step, state.step)
    assert folded_ctx.scratch == ctx.scratch


@pytest.mark.parametrize("event", [Event.BEFORE_FORWARD, Event.AFTER_LOSS, Event.AFTER_OPTIMIZER_STEP])
def test_an_event_without_algorithms_returns_the_very_same_records(event: Event) -> None:
    state, ctx = make_state(), make_ctx()
    for plan in (make_plan([]), make_plan([A(hooked=(Event.BEFORE_LOSS,))])):
        new_state, new_ctx = run_event(event, plan, state, ctx)
        assert new_state is state and new_ctx is ctx


def test_run_event_leaves_its_inputs_unchanged() -> None:
    state, ctx = make_state(), make_ctx()
    run_event(Event.BEFORE_FORWARD, make_plan(FIVE), state, ctx)
    assert int(state.step) == 1 and "log" not in ctx.scratch


HOST_EVENTS_HOOKED = (Event.FIT_START, Event.BATCH_START, Event.EPOCH_END)


@given(
    st.permutations(FIVE + (FIRST(), LAST())),
    st.integers(min_value=0, max_value=7),
    st.sampled_from(HOST_EVENTS_HOOKED),
    st.integers(min_value=0, max_value=20),
    st.one_of(st.none(), st.integers(min_value=1, max_value=64).map(BatchMeta)),
)
def test_run_host_event_folds_the_planned_host_hooks(
    algorithms: list[Algorithm], count: int, event: Event, batch: int, meta: BatchMeta | None
) -> None:
    chosen = [type(a)(hooked=HOST_EVENTS_HOOKED) for a in algorithms[:count]]
    timestamp = Timestamp(batch=batch)
    plan = make_plan(chosen, timestamp=timestamp)
    by_name = {a.name: a for a in chosen}
    module = nn.Identity()
    static, state = Static(module), make_state()
    for name in plan.names(event):
        static, state = by_name[name].host_hooks()[event](static, state, timestamp, meta)

    folded_static, folded_state = run_host_event(event, plan, Static(module), make_state(), timestamp, meta)

    assert folded_static == static
    assert folded_state.algos == state.algos
    assert [entry[0] for entry in folded_state.algos.get("host_log", ())] == list(plan.names(event))
    assert all(
        entry[1:] == (batch, None if meta is None else meta.batch_size)
        for entry in state.algos.get("host_log", ())
    )


def test_run_host_event_without_hooks_returns_the_very_same_records() -> None:
    static, state = Static(nn.Identity()), make_state()
    new_static, new_state = run_host_event(Event.BATCH_START, make_plan(FIVE), static, state, Timestamp())
    assert new_static is static and new_state is state


# ----------------------------------------------------------------------------------------------- matching


@given(
    from_batch=st.integers(min_value=0, max_value=10),
    batch=st.integers(min_value=0, max_value=10),
    others=st.integers(min_value=0, max_value=4),
    position=st.integers(min_value=0, max_value=4),
)
def test_an_algorithm_runs_only_where_it_matches(
    from_batch: int, batch: int, others: int, position: int
) -> None:
    gated = C(from_batch=from_batch)
    algorithms: list[Algorithm] = [A(), B(), D(), E()][:others]
    algorithms.insert(min(position, others), gated)
    plan = make_plan(algorithms, timestamp=Timestamp(batch=batch))
    runs = batch >= from_batch
    always = [a.name for a in algorithms if a is not gated]
    for event, expected_others in ((Event.BEFORE_FORWARD, always), (Event.AFTER_FORWARD, always[::-1])):
        assert (gated.name in plan.names(event)) == runs
        assert (gated.name in log_at(event, plan)) == runs
        assert [n for n in plan.names(event) if n != gated.name] == expected_others


def test_a_plan_without_a_timestamp_is_the_plan_at_the_start() -> None:
    algorithms = [A(), B(from_batch=1)]
    assert make_plan(algorithms) is make_plan(algorithms, timestamp=Timestamp())
    assert make_plan(algorithms).names(Event.BEFORE_FORWARD) == (A().name,)


# ----------------------------------------------------------------------------------------------- memoization


@given(st.permutations(FIVE), st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=50))
def test_make_plan_returns_the_same_plan_object_for_the_same_matches(
    algorithms: list[Algorithm], count: int, batch: int
) -> None:
    chosen = algorithms[:count]
    plan = make_plan(chosen, timestamp=Timestamp(batch=batch))
    assert make_plan(tuple(chosen), timestamp=Timestamp(batch=batch)) is plan
    # Every algorithm here matches at every time, so any other timestamp gives the same plan.
    assert make_plan(list(chosen), timestamp=Timestamp(batch=batch + 1, epoch=3)) is plan


@given(from_batch=st.integers(min_value=1, max_value=10), batch=st.integers(min_value=0, max_value=10))
def test_the_step_key_changes_with_the_traced_matches(from_batch: int, batch: int) -> None:
    algorithms = [A(), B(from_batch=from_batch)]
    start = make_plan(algorithms, timestamp=Timestamp(batch=0))
    now = make_plan(algorithms, timestamp=Timestamp(batch=batch))
    assert (now.step_key == start.step_key) == (batch < from_batch)
    assert hash(now.step_key) == hash(now.step_key)


@given(host_from_batch=st.integers(min_value=1, max_value=10), batch=st.integers(min_value=0, max_value=10))
def test_the_step_key_ignores_host_only_changes(host_from_batch: int, batch: int) -> None:
    algorithms = [A(), B(hooked=(Event.BEFORE_FORWARD, Event.BATCH_START), host_from_batch=host_from_batch)]
    start = make_plan(algorithms, timestamp=Timestamp(batch=0))
    now = make_plan(algorithms, timestamp=Timestamp(batch=batch))
    host_changed = batch >= host_from_batch
    assert (B().name in now.names(Event.BATCH_START)) == host_changed
    assert (now == start) == (not host_changed)
    assert now.step_key == start.step_key


@given(resize_from_batch=st.integers(min_value=1, max_value=10), batch=st.integers(min_value=0, max_value=10))
def test_the_step_key_changes_with_a_plan_key(resize_from_batch: int, batch: int) -> None:
    algorithms = [A(), Resizer(resize_from_batch=resize_from_batch)]
    start = make_plan(algorithms, timestamp=Timestamp(batch=0))
    now = make_plan(algorithms, timestamp=Timestamp(batch=batch))
    assert now.names(Event.BEFORE_FORWARD) == start.names(Event.BEFORE_FORWARD)
    assert (now.step_key == start.step_key) == (batch < resize_from_batch)


# ----------------------------------------------------------------------------------------------- validation


def test_two_algorithms_with_one_name_raise_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=A().name):
        make_plan([A(), B(), A(from_batch=3)])
    with pytest.raises(ValueError, match=A().name):
        make_plan([A(), A()])


def test_something_that_is_not_an_algorithm_raises_type_error() -> None:
    with pytest.raises(TypeError, match="mixup"):
        make_plan([A(), "mixup"])  # type: ignore[list-item]


def test_two_loss_interpolations_leave_a_diagnostic_in_the_plan() -> None:
    hooked = (Event.BEFORE_FORWARD, Event.BEFORE_BACKWARD)
    one = make_plan([A(hooked=hooked, interpolate_loss=True), B(hooked=hooked)])
    assert one.diagnostics == ()
    two = make_plan([A(hooked=hooked, interpolate_loss=True), B(hooked=hooked, interpolate_loss=True), C()])
    assert any(A().name in d and B().name in d and "interpolate" in d for d in two.diagnostics)
    assert len(two.diagnostics) == len(set(two.diagnostics))


# ----------------------------------------------------------------------------------------------- traces


@given(st.permutations(FIVE + (FIRST(), LAST())), st.integers(min_value=0, max_value=7))
def test_traces_list_every_planned_hook_with_its_position(algorithms: list[Algorithm], count: int) -> None:
    chosen = [
        type(a)(hooked=(Event.INIT, Event.BEFORE_FORWARD, Event.AFTER_FORWARD)) for a in algorithms[:count]
    ]
    plan = make_plan(chosen)
    traces = plan.traces()
    assert [(t.name, t.event, t.order) for t in traces] == [
        (name, event, order) for event, names in plan.order for order, name in enumerate(names)
    ]
    assert all(t.traced == t.event.traced for t in traces)
    assert len(traces) == 3 * count
    for event in (Event.INIT, Event.BEFORE_FORWARD, Event.AFTER_FORWARD):
        assert tuple(t.name for t in traces if t.event is event) == plan.names(event)


# ----------------------------------------------------------------------------------------------- dry run


def _span(first: int, last: int) -> str:
    return f"ba {first}" if first == last else f"ba {first}-{last}"


@given(
    steps_per_epoch=st.integers(min_value=1, max_value=4),
    epochs=st.integers(min_value=1, max_value=4),
    data=st.data(),
)
def test_dry_run_rows_cover_the_schedule_in_spans(
    steps_per_epoch: int, epochs: int, data: st.DataObject
) -> None:
    total = steps_per_epoch * epochs
    from_batch = data.draw(st.integers(min_value=0, max_value=total + 1))
    always, gated = (
        A(hooked=(Event.BEFORE_FORWARD,)),
        B(hooked=(Event.BEFORE_FORWARD,), from_batch=from_batch),
    )

    result = dry_run([always, gated], f"{epochs}ep", steps_per_epoch)

    rows = [(r.when, r.event, r.algorithms) for r in result.rows]
    both = (always.name, gated.name)
    if from_batch == 0:
        expected = [(_span(0, total - 1), Event.BEFORE_FORWARD, both)]
    elif from_batch >= total:
        expected = [(_span(0, total - 1), Event.BEFORE_FORWARD, (always.name,))]
    else:
        expected = [
            (_span(0, from_batch - 1), Event.BEFORE_FORWARD, (always.name,)),
            (_span(from_batch, total - 1), Event.BEFORE_FORWARD, both),
        ]
    assert rows == expected
    assert result.total_steps == total
    assert result.compiled_steps == len(expected)


def test_dry_run_of_an_algorithm_starting_at_batch_five() -> None:
    always, gated = A(hooked=(Event.BEFORE_FORWARD,)), B(hooked=(Event.BEFORE_FORWARD,), from_batch=5)

    result = dry_run([always, gated], "4ep", steps_per_epoch=3)

    assert [(r.when, r.algorithms) for r in result.rows] == [
        ("ba 0-4", (always.name,)),
        ("ba 5-11", (always.name, gated.name)),
    ]
    assert result.compiled_steps == 2 and result.total_steps == 12
    text = result.format()
    assert "ba 0-4" in text and "ba 5-11" in text
    assert "12 steps; 2 distinct traced step(s) to compile" in text


@dataclass(frozen=True)
class EvenBatches(recorder("even")):  # type: ignore[misc]
    """Runs at the even batches from ``from_batch`` on, and at every batch from ``every_from`` on."""

    every_from: int = 10**9

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        batch = timestamp.batch
        return batch >= self.from_batch and (batch % 2 == 0 or batch >= self.every_from)


def test_the_dry_run_table_folds_spans_of_one_event_that_lie_close_together() -> None:
    result = dry_run([EvenBatches(hooked=(Event.BEFORE_FORWARD,), from_batch=2)], "100ep", steps_per_epoch=10)
    assert len(result.rows) == 499  # one row per even batch from 2 to 998
    lines = result.format().splitlines()
    assert lines[2].split()[:4] == ["ba", "2-998,", "499", "of"] and lines[2].split()[4] == "997"
    assert len(lines) == 4
    dense = dry_run([EvenBatches(hooked=(Event.BEFORE_FORWARD,), every_from=6)], "2ep", steps_per_epoch=5)
    assert "ba 0-9, 7 of 10" in dense.format()  # batches 0, 2, 4, then 6 to 9


def test_dry_run_shows_host_events_and_diagnostics() -> None:
    hooked = (Event.INIT, Event.EPOCH_START, Event.BEFORE_FORWARD, Event.BEFORE_BACKWARD)
    algorithms = [A(hooked=hooked, interpolate_loss=True), B(hooked=hooked, interpolate_loss=True)]

    result = dry_run(algorithms, "2ep", steps_per_epoch=2)

    assert ("start", Event.INIT, (A().name, B().name)) in [
        (r.when, r.event, r.algorithms) for r in result.rows
    ]
    assert ("ep 0-1", Event.EPOCH_START, (A().name, B().name)) in [
        (r.when, r.event, r.algorithms) for r in result.rows
    ]
    assert result.diagnostics and "warning:" in result.format()


def test_dry_run_counts_compiled_steps_by_the_traced_step_only() -> None:
    traced = A(hooked=(Event.BEFORE_FORWARD,))
    host_only = B(hooked=(Event.BEFORE_FORWARD, Event.BATCH_START), host_from_batch=2)

    result = dry_run([traced, host_only], "2ep", steps_per_epoch=2)

    assert ("ba 2-3", Event.BATCH_START, (host_only.name,)) in [
        (r.when, r.event, r.algorithms) for r in result.rows
    ]
    assert result.compiled_steps == 1


def _epochs_with(result: DryRun, event: Event, name: str) -> set[int]:
    epochs: set[int] = set()
    for row in result.rows:
        if row.event is event and name in row.algorithms and row.when.startswith("ep "):
            first, _, last = row.when[3:].partition("-")
            epochs.update(range(int(first), int(last or first) + 1))
    return epochs


@given(steps_per_epoch=st.integers(min_value=1, max_value=4), steps=st.integers(min_value=1, max_value=14))
def test_dry_run_ends_only_the_epochs_that_complete(steps_per_epoch: int, steps: int) -> None:
    # The trainer stops mid-epoch when max_duration is reached: that epoch has no EPOCH_END (as in Composer).
    probe = A(hooked=(Event.EPOCH_START, Event.EPOCH_END))

    result = dry_run([probe], f"{steps}ba", steps_per_epoch)

    started = -(-steps // steps_per_epoch)
    assert _epochs_with(result, Event.EPOCH_START, probe.name) == set(range(started))
    assert _epochs_with(result, Event.EPOCH_END, probe.name) == set(range(steps // steps_per_epoch))


@dataclass(frozen=True)
class FitEndProbe(Recorder):
    """A test-only algorithm that runs at FIT_END only if it is asked at the given final counters."""

    algorithm_name = "engine_spec_fit_end_probe"
    final_epoch: int = 0
    final_batch_in_epoch: int = 0

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        return (timestamp.epoch, timestamp.batch_in_epoch) == (self.final_epoch, self.final_batch_in_epoch)


@given(steps_per_epoch=st.integers(min_value=1, max_value=4), steps=st.integers(min_value=1, max_value=14))
def test_dry_run_matches_fit_end_at_the_final_timestamp(steps_per_epoch: int, steps: int) -> None:
    # A run that stops mid-epoch stays in that epoch; a run that ends an epoch has moved to the next one.
    probe = FitEndProbe(
        hooked=(Event.FIT_END,),
        final_epoch=steps // steps_per_epoch,
        final_batch_in_epoch=steps % steps_per_epoch,
    )

    result = dry_run([probe], f"{steps}ba", steps_per_epoch)

    assert ("end", Event.FIT_END, (probe.name,)) in [(r.when, r.event, r.algorithms) for r in result.rows]


@dataclass(frozen=True)
class EpochGated(Recorder):
    """A test-only algorithm that matches from ``from_epoch`` on."""

    algorithm_name = "engine_spec_epoch_gated"
    from_epoch: int = 0

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        return timestamp.epoch >= self.from_epoch


def test_dry_run_matches_epoch_checkpoint_at_the_start_of_the_next_epoch() -> None:
    # The checkpoint after an epoch is taken once the timestamp has moved on to the next epoch, so an
    # algorithm matching from epoch 1 on already runs at the checkpoint that closes epoch 0.
    from_epoch_one = EpochGated(hooked=(Event.EPOCH_END, Event.EPOCH_CHECKPOINT), from_epoch=1)

    result = dry_run([from_epoch_one], "2ep", steps_per_epoch=3)

    assert _epochs_with(result, Event.EPOCH_END, from_epoch_one.name) == {1}
    assert _epochs_with(result, Event.EPOCH_CHECKPOINT, from_epoch_one.name) == {0, 1}


@pytest.mark.parametrize("steps_per_epoch", [0, -1])
def test_dry_run_rejects_a_non_positive_epoch_length(steps_per_epoch: int) -> None:
    with pytest.raises(ValueError, match="steps_per_epoch"):
        dry_run([A()], "1ep", steps_per_epoch)


def _names_by_event(plan: Plan) -> dict[Event, tuple[str, ...]]:
    return {event: names for event, names in plan.order}


def test_plans_are_equal_and_hash_alike_when_they_decide_the_same() -> None:
    first = make_plan([A(), B(from_batch=3)], timestamp=Timestamp(batch=0))
    second = make_plan([A(), B(from_batch=4)], timestamp=Timestamp(batch=1))
    assert first == second and hash(first) == hash(second)
    assert _names_by_event(first) == _names_by_event(second)


@dataclass(frozen=True)
class Scaler(Algorithm):
    """A test-only algorithm whose traced hook multiplies the input by a factor chosen by its plan key."""

    algorithm_name = "engine_spec_scaler"

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        return 1 + timestamp.batch % 3 + (meta.input_shape[-1] if meta is not None and meta.input_shape else 0)

    def traced_hooks(self, plan_key: Hashable = 1) -> Mapping[Event, Hook]:
        assert isinstance(plan_key, int)
        return {Event.BEFORE_FORWARD: self._scale_by(plan_key)}

    @staticmethod
    def _scale_by(factor: int) -> Hook:
        def scale(state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
            return state, ctx.replace(batch=ctx.batch * factor)

        return scale


@given(batch=st.integers(0, 20), width=st.integers(0, 4))
def test_traced_hooks_are_resolved_for_the_plan_key_of_the_batch(batch: int, width: int) -> None:
    meta = BatchMeta(2, (2, width)) if width else None
    plan = make_plan([Scaler()], timestamp=Timestamp(batch=batch), meta=meta)
    ctx = StepCtx(batch=torch.ones(2), key=rng.key(0), loss_fn=lambda o, b: o)
    _, out = run_event(Event.BEFORE_FORWARD, plan, make_state(), ctx)
    assert torch.equal(out.batch, torch.full((2,), float(1 + batch % 3 + width)))


@given(batch=st.integers(0, 20))
def test_a_plan_key_may_change_which_events_are_hooked(batch: int) -> None:
    @dataclass(frozen=True)
    class Shifty(Scaler):
        algorithm_name = "engine_spec_shifty"

        def traced_hooks(self, plan_key: Hashable = 1) -> Mapping[Event, Hook]:
            event = Event.AFTER_FORWARD if plan_key == 2 else Event.BEFORE_FORWARD
            return {event: self._scale_by(2)}

    plan = make_plan([Shifty()], timestamp=Timestamp(batch=batch))
    hooked = Event.AFTER_FORWARD if batch % 3 == 1 else Event.BEFORE_FORWARD
    assert [event for event, _ in plan.order] == [hooked]


def test_dry_run_counts_one_compiled_step_per_distinct_plan_key() -> None:
    report = dry_run([Scaler()], "9ba", steps_per_epoch=3, input_shape=(2, 10))
    assert report.compiled_steps == 3
