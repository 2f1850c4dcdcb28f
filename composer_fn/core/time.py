"""Training time: units, amounts of time (`Time`), progress counters (`Timestamp`) and conversions to steps.

Host-only Python values, never traced. Names, string forms and arithmetic follow Composer's
`composer.core.time`, so `'90ep'`, `'0.3dur'`, `'3e4tok'` and `'1h30m'` mean what they mean there.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from composer_fn.core._scalars import is_integer, is_real

__all__ = ["TimeUnit", "Time", "Timestamp", "elapsed", "to_steps"]


class TimeUnit(str, Enum):
    """Units of training time; each member's value is its suffix in a time string."""

    ITERATION = "iter"
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"

    def __repr__(self) -> str:
        # Evaluable, so that records holding a Time have a repr that round-trips.
        return f"TimeUnit.{self.name}"

    def __str__(self) -> str:
        return self.value


_UNIT_SUFFIXES = ", ".join(unit.value for unit in TimeUnit)
_ACCEPTED_FORMS = (
    f"expected a number followed by one of {_UNIT_SUFFIXES} (e.g. '90ep', '0.3dur', '3e4tok') "
    "or a duration like '1h30m'"
)
_TIME_STRING = re.compile(r"^(.+)(iter|ep|ba|sp|tok|dur|sec)$", flags=re.IGNORECASE)
_WALL_CLOCK_STRING = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$", flags=re.IGNORECASE)
# Products such as Time(0.3, dur) * Time(10, ep) land a few ulps off an integer; snap those, reject the rest.
_ARITHMETIC_TOLERANCE = 1e-9


def _as_unit(unit: TimeUnit | str, argument: str) -> TimeUnit:
    if isinstance(unit, TimeUnit):
        return unit
    if isinstance(unit, str):
        try:
            return TimeUnit(unit.lower())
        except ValueError:
            pass
        raise ValueError(f"{argument}={unit!r} is not a time unit; expected one of {_UNIT_SUFFIXES}")
    raise TypeError(f"{argument} must be a TimeUnit or one of {_UNIT_SUFFIXES}, got {type(unit).__name__}")


