"""Evaluation: the held-out metrics of a state, accumulated with torchmetrics over an evaluation loader."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from composer_fn.core.event import Event
from composer_fn.core.state import LossFn, State, batch_get
from composer_fn.trainer.step import class_last

__all__ = ["evaluate"]


def evaluate(
    step: Callable[[State, Any], Tensor],
    state: State,
    batches: Iterable[Any],
    *,
    loss_fn: LossFn,
    target_key: int | str,
    device: torch.device,
    on_event: Callable[[Event], None],
) -> dict[str, float]:
    """Returns ``eval_accuracy`` (multiclass, micro) and ``eval_loss`` (sample-weighted) of ``state``.

    ``step`` maps ``(state, batch)`` to outputs; ``batches`` are already on ``device``. ``on_event`` runs at
    EVAL_BATCH_START and EVAL_BATCH_END of every batch. An empty ``batches`` is an error, not NaN metrics.
    """
    # Imported here: torchmetrics loads scipy, which would add a second to every ``import composer_fn``.
    import torchmetrics

    accuracy: torchmetrics.Metric | None = None
    mean_loss = torchmetrics.MeanMetric().to(device)
    for batch in batches:
        on_event(Event.EVAL_BATCH_START)
        outputs = step(state, batch)
        target = batch_get(batch, target_key)
        predictions = outputs.movedim(-1, 1) if class_last(outputs, target) else outputs
        if accuracy is None:
            # -100 marks positions without a label (masked-LM targets, padding), as in cross-entropy.
            accuracy = torchmetrics.classification.MulticlassAccuracy(
                num_classes=predictions.shape[1], average="micro", ignore_index=-100
            ).to(device)
        accuracy.update(predictions.float(), target)
        with torch.no_grad():
            mean_loss.update(loss_fn(outputs.float(), batch), weight=target.shape[0])
        on_event(Event.EVAL_BATCH_END)
    if accuracy is None:
        raise ValueError("eval_dataloader yielded no batch: an evaluation needs at least one")
    return {
        "eval_accuracy": float(accuracy.compute()),
        "eval_loss": float(mean_loss.compute()),
    }
