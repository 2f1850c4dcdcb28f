"""The run's learning rate: the schedule resolved for the run, adjusted by algorithms, around the optimizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from composer_fn.core.algorithm import Algorithm
from composer_fn.optim.base import GradientTransformation
from composer_fn.optim.schedules import ConstantScheduler
from composer_fn.optim.transforms import scheduled

__all__ = ["learning_rate"]


def learning_rate(
    optimizer: GradientTransformation,
    schedule: Any,
    algorithms: Sequence[Algorithm],
    *,
    steps_per_epoch: int,
    max_steps: int,
    scale_schedule_ratio: float,
) -> tuple[GradientTransformation, Callable[[int], Any]]:
    """Returns the optimizer to train with and the learning-rate multiplier it applies, by step count.

    The schedule (None: the optimizer's own rate throughout) is resolved for the run, then every algorithm
    whose capabilities carry an ``lr_multiplier`` adjusts it, in order. Without a schedule or an adjustment
    the optimizer is returned as it is, with no per-step multiplication.
    """
    if schedule is None:
        base = ConstantScheduler().resolve(steps_per_epoch=steps_per_epoch, max_steps=1)
    else:
        base = schedule.resolve(
            steps_per_epoch=steps_per_epoch, max_steps=max_steps, scale_schedule_ratio=scale_schedule_ratio
        )
    multiplier = base
    for algorithm in algorithms:
        adjust = algorithm.capabilities().lr_multiplier
        if adjust is not None:
            multiplier = adjust(multiplier, steps_per_epoch=steps_per_epoch, max_steps=max_steps)
    if schedule is None and multiplier is base:
        return optimizer, multiplier
    return scheduled(optimizer, multiplier), multiplier
