"""Learning-rate multiplier schedules: pure functions of the optimizer step, named after Composer's schedulers.

A schedule is a frozen record of hyperparameters. `resolve(steps_per_epoch=..., max_steps=...)` turns every
time (`'10ba'`, `'2ep'`, `'0.1dur'`) into a number of optimizer steps and returns a `ScheduleFn`: called on a
Python int it returns a Python float; called on an integer tensor (a 0-d step, or any shape for plotting) it
returns a float32 tensor of the same shape, built from torch ops only so that `torch.compile(fullgraph=True)`
traces it without graph breaks. The host and tensor results agree to 1e-6.

The multiplier scales the optimizer's base learning rate: `lr(step) = base_lr * schedule(step)`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
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


def _check_warmup(t_warmup: object, t_max: object, scale_warmup: object) -> None:
    warmup = _check_time("t_warmup", t_warmup)
    duration = _check_time("t_max", t_max)
    if not isinstance(scale_warmup, bool):
        raise TypeError(f"scale_warmup={scale_warmup!r} is not a bool; expected True or False")
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


@dataclass(frozen=True)
class _StepAnneal:
    """A linear warmup from 0 to `alpha_i` over `t_warmup` steps, then `alpha_i` annealed to `alpha_f` by `t_max`.

    The annealing fraction is `(step - t_warmup) / (t_max - t_warmup)` clamped to [0, 1], and 0 when
    `t_max == t_warmup`, as in Composer.
    """

    curve: Literal["linear", "cosine"]
    alpha_i: float
    alpha_f: float
    t_warmup: int
    t_max: int

    def _anneal_host(self, step: int) -> float:
        span = self.t_max - self.t_warmup
        tau = min(1.0, max(0.0, (step - self.t_warmup) / span)) if span > 0 else 0.0
        if self.curve == "linear":
            return self.alpha_i + tau * (self.alpha_f - self.alpha_i)
        return self.alpha_f + (self.alpha_i - self.alpha_f) * (1.0 + math.cos(math.pi * tau)) / 2.0

    def _anneal_tensor(self, position: Tensor) -> Tensor:
        span = self.t_max - self.t_warmup
        if span > 0:
            tau = torch.clamp((position - self.t_warmup) / span, 0.0, 1.0)
        else:
            tau = torch.zeros_like(position)
        if self.curve == "linear":
            return self.alpha_i + tau * (self.alpha_f - self.alpha_i)
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
    curve: Literal["linear", "cosine"],
    *,
    alpha_i: float,
    alpha_f: float,
    t_warmup: Time | str,
    t_max: Time | str,
    scale_warmup: bool,
    steps_per_epoch: int,
    max_steps: int,
    scale_schedule_ratio: float,
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
    return _StepAnneal(curve, float(alpha_i), float(alpha_f), warmup_steps, max_schedule_steps)


def _resolve_t_max_without_warmup(
    t_max: Time | str, *, steps_per_epoch: int, max_steps: int, scale_schedule_ratio: float
) -> int:
    _check_ratio(scale_schedule_ratio)
    steps = _resolve_steps(
        t_max,
        steps_per_epoch=steps_per_epoch,
        max_steps=max_steps,
        scale_schedule_ratio=scale_schedule_ratio,
    )
    if steps == 0:
        raise ValueError(
            f"t_max={t_max!r} resolves to 0 steps (steps_per_epoch={steps_per_epoch}, max_steps={max_steps}); "
            "expected at least 1 step to anneal over"
        )
    return steps


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

        `max_steps` is the run's length in steps, after any scale-schedule ratio; `scale_schedule_ratio`
        stretches times given in ba or ep, as Composer does.
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
