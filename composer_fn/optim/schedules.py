"""Learning-rate multiplier schedules: pure functions of the optimizer step, named after Composer's schedulers.

A schedule is a frozen record of hyperparameters. `resolve(steps_per_epoch=..., max_steps=...)` turns every
time (`'10ba'`, `'2ep'`, `'0.1dur'`) into a number of optimizer steps and returns a `ScheduleFn` (a
`composer_fn.optim.multipliers.Multiplier`): called on a Python int it returns a Python float; called on an
integer tensor (a 0-d step, or any shape for plotting) it returns a float32 tensor of the same shape, built from
torch ops only so that `torch.compile(fullgraph=True)` traces it without graph breaks. The host and tensor
results agree to 1e-6.

The multiplier scales the optimizer's base learning rate: `lr(step) = base_lr * schedule(step)`.

Every schedule is one record class: its docstring, its fields and how it resolves. What the classes share is
driven by field name: a field means the same in every schedule (`alpha_f` is always a final multiplier,
`t_warmup` always a linear warm-up from 0), so one table checks the fields, one resolver turns the times into
steps, and the warm-up + anneal family (linear, cosine and polynomial with or without a warm-up, constant with
one) is built by one factory.

Scale schedule ratio: as in Composer, the run's `max_duration` is multiplied by the ratio before `max_steps` is
computed, and `resolve(..., scale_schedule_ratio=r)` stretches every time given in ba or ep by the same `r`
(truncating to whole steps); times in dur are fractions of the already scaled `max_steps`. Warmups are stretched
only with `scale_warmup=True`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from torch import Tensor

from composer_fn.core.algorithm import UnfitForTheRun
from composer_fn.core.time import Time, TimeUnit, to_steps
from composer_fn.core.validate import flag, integer
from composer_fn.optim.arguments import real_number, step_time
from composer_fn.optim.multipliers import (
    RESTART_LIMIT,
    Anneal,
    Constant,
    Curve,
    Decay,
    Milestones,
    Multiplier,
    WarmRestarts,
    restart_intervals,
    warmed,
)

__all__ = [
    "ScheduleFn",
    "ConstantScheduler",
    "LinearScheduler",
    "CosineAnnealingScheduler",
    "ConstantWithWarmupScheduler",
    "LinearWithWarmupScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "StepScheduler",
    "MultiStepScheduler",
    "ExponentialScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "PolynomialScheduler",
    "MultiStepWithWarmupScheduler",
    "PolynomialWithWarmupScheduler",
]

ScheduleFn = Callable[[int | Tensor], float | Tensor]
"""A multiplier as a function of the optimizer step: int to float, integer tensor to float32 tensor."""


def _milestones(argument: str, value: object) -> tuple[Time | str, ...]:
    if not isinstance(value, list | tuple):
        raise TypeError(
            f"{argument} must be a list or tuple of times in ba, ep or dur such as ['30ep', '60ep'], "
            f"got {type(value).__name__} {value!r}"
        )
    for index, milestone in enumerate(value):
        step_time(f"{argument}[{index}]", milestone)
    return tuple(value)


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    **dict.fromkeys(
        ("alpha", "alpha_i", "alpha_f"), partial(real_number, minimum=0.0, hint="a learning-rate multiplier")
    ),
    **dict.fromkeys(("gamma", "power"), partial(real_number, minimum=0.0)),
    "t_mult": partial(real_number, minimum=1.0),
    **dict.fromkeys(("t_warmup", "t_max", "step_size", "decay_period", "t_0"), step_time),
    "milestones": _milestones,
    "scale_warmup": flag,
}
"""The check of every schedule field, by field name; each returns the value parsed (a Time for a time)."""


@dataclass(frozen=True)
class _Steps:
    """A schedule's times as optimizer steps, for a run of `max_steps` steps with `steps_per_epoch` per epoch."""

    schedule: _Schedule
    steps_per_epoch: int
    max_steps: int
    scale_schedule_ratio: float

    def given(self, name: str) -> Any:
        """Returns the schedule's field `name` as given."""
        return getattr(self.schedule, name)

    def has(self, name: str) -> bool:
        """Returns whether the schedule has a field `name`."""
        return hasattr(self.schedule, name)

    def _of(self, time: Time | str, *, stretched: bool = True) -> int:
        steps = to_steps(time, steps_per_epoch=self.steps_per_epoch, max_steps=self.max_steps)
        # A 'dur' time is already a fraction of the scaled max_steps; only absolute times are stretched,
        # truncating like Composer's _convert_time.
        if stretched and Time.from_input(time, TimeUnit.BATCH).unit is not TimeUnit.DURATION:
            steps = int(steps * self.scale_schedule_ratio)
        return steps

    def __call__(self, name: str) -> int:
        """Returns the steps of the time field `name`."""
        return self._of(self.given(name))

    def at_least_one(self, name: str, purpose: str) -> int:
        """Returns the steps of the time field `name`; raises ValueError when they are 0."""
        steps = self(name)
        if steps == 0:
            raise ValueError(
                f"{name}={self.given(name)!r} resolves to 0 steps (steps_per_epoch={self.steps_per_epoch}, "
                f"max_steps={self.max_steps}, scale_schedule_ratio={self.scale_schedule_ratio}); "
                f"expected at least 1 step {purpose}"
            )
        return steps

    def each(self, name: str) -> tuple[int, ...]:
        """Returns the steps of every time in the field `name` (the milestones)."""
        return tuple(self._of(time) for time in self.given(name))

    def warmup(self) -> int:
        """Returns the steps of `t_warmup` (0 without one), stretched only with `scale_warmup=True`."""
        if not self.has("t_warmup"):
            return 0
        return self._of(self.given("t_warmup"), stretched=self.given("scale_warmup"))


