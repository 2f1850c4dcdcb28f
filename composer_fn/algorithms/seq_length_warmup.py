"""Sequence length warmup: train on short sequences first and lengthen them over the warm-up (Li et al., 2021).

The length rises from ``min_seq_length`` to ``max_seq_length`` in steps of ``step_size`` with Composer's
formula, in whatever unit the warm-up is measured (``warmup`` units, ``progress`` units done so far)::

    increments = (max_seq_length - min_seq_length) // step_size
    every = warmup // increments
    length = clamp(min_seq_length + step_size * (progress // every), min_seq_length, max_seq_length)

A fractional ``duration`` (Composer's only form) is ``int(max_duration * duration)`` of the run's own unit
(batches in the Trainer), which gives Composer's schedule step for step. Where Composer divides by zero, the
result is defined here: a warm-up of no time gives ``max_seq_length`` at once, and a warm-up shorter than its
number of increments (``0 < warmup < increments``) takes ``progress * increments // warmup`` increments and
gives ``max_seq_length`` from ``progress = warmup`` on, so it ends on time.

Every sequence of the batch (the tokens and whatever has their ``[B, S]``: ``attention_mask``,
``token_type_ids``, per-token labels) is cut along dim 1 to the length (``truncate=True``) or, with
``truncate=False``, flattened and re-cut into rows of the length, dropping the tokens that do not fill a row;
one value per example (a ``[B]`` classification label) is kept as it is. A batch whose sequences are no longer
than the length is returned as it is.

The length is a shape, so it is chosen on the host: ``plan_key`` returns it (capped at the batch's own
length, so a run compiles one step per distinct shape) and the traced hook at AFTER_DATALOADER is specialised
to it as a Python int.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from composer_fn.algorithms._no_op import warn_at_user, warn_changes_nothing_here
from composer_fn.algorithms._sequences import set_batch_sequence_length
from composer_fn.algorithms._timing import stored_time
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit

__all__ = ["SeqLengthWarmup", "set_batch_sequence_length", "warmup_sequence_length"]

_DURATION_UNITS = (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN, TimeUnit.DURATION)


def warmup_sequence_length(
    progress: int, warmup: int, *, min_seq_length: int, max_seq_length: int, step_size: int
) -> int:
    """Returns the sequence length after ``progress`` of a warm-up lasting ``warmup`` (both in one unit).

    Composer's formula (see the module docstring): the length grows by ``step_size`` every
    ``warmup // increments`` units from ``min_seq_length`` and is capped at ``max_seq_length``.
    """
    _check_lengths(min_seq_length, max_seq_length, step_size)
    validate.integer("progress", progress, minimum=0)
    validate.integer("warmup", warmup, minimum=0)
    increments = (max_seq_length - min_seq_length) // step_size
    if increments == 0 or warmup == 0:
        return max_seq_length
    every = warmup // increments
    if every == 0:
        if progress >= warmup:
            return max_seq_length
        return min_seq_length + step_size * (progress * increments // warmup)
    return min(min_seq_length + step_size * (progress // every), max_seq_length)


def _check_lengths(min_seq_length: int, max_seq_length: int, step_size: int) -> None:
    validate.integer("min_seq_length", min_seq_length, minimum=1)
    validate.integer("max_seq_length", max_seq_length, minimum=1)
    validate.integer("step_size", step_size, minimum=1)
    if max_seq_length < min_seq_length:
        raise ValueError(f"max_seq_length={max_seq_length} must be at least min_seq_length={min_seq_length}")
    if 0 < max_seq_length - min_seq_length < step_size:
        raise ValueError(
            f"step_size={step_size} exceeds max_seq_length - min_seq_length = {max_seq_length - min_seq_length}, "
            "so the warm-up has no step; lower step_size, or set min_seq_length = max_seq_length for a fixed length"
        )


@functools.lru_cache(maxsize=64)
def _parsed_duration(duration: float | str) -> Time:
    time = validate.time("duration", duration, _DURATION_UNITS, "2000ba", number_unit=TimeUnit.DURATION)
    if time.unit is TimeUnit.DURATION and time.value > 1:
        raise ValueError(f"duration={duration!r} must be a fraction of the run in [0, 1]")
    return time


@register
@dataclass(frozen=True)
class SeqLengthWarmup(Algorithm):
    """Shortens the sequences of early batches, lengthening them over a warm-up (Composer's ``SeqLengthWarmup``).

    Args:
        duration: how long the warm-up lasts: a fraction of the run in [0, 1] (Composer's form), or a time
            such as ``'2000ba'``, ``'1e6tok'``, ``'512sp'``, ``'2ep'`` or ``'0.3dur'`` (a ``Time`` is stored as its
            string). A warm-up in epochs counts whole epochs (the timestamp does not say how many batches an
            epoch holds), so the length changes only at epoch boundaries; the others change it batch by batch.
            A fraction needs the timestamp's ``max_duration``, which the Trainer sets.
        min_seq_length: the length at the start.
        max_seq_length: the length the warm-up ends at (never exceeded).
        step_size: the increment of the length (a multiple of 8 suits GPU tensor cores).
        truncate: cut sequences (True) or re-cut the batch into more, shorter rows (False).
        preserve_end_of_sequence: keep each row's last token when truncating (see
            ``set_batch_sequence_length``).
    """

    algorithm_name = "seq_length_warmup"

    duration: float | str = 0.3
    min_seq_length: int = 8
    max_seq_length: int = 1024
    step_size: int = 8
    truncate: bool = True
    preserve_end_of_sequence: bool = False

    def __post_init__(self) -> None:
        duration = stored_time("duration", self.duration, "2000ba")
        _parsed_duration(duration)
        object.__setattr__(self, "duration", duration)
        _check_lengths(self.min_seq_length, self.max_seq_length, self.step_size)
        validate.flag("truncate", self.truncate)
        validate.flag("preserve_end_of_sequence", self.preserve_end_of_sequence)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.BATCH_START: self._check_data_length}

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        # The data's length is first known at the run's first batch: it is checked there, once.
        return event is not Event.BATCH_START or timestamp.batch == 0

    def _check_data_length(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        duration = _parsed_duration(self.duration)
        run = timestamp.max_duration
        if duration.unit is TimeUnit.DURATION and run is not None and int(run.value * duration.value) == 0:
            warn_changes_nothing_here(
                "SeqLengthWarmup",
                f"SeqLengthWarmup(duration={self.duration!r}) changes nothing: {duration.value:g} of this run's "
                f"{run} rounds down to a warm-up of 0{run.unit.value}, so every batch keeps its length; give the "
                f"warm-up as a time (e.g. duration='{max(1, int(run.value) // 3)}{run.unit.value}') or a longer run",
            )
        if meta is None or len(meta.input_shape) < 2:
            return static, state
        length = meta.input_shape[1]
        if self.min_seq_length >= length:
            warn_changes_nothing_here(
                "SeqLengthWarmup",
                f"SeqLengthWarmup(min_seq_length={self.min_seq_length}) changes nothing: the data's sequences "
                f"hold {length} tokens, no more than the warm-up's shortest length, so no batch is shortened; "
                f"use min_seq_length < {length} or leave SeqLengthWarmup out",
            )
        elif self.max_seq_length < length:
            warn_at_user(
                f"SeqLengthWarmup(max_seq_length={self.max_seq_length}) never reaches the data's sequence length "
                f"of {length} tokens: every batch of the run, after the warm-up too, is cut to at most "
                f"{self.max_seq_length} tokens; set max_seq_length={length} to train on whole sequences after it"
            )
        return static, state

    def sequence_length(self, timestamp: Timestamp) -> int:
        """Returns the length the warm-up gives batches at ``timestamp``."""
        duration = _parsed_duration(self.duration)
        if duration.unit is TimeUnit.DURATION:
            run = timestamp.max_duration
            if run is None:
                raise ValueError(
                    f"SeqLengthWarmup(duration={self.duration!r}) is a fraction of the run, but the timestamp has "
                    "no max_duration; set it with timestamp.with_max_duration(...) or give duration in ba, ep, sp "
                    "or tok"
                )
            unit, warmup = run.unit, int(run.value * duration.value)
        else:
            unit, warmup = duration.unit, int(duration.value)
        return warmup_sequence_length(
            timestamp.get(unit),
            warmup,
            min_seq_length=self.min_seq_length,
            max_seq_length=self.max_seq_length,
            step_size=self.step_size,
        )

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        length = self.sequence_length(timestamp)
        # Every length at or beyond the batch's own leaves it unchanged: one key, one compiled step, for all.
        if meta is not None and len(meta.input_shape) > 1:
            return min(length, meta.input_shape[1])
        return length

    def traced_hooks(self, plan_key: Hashable = None) -> Mapping[Event, Hook]:
        length = self.max_seq_length if plan_key is None else plan_key
        if not validate.is_integer(length):
            raise TypeError(f"plan_key={plan_key!r}: expected the sequence length (an int) that plan_key returned")
        return {Event.AFTER_DATALOADER: functools.partial(self._set_length, length)}

    def _set_length(self, length: int, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        batch = set_batch_sequence_length(ctx.batch, length, self.truncate, self.preserve_end_of_sequence)
        return state, ctx.replace(batch=batch)