def _checked_value(value: object, unit: TimeUnit) -> int | float:
    if not is_real(value):
        raise TypeError(f"value={value!r} ({type(value).__name__}) is not a number; expected an int or float")
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"value={value!r} is not a valid amount of {unit.value}; expected a finite number >= 0"
        )
    if unit is TimeUnit.DURATION:
        return float(value)
    value = int(value) if is_integer(value) else float(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(
                f"value={value!r} is not a whole number; unit {unit.value!r} counts whole units "
                "(only 'dur' takes fractions)"
            )
        return int(value)
    return value


def _snapped(value: float, unit: TimeUnit) -> int | float:
    if unit is not TimeUnit.DURATION and isinstance(value, float) and math.isfinite(value):
        nearest = round(value)
        if abs(value - nearest) <= _ARITHMETIC_TOLERANCE * max(1.0, abs(value)):
            return nearest
    return value


def _parse_number(text: str) -> int | float:
    # Integers first, so that counts beyond 2**53 survive a round trip exactly.
    try:
        return int(text)
    except ValueError:
        return float(text)


def _from_unit(unit: TimeUnit, doc: str) -> Any:
    def build(cls: type[Time], value: int | float) -> Time:
        return cls(value, unit)

    build.__doc__ = doc
    return classmethod(build)


def _time_comparison(compare: Callable[[Any, Any], bool]) -> Any:
    def method(self: Time, other: Time | str | int | float) -> bool:
        operand = self._operand(other, "compare")
        return NotImplemented if operand is None else compare(self.value, operand.value)

    return method


def _time_arithmetic(operation: str, combine: Callable[[Any, Any], Any]) -> Any:
    def method(self: Time, other: Time | str | int | float) -> Time:
        operand = self._operand(other, operation)
        return NotImplemented if operand is None else Time(combine(self.value, operand.value), self.unit)

    return method


def _timestamp_comparison(compare: Callable[[Any, Any], bool]) -> Any:
    def method(self: Timestamp, other: Time | str) -> bool:
        pair = self._counter_and_time(other)
        return NotImplemented if pair is None else compare(pair[0], pair[1].value)

    return method


@dataclass(frozen=True)
class Time:
    """An amount of training time: a non-negative `value` in a `unit` (whole numbers except for `dur`).

    Arithmetic follows Composer: comparing with a bare number assumes this unit, ordering or adding
    different units raises `RuntimeError`, dividing two times of one unit gives a `dur` ratio, and a
    product needs a scalar or one `dur` operand. Equal times are equal to the bare number of their value.
    """

    value: int | float
    unit: TimeUnit

    def __post_init__(self) -> None:
        unit = _as_unit(self.unit, "unit")
        # Normalising here keeps every Time canonical: ints for counts, floats for durations.
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "value", _checked_value(self.value, unit))

    from_iteration = _from_unit(TimeUnit.ITERATION, "Return `value` iterations.")
    from_epoch = _from_unit(TimeUnit.EPOCH, "Return `value` epochs.")
    from_batch = _from_unit(TimeUnit.BATCH, "Return `value` batches (optimizer steps).")
    from_sample = _from_unit(TimeUnit.SAMPLE, "Return `value` samples.")
    from_token = _from_unit(TimeUnit.TOKEN, "Return `value` tokens.")
    from_duration = _from_unit(TimeUnit.DURATION, "Return the fraction `value` of the whole run (1.0: all of it).")
    from_second = _from_unit(TimeUnit.SECOND, "Return `value` seconds of wall-clock time.")

    @classmethod
    def from_timestring(cls, timestring: str) -> Time:
        """Return the time a string such as `'90ep'`, `'0.5dur'`, `'3e4tok'` or `'1h30m5s'` describes.

        Units are case-insensitive; values may use scientific notation; every unit except `dur` takes
        whole numbers. The `XhYmZs` form (any of the three parts) gives seconds.
        """
        if not isinstance(timestring, str):
            raise TypeError(f"timestring must be a str, got {type(timestring).__name__} {timestring!r}")
        text = timestring.strip()
        wall_clock = _WALL_CLOCK_STRING.match(text)
        if text and wall_clock is not None:
            hours, minutes, seconds = (int(part) if part else 0 for part in wall_clock.groups())
            return cls(hours * 3600 + minutes * 60 + seconds, TimeUnit.SECOND)
        match = _TIME_STRING.match(text)
        if match is None:
            raise ValueError(f"{timestring!r} is not a time string; {_ACCEPTED_FORMS}")
        number, suffix = match.groups()
        unit = TimeUnit(suffix.lower())
        try:
            value = _parse_number(number)
        except ValueError:
            raise ValueError(f"{timestring!r} is not a time string; {_ACCEPTED_FORMS}") from None
        try:
            return cls(value, unit)
        except ValueError as error:
            raise ValueError(f"{timestring!r} is not a valid time: {error}") from None

    @classmethod
    def from_input(cls, time: Time | str | int, default_int_unit: TimeUnit | str) -> Time:
        """Return `time` as a Time: a Time as is, a string parsed, an int counted in `default_int_unit`."""
        if isinstance(time, Time):
            return time
        if isinstance(time, str):
            return cls.from_timestring(time)
        if is_integer(time):
            return cls(time, _as_unit(default_int_unit, "default_int_unit"))
        raise TypeError(
            f"time={time!r} ({type(time).__name__}) is not a time; expected a Time, a time string or an int"
        )

    def to_timestring(self) -> str:
        """Return the time string that `Time.from_timestring` parses back to this time."""
        number = repr(self.value) if isinstance(self.value, float) else str(self.value)
        return f"{number}{self.unit.value}"

    def __str__(self) -> str:
        return self.to_timestring()

    def __repr__(self) -> str:
        return f"Time({self.value!r}, {self.unit!r})"

    def __int__(self) -> int:
        return int(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __hash__(self) -> int:
        # Equal to hash(value) because a Time equals the bare number of its value.
        return hash(self.value)

    def _operand(self, other: object, operation: str) -> Time | None:
        if isinstance(other, Time):
            result = other
        elif isinstance(other, str):
            result = Time.from_timestring(other)
        elif is_real(other):
            return Time(other, self.unit)
        else:
            return None
        if result.unit is not self.unit:
            raise RuntimeError(
                f"cannot {operation} {self} and {result}: units {self.unit.value!r} and "
                f"{result.unit.value!r} differ; convert one of them first"
            )
        return result

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Time):
            return self.unit is other.unit and self.value == other.value
        if is_real(other):
            return self.value == other
        return NotImplemented

    __lt__ = _time_comparison(operator.lt)
    __le__ = _time_comparison(operator.le)
    __gt__ = _time_comparison(operator.gt)
    __ge__ = _time_comparison(operator.ge)

    __add__ = _time_arithmetic("add", operator.add)
    __radd__ = __add__
    __sub__ = _time_arithmetic("subtract", operator.sub)
    __rsub__ = _time_arithmetic("subtract", lambda a, b: b - a)
    __mod__ = _time_arithmetic("take the remainder of", operator.mod)

    def __truediv__(self, other: Time | str | int | float) -> Time:
        if is_real(other):
            return Time(_snapped(self.value / other, self.unit), self.unit)
        operand = self._operand(other, "divide")
        if operand is None:
            return NotImplemented
        return Time(self.value / operand.value, TimeUnit.DURATION)

    def __mul__(self, other: Time | str | int | float) -> Time:
        if is_real(other):
            return Time(_snapped(self.value * other, self.unit), self.unit)
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            return NotImplemented
        if TimeUnit.DURATION not in (self.unit, other.unit):
            raise RuntimeError(
                f"cannot multiply {self} by {other}: one factor must be a scalar or in 'dur' units"
            )
        unit = other.unit if self.unit is TimeUnit.DURATION else self.unit
        return Time(_snapped(self.value * other.value, unit), unit)

    __rmul__ = __mul__


