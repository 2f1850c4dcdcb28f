"""Learning-rate multipliers as functions of the optimizer step: what a schedule resolves to for one run.

Each multiplier is a frozen record of step counts and factors. Called on a Python int it returns a Python float;
called on an integer tensor (a 0-d step, or any shape for plotting) it returns a float32 tensor of the same
shape, built from torch ops only so that `torch.compile(fullgraph=True)` traces it without graph breaks. The
tensor path computes in float64, which keeps it within float32 rounding (1e-6) of the host path at any
realistic step.
"""

from __future__ import annotations

import abc
import bisect
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

__all__ = [
    "Curve",
    "Multiplier",
    "Constant",
    "Anneal",
    "Warmup",
    "warmed",
    "Decay",
    "Milestones",
    "WarmRestarts",
    "RESTART_LIMIT",
    "restart_intervals",
]

Curve = Literal["linear", "cosine", "polynomial"]

_Number = TypeVar("_Number", float, Tensor)


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
    return step.to(torch.float64)


def _host_power(gamma: float, exponent: float) -> float:
    try:
        return gamma**exponent
    except OverflowError:
        # A growing schedule (gamma > 1) saturates at inf, as the tensor path does, instead of raising.
        return math.inf


def _cosine(start: float, end: float, tau: _Number, cos: Callable[[_Number], _Number]) -> _Number:
    return end + (start - end) * (1.0 + cos(math.pi * tau)) / 2.0


class Multiplier(abc.ABC):
    """A multiplier of the optimizer step; subclasses give its value on a host int and on a float64 tensor."""

    @abc.abstractmethod
    def host(self, step: int) -> float:
        """Returns the multiplier at `step`, a validated int >= 0."""

    @abc.abstractmethod
    def tensor(self, position: Tensor) -> Tensor:
        """Returns the multiplier at every step of `position`, a float64 tensor, in float64."""

    def __call__(self, step: int | Tensor) -> float | Tensor:
        """Returns the multiplier at `step`: a float for an int, a float32 tensor for an integer tensor."""
        if isinstance(step, Tensor):
            return self.tensor(_tensor_step(step)).to(torch.float32)
        return self.host(_host_step(step))


@dataclass(frozen=True)
class Constant(Multiplier):
    """`alpha` for steps before `until`, 1.0 from `until` on."""

    alpha: float
    until: int

    def host(self, step: int) -> float:
        return self.alpha if step < self.until else 1.0

    def tensor(self, position: Tensor) -> Tensor:
        alpha = torch.full_like(position, self.alpha)
        return torch.where(position < self.until, alpha, torch.ones_like(position))


@dataclass(frozen=True)
class Anneal(Multiplier):
    """`alpha_i` at step `start` annealed along `curve` to `alpha_f` at step `end`, held outside that span.

    The annealing fraction is `tau = clamp((step - start) / (end - start), 0, 1)`, and 0 when `end == start`, as
    in Composer. The curves: linear `alpha_i + tau * (alpha_f - alpha_i)`, polynomial
    `alpha_f + (alpha_i - alpha_f) * (1 - tau) ** power`, cosine
    `alpha_f + (alpha_i - alpha_f) * (1 + cos(pi * tau)) / 2`.
    """

    curve: Curve
    alpha_i: float
    alpha_f: float
    start: int
    end: int
    power: float = 1.0

    def _along(self, tau: _Number, cos: Callable[[_Number], _Number]) -> _Number:
        if self.curve == "linear":
            return self.alpha_i + tau * (self.alpha_f - self.alpha_i)
        if self.curve == "polynomial":
            return self.alpha_f + (self.alpha_i - self.alpha_f) * (1.0 - tau) ** self.power
        return _cosine(self.alpha_i, self.alpha_f, tau, cos)

    def host(self, step: int) -> float:
        span = self.end - self.start
        tau = min(1.0, max(0.0, (step - self.start) / span)) if span > 0 else 0.0
        return self._along(tau, math.cos)

    def tensor(self, position: Tensor) -> Tensor:
        span = self.end - self.start
        if span > 0:
            tau = torch.clamp((position - self.start) / span, 0.0, 1.0)
        else:
            tau = torch.zeros_like(position)
        return self._along(tau, torch.cos)


