"""SWA: stochastic weight averaging (Composer's ``SWA``, Izmailov et al. 2018), with BatchNorm recomputed.

From ``swa_start`` on, every ``update_interval`` the running average of the weights takes in the current
ones, ``average += (weights - average) / (n + 1)`` (``torch.optim.swa_utils.AveragedModel``'s default). At
``swa_end`` the averaged parameters replace the training ones and the BatchNorm statistics are recomputed for
them by one pass over the training inputs (``torch.optim.swa_utils.update_bn``: statistics reset, then a
cumulative average over the batches, in training mode). Training goes on from the averaged weights if the run
is longer, as in Composer.

When each event happens follows Composer: an interval in batches is checked at ``BATCH_END``, one in epochs
at ``EPOCH_END``; the events from the first one at or after ``swa_start`` are counted and every
``update_interval``-th one (the first included) updates the average; the first event at or after ``swa_end``
ends averaging. Those times are fixed by the schedule, so they are computed on the host, and the average and
its count live in ``State.algos["swa"]``, an ``SWAState``.

With ``schedule_swa_lr``, from the first update on the learning-rate multiplier anneals (``'linear'`` or
``'cos'``) from its value at ``swa_start``, ``m0``, to ``swa_lr`` over ``anneal_steps`` updates, like
``torch.optim.swa_utils.SWALR``: after the ``j``-th update it is ``m0 + (swa_lr - m0) * a(min(1, j /
anneal_steps))``, with ``a(t) = t`` or ``(1 - cos(pi t)) / 2``. ``swa_lr`` is a multiplier of the optimizer's
learning rate (the unit of every schedule here); ``None`` holds ``m0``, which is what Composer does (it
replaces ``swa_lr`` by the current rate).
"""

from __future__ import annotations

import bisect
import copy
import functools
import itertools
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call

from composer_fn.algorithms._no_op import warn_at_user, warn_changes_nothing_here
from composer_fn.algorithms._timing import batch_end_times, epoch_end_times
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Capabilities, Hook, HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.records import Record, record
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit

__all__ = ["SWA", "SWAState", "swa_update", "recompute_batchnorm", "SWASchedule"]

_WINDOW_UNITS = (TimeUnit.DURATION, TimeUnit.EPOCH)
_INTERVAL_UNITS = (TimeUnit.BATCH, TimeUnit.EPOCH)
_STRATEGIES = {"linear": "linear", "lin": "linear", "cos": "cos", "cosine": "cos"}


def swa_update(average: Mapping[str, Tensor], params: Mapping[str, Tensor], n_averaged: int | Tensor) -> dict[str, Tensor]:
    """Returns ``average + (params - average) / (n_averaged + 1)`` per name, as new tensors (the first update copies).

    ``torch.optim.swa_utils.AveragedModel.update_parameters`` with its default averaging; ``n_averaged`` is the
    number of weight sets averaged so far (0 gives ``params``). Neither input is modified.
    """
    if average.keys() != params.keys():
        raise ValueError(
            f"average and params must hold the same names; only in params: {sorted(params.keys() - average.keys())}, "
            f"only in average: {sorted(average.keys() - params.keys())}"
        )
    names = list(average)
    old, new = [average[n] for n in names], [params[n] for n in names]
    for name, before, after in zip(names, old, new, strict=True):
        if not (isinstance(before, Tensor) and isinstance(after, Tensor)):
            raise TypeError(f"average[{name!r}] and params[{name!r}] must be tensors")
        if before.shape != after.shape or before.dtype != after.dtype:
            raise ValueError(
                f"average[{name!r}] ({tuple(before.shape)}, {before.dtype}) and params[{name!r}] "
                f"({tuple(after.shape)}, {after.dtype}) must have the same shape and dtype"
            )
    if isinstance(n_averaged, Tensor):
        # 1 / (n + 1) is 1 for the first update, so the average starts as an exact copy of the weights.
        weight = 1.0 / (n_averaged.to(torch.float32) + 1.0)
        mixed = list(torch._foreach_lerp(old, new, weight)) if old else []  # type: ignore[call-overload]
    else:
        validate.integer("n_averaged", n_averaged, minimum=0)
        mixed = [p.clone() for p in new] if n_averaged == 0 else list(torch._foreach_lerp(old, new, 1.0 / (n_averaged + 1)))
    return dict(zip(names, mixed, strict=True))


