"""EMA: evaluate with an exponential moving average of the weights (Composer's ``EMA``).

``average = smoothing * average + (1 - smoothing) * weights`` after every ``update_interval`` of training, over
the parameters and the buffers (Composer averages BatchNorm statistics too). A half-life ``h`` gives
``smoothing = 2 ** (-update_interval / h)``: the weight of an update falls to one half after ``h``.

The average lives in ``State.algos["ema"]``, an ``EMAState``, next to the training weights, never in place of
them:

- an interval in batches updates inside the compiled step at ``AFTER_OPTIMIZER_STEP``; one in epochs updates on
  the host at ``EPOCH_END``;
- the first update at or after ``ema_start`` restarts the average from the weights of that moment (Composer's
  rule), and only from then on does evaluation see it;
- ``EVAL_START`` swaps the average into ``State.params``/``State.buffers`` and the training weights into
  ``State.algos["ema"]``; ``EVAL_END`` swaps them back, so training resumes from its own weights bit for bit
  and a checkpoint holds both.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from composer_fn.algorithms._timing import batch_end_times, epoch_end_times
from composer_fn.core import validate
from composer_fn.core.algorithm import (
    Algorithm,
    Capabilities,
    ChangesNothing,
    Hook,
    HostHook,
    UnfitForTheRun,
    register,
)
from composer_fn.core.event import Event
from composer_fn.core.host import eager
from composer_fn.core.records import Record, record
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit

__all__ = ["EMA", "EMAState", "compute_ema", "ema_smoothing", "ema_update"]

_INTERVAL_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH)
_START_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.DURATION)
_START = "start"


def _check_smoothing(smoothing: float | Tensor) -> None:
    if isinstance(smoothing, Tensor):
        if smoothing.dim() != 0:
            raise ValueError(
                f"smoothing of shape {tuple(smoothing.shape)}: expected a number or a 0-d tensor"
            )
        return
    validate.real("smoothing", smoothing, minimum=0.0, maximum=1.0)


def _check_names(average: Mapping[str, Tensor], params: Mapping[str, Tensor], of: tuple[str, str]) -> None:
    if average.keys() != params.keys():
        missing, extra = sorted(params.keys() - average.keys()), sorted(average.keys() - params.keys())
        raise ValueError(
            f"{of[0]} and {of[1]} must hold the same names: {missing} only in {of[1]}, {extra} only in {of[0]}"
        )


def _mismatch(average: Mapping[str, Tensor], params: Mapping[str, Tensor], of: tuple[str, str]) -> ValueError | None:
    """Returns the error naming the first name whose two tensors cannot be averaged, or None if there is none."""
    for name, old in average.items():
        new = params[name]
        for side, value in ((of[0], old), (of[1], new)):
            if not isinstance(value, Tensor):
                return ValueError(f"{side}[{name!r}] of type {type(value).__name__}: expected a tensor")
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            return ValueError(
                f"{of[0]}[{name!r}] ({tuple(old.shape)}, {old.dtype}, {old.device}) and {of[1]}[{name!r}] "
                f"({tuple(new.shape)}, {new.dtype}, {new.device}) must have the same shape, dtype and device"
            )
    return None


def ema_update(
    average: Mapping[str, Tensor], params: Mapping[str, Tensor], smoothing: float | Tensor
) -> dict[str, Tensor]:
    """Returns ``smoothing * average + (1 - smoothing) * params`` for every name, as new tensors.

    Floating-point tensors are averaged in one ``torch._foreach_lerp`` (the update of
    ``torch.optim.swa_utils.get_ema_multi_avg_fn``); integer tensors, such as BatchNorm's
    ``num_batches_tracked``, are counters rather than weights and take the value in ``params``. Neither input is
    modified. Both must hold the same names, with tensors of the same shape, dtype and device.
    """
    return _updated(average, params, smoothing, ("average", "params"))


def _updated(
    average: Mapping[str, Tensor], params: Mapping[str, Tensor], smoothing: float | Tensor, of: tuple[str, str]
) -> dict[str, Tensor]:
    _check_smoothing(smoothing)
    _check_names(average, params, of)
    if eager():
        # Found only when the update fails, so the check costs nothing on a good step.
        try:
            return _lerped(average, params, smoothing)
        except (RuntimeError, TypeError, AttributeError) as error:
            mismatch = _mismatch(average, params, of)
            if mismatch is None:
                raise
            raise mismatch from error
    return _lerped(average, params, smoothing)


def _lerped(average: Mapping[str, Tensor], params: Mapping[str, Tensor], smoothing: float | Tensor) -> dict[str, Tensor]:
    floating = [n for n, t in average.items() if t.is_floating_point() or t.is_complex()]
    weight = 1.0 - smoothing
    old, new = [average[n] for n in floating], [params[n] for n in floating]
    # The stubs list only number weights; a 0-d tensor weight is an overload of the same kernel.
    mixed = torch._foreach_lerp(old, new, weight) if floating else []  # type: ignore[arg-type]
    updated = dict(zip(floating, mixed, strict=True))
    return {n: updated[n] if n in updated else params[n].clone() for n in average}


def compute_ema(
    model: Mapping[str, Tensor], ema_model: Mapping[str, Tensor], smoothing: float | Tensor = 0.99
) -> dict[str, Tensor]:
    """Returns ``ema_model`` moved towards ``model``: ``smoothing * ema + (1 - smoothing) * model`` per name.

    Composer's ``compute_ema(model, ema_model, smoothing)`` over tensor dictionaries (parameters and buffers by
    qualified name) rather than modules, returning the new average instead of writing into ``ema_model``.
    Unlike Composer, which averages the names both hold and skips the others without a word, the two must hold
    the same names, with tensors of the same shape, dtype and device: a ValueError names the first that differ.
    """
    return _updated(ema_model, model, smoothing, ("ema_model", "model"))


def ema_smoothing(half_life: str, update_interval: str | None = None) -> float:
    """Returns Composer's smoothing for a half-life: ``2 ** (-update_interval / half_life)``.

    ``update_interval`` defaults to one unit of ``half_life`` (``'1ba'`` for ``'1000ba'``), which gives
    ``exp(-ln 2 / half_life)``; a longer interval gives that per-unit smoothing raised to its length.
    """
    life = validate.time("half_life", half_life, _INTERVAL_UNITS, "1000ba")
    if life.value <= 0:
        raise ValueError(f"half_life={half_life!r} must be positive, e.g. '1000ba'")
    interval = Time(1, life.unit) if update_interval is None else _interval(update_interval)
    if interval.unit is not life.unit:
        raise ValueError(
            f"update_interval={update_interval!r} and half_life={half_life!r} must share a unit "
            f"(both in {life.unit.value} or both in {interval.unit.value})"
        )
    return math.exp(-math.log(2.0) * interval.value / life.value)


def _interval(update_interval: str) -> Time:
    interval = validate.time("update_interval", update_interval, _INTERVAL_UNITS, "1ba")
    if not (interval.value > 0 and float(interval.value).is_integer()):
        raise ValueError(
            f"update_interval={update_interval!r} must be a positive whole number of ba or ep, e.g. '1ba'"
        )
    return interval


class _Schedule(NamedTuple):
    interval: Time
    start: Time
    smoothing: float


@functools.lru_cache(maxsize=64)
def _schedule(algorithm: EMA) -> _Schedule:
    if (algorithm.half_life is None) == (algorithm.smoothing is None):
        raise ValueError(
            f"EMA needs exactly one of half_life and smoothing; got half_life={algorithm.half_life!r}, "
            f"smoothing={algorithm.smoothing!r}: give half_life as a time string such as '1000ba', or smoothing "
            "in [0, 1] with half_life=None"
        )
    start = validate.time("ema_start", algorithm.ema_start, _START_UNITS, "0.0dur")
    if algorithm.half_life is not None:
        life = validate.time("half_life", algorithm.half_life, _INTERVAL_UNITS, "1000ba")
        interval = (
            Time(1, life.unit) if algorithm.update_interval is None else _interval(algorithm.update_interval)
        )
        return _Schedule(interval, start, ema_smoothing(algorithm.half_life, algorithm.update_interval))
    assert algorithm.smoothing is not None
    _check_smoothing(algorithm.smoothing)
    interval = (
        Time(1, TimeUnit.BATCH) if algorithm.update_interval is None else _interval(algorithm.update_interval)
    )
    return _Schedule(interval, start, float(algorithm.smoothing))


def _copies(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {n: t.detach().clone() for n, t in tensors.items()}


@record
class EMAState(Record):
    """EMA's entry of ``State.algos``: the average of the weights, and whether it has started.

    Attributes:
        params: the averaged parameters by qualified name (the training ones while an evaluation has the average
            swapped in).
        buffers: the averaged buffers by qualified name, likewise.
        started: 0-d bool tensor: whether averaging has begun (evaluation uses the average only from then on).
    """

    params: Mapping[str, Tensor]
    buffers: Mapping[str, Tensor]
    started: Tensor


@register
@dataclass(frozen=True)
class EMA(Algorithm):
    """Keeps an exponential moving average of the weights and evaluates with it (Composer's ``EMA``).

    Args:
        half_life: the time (``'1000ba'``, ``'2ep'``) after which an update's weight in the average has halved;
            None when ``smoothing`` is given.
        smoothing: the weight of the old average at each update, in [0, 1]; None when ``half_life`` is given.
        ema_start: when averaging begins (``'0.0dur'``, ``'100ba'``, ``'1ep'``); the first update from then on
            restarts the average from the current weights, and evaluation uses the training weights before it.
        update_interval: how often to update (``'1ba'``, ``'1ep'``); one unit of ``half_life`` by default, else
            ``'1ba'``. Must share the unit of ``half_life``.
    """

    algorithm_name = "ema"

    half_life: str | None = "1000ba"
    smoothing: float | None = None
    ema_start: str = "0.0dur"
    update_interval: str | None = None

    def __post_init__(self) -> None:
        _schedule(self)

    @property
    def update_smoothing(self) -> float:
        """Returns the smoothing applied at each update (``2 ** (-update_interval / half_life)``)."""
        return _schedule(self).smoothing

    @property
    def _in_batches(self) -> bool:
        return _schedule(self).interval.unit is TimeUnit.BATCH

    def init(self, static: Static, state: State) -> EMAState:
        return EMAState(
            params=_copies(state.params),
            buffers=_copies(state.buffers),
            started=torch.zeros((), dtype=torch.bool, device=state.step.device),
        )

    def capabilities(self) -> Capabilities:
        return Capabilities(checks_length=self._checks_length)

    def _first_step(self, max_steps: int, steps_per_epoch: int) -> int:
        start = _schedule(self).start
        first = {
            TimeUnit.DURATION: start.value * max_steps,
            TimeUnit.EPOCH: start.value * steps_per_epoch,
            TimeUnit.BATCH: start.value,
        }[start.unit]
        return math.ceil(first)

    def changes_nothing_in(self, max_steps: int, steps_per_epoch: int) -> str | None:
        first = self._first_step(max_steps, steps_per_epoch)
        if first < max_steps:
            return None
        return f"EMA(ema_start={self.ema_start!r}) starts at step {first}, and the whole run is {max_steps}: it never averages"

    def _checks_length(self, max_steps: int, steps_per_epoch: int) -> None:
        # The average starts from the weights of its first update; after n more updates those weights still hold
        # smoothing ** n of it. A half-life beyond a quarter of the span leaves them more than 1/16 at the end.
        reason = self.changes_nothing_in(max_steps, steps_per_epoch)
        if reason is not None:
            warnings.warn(ChangesNothing(reason, "EMA"), stacklevel=4)  # the user's Trainer(...) call
            return
        schedule = _schedule(self)
        span = max_steps - self._first_step(max_steps, steps_per_epoch)
        per_update = schedule.interval.value * (steps_per_epoch if schedule.interval.unit is TimeUnit.EPOCH else 1)
        updates = span // per_update
        left = schedule.smoothing**updates
        if left <= 2**-4:
            return
        # A tenth of the span, in the interval's unit; in batches where that is under one epoch (unless the
        # interval is set in epochs, which the half-life must share).
        in_epochs = schedule.interval.unit is TimeUnit.EPOCH
        if in_epochs and (span / steps_per_epoch >= 10 or self.update_interval is not None):
            unit, length = "ep", span / steps_per_epoch
        else:
            unit, length = "ba", float(span)
        suggested = max(1, round(length / 10))
        setting = f"half_life={self.half_life!r}" if self.half_life is not None else f"smoothing={self.smoothing!r}"
        warnings.warn(
            UnfitForTheRun(
                f"EMA({setting}) averages over {span} steps of this {max_steps}-step run, and at its end the weights "
                f"it started from still hold {left:.0%} of the average that evaluation and the checkpoint use: "
                f"a half-life of at most a quarter of the span acts (half_life='{suggested}{unit}' leaves them "
                f"{2 ** -(length / suggested):.1%})",
                "EMA",
            ),
            stacklevel=4,  # the user's Trainer(...) call
        )

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        if not self._in_batches:
            return {}
        if plan_key == _START:
            return {Event.AFTER_OPTIMIZER_STEP: self._restart}
        # Resolved here, on the host: the traced hook binds the smoothing as a constant.
        smoothing = self.update_smoothing

        def update(state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
            return self._averaged(state, smoothing), ctx

        return {Event.AFTER_OPTIMIZER_STEP: update}

    def host_hooks(self) -> Mapping[Event, HostHook]:
        hooks: dict[Event, HostHook] = {Event.EVAL_START: self._swap, Event.EVAL_END: self._swap}
        if not self._in_batches:
            hooks[Event.EPOCH_END] = self._update_at_epoch_end
        return hooks

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        if event is Event.AFTER_OPTIMIZER_STEP:
            return self._updates(*batch_end_times(timestamp))
        if event is Event.EPOCH_END:
            return self._updates(*epoch_end_times(timestamp))
        return True

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        if self._in_batches and self._restarts(*batch_end_times(timestamp)):
            return _START
        return ()

    def _reached(self, timestamp: Timestamp) -> bool:
        start = _schedule(self).start
        if start.unit is TimeUnit.DURATION:
            return timestamp.elapsed >= start.value
        return timestamp.get(start.unit) >= start.value

    def _restarts(self, now: Timestamp, previous: Timestamp | None) -> bool:
        # The start test is monotone in time, so the average begins at the first update event that passes it.
        return self._reached(now) and (previous is None or not self._reached(previous))

    def _updates(self, now: Timestamp, previous: Timestamp | None) -> bool:
        interval = _schedule(self).interval
        due = now.get(interval.unit) % int(interval.value) == 0
        return self._restarts(now, previous) or (due and self._reached(now))

    def _restart(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        return self._restarted(state), ctx

    def _update_at_epoch_end(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        restarts = self._restarts(*epoch_end_times(timestamp))
        return static, self._restarted(state) if restarts else self._averaged(state, self.update_smoothing)

    def _averaged(self, state: State, smoothing: float) -> State:
        entry: EMAState = state.algos[self.name]
        # One foreach call over parameters and buffers together: qualified names never collide across them.
        average = ema_update({**entry.params, **entry.buffers}, {**state.params, **state.buffers}, smoothing)
        new_entry = entry.replace(
            params={n: average[n] for n in entry.params}, buffers={n: average[n] for n in entry.buffers}
        )
        return state.with_algo(self.name, new_entry)

    def _restarted(self, state: State) -> State:
        entry: EMAState = state.algos[self.name]
        new_entry = EMAState(
            params=_copies(state.params), buffers=_copies(state.buffers), started=torch.ones_like(entry.started)
        )
        return state.with_algo(self.name, new_entry)

    def _swap(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        # Selecting with the start flag keeps the hook free of host reads of tensor values; before the
        # average has started both selections return the training weights, and swapping twice is exact.
        entry: EMAState = state.algos[self.name]
        started = entry.started
        params = {n: torch.where(started, entry.params[n], p) for n, p in state.params.items()}
        buffers = {n: torch.where(started, entry.buffers[n], b) for n, b in state.buffers.items()}
        kept = entry.replace(
            params={n: torch.where(started, p, entry.params[n]) for n, p in state.params.items()},
            buffers={n: torch.where(started, b, entry.buffers[n]) for n, b in state.buffers.items()},
        )
        return static, state.with_algo(self.name, kept).replace(params=params, buffers=buffers)
