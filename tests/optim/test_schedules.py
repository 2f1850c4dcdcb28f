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
    CosineAnnealingWithWarmupScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    ScheduleFn,
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

schedules = st.one_of(
    st.builds(ConstantScheduler, multipliers, maxima),
    st.builds(LinearScheduler, multipliers, multipliers, maxima),
    st.builds(CosineAnnealingScheduler, maxima, multipliers),
    st.builds(ConstantWithWarmupScheduler, warmups, multipliers, maxima, st.booleans()),
    st.builds(LinearWithWarmupScheduler, warmups, multipliers, multipliers, maxima, st.booleans()),
    st.builds(CosineAnnealingWithWarmupScheduler, warmups, maxima, multipliers, st.booleans()),
)


def _resolve_or_reject(
    draw_schedule: st.DataObject, steps_per_epoch: int, max_steps: int, ratio: float
) -> tuple[object, ScheduleFn]:
    try:
        schedule = draw_schedule.draw(schedules)
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


@settings(deadline=None)
@given(st.data(), st.integers(1, 20), st.integers(1, 300))
def test_multipliers_stay_between_zero_and_the_largest_hyperparameter(
    data: st.DataObject, steps_per_epoch: int, max_steps: int
) -> None:
    schedule, fn = _resolve_or_reject(data, steps_per_epoch, max_steps, 1.0)
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
    ],
)
def test_a_resolved_schedule_compiles_without_graph_breaks(schedule: object) -> None:
    fn = resolved(schedule)

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
        (lambda: LinearScheduler(t_max="100sp"), "t_max='100sp'.*expected ba, ep or dur"),
        (lambda: CosineAnnealingScheduler(t_max="10 epochs"), "'10 epochs' is not a time string"),
        (lambda: LinearWithWarmupScheduler(t_warmup="20ba", t_max="10ba"), "t_warmup='20ba'.*t_max='10ba'"),
        (lambda: CosineAnnealingWithWarmupScheduler(t_warmup="1.5dur"), "t_warmup='1.5dur'"),
        (lambda: ConstantWithWarmupScheduler(t_warmup="1tok"), "t_warmup='1tok'"),
    ],
)
def test_bad_hyperparameters_raise_value_errors_naming_them(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_bad_hyperparameter_types_raise_type_errors() -> None:
    with pytest.raises(TypeError, match="t_max=100"):
        LinearScheduler(t_max=100)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="alpha='1'"):
        ConstantScheduler(alpha="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="scale_warmup=1"):
        LinearWithWarmupScheduler(t_warmup="1ba", scale_warmup=1)  # type: ignore[arg-type]


def test_problems_only_visible_in_steps_are_reported_at_resolve() -> None:
    with pytest.raises(ValueError, match="t_warmup='2ep' resolves to 20 steps.*t_max='0.1dur'"):
        resolved(CosineAnnealingWithWarmupScheduler(t_warmup="2ep", t_max="0.1dur"))
    with pytest.raises(ValueError, match="t_max='0.001dur' resolves to 0 steps"):
        resolved(LinearScheduler(t_max="0.001dur"))
    with pytest.raises(ValueError, match="scale_schedule_ratio=0"):
        resolved(LinearScheduler(), scale_schedule_ratio=0)
    with pytest.raises(ValueError, match="max_steps=-1"):
        LinearScheduler(t_max="10ba").resolve(steps_per_epoch=1, max_steps=-1)


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
