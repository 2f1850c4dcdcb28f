"""Argument checks of the optimizers, transforms and schedules: `core.validate`'s, with a TypeError for the wrong kind.

`core.validate` raises ValueError for every bad argument; here a value that is not even of the accepted kind
(a string for a learning rate, a bare number for a time) raises TypeError, Python's error for a value of the
wrong type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from composer_fn.core.time import Time, TimeUnit
from composer_fn.core.validate import is_real, real, time

__all__ = ["STEP_UNITS", "of_kind", "real_number", "step_time"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

STEP_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.DURATION)
"""The units of a time that resolves to a number of optimizer steps."""


def of_kind(
    kind: str, is_kind: Callable[[object], bool], check: Callable[Concatenate[str, object, _P], _T]
) -> Callable[Concatenate[str, object, _P], _T]:
    """Returns ``check`` raising TypeError first, naming the argument, the value and ``kind``, for a value that
    ``is_kind`` refuses."""

    def checked(argument: str, value: object, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if not is_kind(value):
            raise TypeError(f"{argument} must be {kind}, got {type(value).__name__} {value!r}")
        return check(argument, value, *args, **kwargs)

    return checked


real_number = of_kind("a real number (int or float)", is_real, real)
"""``validate.real``, raising TypeError for anything but a real number (``int``, ``float``, a NumPy number or
another ``numbers.Real``; never a ``bool``)."""

_time = of_kind(
    "a Time or a time string such as '100ba', '2ep' or '0.1dur'", lambda v: isinstance(v, Time | str), time
)


def step_time(argument: str, value: object) -> Time:
    """Returns ``value`` as a Time in ba, ep or dur.

    Raises TypeError unless it is a ``Time`` or a time string, ValueError unless its unit is one of those.
    """
    return _time(argument, value, STEP_UNITS, "0.1dur")
