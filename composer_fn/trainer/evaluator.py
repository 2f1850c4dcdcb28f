"""Named evaluators: what a run evaluates on, with which metrics, logged as ``eval/<label>/<metric>``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from composer_fn.core import validate

__all__ = ["Evaluator"]


@dataclass(frozen=True)
class Evaluator:
    """One held-out set of a run: its ``label``, its ``dataloader`` and its metrics.

    Args:
        label: the name in the metrics' names, ``eval/<label>/<metric>`` (letters, digits, ``_``, ``-``, ``.``).
        dataloader: the batches, as the trainer's ``eval_dataloader`` takes them.
        metrics: ``torchmetrics`` metrics by name, each updated with ``(outputs, targets)`` on every batch and
            computed at the end (across processes as torchmetrics syncs them); None: the exact accuracy and
            loss of classification (``eval/<label>/accuracy``, ``eval/<label>/loss``).
        subset_num_batches: evaluate on the first this many batches only; None: all.
        eval_interval: how often this evaluator runs (``'2ep'``, ``'500ba'``), a multiple of the trainer's
            ``eval_interval`` in the same unit; None: at each of the trainer's evaluations. Every evaluator runs
            at the end of the run.
    """

    label: str
    dataloader: Any
    metrics: Mapping[str, Any] | None = field(default=None, hash=False)
    subset_num_batches: int | None = None
    eval_interval: str | int | None = None

    def __post_init__(self) -> None:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
        if not isinstance(self.label, str) or not self.label or not set(self.label) <= allowed:
            raise ValueError(
                f"label={self.label!r}: expected a non-empty name of letters, digits, '_', '-' or '.' "
                "(it is a part of the metrics' names, eval/<label>/<metric>)"
            )
        if not isinstance(self.dataloader, Iterable) or isinstance(self.dataloader, Iterator):
            raise TypeError(
                f"dataloader of type {type(self.dataloader).__name__}: expected something iterable again at each "
                "evaluation (a DataLoader, a TensorLoader, a list of batches)"
            )
        if self.metrics is not None:
            from torchmetrics import Metric

            if not isinstance(self.metrics, Mapping) or not self.metrics:
                raise TypeError(f"metrics={self.metrics!r}: expected a mapping of names to torchmetrics metrics")
            for name, metric in self.metrics.items():
                if not isinstance(name, str) or not name or "/" in name:
                    raise ValueError(f"metrics has the name {name!r}: expected a non-empty name without '/'")
                if isinstance(metric, type) and issubclass(metric, Metric):
                    raise TypeError(
                        f"metrics[{name!r}] is the class {metric.__name__}; pass an instance: {metric.__name__}(...)"
                    )
                if not isinstance(metric, Metric):
                    raise TypeError(
                        f"metrics[{name!r}] of type {type(metric).__name__}: expected a torchmetrics.Metric, such "
                        "as torchmetrics.classification.MulticlassAccuracy(num_classes=10)"
                    )
        if self.subset_num_batches is not None:
            count = validate.integer("subset_num_batches", self.subset_num_batches, minimum=1, hint="batches")
            object.__setattr__(self, "subset_num_batches", count)
