"""Learning-rate multiplier schedules: pure functions of the optimizer step, named after Composer's schedulers.

A schedule is a frozen record of hyperparameters. `resolve(steps_per_epoch=..., max_steps=...)` turns every
time (`'10ba'`, `'2ep'`, `'0.1dur'`) into a number of optimizer steps and returns a `ScheduleFn`: called on a
Python int it returns a Python float; called on an integer tensor (a 0-d step, or any shape for plotting) it
returns a float32 tensor of the same shape, built from torch ops only so that `torch.compile(fullgraph=True)`
traces it without graph breaks. The host and tensor results agree to 1e-6.

The multiplier scales the optimizer's base learning rate: `lr(step) = base_lr * schedule(step)`.

Scale schedule ratio: as in Composer, the run's `max_duration` is multiplied by the ratio before `max_steps` is
computed, and `resolve(..., scale_schedule_ratio=r)` stretches every time given in ba or ep by the same `r`
(truncating to whole steps); times in dur are fractions of the already scaled `max_steps`. Warmups are stretched
only with `scale_warmup=True`.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from composer_fn.core.time import Time, TimeUnit, to_steps

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

_STEP_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.DURATION)


def _check_time(name: str, value: object) -> Time:
    if not isinstance(value, (Time, str)):
        raise TypeError(
            f"{name}={value!r} ({type(value).__name__}) is not a time; expected a Time or a time string "
            "in ba, ep or dur such as '100ba', '2ep', '0.1dur'"
        )
    time = Time.from_input(value, TimeUnit.BATCH)
    if time.unit not in _STEP_UNITS:
        raise ValueError(f"{name}={value!r} is in {time.unit.value!r}; expected ba, ep or dur")
    return time


def _check_multiplier(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} ({type(value).__name__}) is not a number; expected a float >= 0")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} is not a learning-rate multiplier; expected a finite float >= 0")


def _check_real(name: str, value: object, *, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name}={value!r} ({type(value).__name__}) is not a number; expected a finite float >= {minimum:g}"
        )
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name}={value!r} is out of range; expected a finite float >= {minimum:g}")


def _check_milestones(milestones: object) -> tuple[Time | str, ...]:
    if isinstance(milestones, (str, Time)) or not isinstance(milestones, (list, tuple)):
        raise TypeError(
            f"milestones={milestones!r} ({type(milestones).__name__}) is not a sequence of times; "
            "expected a list or tuple of times in ba, ep or dur such as ['30ep', '60ep']"
        )
    for index, milestone in enumerate(milestones):
        _check_time(f"milestones[{index}]", milestone)
    return tuple(milestones)


def _check_scale_warmup(scale_warmup: object) -> None:
    if not isinstance(scale_warmup, bool):
        raise TypeError(f"scale_warmup={scale_warmup!r} is not a bool; expected True or False")


def _check_warmup(t_warmup: object, t_max: object, scale_warmup: object) -> None:
    warmup = _check_time("t_warmup", t_warmup)
    duration = _check_time("t_max", t_max)
    _check_scale_warmup(scale_warmup)
    if warmup.unit is duration.unit and warmup.value > duration.value:
        raise ValueError(f"t_warmup={t_warmup!r} is longer than t_max={t_max!r}; expected t_warmup <= t_max")


def _resolve_steps(
    time: Time | str, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float
) -> int:
    steps = to_steps(time, steps_per_epoch=steps_per_epoch, max_steps=max_steps)
    # A 'dur' time is already a fraction of the scaled max_steps; only absolute times are stretched,
    # truncating like Composer's _convert_time.
    if Time.from_input(time, TimeUnit.BATCH).unit is not TimeUnit.DURATION:
        steps = int(steps * scale_schedule_ratio)
    return steps


def _check_ratio(scale_schedule_ratio: float) -> None:
    if isinstance(scale_schedule_ratio, bool) or not isinstance(scale_schedule_ratio, (int, float)):
        raise TypeError(
            f"scale_schedule_ratio={scale_schedule_ratio!r} ({type(scale_schedule_ratio).__name__}) is not a "
            "number; expected a finite number > 0"
        )
    if not math.isfinite(scale_schedule_ratio) or scale_schedule_ratio <= 0:
        raise ValueError(
            f"scale_schedule_ratio={scale_schedule_ratio!r} is not a ratio; expected a finite number > 0"
        )


def _resolve_nonzero_steps(
    name: str,
    time: Time | str,
    *,
    purpose: str,
    steps_per_epoch: int,
    max_steps: int,
    scale_schedule_ratio: float,
) -> int:
    _check_ratio(scale_schedule_ratio)
    steps = _resolve_steps(
        time, steps_per_epoch=steps_per_epoch, max_steps=max_steps, scale_schedule_ratio=scale_schedule_ratio
    )
    if steps == 0:
        raise ValueError(
            f"{name}={time!r} resolves to 0 steps (steps_per_epoch={steps_per_epoch}, max_steps={max_steps}, "
            f"scale_schedule_ratio={scale_schedule_ratio}); expected at least 1 step {purpose}"
        )
    return steps


def _host_power(gamma: float, exponent: float) -> float:
    try:
        return gamma**exponent
    except OverflowError:
        # A growing schedule (gamma > 1) saturates at inf, as the tensor path does, instead of raising.
        return math.inf


def _host_step(step: int) -> int:
    if isinstance(step, bool):
        raise TypeError("step=True/False is a bool; expected an int >= 0 or an integer tensor")
    try:
        index = operator.index(step)
    except TypeError:
        raise TypeError(
            f"step={step!r} ({type(step).__name__}) is not a step; expected an int >= 0 or an integer tensor"
        ) from None
    if index < 0:
        raise ValueError(f"step={index} is negative; expected an int >= 0")
    return index


def _tensor_step(step: Tensor) -> Tensor:
    if step.dtype.is_floating_point or step.dtype.is_complex or step.dtype == torch.bool:
        raise TypeError(f"step has dtype {step.dtype}; expected an integer tensor such as torch.int64")
    # float64 keeps the tensor path within float32 rounding of the host path at any realistic step.
    return step.to(torch.float64)


@dataclass(frozen=True)
class _StepConstant:
    """`alpha` for steps before `t_max`, 1.0 from `t_max` on."""

    alpha: float
    t_max: int

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            alpha = torch.full_like(position, self.alpha)
            return torch.where(position < self.t_max, alpha, torch.ones_like(position)).to(torch.float32)
        return self.alpha if _host_step(step) < self.t_max else 1.0


_Curve = Literal["linear", "cosine", "polynomial"]


@dataclass(frozen=True)
class _StepAnneal:
    """A linear warmup from 0 to `alpha_i` over `t_warmup` steps, then `alpha_i` annealed to `alpha_f` by `t_max`.

    The annealing fraction is `(step - t_warmup) / (t_max - t_warmup)` clamped to [0, 1], and 0 when
    `t_max == t_warmup`, as in Composer. The polynomial curve is `(1 - tau) ** power`.
    """

    curve: _Curve
    alpha_i: float
    alpha_f: float
    t_warmup: int
    t_max: int
    power: float = 1.0

    def _anneal_host(self, step: int) -> float:
        span = self.t_max - self.t_warmup
        tau = min(1.0, max(0.0, (step - self.t_warmup) / span)) if span > 0 else 0.0
        if self.curve == "linear":
            return self.alpha_i + tau * (self.alpha_f - self.alpha_i)
        if self.curve == "polynomial":
            return self.alpha_f + (self.alpha_i - self.alpha_f) * (1.0 - tau) ** self.power
        return self.alpha_f + (self.alpha_i - self.alpha_f) * (1.0 + math.cos(math.pi * tau)) / 2.0

    def _anneal_tensor(self, position: Tensor) -> Tensor:
        span = self.t_max - self.t_warmup
        if span > 0:
            tau = torch.clamp((position - self.t_warmup) / span, 0.0, 1.0)
        else:
            tau = torch.zeros_like(position)
        if self.curve == "linear":
            return self.alpha_i + tau * (self.alpha_f - self.alpha_i)
        if self.curve == "polynomial":
            return self.alpha_f + (self.alpha_i - self.alpha_f) * torch.pow(1.0 - tau, self.power)
        return self.alpha_f + (self.alpha_i - self.alpha_f) * (1.0 + torch.cos(math.pi * tau)) / 2.0

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            annealed = self._anneal_tensor(position)
            if self.t_warmup > 0:
                warmup = self.alpha_i * position / self.t_warmup
                annealed = torch.where(position < self.t_warmup, warmup, annealed)
            return annealed.to(torch.float32)
        index = _host_step(step)
        if index < self.t_warmup:
            return self.alpha_i * index / self.t_warmup
        return self._anneal_host(index)


def _resolve_anneal(
    curve: _Curve,
    *,
    alpha_i: float,
    alpha_f: float,
    t_warmup: Time | str,
    t_max: Time | str,
    scale_warmup: bool,
    steps_per_epoch: int,
    max_steps: int,
    scale_schedule_ratio: float,
    power: float = 1.0,
) -> ScheduleFn:
    _check_ratio(scale_schedule_ratio)
    warmup_steps = _resolve_steps(
        t_warmup,
        steps_per_epoch=steps_per_epoch,
        max_steps=max_steps,
        scale_schedule_ratio=scale_schedule_ratio if scale_warmup else 1.0,
    )
    max_schedule_steps = _resolve_steps(
        t_max, steps_per_epoch=steps_per_epoch, max_steps=max_steps, scale_schedule_ratio=scale_schedule_ratio
    )
    if warmup_steps > max_schedule_steps:
        raise ValueError(
            f"t_warmup={t_warmup!r} resolves to {warmup_steps} steps, more than the {max_schedule_steps} of "
            f"t_max={t_max!r} (steps_per_epoch={steps_per_epoch}, max_steps={max_steps}); "
            "expected t_warmup <= t_max"
        )
    return _StepAnneal(curve, float(alpha_i), float(alpha_f), warmup_steps, max_schedule_steps, float(power))


def _resolve_t_max_without_warmup(
    t_max: Time | str, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float
) -> int:
    return _resolve_nonzero_steps(
        "t_max",
        t_max,
        purpose="to anneal over",
        steps_per_epoch=steps_per_epoch,
        max_steps=max_steps,
        scale_schedule_ratio=scale_schedule_ratio,
    )


@dataclass(frozen=True)
class _StepStaircase:
    """`gamma ** floor(step / step_size)`."""

    gamma: float
    step_size: int

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            return torch.pow(self.gamma, torch.floor(position / self.step_size)).to(torch.float32)
        return _host_power(self.gamma, _host_step(step) // self.step_size)


@dataclass(frozen=True)
class _StepExponential:
    """`gamma ** (step / decay_period)`."""

    gamma: float
    decay_period: int

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            return torch.pow(self.gamma, position / self.decay_period).to(torch.float32)
        return _host_power(self.gamma, _host_step(step) / self.decay_period)


@dataclass(frozen=True)
class _StepMilestones:
    """A linear warmup from 0 to 1.0 over `t_warmup` steps, then `gamma ** (number of milestones <= step)`."""

    gamma: float
    milestones: tuple[int, ...]
    t_warmup: int = 0

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            passed = torch.zeros_like(position)
            # Unrolled over the (few, fixed) milestones so the graph holds no data-dependent lookup.
            for milestone in self.milestones:
                passed = passed + (position >= milestone).to(position.dtype)
            decayed = torch.pow(self.gamma, passed)
            if self.t_warmup > 0:
                decayed = torch.where(position < self.t_warmup, position / self.t_warmup, decayed)
            return decayed.to(torch.float32)
        index = _host_step(step)
        if index < self.t_warmup:
            return index / self.t_warmup
        return _host_power(self.gamma, sum(1 for milestone in self.milestones if index >= milestone))


_RESTART_LIMIT = 10_000
"""How many growing warm-restart intervals are tabulated at most."""

_EXACT_STEPS = 2**53
"""The float64 step of the tensor path counts exactly below this step."""


def _restart_intervals(t_0: int, t_mult: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return the starts and lengths of the warm-restart intervals, Composer's `int(t_mult * length)` growth.

    The table ends when the length stops changing (from then on every interval has that length), at
    `_EXACT_STEPS`, or after `_RESTART_LIMIT` intervals.
    """
    starts, lengths = [0], [t_0]
    while len(starts) < _RESTART_LIMIT:
        following = int(t_mult * lengths[-1])
        end = starts[-1] + lengths[-1]
        if following == lengths[-1] or end >= _EXACT_STEPS:
            break
        starts.append(end)
        lengths.append(following)
    return tuple(starts), tuple(lengths)