@dataclass(frozen=True)
class _Schedule:
    """What every schedule shares: its fields checked by name at construction, and `resolve`."""

    def __post_init__(self) -> None:
        given = {field.name: getattr(self, field.name) for field in fields(self)}
        checked = {name: _CHECKS[name](name, value) for name, value in given.items()}
        if "milestones" in checked:
            # A list is kept as a tuple so that the record stays hashable.
            object.__setattr__(self, "milestones", checked["milestones"])
        if "t_warmup" in checked and "t_max" in checked:
            warmup, duration = checked["t_warmup"], checked["t_max"]
            if warmup.unit is duration.unit and warmup.value > duration.value:
                raise ValueError(
                    f"t_warmup={given['t_warmup']!r} is longer than t_max={given['t_max']!r}; "
                    "expected t_warmup <= t_max"
                )

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Returns the multiplier as a function of the optimizer step.

        `max_steps` is the run's length in steps, computed from `max_duration` after the trainer has scaled it
        by `scale_schedule_ratio`; the same ratio stretches times given in ba or ep, as Composer does.
        """
        steps = _Steps(
            self,
            integer("steps_per_epoch", steps_per_epoch, minimum=0),
            integer("max_steps", max_steps, minimum=0),
            real_number("scale_schedule_ratio", scale_schedule_ratio, minimum=0.0, open_below=True),
        )
        if steps.warmup() > steps.max_steps:
            warnings.warn(
                UnfitForTheRun(
                    f"{type(self).__name__}(t_warmup={steps.given('t_warmup')!r}) warms up over {steps.warmup()} steps, and "
                    f"the whole run is {steps.max_steps}: the learning rate never reaches its peak; a warm-up of a "
                    f"tenth of the run reaches it (t_warmup='0.1dur', {max(1, steps.max_steps // 10)} steps)",
                    type(self).__name__,
                ),
                stacklevel=2,
            )
        return self._multiplier(steps)

    def _multiplier(self, steps: _Steps) -> Multiplier:
        raise NotImplementedError


def _warmup_anneal(
    curve: Curve, alpha_i: float, alpha_f: float, steps: _Steps, power: float = 1.0
) -> Multiplier:
    """Returns a linear warm-up from 0 to `alpha_i` over `t_warmup`, then `curve` from `alpha_i` to `alpha_f`.

    The anneal runs from the end of the warm-up to `t_max`; a schedule without `t_warmup` anneals from step 0,
    over at least one step.
    """
    alpha_i, alpha_f, power = float(alpha_i), float(alpha_f), float(power)
    if not steps.has("t_warmup"):
        return Anneal(curve, alpha_i, alpha_f, 0, steps.at_least_one("t_max", "to anneal over"), power)
    warmup, end = steps.warmup(), steps("t_max")
    if warmup > end:
        raise ValueError(
            f"t_warmup={steps.given('t_warmup')!r} resolves to {warmup} steps, more than the {end} of "
            f"t_max={steps.given('t_max')!r} (steps_per_epoch={steps.steps_per_epoch}, "
            f"max_steps={steps.max_steps}); expected t_warmup <= t_max"
        )
    return warmed(alpha_i, warmup, Anneal(curve, alpha_i, alpha_f, warmup, end, power))


@dataclass(frozen=True)
class ConstantScheduler(_Schedule):
    """Multiplier `alpha` before `t_max` and 1.0 from `t_max` on (Composer's `ConstantScheduler`).

    Args:
        alpha: multiplier held while the schedule is active, >= 0.
        t_max: how long it is active, in ba, ep or dur.
    """

    alpha: float = 1.0
    t_max: Time | str = "1dur"

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return Constant(float(self.alpha), steps("t_max"))


@dataclass(frozen=True)
class LinearScheduler(_Schedule):
    """Multiplier going linearly from `alpha_i` at step 0 to `alpha_f` at `t_max`, then `alpha_f`.

    `alpha(t) = alpha_i + (alpha_f - alpha_i) * min(1, t / t_max)` (Composer's `LinearScheduler`).

    Args:
        alpha_i: initial multiplier, >= 0.
        alpha_f: final multiplier, >= 0.
        t_max: length of the ramp, in ba, ep or dur; must resolve to at least one step.
    """

    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: Time | str = "1dur"

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("linear", self.alpha_i, self.alpha_f, steps)


@dataclass(frozen=True)
class CosineAnnealingScheduler(_Schedule):
    """Multiplier following half a cosine from 1.0 at step 0 down to `alpha_f` at `t_max`, then `alpha_f`.

    `alpha(t) = alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2` with `tau = min(1, t / t_max)`
    (Composer's `CosineAnnealingScheduler`).

    Args:
        t_max: length of the decay, in ba, ep or dur; must resolve to at least one step.
        alpha_f: final multiplier, >= 0.
    """

    t_max: Time | str = "1dur"
    alpha_f: float = 0.0

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("cosine", 1.0, self.alpha_f, steps)


@dataclass(frozen=True)
class ConstantWithWarmupScheduler(_Schedule):
    """Multiplier rising linearly from 0 to `alpha` over `t_warmup` (`alpha * t / t_warmup`), then `alpha`.

    As in Composer's `ConstantWithWarmupScheduler` (a linear-with-warmup schedule from `alpha` to `alpha`), the
    multiplier stays `alpha` after `t_max`; `t_max` bounds the warmup.

    Args:
        t_warmup: warmup length, in ba, ep or dur.
        alpha: multiplier after warmup, >= 0.
        t_max: duration of the schedule, in ba, ep or dur.
        scale_warmup: whether a scale-schedule ratio also stretches the warmup.
    """

    t_warmup: Time | str
    alpha: float = 1.0
    t_max: Time | str = "1dur"
    scale_warmup: bool = False

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("linear", self.alpha, self.alpha, steps)


@dataclass(frozen=True)
class LinearWithWarmupScheduler(_Schedule):
    """Multiplier rising linearly from 0 to `alpha_i` over `t_warmup`, then going linearly to `alpha_f` at `t_max`.

    During warmup (`t < t_warmup`) `alpha(t) = alpha_i * t / t_warmup`; after it
    `alpha(t) = alpha_i + (alpha_f - alpha_i) * tau` with `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)`
    (Composer's `LinearWithWarmupScheduler`).

    Args:
        t_warmup: warmup length, in ba, ep or dur.
        alpha_i: multiplier at the end of warmup, >= 0.
        alpha_f: final multiplier, >= 0.
        t_max: step at which `alpha_f` is reached, in ba, ep or dur.
        scale_warmup: whether a scale-schedule ratio also stretches the warmup.
    """

    t_warmup: Time | str
    alpha_i: float = 1.0
    alpha_f: float = 0.0
    t_max: Time | str = "1dur"
    scale_warmup: bool = False

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("linear", self.alpha_i, self.alpha_f, steps)


@dataclass(frozen=True)
class CosineAnnealingWithWarmupScheduler(_Schedule):
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then half a cosine down to `alpha_f` at `t_max`.

    During warmup (`t < t_warmup`) `alpha(t) = t / t_warmup`; after it
    `alpha(t) = alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2` with
    `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)` (Composer's `CosineAnnealingWithWarmupScheduler`).

    Args:
        t_warmup: warmup length, in ba, ep or dur.
        t_max: step at which `alpha_f` is reached, in ba, ep or dur.
        alpha_f: final multiplier, >= 0.
        scale_warmup: whether a scale-schedule ratio also stretches the warmup.
    """

    t_warmup: Time | str
    t_max: Time | str = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("cosine", 1.0, self.alpha_f, steps)


@dataclass(frozen=True)
class StepScheduler(_Schedule):
    """Multiplier `gamma ** floor(t / step_size)`: decayed by `gamma` every `step_size` (Composer's `StepScheduler`).

    Args:
        step_size: time between decays, in ba, ep or dur; must resolve to at least one step.
        gamma: decay factor, >= 0.
    """

    step_size: Time | str
    gamma: float = 0.1

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return Decay(float(self.gamma), steps.at_least_one("step_size", "between decays"), staircase=True)


@dataclass(frozen=True)
class MultiStepScheduler(_Schedule):
    """Multiplier `gamma ** k`, `k` the number of milestones at or before `t` (Composer's `MultiStepScheduler`).

    Milestones may come in any order; a list is stored as a tuple so that the record stays hashable.

    Args:
        milestones: times at which the multiplier is multiplied by `gamma`, each in ba, ep or dur.
        gamma: decay factor, >= 0.
    """

    milestones: Sequence[Time | str]
    gamma: float = 0.1

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return Milestones(float(self.gamma), steps.each("milestones"))


@dataclass(frozen=True)
class ExponentialScheduler(_Schedule):
    """Multiplier `gamma ** (t / decay_period)`, decaying continuously (Composer's `ExponentialScheduler`).

    Args:
        gamma: factor the multiplier is multiplied by over each `decay_period`, >= 0.
        decay_period: time over which the multiplier falls by `gamma`, in ba, ep or dur; must resolve to at
            least one step.
    """

    gamma: float
    decay_period: Time | str = "1ep"

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return Decay(
            float(self.gamma), steps.at_least_one("decay_period", "per decay period"), staircase=False
        )


@dataclass(frozen=True)
class CosineAnnealingWarmRestartsScheduler(_Schedule):
    """Multiplier annealed by half a cosine from 1.0 to `alpha_f` over each interval, restarting at 1.0.

    Within an interval of length `L` that started at `s`,
    `alpha(t) = alpha_f + (1 - alpha_f) * (1 + cos(pi * (t - s) / L)) / 2`. The first interval lasts `t_0`
    and each next one `int(t_mult * L)` steps, truncated as in Composer's `CosineAnnealingWarmRestartsScheduler`.

    Composer accepts `t_mult < 1`, but then the intervals shrink to 0 steps and it raises in the middle of the
    run; here it is rejected up front. Once the length stops growing every later interval has that length;
    past 10,000 growing intervals (or step 2**53) the last one repeats, and `resolve` raises if the run gets
    there.

    Args:
        t_0: length of the first interval, in ba, ep or dur; must resolve to at least one step.
        t_mult: growth factor of the interval lengths, >= 1.
        alpha_f: multiplier approached at the end of each interval, >= 0.
    """

    t_0: Time | str
    t_mult: float = 1.0
    alpha_f: float = 0.0

    def _multiplier(self, steps: _Steps) -> Multiplier:
        t_mult = float(self.t_mult)
        starts, lengths = restart_intervals(steps.at_least_one("t_0", "in the first interval"), t_mult)
        still_growing = int(t_mult * lengths[-1]) != lengths[-1]
        if still_growing and starts[-1] + lengths[-1] < steps.max_steps:
            raise ValueError(
                f"t_mult={self.t_mult!r} with t_0={self.t_0!r} makes more than {RESTART_LIMIT} growing restart "
                f"intervals within max_steps={steps.max_steps}; expected a larger t_0 or t_mult, or t_mult=1"
            )
        return WarmRestarts(float(self.alpha_f), starts, lengths)


@dataclass(frozen=True)
class PolynomialScheduler(_Schedule):
    """Multiplier `alpha_f + (1 - alpha_f) * (1 - tau) ** power` with `tau = min(1, t / t_max)`.

    Composer's `PolynomialScheduler`; after `t_max` the multiplier stays `alpha_f`.

    Args:
        power: exponent of the decay, >= 0.
        t_max: length of the decay, in ba, ep or dur; must resolve to at least one step.
        alpha_f: final multiplier, >= 0.
    """

    power: float
    t_max: Time | str = "1dur"
    alpha_f: float = 0.0

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("polynomial", 1.0, self.alpha_f, steps, self.power)


@dataclass(frozen=True)
class MultiStepWithWarmupScheduler(_Schedule):
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then `gamma ** k` as in `MultiStepScheduler`.

    `k` counts the milestones at or before `t`, measured from step 0, so a milestone inside the warmup applies
    from the end of the warmup on (Composer's `MultiStepWithWarmupScheduler`). During warmup (`t < t_warmup`)
    the multiplier is `t / t_warmup`.

    Args:
        t_warmup: warmup length, in ba, ep or dur.
        milestones: times at which the multiplier is multiplied by `gamma`, each in ba, ep or dur.
        gamma: decay factor, >= 0.
        scale_warmup: whether a scale-schedule ratio also stretches the warmup.
    """

    t_warmup: Time | str
    milestones: Sequence[Time | str]
    gamma: float = 0.1
    scale_warmup: bool = False

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return warmed(1.0, steps.warmup(), Milestones(float(self.gamma), steps.each("milestones")))


@dataclass(frozen=True)
class PolynomialWithWarmupScheduler(_Schedule):
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then a polynomial decay to `alpha_f` at `t_max`.

    During warmup (`t < t_warmup`) `alpha(t) = t / t_warmup`; after it
    `alpha(t) = alpha_f + (1 - alpha_f) * (1 - tau) ** power` with
    `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)` (Composer's `PolynomialWithWarmupScheduler`).

    Args:
        t_warmup: warmup length, in ba, ep or dur.
        power: exponent of the decay, >= 0.
        t_max: step at which `alpha_f` is reached, in ba, ep or dur.
        alpha_f: final multiplier, >= 0.
        scale_warmup: whether a scale-schedule ratio also stretches the warmup.
    """

    t_warmup: Time | str
    power: float = 2.0
    t_max: Time | str = "1dur"
    alpha_f: float = 0.0
    scale_warmup: bool = False

    def _multiplier(self, steps: _Steps) -> Multiplier:
        return _warmup_anneal("polynomial", 1.0, self.alpha_f, steps, self.power)