def recompute_batchnorm(
    module: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], inputs: Iterable[Any]
) -> dict[str, Tensor]:
    """Returns ``buffers`` with every BatchNorm's statistics recomputed over ``inputs`` at ``params``.

    ``torch.optim.swa_utils.update_bn`` without its side effects: each BatchNorm's running mean and variance
    restart from 0 and 1 and become the cumulative average of the batch statistics over ``inputs`` (momentum
    None), in training mode, and ``num_batches_tracked`` counts the batches. Other buffers are returned as
    given. ``module``, ``params`` and ``buffers`` are not modified; with no BatchNorm the result equals
    ``buffers``. ``inputs`` must yield at least one batch (checked before any statistic is reset), and
    ``params`` and ``buffers`` may only name tensors of ``module``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module of type {type(module).__name__}: expected a torch.nn.Module")
    for argument, given, known in (
        ("params", params, dict(module.named_parameters())),
        ("buffers", buffers, dict(module.named_buffers())),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"{argument} holds {unknown[:5]}, which module {type(module).__name__} does not have")
    norms = {name: m for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    if not norms:
        return dict(buffers)
    batches = iter(inputs)
    first = next(batches, _NOTHING)
    if first is _NOTHING:
        raise ValueError(
            f"inputs={inputs!r} yields no batch: recomputing the BatchNorm statistics needs at least one "
            "(nothing was reset)"
        )
    inputs = itertools.chain((first,), batches)
    structure = copy.deepcopy(module).train()
    for name in norms:
        norm = structure.get_submodule(name)
        assert isinstance(norm, nn.modules.batchnorm._BatchNorm)
        norm.momentum = None
    fresh = {name: b.clone() for name, b in buffers.items()}
    for name in norms:
        for statistic, value in (("running_mean", 0.0), ("running_var", 1.0), ("num_batches_tracked", 0)):
            qualified = f"{name}.{statistic}" if name else statistic
            if qualified in fresh:
                fresh[qualified] = torch.full_like(fresh[qualified], value)
    with torch.no_grad():
        for input in inputs:
            functional_call(structure, (dict(params), fresh), (input,))
    return fresh


_NOTHING = object()


class _Events(NamedTuple):
    updates: tuple[int, ...]
    """The batch counts at which the average takes in the weights, in order."""
    end: int | None
    """The batch count at which averaging ends and the average replaces the weights (None: not in the run)."""


@dataclass(frozen=True)
class SWASchedule:
    """The learning-rate multiplier with SWA's annealing from the first update on (see the module docstring)."""

    base: Any
    updates: tuple[int, ...]
    start_multiplier: float
    swa_lr: float
    anneal_steps: int
    strategy: str

    def _annealed(self, fraction: float | Tensor) -> float | Tensor:
        if self.strategy == "linear":
            return fraction
        if isinstance(fraction, Tensor):
            return (1.0 - torch.cos(math.pi * fraction)) / 2.0
        return (1.0 - math.cos(math.pi * fraction)) / 2.0

    def __call__(self, step: int | Tensor) -> float | Tensor:
        first = self.updates[0]
        if isinstance(step, Tensor):
            position = step.to(torch.float64)
            points = torch.tensor(self.updates, dtype=torch.float64, device=position.device)
            done = torch.searchsorted(points, position, right=True).to(torch.float64)
            fraction = torch.clamp(done / self.anneal_steps, 0.0, 1.0)
            swa = self.start_multiplier + (self.swa_lr - self.start_multiplier) * self._annealed(fraction)
            base = self.base(step)
            base = base if isinstance(base, Tensor) else torch.full_like(position, base)
            return torch.where(position < first, base.to(torch.float64), swa).to(torch.float32)
        index = int(step)
        if index < first:
            return self.base(index)  # type: ignore[no-any-return]
        taken = bisect.bisect_right(self.updates, index)
        part = min(1.0, taken / self.anneal_steps)
        return self.start_multiplier + (self.swa_lr - self.start_multiplier) * float(self._annealed(part))


@record
class SWAState(Record):
    """SWA's entry of ``State.algos``: the running average of the weights and how many it has taken in.

    Attributes:
        params: the averaged parameters by qualified name.
        n_averaged: 0-d int64 tensor: the number of weight sets averaged so far.
    """

    params: Mapping[str, Tensor]
    n_averaged: Tensor


