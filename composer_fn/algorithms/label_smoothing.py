"""Label smoothing: train against ``(1 - smoothing) * one_hot(y) + smoothing / C`` instead of ``one_hot(y)``.

Runs at BEFORE_LOSS (traced) and restores the original targets at AFTER_LOSS, so whatever runs after the
loss (metrics, other algorithms) sees the labels the loader gave.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from composer_fn.algorithms._no_op import warn_changes_nothing
from composer_fn.algorithms._targets import class_dimension, ensure_targets_one_hot
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, register
from composer_fn.core.event import Event
from composer_fn.core.state import State, StepCtx, batch_get, batch_set

__all__ = ["LabelSmoothing", "smooth_labels"]


def smooth_labels(logits: Tensor, target: Tensor, smoothing: float | Tensor = 0.1) -> Tensor:
    """Returns the smoothed targets ``(1 - smoothing) * one_hot(target) + smoothing / C``, shaped like ``logits``.

    Index or probability is decided by rank, as in Composer: ``target`` of the logits' rank holds class
    probabilities (an integer one-hot target from ``F.one_hot`` included) over ``C = logits.shape[1]``; one rank
    less holds class indices, along dim 1 of ``[N, C, ...]`` logits (``C = logits.shape[1]``) or, when only
    that fits, along the last dim of sequence logits ``[B, S, V]`` against ``[B, S]`` targets (``C = V``).
    Each output row sums to 1 when the input row does; ``smoothing = 0`` gives the one-hot targets. A target
    that fits neither way, or (eagerly) a class index outside ``[0, C)``, raises ValueError.
    """
    if isinstance(smoothing, Tensor):
        if smoothing.dim() != 0:
            raise ValueError(f"smoothing of shape {tuple(smoothing.shape)}: expected a number or a 0-d tensor")
    else:
        smoothing = validate.real("smoothing", smoothing, minimum=0.0, maximum=1.0)
    dim = class_dimension(logits, target)
    num_classes = logits.shape[dim]
    if target.dim() == logits.dim() and not target.is_floating_point():
        target = target.to(torch.float32)
    one_hot = ensure_targets_one_hot(target, num_classes, class_last=dim == -1)
    return one_hot * (1.0 - smoothing) + smoothing / num_classes


@register
@dataclass(frozen=True)
class LabelSmoothing(Algorithm):
    """Smooths the targets before the loss (Composer's ``LabelSmoothing``).

    Args:
        smoothing: the probability mass spread uniformly over all classes, in [0, 1].
        target_key: where the target sits in the batch (a position or a mapping key).
    """

    smoothing: float = 0.1
    target_key: int | str = 1

    def __post_init__(self) -> None:
        validate.real("smoothing", self.smoothing, minimum=0.0, maximum=1.0)
        validate.batch_key("target_key", self.target_key)
        if self.smoothing == 0:
            warn_changes_nothing(
                "LabelSmoothing(smoothing=0) changes nothing: the smoothed targets are the one-hot targets; use "
                "smoothing > 0 (Composer's default is 0.1) or leave LabelSmoothing out"
            )

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.BEFORE_LOSS: self._smooth, Event.AFTER_LOSS: self._restore}

    def _smooth(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        target = batch_get(ctx.batch, self.target_key)
        smoothed = batch_set(ctx.batch, self.target_key, smooth_labels(ctx.outputs, target, self.smoothing))
        return state, ctx.with_scratch(self.name, target, batch=smoothed)

    def _restore(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        scratch = dict(ctx.scratch)
        original = scratch.pop(self.name)
        return state, ctx.replace(batch=batch_set(ctx.batch, self.target_key, original), scratch=scratch)
