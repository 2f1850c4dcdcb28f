"""When Composer's host events happen, seen from the timestamps our trainer plans with, and how a record
stores a time it was given."""

from __future__ import annotations

import dataclasses

from composer_fn.core.time import Time, Timestamp
from composer_fn.core.validate import is_real

__all__ = ["stored_time", "batch_end_times", "epoch_end_times"]


def stored_time(argument: str, value: object, example: str) -> float | str:
    """Returns ``value`` in the form a record stores a time: a float (a fraction of the run) or a time string.

    Any number (an int, a NumPy scalar) becomes a Python float and a ``Time`` its string, so that equal times make
    equal, JSON-friendly records.
    Raises TypeError naming ``argument`` for anything else; ``example`` shows a time string it accepts.
    """
    if isinstance(value, Time):
        return value.to_timestring()
    if is_real(value):
        return float(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{argument}={value!r} ({type(value).__name__}): expected a fraction of the run (float), a time "
            f"string such as {example!r}, or a Time"
        )
    return value


def batch_end_times(timestamp: Timestamp) -> tuple[Timestamp, Timestamp | None]:
    """Returns Composer's ``BATCH_END`` timestamp of the step starting at ``timestamp``, and of the step before.

    The traced step is planned from the timestamp before the batch; Composer decides at ``BATCH_END``, one batch
    later. The previous batch ended in the previous epoch when this one opens an epoch.
    """
    now = timestamp.advance(0)
    if timestamp.batch == 0:
        return now, None
    if timestamp.batch_in_epoch == 0 and timestamp.epoch > 0:
        return now, dataclasses.replace(timestamp, epoch=timestamp.epoch - 1)
    return now, timestamp


def epoch_end_times(timestamp: Timestamp) -> tuple[Timestamp, Timestamp | None]:
    """Returns Composer's ``EPOCH_END`` timestamp (the epoch already counted) and that of the epoch before."""
    now = timestamp.next_epoch()
    if timestamp.epoch == 0:
        return now, None
    begun = timestamp.batch - timestamp.batch_in_epoch
    return now, dataclasses.replace(timestamp, batch=begun, batch_in_epoch=0)