@dataclass(frozen=True)
class _StepWarmRestarts:
    """Half a cosine from 1.0 to `alpha_f` over each interval; the last tabulated interval repeats forever."""

    alpha_f: float
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def __call__(self, step: int | Tensor) -> float | Tensor:
        if isinstance(step, Tensor):
            position = _tensor_step(step)
            if len(self.starts) == 1:
                tau = torch.remainder(position, self.lengths[0]) / self.lengths[0]
            else:
                starts = torch.tensor(self.starts, dtype=torch.float64, device=position.device)
                lengths = torch.tensor(self.lengths, dtype=torch.float64, device=position.device)
                interval = torch.searchsorted(starts, position, right=True) - 1
                # `take` gathers without reading the index on the host, which `starts[interval]` would do.
                start, length = torch.take(starts, interval), torch.take(lengths, interval)
                tau = torch.remainder(position - start, length) / length
            annealed = self.alpha_f + (1.0 - self.alpha_f) * (1.0 + torch.cos(math.pi * tau)) / 2.0
            return annealed.to(torch.float32)
        index = _host_step(step)
        current = bisect.bisect_right(self.starts, index) - 1
        span = self.lengths[current]
        fraction = ((index - self.starts[current]) % span) / span
        return self.alpha_f + (1.0 - self.alpha_f) * (1.0 + math.cos(math.pi * fraction)) / 2.0