@dataclass(frozen=True)
class Timestamp:
    """Training progress: counters since the start of training and within the current epoch, and wall-clock seconds.

    `batch` counts optimizer steps. `total_wct` and `epoch_wct` accumulate seconds; `batch_wct` is the
    duration of the last batch. Comparing with a `Time` or time string compares the counter of its unit:
    `timestamp >= '2ep'` is `timestamp.epoch >= 2`, and `timestamp >= '0.3dur'` is `timestamp.elapsed >= 0.3`.

    `max_duration` is the run's length (the trainer sets it in batches, so `elapsed` moves every step, not only
    at epoch ends as Composer's `get_elapsed_duration` does for a duration in epochs). It is a setting of the run
    rather than progress: `to_dict` leaves it out and a resumed run takes its own.
    """

    iteration: int = 0
    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    epoch_in_iteration: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    total_wct: float = 0.0
    epoch_wct: float = 0.0
    batch_wct: float = 0.0
    max_duration: Time | None = None

    @property
    def elapsed(self) -> float:
        """Return the fraction of `max_duration` done, in [0, 1]; 0.0 when the timestamp has no `max_duration`."""
        if self.max_duration is None:
            return 0.0
        return elapsed(self, self.max_duration)

    def with_max_duration(self, max_duration: Time | str | None) -> Timestamp:
        """Return the same progress measured against `max_duration` (in ep, ba, sp or tok)."""
        if max_duration is None:
            return replace(self, max_duration=None)
        duration = Time.from_input(max_duration, TimeUnit.EPOCH)
        if duration.unit not in _COUNTED_UNITS:
            raise ValueError(
                f"max_duration={max_duration!r} has unit {duration.unit.value!r}; expected ep, ba, sp or tok"
            )
        return replace(self, max_duration=duration)

    def advance(self, samples: int, tokens: int = 0, duration: float = 0.0, batches: int = 1) -> Timestamp:
        """Return the timestamp after one more batch of `samples` samples and `tokens` tokens taking `duration` s (or
        `batches` more, of those in all: `batch_wct` is then their mean)."""
        if samples < 0 or tokens < 0 or batches < 1:
            raise ValueError(f"samples={samples!r} and tokens={tokens!r} must both be >= 0, batches={batches!r} >= 1")
        # Built from a copy of the fields rather than through __init__: this runs on every training step.
        fields = self.__dict__.copy()
        fields.update(
            batch=self.batch + batches,
            sample=self.sample + samples,
            token=self.token + tokens,
            batch_in_epoch=self.batch_in_epoch + batches,
            sample_in_epoch=self.sample_in_epoch + samples,
            token_in_epoch=self.token_in_epoch + tokens,
            total_wct=self.total_wct + duration,
            epoch_wct=self.epoch_wct + duration,
            batch_wct=duration / batches,
        )
        advanced = object.__new__(Timestamp)
        object.__setattr__(advanced, "__dict__", fields)
        return advanced

    def next_epoch(self, duration: float = 0.0) -> Timestamp:
        """Return the timestamp at the start of the next epoch; `duration` s are added to `total_wct`."""
        return Timestamp(
            self.iteration,
            self.epoch + 1,
            self.batch,
            self.sample,
            self.token,
            self.epoch_in_iteration + 1,
            0,
            0,
            0,
            self.total_wct + duration,
            0.0,
            0.0,
            self.max_duration,
        )

    def get(self, unit: TimeUnit | str) -> int:
        """Return the counter for `unit` (iter, ep, ba, sp or tok) since the start of training."""
        counter = _COUNTERS.get(_as_unit(unit, "unit"))
        if counter is not None:
            return int(getattr(self, counter))
        raise ValueError(
            f"unit={_as_unit(unit, 'unit').value!r} has no counter; expected one of iter, ep, ba, sp, tok "
            "('dur' needs a max_duration, see elapsed(); wall-clock seconds are in total_wct)"
        )

    def to_dict(self) -> dict[str, int | float]:
        """Return the fields as plain ints and floats, for checkpoints."""
        return {name: getattr(self, name) for name in _TIMESTAMP_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timestamp:
        """Return the timestamp that `to_dict` wrote as `data`; unknown or missing keys are errors."""
        if not isinstance(data, dict):
            raise TypeError(f"data must be a dict from Timestamp.to_dict, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_TIMESTAMP_FIELDS))
        missing = [name for name in _TIMESTAMP_FIELDS if name not in data]
        if unknown or missing:
            raise ValueError(
                f"data is not a Timestamp dict: unknown keys {unknown}, missing keys {missing}; "
                f"expected exactly {list(_TIMESTAMP_FIELDS)}"
            )
        values: dict[str, int | float] = {}
        for name in _TIMESTAMP_FIELDS:
            value = data[name]
            counter = name not in _WALL_CLOCK_FIELDS
            if not (is_integer(value) if counter else is_real(value)) or not value >= 0:
                expected = "an int >= 0" if counter else "a number of seconds >= 0"
                raise ValueError(f"data[{name!r}]={value!r} is not a valid {name}; expected {expected}")
            values[name] = value if counter else float(value)
        return cls(**values)  # type: ignore[arg-type]

    def _counter_and_time(self, other: object) -> tuple[float, Time] | None:
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            return None
        if other.unit is TimeUnit.DURATION:
            if self.max_duration is None:
                raise ValueError(
                    f"cannot compare a timestamp without max_duration with {other}: "
                    "set it with with_max_duration(...)"
                )
            return self.elapsed, other
        return self.get(other.unit), other

    __ge__ = _timestamp_comparison(operator.ge)
    __gt__ = _timestamp_comparison(operator.gt)
    __le__ = _timestamp_comparison(operator.le)
    __lt__ = _timestamp_comparison(operator.lt)


_TIMESTAMP_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(Timestamp) if field.name != "max_duration")
_WALL_CLOCK_FIELDS = frozenset({"total_wct", "epoch_wct", "batch_wct"})
_COUNTED_UNITS = (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)
_COUNTERS = {
    TimeUnit.ITERATION: "iteration",
    TimeUnit.EPOCH: "epoch",
    TimeUnit.BATCH: "batch",
    TimeUnit.SAMPLE: "sample",
    TimeUnit.TOKEN: "token",
}


def elapsed(timestamp: Timestamp, max_duration: Time | str) -> float:
    """Return the fraction of `max_duration` (in ep, ba, sp or tok) that `timestamp` has done, clamped to [0, 1].

    A zero `max_duration` counts as done (1.0).
    """
    max_duration = Time.from_input(max_duration, TimeUnit.EPOCH)
    if max_duration.unit not in _COUNTED_UNITS:
        raise ValueError(
            f"max_duration={max_duration} has unit {max_duration.unit.value!r}; expected ep, ba, sp or tok"
        )
    if max_duration.value == 0:
        return 1.0
    return min(1.0, max(0.0, timestamp.get(max_duration.unit) / max_duration.value))


def to_steps(time: Time | str, *, steps_per_epoch: int, max_steps: int) -> int:
    """Return the number of optimizer steps that `time` (in ba, ep or dur) spans.

    `ep` counts `steps_per_epoch` steps each; `dur` is a fraction of `max_steps`, rounded to the nearest
    step (ties to even).
    """
    for name, count in (("steps_per_epoch", steps_per_epoch), ("max_steps", max_steps)):
        if not is_integer(count) or count < 0:
            raise ValueError(f"{name}={count!r} is not a step count; expected an int >= 0")
    time = Time.from_input(time, TimeUnit.BATCH)
    if time.unit is TimeUnit.BATCH:
        return int(time.value)
    if time.unit is TimeUnit.EPOCH:
        return int(time.value) * steps_per_epoch
    if time.unit is TimeUnit.DURATION:
        return round(time.value * max_steps)
    raise ValueError(
        f"time={time} is in {time.unit.value!r}, which has no fixed number of optimizer steps; "
        "expected ba, ep or dur"
    )
