"""When Composer's host events happen, seen from the timestamps our trainer plans with, and time parsing."""

from __future__ import annotations

import dataclasses

from composer_fn.core.time import Time, Timestamp, TimeUnit

__all__ = ["parse_time", "batch_end_times", "epoch_end_times"]


def parse_time(value: str, argument: str, units: tuple[TimeUnit, ...], example: str) -> Time:
    """Returns ``value`` parsed as a time in one of ``units``; a ValueError names ``argument`` otherwise."""
    accepted = ", ".join(u.value for u in units)
    try:
        parsed = Time.from_timestring(value) if isinstance(value, str) else None
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.unit not in units:
        raise ValueError(f"{argument}={value!r} must be a time string in {accepted}, e.g. {example!r}")
    return parsed


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