@register
@dataclass(frozen=True)
class SWA(Algorithm):
    """Averages the weights from ``swa_start`` to ``swa_end`` and trains on from the average (Composer's ``SWA``).

    Args:
        swa_start: when averaging begins, in dur or ep (``'0.7dur'``, ``'6ep'``).
        swa_end: when the average replaces the weights (with BatchNorm recomputed), in the unit of ``swa_start``.
        update_interval: how often the average takes in the weights, in ba or ep (``'1ep'``, ``'5ba'``).
        schedule_swa_lr: anneal the learning-rate multiplier to ``swa_lr`` from the first update on.
        anneal_strategy: ``'linear'`` or ``'cos'`` (``'lin'``/``'cosine'`` accepted).
        anneal_steps: the number of updates the annealing takes, >= 1.
        swa_lr: the multiplier annealed to; None holds the multiplier at ``swa_start``.
    """

    algorithm_name = "swa"
    requires = frozenset({"train_data"})

    swa_start: str = "0.7dur"
    swa_end: str = "0.97dur"
    update_interval: str = "1ep"
    schedule_swa_lr: bool = False
    anneal_strategy: str = "linear"
    anneal_steps: int = 10
    swa_lr: float | None = None

    def __post_init__(self) -> None:
        start = validate.time("swa_start", self.swa_start, _WINDOW_UNITS, "0.7dur")
        end = validate.time("swa_end", self.swa_end, _WINDOW_UNITS, "0.97dur")
        if start.unit is not end.unit:
            raise ValueError(
                f"swa_start={self.swa_start!r} and swa_end={self.swa_end!r} must share a unit (both dur or both ep)"
            )
        for argument, value in (("swa_start", start), ("swa_end", end)):
            if value.unit is TimeUnit.DURATION and value.value > 1:
                raise ValueError(f"{argument}={getattr(self, argument)!r} must be in [0, 1] dur or >= 0 ep")
        if not start.value < end.value:
            raise ValueError(f"swa_end={self.swa_end!r} must come after swa_start={self.swa_start!r}")
        interval = validate.time("update_interval", self.update_interval, _INTERVAL_UNITS, "1ep")
        if not (interval.value >= 1 and float(interval.value).is_integer()):
            raise ValueError(f"update_interval={self.update_interval!r} must be a whole number >= 1 of ba or ep")
        validate.choice("anneal_strategy", self.anneal_strategy, _STRATEGIES)
        validate.integer("anneal_steps", self.anneal_steps, minimum=1)
        if self.swa_lr is not None:
            validate.real("swa_lr", self.swa_lr, minimum=0.0, hint="a learning-rate multiplier, or None")

    @property
    def _interval(self) -> Time:
        return Time.from_timestring(self.update_interval)

    @property
    def _in_batches(self) -> bool:
        return self._interval.unit is TimeUnit.BATCH

    def init(self, static: Static, state: State) -> SWAState:
        return SWAState(
            params={n: p.detach().clone() for n, p in state.params.items()},
            n_averaged=torch.zeros((), dtype=torch.int64, device=state.step.device),
        )

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.AFTER_OPTIMIZER_STEP: self._update_in_step} if self._in_batches else {}

    def host_hooks(self) -> Mapping[Event, HostHook]:
        if self._in_batches:
            return {Event.BATCH_END: self._finish}
        return {Event.EPOCH_END: self._update_at_epoch_end}

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        if event is Event.AFTER_OPTIMIZER_STEP:
            now = batch_end_times(timestamp)[0]
            return now.batch in self._events_for(now).updates
        if event is Event.BATCH_END:
            return timestamp.batch == self._events_for(timestamp).end
        if event is Event.EPOCH_END:
            now = epoch_end_times(timestamp)[0]
            events = self._events_for(now)
            return now.batch in events.updates or now.batch == events.end
        return False

    def _events_for(self, now: Timestamp) -> _Events:
        max_steps = int(now.max_duration.value) if now.max_duration is not None else 0
        if now.max_duration is None or now.max_duration.unit is not TimeUnit.BATCH:
            raise ValueError("SWA needs timestamps whose max_duration is in batches (the Trainer sets it)")
        finished_batches = now.batch - now.batch_in_epoch
        # Epochs have one length in a run; before the first epoch ends no event depends on it.
        steps_per_epoch = max(finished_batches // now.epoch, 1) if now.epoch > 0 and finished_batches > 0 else max(max_steps, 1)
        return _events(self, steps_per_epoch, max_steps)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            lr_multiplier=self.lr_multiplier if self.schedule_swa_lr else None,
            checks_length=self.check_length,
            unshardable=self.unshardable,
        )

    def unshardable(self, module: object) -> str | None:
        """Why a sharded run of ``module`` cannot run SWA: a model with BatchNorm layers, whose statistics SWA
        recomputes for the averaged weights at its end by running the whole model, unsharded, on the training
        data; None for any other model."""
        if isinstance(module, nn.Module) and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            return (
                "at its end SWA recomputes the BatchNorm statistics of the averaged weights by running the whole "
                "model, unsharded, on the training data"
            )
        return None

    def check_length(self, max_steps: int, steps_per_epoch: int) -> None:
        """Warns when a run of ``max_steps`` steps gives SWA nothing to average or never applies the average
        (``ChangesNothing``), or gives it one set of weights only."""
        reason = self.changes_nothing_in(max_steps, steps_per_epoch)
        if reason is not None:
            warn_changes_nothing_here("SWA", reason)
        elif len(_events(self, steps_per_epoch, max_steps).updates) == 1:
            warn_at_user(
                self._in_run(
                    max_steps,
                    steps_per_epoch,
                    "takes in one set of weights only: the average is the weights themselves, so it changes no "
                    "weight (only BatchNorm statistics are recomputed)",
                )
            )

    def changes_nothing_in(self, max_steps: int, steps_per_epoch: int) -> str | None:
        events = _events(self, steps_per_epoch, max_steps)
        if not events.updates:
            reason = "takes in no weights (averaging would begin after the run ends), so it changes nothing"
        elif events.end is None:
            reason = "never reaches swa_end, so the average never replaces the weights: it changes nothing"
        else:
            return None
        return self._in_run(max_steps, steps_per_epoch, reason)

    def _in_run(self, max_steps: int, steps_per_epoch: int, reason: str) -> str:
        window = (
            f"SWA(swa_start={self.swa_start!r}, swa_end={self.swa_end!r}, update_interval={self.update_interval!r}) "
            f"in a run of {max_steps} steps ({steps_per_epoch} per epoch)"
        )
        return f"{window} {reason}; start averaging earlier or update it more often"

    def lr_multiplier(self, schedule: Any, *, steps_per_epoch: int, max_steps: int) -> Any:
        """Returns the run's multiplier ``schedule`` with the SWA annealing from the first update on."""
        if not self.schedule_swa_lr:
            return schedule
        events = _events(self, steps_per_epoch, max_steps)
        if not events.updates:
            return schedule
        start = float(schedule(events.updates[0] - 1))
        swa_lr = start if self.swa_lr is None else float(self.swa_lr)
        return SWASchedule(
            schedule,
            events.updates[: self.anneal_steps],
            start,
            swa_lr,
            self.anneal_steps,
            _STRATEGIES[self.anneal_strategy],
        )

    def _averaged(self, state: State) -> State:
        entry: SWAState = state.algos[self.name]
        average = swa_update(entry.params, state.params, entry.n_averaged)
        return state.with_algo(self.name, SWAState(params=average, n_averaged=entry.n_averaged + 1))

    def _update_in_step(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        return self._averaged(state), ctx

    def _finish(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        if static.train_inputs is None:
            raise ValueError("SWA requires 'train_data' (Static.train_inputs) to recompute BatchNorm statistics")
        entry: SWAState = state.algos[self.name]
        params = {n: p.clone() for n, p in entry.params.items()}
        buffers = recompute_batchnorm(static.module, params, state.buffers, static.train_inputs())
        return static, state.replace(params=params, buffers=buffers)

    def _update_at_epoch_end(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        now = epoch_end_times(timestamp)[0]
        events = self._events_for(now)
        if now.batch in events.updates:
            state = self._averaged(state)
        if now.batch == events.end:
            static, state = self._finish(static, state, timestamp, meta)
        return static, state


@functools.lru_cache(maxsize=64)
def _events(algorithm: SWA, steps_per_epoch: int, max_steps: int) -> _Events:
    """Returns when the average updates and when averaging ends, by Composer's rules, in batch counts."""
    start = Time.from_timestring(algorithm.swa_start)
    end = Time.from_timestring(algorithm.swa_end)
    interval = int(Time.from_timestring(algorithm.update_interval).value)
    duration = Time(max_steps, TimeUnit.BATCH)
    if algorithm._in_batches:
        points = [
            Timestamp(
                epoch=(b - 1) // steps_per_epoch,
                batch=b,
                batch_in_epoch=(b - 1) % steps_per_epoch + 1,
                max_duration=duration,
            )
            for b in range(1, max_steps + 1)
        ]
    else:
        points = [
            Timestamp(epoch=e, batch=e * steps_per_epoch, max_duration=duration)
            for e in range(1, max_steps // steps_per_epoch + 1)
        ]
    updates: list[int] = []
    counter = 0
    for now in points:
        if not now >= start:
            continue
        if counter % interval == 0:
            updates.append(now.batch)
        counter += 1
        if now >= end:
            return _Events(tuple(updates), now.batch)
    return _Events(tuple(updates), None)
