"""Specification of the learning-rate multiplier schedules: the formulas, host == tensor, traceability."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from composer_fn.core.time import Time
from composer_fn.optim.schedules import (
    ConstantScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    MultiStepWithWarmupScheduler,
    PolynomialScheduler,
    PolynomialWithWarmupScheduler,
    ScheduleFn,
    StepScheduler,
)

STEPS_PER_EPOCH = 10
MAX_STEPS = 100


def resolved(schedule: object, **kwargs: float) -> ScheduleFn:
    return schedule.resolve(steps_per_epoch=STEPS_PER_EPOCH, max_steps=MAX_STEPS, **kwargs)  # type: ignore[attr-defined]


def cosine(tau: float, alpha_f: float) -> float:
    return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + math.cos(math.pi * tau))


# (schedule, step, expected multiplier) with steps_per_epoch=10 and max_steps=100, values from the formulas.
EXPECTED = [
    (ConstantScheduler(), 0, 1.0),
    (ConstantScheduler(alpha=0.5, t_max="0.5dur"), 0, 0.5),
    (ConstantScheduler(alpha=0.5, t_max="0.5dur"), 49, 0.5),
    (ConstantScheduler(alpha=0.5, t_max="0.5dur"), 50, 1.0),
    (ConstantScheduler(alpha=0.5, t_max="0.5dur"), 150, 1.0),
    (ConstantScheduler(alpha=0.1, t_max="2ep"), 19, 0.1),
    (ConstantScheduler(alpha=0.1, t_max="2ep"), 20, 1.0),
    (LinearScheduler(), 0, 1.0),
    (LinearScheduler(), 25, 0.75),
    (LinearScheduler(), 100, 0.0),
    (LinearScheduler(), 130, 0.0),
    (LinearScheduler(alpha_i=0.2, alpha_f=1.0, t_max="4ep"), 20, 0.6),
    (LinearScheduler(alpha_i=0.2, alpha_f=1.0, t_max="4ep"), 40, 1.0),
    (LinearScheduler(alpha_i=0.2, alpha_f=1.0, t_max="4ep"), 90, 1.0),
    (CosineAnnealingScheduler(), 0, 1.0),
    (CosineAnnealingScheduler(), 50, 0.5),
    (CosineAnnealingScheduler(), 25, cosine(0.25, 0.0)),
    (CosineAnnealingScheduler(), 100, 0.0),
    (CosineAnnealingScheduler(alpha_f=0.1), 50, 0.55),
    (CosineAnnealingScheduler(t_max="40ba", alpha_f=0.1), 40, 0.1),
    (CosineAnnealingScheduler(t_max="40ba", alpha_f=0.1), 77, 0.1),
    (CosineAnnealingWithWarmupScheduler(t_warmup="10ba"), 0, 0.0),
    (CosineAnnealingWithWarmupScheduler(t_warmup="10ba"), 5, 0.5),
    (CosineAnnealingWithWarmupScheduler(t_warmup="10ba"), 10, 1.0),
    (CosineAnnealingWithWarmupScheduler(t_warmup="10ba"), 55, 0.5),
    (CosineAnnealingWithWarmupScheduler(t_warmup="10ba"), 100, 0.0),
    (CosineAnnealingWithWarmupScheduler(t_warmup="1ep", alpha_f=0.2), 55, 0.6),
    (CosineAnnealingWithWarmupScheduler(t_warmup="1ep", alpha_f=0.2), 120, 0.2),
    (LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_i=0.8, alpha_f=0.2), 5, 0.4),
    (LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_i=0.8, alpha_f=0.2), 10, 0.8),
    (LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_i=0.8, alpha_f=0.2), 55, 0.5),
    (LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_i=0.8, alpha_f=0.2), 100, 0.2),
    (LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_i=0.8, alpha_f=0.2), 200, 0.2),
    (LinearWithWarmupScheduler(t_warmup="20ba", t_max="20ba"), 20, 1.0),
    (LinearWithWarmupScheduler(t_warmup="20ba", t_max="20ba"), 90, 1.0),
    (ConstantWithWarmupScheduler(t_warmup="2ep", alpha=0.5), 10, 0.25),
    (ConstantWithWarmupScheduler(t_warmup="2ep", alpha=0.5), 20, 0.5),
    (ConstantWithWarmupScheduler(t_warmup="2ep", alpha=0.5), 100, 0.5),
    (ConstantWithWarmupScheduler(t_warmup="2ep", alpha=0.5, t_max="5ep"), 200, 0.5),
    (ConstantWithWarmupScheduler(t_warmup="0ba"), 0, 1.0),
    # gamma ** floor(t / step_size)
    (StepScheduler(step_size="2ep"), 0, 1.0),
    (StepScheduler(step_size="2ep"), 19, 1.0),
    (StepScheduler(step_size="2ep"), 20, 0.1),
    (StepScheduler(step_size="2ep"), 45, 0.01),
    (StepScheduler(step_size="2ep"), 60, 0.001),
    (StepScheduler(step_size="25ba", gamma=0.5), 24, 1.0),
    (StepScheduler(step_size="25ba", gamma=0.5), 25, 0.5),
    (StepScheduler(step_size="25ba", gamma=0.5), 99, 0.125),
    (StepScheduler(step_size="25ba", gamma=0.5), 100, 0.0625),
    (StepScheduler(step_size="0.3dur", gamma=0.5), 29, 1.0),
    (StepScheduler(step_size="0.3dur", gamma=0.5), 30, 0.5),
    (StepScheduler(step_size="0.3dur", gamma=0.5), 60, 0.25),
    # gamma ** (number of milestones <= t); milestones at 30, 60 and 90 steps
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 0, 1.0),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 29, 1.0),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 30, 0.5),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 59, 0.5),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 60, 0.25),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 90, 0.125),
    (MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5), 150, 0.125),
    (MultiStepScheduler(milestones=["0.9dur", "3ep"], gamma=0.5), 95, 0.25),
    (MultiStepScheduler(milestones=["0ba"]), 0, 0.1),
    (MultiStepScheduler(milestones=[]), 50, 1.0),
    # gamma ** (t / decay_period)
    (ExponentialScheduler(gamma=0.5), 0, 1.0),
    (ExponentialScheduler(gamma=0.5), 5, math.sqrt(0.5)),
    (ExponentialScheduler(gamma=0.5), 10, 0.5),
    (ExponentialScheduler(gamma=0.5), 25, 0.5**2.5),
    (ExponentialScheduler(gamma=0.9, decay_period="20ba"), 40, 0.81),
    (ExponentialScheduler(gamma=0.1, decay_period="0.5dur"), 50, 0.1),
    (ExponentialScheduler(gamma=0.1, decay_period="0.5dur"), 100, 0.01),
    # a cosine over each interval; t_0=20 steps, t_mult=1
    (CosineAnnealingWarmRestartsScheduler(t_0="2ep"), 0, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ep"), 10, 0.5),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ep"), 20, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ep"), 25, cosine(0.25, 0.0)),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ep"), 130, 0.5),
    # intervals [0, 10), [10, 30), [30, 70), [70, 150)
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 5, 0.6),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 10, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 20, 0.6),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 30, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 60, cosine(0.75, 0.2)),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 70, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=2.0, alpha_f=0.2), 110, 0.6),
    # lengths truncate: 4, 6, 9, 13 (not 13.5), 19, so restarts at 4, 10, 19, 32, 51
    (CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5), 19, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5), 25, cosine(6 / 13, 0.0)),
    (CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5), 31, cosine(12 / 13, 0.0)),
    (CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5), 32, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5), 51, 1.0),
    # int(1.3 * 2) == 2: the intervals stay 2 steps long
    (CosineAnnealingWarmRestartsScheduler(t_0="2ba", t_mult=1.3), 1, 0.5),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ba", t_mult=1.3), 2, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="2ba", t_mult=1.3), 101, 0.5),
    (CosineAnnealingWarmRestartsScheduler(t_0="0.25dur"), 50, 1.0),
    (CosineAnnealingWarmRestartsScheduler(t_0="0.25dur"), 60, cosine(0.4, 0.0)),
    # alpha_f + (1 - alpha_f) * (1 - min(1, t / t_max)) ** power
    (PolynomialScheduler(power=2.0), 0, 1.0),
    (PolynomialScheduler(power=2.0), 25, 0.5625),
    (PolynomialScheduler(power=2.0), 50, 0.25),
    (PolynomialScheduler(power=2.0), 100, 0.0),
    (PolynomialScheduler(power=2.0), 150, 0.0),
    (PolynomialScheduler(power=0.5, t_max="4ep", alpha_f=0.1), 10, 0.1 + 0.9 * math.sqrt(0.75)),
    (PolynomialScheduler(power=0.5, t_max="4ep", alpha_f=0.1), 40, 0.1),
    (PolynomialScheduler(power=3.0, t_max="50ba"), 25, 0.125),
    (PolynomialScheduler(power=0.0, t_max="50ba"), 50, 1.0),
    # warmup to 1.0 over 10 steps, then milestones at 50 and 80 steps
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 0, 0.0),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 5, 0.5),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 9, 0.9),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 10, 1.0),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 49, 1.0),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 50, 0.5),
    (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur"), gamma=0.5), 80, 0.25),
    # a milestone inside the warmup applies once the warmup ends
    (MultiStepWithWarmupScheduler(t_warmup="1ep", milestones=("5ba",)), 5, 0.5),
    (MultiStepWithWarmupScheduler(t_warmup="1ep", milestones=("5ba",)), 10, 0.1),
    # warmup to 1.0 over 10 steps, then (1 - tau) ** 2 with tau = (t - 10) / 90
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 0, 0.0),
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 5, 0.5),
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 10, 1.0),
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 55, 0.25),
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 100, 0.0),
    (PolynomialWithWarmupScheduler(t_warmup="0.1dur"), 120, 0.0),
    (PolynomialWithWarmupScheduler(t_warmup="2ep", power=1.0, t_max="6ep", alpha_f=0.2), 10, 0.5),
    (PolynomialWithWarmupScheduler(t_warmup="2ep", power=1.0, t_max="6ep", alpha_f=0.2), 40, 0.6),
    (PolynomialWithWarmupScheduler(t_warmup="2ep", power=1.0, t_max="6ep", alpha_f=0.2), 60, 0.2),
    (PolynomialWithWarmupScheduler(t_warmup="20ba", t_max="20ba"), 20, 1.0),
    (PolynomialWithWarmupScheduler(t_warmup="20ba", t_max="20ba"), 90, 1.0),
]


@pytest.mark.parametrize(("schedule", "step", "expected"), EXPECTED)
def test_multiplier_matches_the_formula(schedule: object, step: int, expected: float) -> None:
    fn = resolved(schedule)
    assert fn(step) == pytest.approx(expected, abs=1e-12)
    value = fn(torch.tensor(step))
    assert isinstance(value, torch.Tensor)
    assert value.dtype == torch.float32 and value.shape == ()
    assert value.item() == pytest.approx(expected, abs=1e-6)


def test_host_steps_give_python_floats() -> None:
    for schedule, step, _ in EXPECTED:
        assert type(resolved(schedule)(step)) is float


def test_scale_schedule_ratio_stretches_absolute_times_and_warmup_only_when_asked() -> None:
    schedule = LinearWithWarmupScheduler(t_warmup="10ba", t_max="100ba")
    # t_max becomes 50 steps; the warmup stays 10 steps.
    fn = resolved(schedule, scale_schedule_ratio=0.5)
    assert fn(10) == 1.0
    assert fn(30) == pytest.approx(0.5)
    assert fn(50) == 0.0
    scaled = resolved(
        LinearWithWarmupScheduler(t_warmup="10ba", t_max="100ba", scale_warmup=True), scale_schedule_ratio=0.5
    )
    assert scaled(4) == pytest.approx(0.8)
    assert scaled(5) == 1.0
    # dur times are fractions of max_steps, which the caller has already scaled.
    cosine_fn = resolved(CosineAnnealingScheduler(), scale_schedule_ratio=0.5)
    assert cosine_fn(50) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("schedule", "ratio", "step", "expected"),
    [
        # step_size 20 -> 10 steps
        (StepScheduler(step_size="20ba"), 0.5, 9, 1.0),
        (StepScheduler(step_size="20ba"), 0.5, 10, 0.1),
        # step_size 30 -> int(30 * 1.5) = 45 steps
        (StepScheduler(step_size="3ep", gamma=0.5), 1.5, 44, 1.0),
        (StepScheduler(step_size="3ep", gamma=0.5), 1.5, 45, 0.5),
        # milestones 30, 60 -> 15, 30; the dur milestone is already a fraction of the scaled run
        (MultiStepScheduler(milestones=("30ba", "6ep", "0.9dur")), 0.5, 15, 0.1),
        (MultiStepScheduler(milestones=("30ba", "6ep", "0.9dur")), 0.5, 30, 0.01),
        (MultiStepScheduler(milestones=("30ba", "6ep", "0.9dur")), 0.5, 89, 0.01),
        (MultiStepScheduler(milestones=("30ba", "6ep", "0.9dur")), 0.5, 90, 0.001),
        # decay_period 10 -> 5 steps
        (ExponentialScheduler(gamma=0.5), 0.5, 5, 0.5),
        # t_0 20 -> 10 steps
        (CosineAnnealingWarmRestartsScheduler(t_0="20ba"), 0.5, 5, 0.5),
        (CosineAnnealingWarmRestartsScheduler(t_0="20ba"), 0.5, 10, 1.0),
        # t_max 100 -> 50 steps
        (PolynomialScheduler(power=2.0, t_max="100ba"), 0.5, 25, 0.25),
        (PolynomialScheduler(power=2.0, t_max="100ba"), 0.5, 50, 0.0),
        # the warmup is stretched only with scale_warmup=True; the milestone 40 -> 20 steps either way
        (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("40ba",)), 0.5, 5, 0.5),
        (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("40ba",)), 0.5, 20, 0.1),
        (MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("40ba",), scale_warmup=True), 0.5, 5, 1.0),
        # warmup 10 (scaled: 5), t_max 110 -> 55 steps
        (PolynomialWithWarmupScheduler(t_warmup="10ba", power=1.0, t_max="110ba"), 0.5, 10, 1.0),
        (PolynomialWithWarmupScheduler(t_warmup="10ba", power=1.0, t_max="110ba"), 0.5, 55, 0.0),
        (
            PolynomialWithWarmupScheduler(t_warmup="10ba", power=1.0, t_max="110ba", scale_warmup=True),
            0.5,
            30,
            0.5,
        ),
    ],
)
def test_scale_schedule_ratio_stretches_the_times_of_every_schedule(
    schedule: object, ratio: float, step: int, expected: float
) -> None:
    fn = resolved(schedule, scale_schedule_ratio=ratio)
    assert fn(step) == pytest.approx(expected, abs=1e-12)
    value = fn(torch.tensor(step))
    assert isinstance(value, torch.Tensor)
    assert value.item() == pytest.approx(expected, abs=1e-6)


def _batches(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda value: f"{value}ba")


def _epochs(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda value: f"{value}ep")


def _durations(low: float, high: float) -> st.SearchStrategy[str]:
    return st.floats(low, high).map(lambda value: Time.from_duration(value).to_timestring())


warmups = st.one_of(_batches(0, 60), _epochs(0, 4), _durations(0.0, 0.5))
maxima = st.one_of(_batches(1, 300), _epochs(1, 30), _durations(0.3, 1.5))
multipliers = st.floats(0.0, 4.0)
fractions = st.floats(0.0, 1.0)
periods = st.one_of(_batches(1, 60), _epochs(1, 5), _durations(0.05, 0.5))
milestone_lists = st.lists(st.one_of(_batches(0, 300), _epochs(0, 30), _durations(0.0, 1.5)), max_size=4)
powers = st.floats(0.0, 4.0)
growths = st.one_of(st.just(1.0), st.floats(1.0, 3.0))

schedules = st.one_of(
    st.builds(ConstantScheduler, multipliers, maxima),
    st.builds(LinearScheduler, multipliers, multipliers, maxima),
    st.builds(CosineAnnealingScheduler, maxima, multipliers),
    st.builds(ConstantWithWarmupScheduler, warmups, multipliers, maxima, st.booleans()),
    st.builds(LinearWithWarmupScheduler, warmups, multipliers, multipliers, maxima, st.booleans()),
    st.builds(CosineAnnealingWithWarmupScheduler, warmups, maxima, multipliers, st.booleans()),
)

added_schedules = st.one_of(
    st.builds(StepScheduler, periods, fractions),
    st.builds(MultiStepScheduler, milestone_lists, fractions),
    st.builds(ExponentialScheduler, fractions, periods),
    st.builds(CosineAnnealingWarmRestartsScheduler, periods, growths, multipliers),
    st.builds(PolynomialScheduler, powers, maxima, multipliers),
    st.builds(MultiStepWithWarmupScheduler, warmups, milestone_lists, fractions, st.booleans()),
    st.builds(PolynomialWithWarmupScheduler, warmups, powers, maxima, multipliers, st.booleans()),
)


def _resolve_or_reject(
    draw_schedule: st.DataObject,
    steps_per_epoch: int,
    max_steps: int,
    ratio: float,
    among: st.SearchStrategy[object] = schedules,
) -> tuple[object, ScheduleFn]:
    try:
        schedule = draw_schedule.draw(among)
        fn = schedule.resolve(
            steps_per_epoch=steps_per_epoch, max_steps=max_steps, scale_schedule_ratio=ratio
        )
    except ValueError:
        # Warmups longer than t_max, and anneals over 0 steps, are rejected by design.
        assume(False)
        raise
    return schedule, fn


@settings(deadline=None, max_examples=150)
@given(st.data(), st.integers(1, 20), st.integers(1, 300), st.sampled_from([1.0, 1.0, 0.5, 1.7]))
def test_host_and_tensor_paths_agree_at_every_step(
    data: st.DataObject, steps_per_epoch: int, max_steps: int, ratio: float
) -> None:
    _, fn = _resolve_or_reject(data, steps_per_epoch, max_steps, ratio)
    steps = range(0, max_steps + 2 * steps_per_epoch + 1)
    host = torch.tensor([fn(step) for step in steps], dtype=torch.float64)
    for dtype in (torch.int64, torch.int32):
        traced = fn(torch.arange(len(steps), dtype=dtype))
        assert isinstance(traced, torch.Tensor) and traced.dtype == torch.float32
        assert torch.allclose(traced.double(), host, rtol=0.0, atol=1e-6)
    last = fn(torch.tensor(steps[-1]))
    assert isinstance(last, torch.Tensor) and last.shape == ()
    assert abs(last.item() - host[-1].item()) <= 1e-6


@settings(deadline=None, max_examples=150)
@given(st.data(), st.integers(1, 20), st.integers(1, 300), st.sampled_from([1.0, 1.0, 0.5, 1.7]))
def test_host_and_tensor_paths_agree_at_every_step_for_the_decay_and_restart_schedules(
    data: st.DataObject, steps_per_epoch: int, max_steps: int, ratio: float
) -> None:
    _, fn = _resolve_or_reject(data, steps_per_epoch, max_steps, ratio, added_schedules)
    steps = range(0, max_steps + 2 * steps_per_epoch + 1)
    host = torch.tensor([fn(step) for step in steps], dtype=torch.float64)
    for dtype in (torch.int64, torch.int32):
        traced = fn(torch.arange(len(steps), dtype=dtype))
        assert isinstance(traced, torch.Tensor) and traced.dtype == torch.float32
        assert torch.allclose(traced.double(), host, rtol=0.0, atol=1e-6)
    for step in (0, steps[-1]):
        single = fn(torch.tensor(step))
        assert isinstance(single, torch.Tensor) and single.shape == ()
        assert abs(single.item() - host[step].item()) <= 1e-6


@settings(deadline=None)
@given(st.data(), st.integers(1, 20), st.integers(1, 300), st.booleans())
def test_multipliers_stay_between_zero_and_the_largest_hyperparameter(
    data: st.DataObject, steps_per_epoch: int, max_steps: int, added: bool
) -> None:
    among = added_schedules if added else schedules
    schedule, fn = _resolve_or_reject(data, steps_per_epoch, max_steps, 1.0, among)
    ceiling = max([1.0] + [value for value in vars(schedule).values() if isinstance(value, float)])
    for step in range(max_steps + 1):
        assert 0.0 <= fn(step) <= ceiling + 1e-12


@settings(deadline=None)
@given(fractions, fractions, maxima, st.integers(1, 20), st.integers(1, 300))
def test_decaying_schedules_never_increase(
    high: float, low: float, t_max: str, steps_per_epoch: int, max_steps: int
) -> None:
    low, high = min(low, high), max(low, high)
    for schedule in (
        LinearScheduler(alpha_i=high, alpha_f=low, t_max=t_max),
        CosineAnnealingScheduler(t_max, low),
    ):
        try:
            fn = schedule.resolve(steps_per_epoch=steps_per_epoch, max_steps=max_steps)
        except ValueError:
            assume(False)
            raise
        values = [fn(step) for step in range(max_steps + 5)]
        assert all(later <= earlier for earlier, later in zip(values, values[1:], strict=False))


@settings(deadline=None)
@given(warmups, maxima, fractions, st.integers(1, 20), st.integers(1, 300))
def test_warmup_rises_to_its_peak_and_cosine_then_decays(
    t_warmup: str, t_max: str, alpha_f: float, steps_per_epoch: int, max_steps: int
) -> None:
    try:
        schedule = CosineAnnealingWithWarmupScheduler(t_warmup, t_max, alpha_f)
        fn = schedule.resolve(steps_per_epoch=steps_per_epoch, max_steps=max_steps)
    except ValueError:
        assume(False)
        raise
    warmup_steps = Time.from_timestring(t_warmup)
    peak_step = {"ba": warmup_steps.value, "ep": warmup_steps.value * steps_per_epoch}.get(
        warmup_steps.unit.value, round(warmup_steps.value * max_steps)
    )
    values = [fn(step) for step in range(max_steps + 5)]
    rising, falling = values[: int(peak_step) + 1], values[int(peak_step) :]
    assert all(later >= earlier for earlier, later in zip(rising, rising[1:], strict=False))
    assert all(later <= earlier for earlier, later in zip(falling, falling[1:], strict=False))
    assert values[0] == (0.0 if peak_step > 0 else 1.0)
    if peak_step < len(values):
        assert values[int(peak_step)] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule",
    [
        ConstantScheduler(alpha=0.5, t_max="0.5dur"),
        LinearScheduler(),
        CosineAnnealingScheduler(alpha_f=0.1),
        ConstantWithWarmupScheduler(t_warmup="10ba", alpha=0.5),
        LinearWithWarmupScheduler(t_warmup="1ep"),
        CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur"),
        StepScheduler(step_size="2ep"),
        MultiStepScheduler(milestones=("3ep", "60ba", "0.9dur"), gamma=0.5),
        ExponentialScheduler(gamma=0.5),
        CosineAnnealingWarmRestartsScheduler(t_0="2ep"),
        CosineAnnealingWarmRestartsScheduler(t_0="4ba", t_mult=1.5, alpha_f=0.1),
        PolynomialScheduler(power=2.0),
        MultiStepWithWarmupScheduler(t_warmup="10ba", milestones=("5ep", "0.8dur")),
        PolynomialWithWarmupScheduler(t_warmup="1ep"),
    ],
)
def test_a_resolved_schedule_compiles_without_graph_breaks(schedule: object) -> None:
    fn = resolved(schedule)
    # Every case shares the code object of `learning_rate`; a fresh cache keeps each within the recompile limit.
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="eager")
    def learning_rate(step: torch.Tensor) -> torch.Tensor:
        multiplier = fn(step)
        assert isinstance(multiplier, torch.Tensor)
        return 0.1 * multiplier

    for step in (0, 7, 55, 100, 140):
        compiled = learning_rate(torch.tensor(step, dtype=torch.int64))
        assert compiled.shape == ()
        assert compiled.item() == pytest.approx(0.1 * fn(step), abs=1e-7)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ConstantScheduler(alpha=-0.5), "alpha=-0.5"),
        (lambda: LinearScheduler(alpha_f=float("nan")), "alpha_f=nan"),
        (lambda: CosineAnnealingScheduler(alpha_f=-1.0), "alpha_f=-1.0"),
        (lambda: LinearScheduler(t_max="100sp"), "t_max='100sp' must be a time string in ba, ep, dur"),
        (lambda: CosineAnnealingScheduler(t_max="10 epochs"), "t_max='10 epochs' must be a time string"),
        (lambda: LinearWithWarmupScheduler(t_warmup="20ba", t_max="10ba"), "t_warmup='20ba'.*t_max='10ba'"),
        (lambda: CosineAnnealingWithWarmupScheduler(t_warmup="1.5dur"), "t_warmup='1.5dur'"),
        (lambda: ConstantWithWarmupScheduler(t_warmup="1tok"), "t_warmup='1tok'"),
        (lambda: StepScheduler(step_size="10sp"), "step_size='10sp' must be a time string in ba, ep, dur"),
        (lambda: StepScheduler(step_size="1ep", gamma=-0.1), "gamma=-0.1 must be a finite number >= 0"),
        (lambda: MultiStepScheduler(milestones=["10ba", "3tok"]), r"milestones\[1\]='3tok'"),
        (lambda: MultiStepScheduler(milestones=["10ba"], gamma=float("nan")), "gamma=nan"),
        (lambda: ExponentialScheduler(gamma=float("inf")), "gamma=inf"),
        (lambda: ExponentialScheduler(gamma=0.5, decay_period="1sp"), "decay_period='1sp'"),
        (lambda: CosineAnnealingWarmRestartsScheduler(t_0="1tok"), "t_0='1tok'"),
        (
            lambda: CosineAnnealingWarmRestartsScheduler(t_0="10ba", t_mult=0.5),
            "t_mult=0.5 must be a finite number >= 1",
        ),
        (lambda: CosineAnnealingWarmRestartsScheduler(t_0="10ba", alpha_f=-1), "alpha_f=-1"),
        (lambda: PolynomialScheduler(power=-1.0), "power=-1.0 must be a finite number >= 0"),
        (lambda: PolynomialScheduler(power=2.0, t_max="2sp"), "t_max='2sp'"),
        (lambda: PolynomialWithWarmupScheduler(t_warmup="2ep", t_max="1ep"), "t_warmup='2ep'.*t_max='1ep'"),
        (lambda: PolynomialWithWarmupScheduler(t_warmup="1ba", power=float("inf")), "power=inf"),
        (lambda: MultiStepWithWarmupScheduler(t_warmup="1tok", milestones=[]), "t_warmup='1tok'"),
        (lambda: MultiStepWithWarmupScheduler(t_warmup="1ba", milestones=["1sp"]), r"milestones\[0\]='1sp'"),
        (lambda: MultiStepWithWarmupScheduler(t_warmup="1ba", milestones=[], gamma=-2.0), "gamma=-2.0"),
    ],
)
def test_bad_hyperparameters_raise_value_errors_naming_them(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_bad_hyperparameter_types_raise_type_errors() -> None:
    with pytest.raises(TypeError, match="t_max must be a Time or a time string.* 100"):
        LinearScheduler(t_max=100)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="alpha must be a real number.*'1'"):
        ConstantScheduler(alpha="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scale_warmup=1"):
        LinearWithWarmupScheduler(t_warmup="1ba", scale_warmup=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="milestones must be a list or tuple.*'10ba'"):
        MultiStepScheduler(milestones="10ba")
    with pytest.raises(TypeError, match="gamma must be a real number.*'0.1'"):
        StepScheduler(step_size="1ep", gamma="0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scale_warmup=0"):
        MultiStepWithWarmupScheduler(t_warmup="1ba", milestones=[], scale_warmup=0)  # type: ignore[arg-type]


def test_problems_only_visible_in_steps_are_reported_at_resolve() -> None:
    with pytest.raises(ValueError, match="t_warmup='2ep' resolves to 20 steps.*t_max='0.1dur'"):
        resolved(CosineAnnealingWithWarmupScheduler(t_warmup="2ep", t_max="0.1dur"))
    with pytest.raises(ValueError, match="t_max='0.001dur' resolves to 0 steps"):
        resolved(LinearScheduler(t_max="0.001dur"))
    with pytest.raises(ValueError, match="scale_schedule_ratio=0"):
        resolved(LinearScheduler(), scale_schedule_ratio=0)
    with pytest.raises(ValueError, match="max_steps=-1"):
        LinearScheduler(t_max="10ba").resolve(steps_per_epoch=1, max_steps=-1)
    with pytest.raises(ValueError, match="step_size='0ba' resolves to 0 steps"):
        resolved(StepScheduler(step_size="0ba"))
    with pytest.raises(ValueError, match="decay_period='1ep' resolves to 0 steps"):
        ExponentialScheduler(gamma=0.5).resolve(steps_per_epoch=0, max_steps=10)
    with pytest.raises(ValueError, match="t_0='1ba' resolves to 0 steps"):
        resolved(CosineAnnealingWarmRestartsScheduler(t_0="1ba"), scale_schedule_ratio=0.5)
    with pytest.raises(ValueError, match="t_max='0.001dur' resolves to 0 steps"):
        resolved(PolynomialScheduler(power=1.0, t_max="0.001dur"))
    with pytest.raises(ValueError, match="t_warmup='2ep' resolves to 20 steps.*t_max='0.1dur'"):
        resolved(PolynomialWithWarmupScheduler(t_warmup="2ep", t_max="0.1dur"))
    with pytest.raises(ValueError, match="scale_schedule_ratio=-1"):
        resolved(MultiStepWithWarmupScheduler(t_warmup="1ba", milestones=["1ep"]), scale_schedule_ratio=-1)
    # Intervals growing by about 0.1% each make 10,000 restarts long before step 10**12.
    with pytest.raises(ValueError, match="t_mult=1.0011 with t_0='1000ba' makes more than 10000"):
        CosineAnnealingWarmRestartsScheduler(t_0="1000ba", t_mult=1.0011).resolve(
            steps_per_epoch=10, max_steps=10**12
        )


def test_bad_steps_are_rejected() -> None:
    fn = resolved(CosineAnnealingScheduler())
    with pytest.raises(ValueError, match="step=-1"):
        fn(-1)
    with pytest.raises(TypeError, match="step=1.5"):
        fn(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="torch.float32"):
        fn(torch.tensor(1.0))


def test_schedules_are_hashable_records_whose_repr_round_trips() -> None:
    schedule = CosineAnnealingWithWarmupScheduler(t_warmup=Time.from_batch(10), alpha_f=0.1)
    namespace = {"CosineAnnealingWithWarmupScheduler": CosineAnnealingWithWarmupScheduler, "Time": Time}
    namespace["TimeUnit"] = type(Time.from_batch(1).unit)
    assert eval(repr(schedule), namespace) == schedule
    assert hash(schedule) == hash(
        CosineAnnealingWithWarmupScheduler(t_warmup=Time.from_batch(10), alpha_f=0.1)
    )


@pytest.mark.parametrize(
    "schedule",
    [
        StepScheduler(step_size="2ep", gamma=0.5),
        MultiStepScheduler(milestones=["30ep", Time.from_batch(600)], gamma=0.2),
        ExponentialScheduler(gamma=0.95, decay_period="10ba"),
        CosineAnnealingWarmRestartsScheduler(t_0="0.25dur", t_mult=2.0, alpha_f=0.05),
        PolynomialScheduler(power=1.5, t_max="90ep", alpha_f=0.01),
        MultiStepWithWarmupScheduler(t_warmup="1ep", milestones=("30ep", "60ep"), scale_warmup=True),
        PolynomialWithWarmupScheduler(t_warmup=Time.from_batch(10), power=3.0, alpha_f=0.1),
    ],
)
def test_added_schedules_are_hashable_records_whose_repr_round_trips(schedule: object) -> None:
    namespace = {type(schedule).__name__: type(schedule), "Time": Time}
    namespace["TimeUnit"] = type(Time.from_batch(1).unit)
    copy = eval(repr(schedule), namespace)
    assert copy == schedule and hash(copy) == hash(schedule)


def test_milestones_given_as_a_list_are_kept_as_a_tuple() -> None:
    schedule = MultiStepScheduler(milestones=["30ep", "60ep"])
    assert schedule.milestones == ("30ep", "60ep")
    assert schedule == MultiStepScheduler(milestones=("30ep", "60ep"))
