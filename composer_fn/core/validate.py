"""Argument checks shared by every public constructor: each returns the value or raises naming all three of
the argument, the value given and what is accepted.

``integer`` and ``real`` accept any ``numbers.Integral``/``numbers.Real`` (NumPy's and Python's scalars alike,
and a 0-dimensional integer or floating tensor's ``.item()`` is one of those) and refuse ``bool`` and ``numpy.bool_``
(never meant as a count or a rate); ``integer`` returns an ``int``, ``real`` a ``float``; ``time`` parses Composer's
time strings. ``is_integer`` and ``is_real`` are the predicates ``core.time`` also reads (``core._scalars``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TypeVar

from composer_fn.core._scalars import is_bool, is_integer, is_real
from composer_fn.core.time import Time, TimeUnit

__all__ = ["is_bool", "is_integer", "is_real", "integer", "real", "probability", "flag", "batch_key", "choice", "time"]

_C = TypeVar("_C")


def _number(value: float) -> str:
    return str(value) if is_integer(value) else f"{value:g}"


def _bounds(minimum: float | None, maximum: float | None, open_below: bool, open_above: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"in {'(' if open_below else '['}{_number(minimum)}, {_number(maximum)}{')' if open_above else ']'}"
    if minimum is not None:
        return f"{'>' if open_below else '>='} {_number(minimum)}"
    if maximum is not None:
        return f"{'<' if open_above else '<='} {_number(maximum)}"
    return ""


def integer(
    argument: str, value: object, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int:
    """Returns ``value`` if it is an int (not a bool) in ``[minimum, maximum]``; raises ValueError otherwise."""
    if is_integer(value) and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return int(value)
    accepted = " ".join(filter(None, ("an int", _bounds(minimum, maximum, False, False))))
    raise ValueError(f"{argument}={value!r} must be {accepted}{f' ({hint})' if hint else ''}")


def real(
    argument: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    open_below: bool = False,
    open_above: bool = False,
    hint: str = "",
) -> float:
    """Returns ``value`` as a float if it is a finite real number within the bounds; raises ValueError otherwise.

    ``open_below``/``open_above`` exclude the bound itself (``minimum=0, open_below=True``: positive).
    """
    # Checked inline: some callers run once per training step.
    if (
        (type(value) is float or type(value) is int or is_real(value))
        and math.isfinite(float(value))
        and (minimum is None or value > minimum or (value == minimum and not open_below))
        and (maximum is None or value < maximum or (value == maximum and not open_above))
    ):
        return float(value)
    accepted = " ".join(filter(None, ("a finite number", _bounds(minimum, maximum, open_below, open_above))))
    raise ValueError(f"{argument}={value!r} must be {accepted}{f' ({hint})' if hint else ''}")


def probability(argument: str, value: object, *, hint: str = "") -> float:
    """Returns ``value`` as a float if it is a number in [0, 1]; raises ValueError otherwise."""
    return real(argument, value, minimum=0.0, maximum=1.0, hint=hint or "a probability")


def flag(argument: str, value: object) -> bool:
    """Returns ``value`` as a bool if it is a ``bool`` or a ``numpy.bool_``; raises TypeError otherwise."""
    if not is_bool(value):
        raise TypeError(f"{argument}={value!r} must be True or False")
    return bool(value)


def batch_key(argument: str, value: object) -> int | str:
    """Returns ``value`` if it is a position (int) or a key (str) of a batch; raises TypeError otherwise."""
    if isinstance(value, str):
        return value
    if not is_integer(value):
        raise TypeError(f"{argument}={value!r} must be a position (int) or a key (str) of the batch")
    return int(value)


def choice(argument: str, value: _C, accepted: Collection[_C]) -> _C:
    """Returns ``value`` if it is one of ``accepted``; raises ValueError listing them otherwise."""
    if isinstance(value, bool) or value not in accepted:
        raise ValueError(f"{argument}={value!r} must be one of {', '.join(repr(a) for a in accepted)}")
    return value


def time(
    argument: str, value: object, units: Collection[TimeUnit], example: str, *, number_unit: TimeUnit | None = None
) -> Time:
    """Returns ``value`` (a time string such as ``"0.5dur"``, or a ``Time``) if its unit is one of ``units``.

    With ``number_unit``, a bare non-negative number counts in that unit (``0.1`` as ``0.1dur``). Raises
    ValueError naming the argument, the value, the accepted units and ``example`` otherwise.
    """
    parsed: Time | None = None
    try:
        if isinstance(value, Time | str):
            parsed = value if isinstance(value, Time) else Time.from_timestring(value)
        elif number_unit is not None and is_real(value):
            parsed = Time(int(value) if is_integer(value) else float(value), number_unit)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.unit not in units or parsed.value < 0:
        accepted = ", ".join(u.value for u in units)
        number = f" (or a number of {number_unit.value})" if number_unit is not None else ""
        raise ValueError(f"{argument}={value!r} must be a time string in {accepted}{number}, e.g. {example!r}")
    return parsed
