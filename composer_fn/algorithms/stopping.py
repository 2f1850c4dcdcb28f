"""EarlyStopper and ThresholdStopper: end a run on what it measured (Composer's callbacks of those names).

Stopping changes the run, so these are algorithms: each declares ``Capabilities.stops``, a pure rule the
trainer applies after each measurement of the evaluator labelled ``dataloader_label`` (a plain
``eval_dataloader`` is labelled ``'eval'``), or at each log step (``'train'``), with the rule's memory (the best
value so far, when it was seen: a ``StopperState``) in ``State.algos``, so a resumed run stops where the
uninterrupted one would.
The run then ends at that batch as if it were ``max_duration``: FIT_END, the final checkpoint and evaluation
follow. ``monitor`` is the metric's name within its evaluator (``loss``, ``accuracy``, a torchmetrics
metric's name: read as ``eval/<label>/<monitor>``) or in the training record (``loss``, a monitor's
``throughput/samples_per_second``); a name starting ``eval/`` is read as it is. When the trainer is built, a
monitor the run never logs where the stopper reads it, or a ``ThresholdStopper`` threshold its metric's range
cannot reach (above 1 for an accuracy), is refused.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Capabilities, ChangesNothing, UnfitForTheRun, register
from composer_fn.core.records import Record, record
from composer_fn.core.state import State, Static
from composer_fn.core.time import Timestamp, TimeUnit

__all__ = ["EarlyStopper", "StopperState", "ThresholdStopper"]

_COMPARISONS = ("lt", "gt", "le", "ge")


def _better(comp: str | None, monitor: str, reached: bool = False) -> str:
    # Composer's default: a loss improves downwards, anything else upwards; a threshold is reached at equality.
    if comp is not None:
        return comp
    lower = "loss" in monitor
    return ("le" if lower else "ge") if reached else ("lt" if lower else "gt")


def _compares(comp: str, value: float, bound: float) -> bool:
    return {"lt": value < bound, "gt": value > bound, "le": value <= bound, "ge": value >= bound}[comp]


def _check(name: str, monitor: str, dataloader_label: str, comp: str | None) -> None:
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"{name}: monitor={monitor!r}: expected a metric's name, e.g. 'loss' or 'accuracy'")
    if not isinstance(dataloader_label, str) or not dataloader_label:
        raise ValueError(
            f"{name}: dataloader_label={dataloader_label!r}: expected an evaluator's label ('eval' for a plain "
            "eval_dataloader) or 'train'"
        )
    if comp is not None:
        validate.choice("comp", comp, _COMPARISONS)


def _value(metrics: Mapping[str, float], monitor: str, name: str, where: str) -> float | None:
    logged = monitor if where == "train" or monitor.startswith("eval/") else f"eval/{where}/{monitor}"
    if logged not in metrics:
        checks = "log steps" if where == "train" else f"evaluations of {where!r}"
        raise ValueError(
            f"{name} monitors {logged!r}, which the run does not log at its {checks}; logged: "
            f"{', '.join(sorted(metrics)) or 'nothing yet'}"
        )
    value = float(metrics[logged])
    return value if math.isfinite(value) else None


def _logged_name(monitor: str, where: str) -> str:
    return monitor if where == "train" or monitor.startswith("eval/") else f"eval/{where}/{monitor}"


def _range(
    name: str, monitor: str, where: str, logged: Mapping[str, tuple[float, float]]
) -> tuple[float, float]:
    # The range of the watched metric among the names the run logs there; a name it never logs is refused.
    full = _logged_name(monitor, where)
    if full in logged:
        return logged[full]
    if any(fnmatch.fnmatchcase(full, pattern) for pattern in logged):
        return (-math.inf, math.inf)
    checks = "its log steps (dataloader_label='train')" if where == "train" else f"the evaluations of {where!r}"
    hint = (
        f": an evaluator's metric is read after its evaluations, so pass dataloader_label={monitor.split('/')[1]!r}"
        if where == "train" and monitor.startswith("eval/") and monitor.count("/") >= 2
        else ""
    )
    raise ValueError(
        f"{name}(monitor={monitor!r}) reads {full!r}, which the run never logs at {checks}; it logs "
        f"{', '.join(sorted(logged))}{hint}"
    )


def _patience(patience: int | str) -> tuple[int, TimeUnit | None]:
    # A number of checks, or a span of batches or epochs.
    if isinstance(patience, str):
        span = validate.time("patience", patience, (TimeUnit.BATCH, TimeUnit.EPOCH), "2ep")
        if span.value < 1:
            raise ValueError(f"patience={patience!r}: expected at least 1 batch or epoch, e.g. '2ep' or '500ba'")
        return int(span.value), span.unit
    return validate.integer("patience", patience, minimum=1, hint="checks without improvement, or a span like '2ep'"), None


def _unpacked(leaves: Sequence[Any]) -> tuple[StopperState, int] | None:
    # Until EarlyStopper's state was a record, it was one float64 tensor of these five values in this order.
    packed = leaves[0] if leaves else None
    if not isinstance(packed, Tensor) or tuple(packed.shape) != (5,):
        return None
    best, checks_since, has_best, best_batch, best_epoch = packed.tolist()
    return _stopper_state(best, int(checks_since), bool(has_best), int(best_batch), int(best_epoch)), 1


@record(earlier_layout=_unpacked)
class StopperState(Record):
    """EarlyStopper's entry of ``State.algos``: what its rule remembers between checks, as 0-d tensors on the host.

    Attributes:
        best: the best value so far (float64; 0 before there is one).
        checks_since: the number of checks since the one that set the best (int64).
        has_best: whether a finite value has been seen, so that ``best`` holds one (bool).
        best_batch: the batch count at the check that set the best (int64).
        best_epoch: the epoch count at the check that set the best (int64).
    """

    best: Tensor
    checks_since: Tensor
    has_best: Tensor
    best_batch: Tensor
    best_epoch: Tensor


def _stopper_state(best: float, checks_since: int, has_best: bool, best_batch: int, best_epoch: int) -> StopperState:
    return StopperState(
        best=torch.tensor(best, dtype=torch.float64),
        checks_since=torch.tensor(checks_since, dtype=torch.int64),
        has_best=torch.tensor(has_best, dtype=torch.bool),
        best_batch=torch.tensor(best_batch, dtype=torch.int64),
        best_epoch=torch.tensor(best_epoch, dtype=torch.int64),
    )


@register
@dataclass(frozen=True)
class EarlyStopper(Algorithm):
    """Ends the run once ``monitor`` has not improved by more than ``min_delta`` for ``patience``.

    Args:
        monitor: the metric's name within its evaluator (``loss``, ``accuracy``, ``f1``) or the training record
            (``loss``), or a full name ``eval/<label>/<metric>``.
        dataloader_label: the label of the evaluator checked after each of its evaluations (``'eval'``: a plain
            ``eval_dataloader``), or ``'train'``: the training record at each log step.
        comp: how a better value compares to the best so far: ``'lt'``, ``'gt'``, ``'le'`` or ``'ge'``; by
            default lower for a name holding ``loss``, higher otherwise.
        min_delta: the least change that counts as an improvement.
        patience: how long the metric may go without improving: a number of checks, or a span of the run
            (``'2ep'``, ``'500ba'``) since the check that set the best (or since the run began, before any).
    """

    monitor: str = "loss"
    dataloader_label: str = "eval"
    comp: str | None = None
    min_delta: float = 0.0
    patience: int | str = 1

    def __post_init__(self) -> None:
        _check("EarlyStopper", self.monitor, self.dataloader_label, self.comp)
        validate.real("min_delta", self.min_delta, minimum=0.0)
        _patience(self.patience)

    def init(self, static: Static, state: State) -> StopperState:
        return _stopper_state(best=0.0, checks_since=0, has_best=False, best_batch=0, best_epoch=0)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            stops=self._stops,
            watches=self.dataloader_label,
            checks_logged=self._checks_logged,
            checks_length=self._checks_length,
        )

    def _checks_logged(self, logged: Mapping[str, tuple[float, float]]) -> None:
        _range("EarlyStopper", self.monitor, self.dataloader_label, logged)

    def _checks_length(self, max_steps: int, steps_per_epoch: int) -> None:
        reason = self.changes_nothing_in(max_steps, steps_per_epoch)
        if reason is not None:
            warnings.warn(ChangesNothing(reason, "EarlyStopper"), stacklevel=4)  # the user's Trainer(...) call

    def changes_nothing_in(self, max_steps: int, steps_per_epoch: int) -> str | None:
        span, unit = _patience(self.patience)
        if unit is None:
            return None
        steps = span * (steps_per_epoch if unit is TimeUnit.EPOCH else 1)
        if steps < max_steps:
            return None
        return (
            f"EarlyStopper(patience={self.patience!r}) waits at least {steps} batches, and the whole run is "
            f"{max_steps}: it can never stop this run"
        )

    def _stops(
        self, entry: StopperState, metrics: Mapping[str, float], where: str, timestamp: Timestamp
    ) -> tuple[StopperState, bool]:
        if where != self.dataloader_label:
            return entry, False
        value = _value(metrics, self.monitor, "EarlyStopper", where)
        best, waited, known = float(entry.best), int(entry.checks_since), bool(entry.has_best)
        batch, epoch = int(entry.best_batch), int(entry.best_epoch)
        comp = _better(self.comp, self.monitor)
        # An improvement beats the best by more than min_delta; the first finite value sets the best.
        shifted = None if value is None else (value + self.min_delta if comp in ("lt", "le") else value - self.min_delta)
        if value is not None and shifted is not None and (not known or _compares(comp, shifted, best)):
            best, waited, known, batch, epoch = value, 0, True, timestamp.batch, timestamp.epoch
        else:
            waited += 1
        span, unit = _patience(self.patience)
        since = {None: waited, TimeUnit.BATCH: timestamp.batch - batch, TimeUnit.EPOCH: timestamp.epoch - epoch}[unit]
        return _stopper_state(best, waited, known, batch, epoch), bool(waited) and since >= span


@register
@dataclass(frozen=True)
class ThresholdStopper(Algorithm):
    """Ends the run once ``monitor`` reaches ``threshold``.

    Args:
        monitor: the metric's name within its evaluator or the training record, as for ``EarlyStopper``.
        dataloader_label: the evaluator checked (``'eval'``: a plain ``eval_dataloader``), or ``'train'``.
        threshold: the value to reach.
        comp: how a value that reached it compares to ``threshold``: ``'lt'``, ``'gt'``, ``'le'`` or ``'ge'``;
            by default at or below for a name holding ``loss``, at or above otherwise.
    """

    monitor: str = "accuracy"
    dataloader_label: str = "eval"
    threshold: float = 1.0
    comp: str | None = None

    def __post_init__(self) -> None:
        _check("ThresholdStopper", self.monitor, self.dataloader_label, self.comp)
        validate.real("threshold", self.threshold)

    def capabilities(self) -> Capabilities:
        return Capabilities(stops=self._stops, watches=self.dataloader_label, checks_logged=self._checks_logged)

    def _checks_logged(self, logged: Mapping[str, tuple[float, float]]) -> None:
        # A bounded metric (accuracy in [0, 1]) cannot reach a threshold beyond its bounds: the run would never stop.
        low, high = _range("ThresholdStopper", self.monitor, self.dataloader_label, logged)
        comp = _better(self.comp, self.monitor, reached=True)
        best = high if comp in ("gt", "ge") else low
        if not _compares(comp, best, self.threshold):
            sign = {"lt": "<", "gt": ">", "le": "<=", "ge": ">="}[comp]
            raise ValueError(
                f"ThresholdStopper(threshold={self.threshold!r}): {_logged_name(self.monitor, self.dataloader_label)!r} "
                f"lies in [{low:g}, {high:g}], so it never becomes {sign} {self.threshold!r} (comp={comp!r}) and the run "
                f"would never stop; expected a threshold within [{low:g}, {high:g}]"
            )
        if best == self.threshold:
            # Reachable, but only by a perfect score (every held-out sample right): most runs go to their end.
            if math.isfinite(high - low):
                inside = best - 0.01 * (high - low) if comp in ("gt", "ge") else best + 0.01 * (high - low)
                instead = f"a threshold inside [{low:g}, {high:g}] stops it (threshold={inside:g})"
            else:
                instead = f"a threshold {'below' if comp in ('gt', 'ge') else 'above'} {best:g}, the value aimed for, stops it"
            warnings.warn(
                UnfitForTheRun(
                    f"ThresholdStopper(threshold={self.threshold!r}): {_logged_name(self.monitor, self.dataloader_label)!r} "
                    f"reaches {best:g} only at its bound (a perfect score), so the run will most likely go to its end; "
                    f"{instead}",
                    "ThresholdStopper",
                ),
                stacklevel=4,  # the user's Trainer(...) call
            )

    def _stops(self, entry: None, metrics: Mapping[str, float], where: str, timestamp: Timestamp) -> tuple[None, bool]:
        if where != self.dataloader_label:
            return entry, False
        value = _value(metrics, self.monitor, "ThresholdStopper", where)
        reached = _better(self.comp, self.monitor, reached=True)
        return entry, value is not None and _compares(reached, value, self.threshold)
