"""Label smoothing: train against ``(1 - smoothing) * one_hot(y) + smoothing / C`` instead of ``one_hot(y)``.

Runs at BEFORE_LOSS (traced) and restores the original targets at AFTER_LOSS, so whatever runs after the
loss (metrics, other algorithms) sees the labels the loader gave.

Class index -100 (``IGNORE_INDEX``, what Hugging Face collators write where no token is scored) marks a
position without a target: its smoothed row is zeros, and the other rows are weighted by
``positions / kept positions``, so that the mean cross-entropy over all positions equals the mean over the
kept ones, as ``F.cross_entropy(logits, target, ignore_index=-100, label_smoothing=smoothing)`` computes it.

Two losses cannot take smoothed targets, and there the loss is smoothed instead. A model whose output is a
mapping or record holding ``logits`` (a Hugging Face ``ModelOutput``) computes its loss itself, inside the
forward, from the labels it was given, so smoothed targets in the batch would not reach it. Sequence logits
``[B, S, V]`` against class indices ``[B, S]`` hold their classes last, but probability targets of the logits'
shape are read with their classes along dim 1 (Composer's convention, which ``cross_entropy_loss`` follows),
so smoothed sequence targets would be read across positions. Cross-entropy with label smoothing is
``(1 - smoothing) * nll + smoothing * mean_c(-log p_c)`` averaged over the kept positions, so in both cases the
loss (taken to be the cross-entropy: a Hugging Face model's own loss, or ``cross_entropy_loss``) becomes
``(1 - smoothing) * loss + smoothing * mean_c(-log p_c)`` at AFTER_LOSS, and the batch keeps its labels. A
causal language model (an output type named ``CausalLM...``) scores position ``t``'s logits against label
``t + 1``, as its own loss does. A mapping batch whose ``target_key`` is a position (the default, 1) reads its
targets from ``"labels"``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from composer_fn.algorithms._targets import (
    IGNORE_INDEX,
    class_dimension,
    ensure_targets_one_hot,
    model_logits,
)
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, no_change, register
from composer_fn.core.event import Event
from composer_fn.core.state import State, StepCtx, batch_get, batch_set, target_key_of

__all__ = ["LabelSmoothing", "smooth_labels", "smoothing_term"]


def smooth_labels(logits: Tensor, target: Tensor, smoothing: float | Tensor = 0.1) -> Tensor:
    """Returns the smoothed targets ``(1 - smoothing) * one_hot(target) + smoothing / C``, shaped like ``logits``.

    Index or probability is decided by rank, as in Composer: ``target`` of the logits' rank holds class
    probabilities (an integer one-hot target from ``F.one_hot`` included) over ``C = logits.shape[1]``; one rank
    less holds class indices, along dim 1 of ``[N, C, ...]`` logits (``C = logits.shape[1]``) or, when only
    that fits, along the last dim of sequence logits ``[B, S, V]`` against ``[B, S]`` targets (``C = V``).
    Each output row sums to 1 when the input row does; ``smoothing = 0`` gives the one-hot targets. A class
    index of -100 (``IGNORE_INDEX``) marks a position without a target and gives a row of zeros. A target that
    fits neither way, or (eagerly) another class index outside ``[0, C)``, raises ValueError.
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
    smoothed = one_hot * (1.0 - smoothing) + smoothing / num_classes
    if target.is_floating_point():
        return smoothed
    kept = (target != IGNORE_INDEX).unsqueeze(-1 if dim == -1 else 1)
    return smoothed * kept


def smoothing_term(logits: Tensor, target: Tensor, *, causal: bool = False) -> Tensor:
    """Returns ``mean_c(-log softmax(logits)_c)`` averaged over the positions whose ``target`` is not -100.

    ``(1 - s) * nll + s * smoothing_term`` is the cross-entropy with label smoothing ``s``. ``target`` holds
    class indices: ``[N]`` against logits ``[N, C]``, or ``[B, S]`` against sequence logits ``[B, S, V]``;
    ``causal`` pairs the logits at position ``t`` with the target at ``t + 1`` (a causal language model's loss).
    """
    if target.is_floating_point():
        raise ValueError(
            f"target of dtype {target.dtype}: smoothing a model's own loss needs class indices (the labels the "
            "model's cross-entropy read); float labels are regression or multi-label targets"
        )
    if causal:
        logits, target = logits[:, :-1], target[:, 1:]
    dim = class_dimension(logits, target)
    uniform = -torch.log_softmax(logits.float(), dim=dim).mean(dim=dim)
    kept = target != IGNORE_INDEX
    return (uniform * kept).sum() / kept.sum().clamp(min=1)


def _kept_weight(target: Tensor) -> Tensor:
    """Returns ``positions / kept positions`` as a float32 0-d tensor (1 when no position is ignored)."""
    kept = target != IGNORE_INDEX
    return kept.numel() / kept.sum().clamp(min=1).to(torch.float32)


@register
@dataclass(frozen=True)
class LabelSmoothing(Algorithm):
    """Smooths the targets before the loss (Composer's ``LabelSmoothing``).

    Args:
        smoothing: the probability mass spread uniformly over all classes, in [0, 1].
        target_key: where the target sits in the batch (a position or a mapping key); a mapping batch given a
            position reads ``"labels"``.
    """

    smoothing: float = 0.1
    target_key: int | str = 1

    def __post_init__(self) -> None:
        validate.real("smoothing", self.smoothing, minimum=0.0, maximum=1.0)
        validate.batch_key("target_key", self.target_key)

    def changes_nothing(self) -> str | None:
        why = "the smoothed targets are the one-hot targets"
        instead = "smoothing > 0 (Composer's default is 0.1)"
        return no_change("LabelSmoothing", "smoothing=0", why, instead) if self.smoothing == 0 else None

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.BEFORE_LOSS: self._smooth, Event.AFTER_LOSS: self._restore}

    def _smooth(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        key = target_key_of(ctx.batch, self.target_key)
        target = batch_get(ctx.batch, key)
        if _smooths_the_loss(ctx.outputs, target):
            return state, ctx
        smoothed = smooth_labels(ctx.outputs, target, self.smoothing)
        if not target.is_floating_point() and target.dim() < ctx.outputs.dim():
            # Zero rows for ignored positions; the kept rows carry their weight, so a mean over all positions
            # is the mean over the kept ones.
            smoothed = smoothed * _kept_weight(target)
        return state, ctx.with_scratch(self.name, target, batch=batch_set(ctx.batch, key, smoothed))

    def _restore(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        key = target_key_of(ctx.batch, self.target_key)
        if self.name not in ctx.scratch:
            assert ctx.loss is not None
            target = batch_get(ctx.batch, key)
            causal = "CausalLM" in type(ctx.outputs).__name__
            term = smoothing_term(model_logits(ctx.outputs), target, causal=causal).to(ctx.loss.dtype)
            return state, ctx.replace(loss=ctx.loss * (1.0 - self.smoothing) + term * self.smoothing)
        scratch = dict(ctx.scratch)
        original = scratch.pop(self.name)
        return state, ctx.replace(batch=batch_set(ctx.batch, key, original), scratch=scratch)


def _smooths_the_loss(outputs: Any, target: Tensor) -> bool:
    """Returns whether the loss is smoothed rather than the targets (see the module docstring)."""
    if not isinstance(outputs, Tensor):
        return True
    return not target.is_floating_point() and class_dimension(outputs, target) == -1
