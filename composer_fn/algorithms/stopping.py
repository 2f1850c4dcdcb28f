"""EarlyStopper and ThresholdStopper: end a run on what it measured (Composer's callbacks of those names).

Stopping changes the run, so these are algorithms: each declares ``Capabilities.stops``, a pure rule the
trainer applies to the metrics of each evaluation (``dataloader_label='eval'``) or each log step (``'train'``),
with the rule's memory (the best value so far, the checks since it) in ``State.algos``, so a resumed run stops
where the uninterrupted one would. The run then ends at that batch as if it were ``max_duration``: FIT_END, the
final checkpoint and evaluation follow. Metrics are named as the trainer logs them (``eval_loss``,
``eval_accuracy``, ``loss``, a monitor's ``throughput/samples_per_second``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Capabilities, register
from composer_fn.core.state import State, Static

__all__ = ["EarlyStopper", "ThresholdStopper"]

_COMPARISONS = ("lt", "gt", "le", "ge")
_LABELS = ("eval", "train")


def _better(comp: str | None, monitor: str) -> str:
    # Composer's default: a loss improves downwards, anything else upwards.
    if comp is not None:
        return comp
    return "lt" if "loss" in monitor else "gt"


def _compares(comp: str, value: float, bound: float) -> bool:
    return {"lt": value < bound, "gt": value > bound, "le": value <= bound, "ge": value >= bound}[comp]


def _check(name: str, monitor: str, dataloader_label: str, comp: str | None) -> None:
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"{name}: monitor={monitor!r}: expected a metric's name, e.g. 'eval_loss' or 'loss'")
    validate.choice("dataloader_label", dataloader_label, _LABELS)
    if comp is not None:
        validate.choice("comp", comp, _COMPARISONS)


def _value(metrics: Mapping[str, float], monitor: str, name: str, where: str) -> float | None:
    if monitor not in metrics:
        raise ValueError(
            f"{name} monitors {monitor!r}, which the run does not log at its {where} checks; logged: "
            f"{', '.join(sorted(metrics)) or 'nothing yet'}"
        )
    value = float(metrics[monitor])
    return value if math.isfinite(value) else None


@register
@dataclass(frozen=True)
class EarlyStopper(Algorithm):
    """Ends the run once ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks.

    Args:
        monitor: the metric, as logged (``eval_loss``, ``eval_accuracy``, ``loss``, ...).
        dataloader_label: ``'eval'`` checks at each evaluation; ``'train'`` at each log step.
        comp: how a better value compares to the best so far: ``'lt'``, ``'gt'``, ``'le'`` or ``'ge'``; by
            default lower for a name holding ``loss``, higher otherwise.
        min_delta: the least change that counts as an improvement.
        patience: checks without improvement before the run ends.
    """

    monitor: str = "eval_loss"
    dataloader_label: str = "eval"
    comp: str | None = None
    min_delta: float = 0.0
    patience: int = 1

    def __post_init__(self) -> None:
        _check("EarlyStopper", self.monitor, self.dataloader_label, self.comp)
        validate.real("min_delta", self.min_delta, minimum=0.0)
        validate.integer("patience", self.patience, minimum=1, hint="checks without improvement")

    def init(self, static: Static, state: State) -> torch.Tensor:
        # [best value so far, checks since it, whether there is a best yet]
        return torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)

    def capabilities(self) -> Capabilities:
        return Capabilities(stops=self._stops)

    def _stops(self, entry: Any, metrics: Mapping[str, float], where: str) -> tuple[Any, bool]:
        if where != self.dataloader_label:
            return entry, False
        value = _value(metrics, self.monitor, "EarlyStopper", where)
        best, waited, known = float(entry[0]), float(entry[1]), bool(entry[2])
        comp = _better(self.comp, self.monitor)
        # An improvement beats the best by more than min_delta; the first finite value sets the best.
        shifted = None if value is None else (value + self.min_delta if comp in ("lt", "le") else value - self.min_delta)
        if value is not None and shifted is not None and (not known or _compares(comp, shifted, best)):
            best, waited, known = value, 0.0, True
        else:
            waited += 1
        return torch.tensor([best, waited, float(known)], dtype=torch.float64), waited >= self.patience


@register
@dataclass(frozen=True)
class ThresholdStopper(Algorithm):
    """Ends the run once ``monitor`` passes ``threshold``.

    Args:
        monitor: the metric, as logged (``eval_accuracy``, ``loss``, ...).
        dataloader_label: ``'eval'`` checks at each evaluation; ``'train'`` at each log step.
        threshold: the value to reach.
        comp: how a value that reached it compares to ``threshold``: ``'lt'``, ``'gt'``, ``'le'`` or ``'ge'``;
            by default below for a name holding ``loss``, above otherwise.
    """

    monitor: str = "eval_accuracy"
    dataloader_label: str = "eval"
    threshold: float = 1.0
    comp: str | None = None

    def __post_init__(self) -> None:
        _check("ThresholdStopper", self.monitor, self.dataloader_label, self.comp)
        validate.real("threshold", self.threshold)

    def capabilities(self) -> Capabilities:
        return Capabilities(stops=self._stops)

    def _stops(self, entry: Any, metrics: Mapping[str, float], where: str) -> tuple[Any, bool]:
        if where != self.dataloader_label:
            return entry, False
        value = _value(metrics, self.monitor, "ThresholdStopper", where)
        return entry, value is not None and _compares(_better(self.comp, self.monitor), value, self.threshold)