@dataclass(frozen=True)
class Warmup(Multiplier):
    """A linear rise from 0 to `peak` over the first `steps` steps (`peak * step / steps`), then `after`."""

    peak: float
    steps: int
    after: Multiplier

    def host(self, step: int) -> float:
        return self.peak * step / self.steps if step < self.steps else self.after.host(step)

    def tensor(self, position: Tensor) -> Tensor:
        return torch.where(
            position < self.steps, self.peak * position / self.steps, self.after.tensor(position)
        )


def warmed(peak: float, steps: int, after: Multiplier) -> Multiplier:
    """Returns `after` preceded by a linear warm-up to `peak` over `steps` steps (`after` itself for 0 steps)."""
    return Warmup(peak, steps, after) if steps > 0 else after


@dataclass(frozen=True)
class Decay(Multiplier):
    """`gamma ** (step / period)`, or `gamma ** floor(step / period)` as a `staircase`."""

    gamma: float
    period: int
    staircase: bool

    def host(self, step: int) -> float:
        return _host_power(self.gamma, step // self.period if self.staircase else step / self.period)

    def tensor(self, position: Tensor) -> Tensor:
        exponent = position / self.period
        return torch.pow(self.gamma, torch.floor(exponent) if self.staircase else exponent)


@dataclass(frozen=True)
class Milestones(Multiplier):
    """`gamma ** k`, `k` the number of `milestones` at or before the step."""

    gamma: float
    milestones: tuple[int, ...]

    def host(self, step: int) -> float:
        return _host_power(self.gamma, sum(1 for milestone in self.milestones if step >= milestone))

    def tensor(self, position: Tensor) -> Tensor:
        passed = torch.zeros_like(position)
        # Unrolled over the (few, fixed) milestones so the graph holds no data-dependent lookup.
        for milestone in self.milestones:
            passed = passed + (position >= milestone).to(position.dtype)
        return torch.pow(self.gamma, passed)


RESTART_LIMIT = 10_000
"""How many growing warm-restart intervals are tabulated at most."""

_EXACT_STEPS = 2**53
"""The float64 step of the tensor path counts exactly below this step."""


def restart_intervals(t_0: int, t_mult: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Returns the starts and lengths of the warm-restart intervals, Composer's `int(t_mult * length)` growth.

    The table ends when the length stops changing (from then on every interval has that length), at step
    2**53, or after `RESTART_LIMIT` intervals.
    """
    starts, lengths = [0], [t_0]
    while len(starts) < RESTART_LIMIT:
        following = int(t_mult * lengths[-1])
        end = starts[-1] + lengths[-1]
        if following == lengths[-1] or end >= _EXACT_STEPS:
            break
        starts.append(end)
        lengths.append(following)
    return tuple(starts), tuple(lengths)


@dataclass(frozen=True)
class WarmRestarts(Multiplier):
    """Half a cosine from 1.0 to `alpha_f` over each interval; the last tabulated interval repeats forever."""

    alpha_f: float
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    def host(self, step: int) -> float:
        current = bisect.bisect_right(self.starts, step) - 1
        span = self.lengths[current]
        return _cosine(1.0, self.alpha_f, ((step - self.starts[current]) % span) / span, math.cos)

    def tensor(self, position: Tensor) -> Tensor:
        if len(self.starts) == 1:
            tau = torch.remainder(position, self.lengths[0]) / self.lengths[0]
        else:
            starts = torch.tensor(self.starts, dtype=torch.float64, device=position.device)
            lengths = torch.tensor(self.lengths, dtype=torch.float64, device=position.device)
            interval = torch.searchsorted(starts, position, right=True) - 1
            # `take` gathers without reading the index on the host, which `starts[interval]` would do.
            start, length = torch.take(starts, interval), torch.take(lengths, interval)
            tau = torch.remainder(position - start, length) / length
        return _cosine(1.0, self.alpha_f, tau, torch.cos)