@dataclass(frozen=True)
class ConstantScheduler:
    """Multiplier `alpha` before `t_max` and 1.0 from `t_max` on (Composer's `ConstantScheduler`).

    Args:
        alpha: multiplier held while the schedule is active, >= 0.
        t_max: how long it is active, in ba, ep or dur.
    """

    alpha: float = 1.0
    t_max: Time | str = "1dur"

    def __post_init__(self) -> None:
        _check_multiplier("alpha", self.alpha)
        _check_time("t_max", self.t_max)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step.

        `max_steps` is the run's length in steps, computed from `max_duration` after the trainer has scaled it
        by `scale_schedule_ratio`; the same ratio stretches times given in ba or ep, as Composer does.
        """
        _check_ratio(scale_schedule_ratio)
        steps = _resolve_steps(
            self.t_max,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepConstant(float(self.alpha), steps)


@dataclass(frozen=True)
class LinearScheduler:
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

    def __post_init__(self) -> None:
        _check_multiplier("alpha_i", self.alpha_i)
        _check_multiplier("alpha_f", self.alpha_f)
        _check_time("t_max", self.t_max)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        steps = _resolve_t_max_without_warmup(
            self.t_max,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepAnneal("linear", float(self.alpha_i), float(self.alpha_f), 0, steps)


@dataclass(frozen=True)
class CosineAnnealingScheduler:
    """Multiplier following half a cosine from 1.0 at step 0 down to `alpha_f` at `t_max`, then `alpha_f`.

    `alpha(t) = alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2` with `tau = min(1, t / t_max)`
    (Composer's `CosineAnnealingScheduler`).

    Args:
        t_max: length of the decay, in ba, ep or dur; must resolve to at least one step.
        alpha_f: final multiplier, >= 0.
    """

    t_max: Time | str = "1dur"
    alpha_f: float = 0.0

    def __post_init__(self) -> None:
        _check_time("t_max", self.t_max)
        _check_multiplier("alpha_f", self.alpha_f)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        steps = _resolve_t_max_without_warmup(
            self.t_max,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepAnneal("cosine", 1.0, float(self.alpha_f), 0, steps)


@dataclass(frozen=True)
class ConstantWithWarmupScheduler:
    """Multiplier rising linearly from 0 to `alpha` over `t_warmup`, then `alpha` (Composer's scheduler).

    As in Composer's implementation (a linear-with-warmup schedule from `alpha` to `alpha`), the multiplier
    stays `alpha` after `t_max`; `t_max` bounds the warmup.

    During warmup (`t < t_warmup`) the multiplier is `alpha * t / t_warmup`. A scale-schedule ratio stretches
    `t_max` when given in ba or ep, and the warmup only with `scale_warmup=True`; dur times are fractions of
    the already scaled `max_steps` either way.

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

    def __post_init__(self) -> None:
        _check_multiplier("alpha", self.alpha)
        _check_warmup(self.t_warmup, self.t_max, self.scale_warmup)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        return _resolve_anneal(
            "linear",
            alpha_i=self.alpha,
            alpha_f=self.alpha,
            t_warmup=self.t_warmup,
            t_max=self.t_max,
            scale_warmup=self.scale_warmup,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )


@dataclass(frozen=True)
class LinearWithWarmupScheduler:
    """Multiplier rising linearly from 0 to `alpha_i` over `t_warmup`, then going linearly to `alpha_f` at `t_max`.

    After warmup `alpha(t) = alpha_i + (alpha_f - alpha_i) * tau` with
    `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)` (Composer's `LinearWithWarmupScheduler`).

    During warmup (`t < t_warmup`) the multiplier is `alpha_i * t / t_warmup`. A scale-schedule ratio stretches
    `t_max` when given in ba or ep, and the warmup only with `scale_warmup=True`; dur times are fractions of
    the already scaled `max_steps` either way.

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

    def __post_init__(self) -> None:
        _check_multiplier("alpha_i", self.alpha_i)
        _check_multiplier("alpha_f", self.alpha_f)
        _check_warmup(self.t_warmup, self.t_max, self.scale_warmup)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        return _resolve_anneal(
            "linear",
            alpha_i=self.alpha_i,
            alpha_f=self.alpha_f,
            t_warmup=self.t_warmup,
            t_max=self.t_max,
            scale_warmup=self.scale_warmup,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )


@dataclass(frozen=True)
class CosineAnnealingWithWarmupScheduler:
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then half a cosine down to `alpha_f` at `t_max`.

    After warmup `alpha(t) = alpha_f + (1 - alpha_f) * (1 + cos(pi * tau)) / 2` with
    `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)` (Composer's `CosineAnnealingWithWarmupScheduler`).

    During warmup (`t < t_warmup`) the multiplier is `1.0 * t / t_warmup`. A scale-schedule ratio stretches
    `t_max` when given in ba or ep, and the warmup only with `scale_warmup=True`; dur times are fractions of
    the already scaled `max_steps` either way.

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

    def __post_init__(self) -> None:
        _check_multiplier("alpha_f", self.alpha_f)
        _check_warmup(self.t_warmup, self.t_max, self.scale_warmup)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        return _resolve_anneal(
            "cosine",
            alpha_i=1.0,
            alpha_f=self.alpha_f,
            t_warmup=self.t_warmup,
            t_max=self.t_max,
            scale_warmup=self.scale_warmup,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )


@dataclass(frozen=True)
class StepScheduler:
    """Multiplier `gamma ** floor(t / step_size)`: decayed by `gamma` every `step_size` (Composer's `StepScheduler`).

    Args:
        step_size: time between decays, in ba, ep or dur; must resolve to at least one step.
        gamma: decay factor, >= 0.
    """

    step_size: Time | str
    gamma: float = 0.1

    def __post_init__(self) -> None:
        _check_time("step_size", self.step_size)
        _check_real("gamma", self.gamma, minimum=0.0)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        steps = _resolve_nonzero_steps(
            "step_size",
            self.step_size,
            purpose="between decays",
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepStaircase(float(self.gamma), steps)


@dataclass(frozen=True)
class MultiStepScheduler:
    """Multiplier `gamma ** k`, `k` the number of milestones at or before `t` (Composer's `MultiStepScheduler`).

    Milestones may come in any order; a list is stored as a tuple so that the record stays hashable.

    Args:
        milestones: times at which the multiplier is multiplied by `gamma`, each in ba, ep or dur.
        gamma: decay factor, >= 0.
    """

    milestones: Sequence[Time | str]
    gamma: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "milestones", _check_milestones(self.milestones))
        _check_real("gamma", self.gamma, minimum=0.0)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        _check_ratio(scale_schedule_ratio)
        milestones = tuple(
            _resolve_steps(
                milestone,
                steps_per_epoch=steps_per_epoch,
                max_steps=max_steps,
                scale_schedule_ratio=scale_schedule_ratio,
            )
            for milestone in self.milestones
        )
        return _StepMilestones(float(self.gamma), milestones)


@dataclass(frozen=True)
class ExponentialScheduler:
    """Multiplier `gamma ** (t / decay_period)`, decaying continuously (Composer's `ExponentialScheduler`).

    Args:
        gamma: factor the multiplier is multiplied by over each `decay_period`, >= 0.
        decay_period: time over which the multiplier falls by `gamma`, in ba, ep or dur; must resolve to at
            least one step.
    """

    gamma: float
    decay_period: Time | str = "1ep"

    def __post_init__(self) -> None:
        _check_real("gamma", self.gamma, minimum=0.0)
        _check_time("decay_period", self.decay_period)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        steps = _resolve_nonzero_steps(
            "decay_period",
            self.decay_period,
            purpose="per decay period",
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepExponential(float(self.gamma), steps)


@dataclass(frozen=True)
class CosineAnnealingWarmRestartsScheduler:
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

    def __post_init__(self) -> None:
        _check_time("t_0", self.t_0)
        _check_real("t_mult", self.t_mult, minimum=1.0)
        _check_multiplier("alpha_f", self.alpha_f)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        first = _resolve_nonzero_steps(
            "t_0",
            self.t_0,
            purpose="in the first interval",
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        starts, lengths = _restart_intervals(first, float(self.t_mult))
        still_growing = int(float(self.t_mult) * lengths[-1]) != lengths[-1]
        if still_growing and starts[-1] + lengths[-1] < max_steps:
            raise ValueError(
                f"t_mult={self.t_mult!r} with t_0={self.t_0!r} makes more than {_RESTART_LIMIT} growing restart "
                f"intervals within max_steps={max_steps}; expected a larger t_0 or t_mult, or t_mult=1"
            )
        return _StepWarmRestarts(float(self.alpha_f), starts, lengths)


@dataclass(frozen=True)
class PolynomialScheduler:
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

    def __post_init__(self) -> None:
        _check_real("power", self.power, minimum=0.0)
        _check_time("t_max", self.t_max)
        _check_multiplier("alpha_f", self.alpha_f)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        steps = _resolve_t_max_without_warmup(
            self.t_max,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
        )
        return _StepAnneal("polynomial", 1.0, float(self.alpha_f), 0, steps, float(self.power))


@dataclass(frozen=True)
class MultiStepWithWarmupScheduler:
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then `gamma ** k` as in `MultiStepScheduler`.

    `k` counts the milestones at or before `t`, measured from step 0, so a milestone inside the warmup applies
    from the end of the warmup on (Composer's `MultiStepWithWarmupScheduler`). During warmup (`t < t_warmup`)
    the multiplier is `t / t_warmup`. A scale-schedule ratio stretches milestones given in ba or ep, and the
    warmup only with `scale_warmup=True`.

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

    def __post_init__(self) -> None:
        _check_time("t_warmup", self.t_warmup)
        object.__setattr__(self, "milestones", _check_milestones(self.milestones))
        _check_real("gamma", self.gamma, minimum=0.0)
        _check_scale_warmup(self.scale_warmup)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        _check_ratio(scale_schedule_ratio)
        warmup_steps = _resolve_steps(
            self.t_warmup,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio if self.scale_warmup else 1.0,
        )
        milestones = tuple(
            _resolve_steps(
                milestone,
                steps_per_epoch=steps_per_epoch,
                max_steps=max_steps,
                scale_schedule_ratio=scale_schedule_ratio,
            )
            for milestone in self.milestones
        )
        return _StepMilestones(float(self.gamma), milestones, warmup_steps)


@dataclass(frozen=True)
class PolynomialWithWarmupScheduler:
    """Multiplier rising linearly from 0 to 1.0 over `t_warmup`, then a polynomial decay to `alpha_f` at `t_max`.

    After warmup `alpha(t) = alpha_f + (1 - alpha_f) * (1 - tau) ** power` with
    `tau = clamp((t - t_warmup) / (t_max - t_warmup), 0, 1)` (Composer's `PolynomialWithWarmupScheduler`).

    During warmup (`t < t_warmup`) the multiplier is `t / t_warmup`. A scale-schedule ratio stretches `t_max`
    when given in ba or ep, and the warmup only with `scale_warmup=True`; dur times are fractions of the already
    scaled `max_steps` either way.

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

    def __post_init__(self) -> None:
        _check_real("power", self.power, minimum=0.0)
        _check_multiplier("alpha_f", self.alpha_f)
        _check_warmup(self.t_warmup, self.t_max, self.scale_warmup)

    def resolve(
        self, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float = 1.0
    ) -> ScheduleFn:
        """Return the multiplier as a function of the optimizer step (see `ConstantScheduler.resolve`)."""
        return _resolve_anneal(
            "polynomial",
            alpha_i=1.0,
            alpha_f=self.alpha_f,
            t_warmup=self.t_warmup,
            t_max=self.t_max,
            scale_warmup=self.scale_warmup,
            steps_per_epoch=steps_per_epoch,
            max_steps=max_steps,
            scale_schedule_ratio=scale_schedule_ratio,
            power=self.power,
        )
