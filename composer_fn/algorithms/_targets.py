"""Class targets as probabilities, shared by label smoothing and the label-mixing algorithms.

A class index of ``IGNORE_INDEX`` (-100, what every Hugging Face collator writes at padding and at tokens it
does not score, and what ``torch.nn.functional.cross_entropy`` skips by default) is no class: it becomes an
all-zero row of probabilities, so the position adds nothing to a cross-entropy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core.host import eager
from composer_fn.core.state import held_logits

__all__ = ["IGNORE_INDEX", "class_dimension", "ensure_targets_one_hot", "model_logits", "num_classes_of"]

IGNORE_INDEX = -100
"""The class index that marks a position without a target (torch's and Hugging Face's default)."""


def model_logits(outputs: Any) -> Tensor:
    """Returns the logits of a model's ``outputs``: the tensor itself, or the ``logits`` of a mapping or record.

    A Hugging Face ``ModelOutput`` is a mapping that holds ``logits`` (and ``loss`` when labels reached the
    model). Raises TypeError naming what was found otherwise.
    """
    logits = held_logits(outputs)
    if logits is not None:
        return logits
    found = f"a mapping with keys {list(outputs)}" if isinstance(outputs, Mapping) else type(outputs).__name__
    raise TypeError(f"model outputs of {found}: expected a logits tensor, or a mapping or record holding 'logits'")


def class_dimension(logits: Tensor, target: Tensor) -> int:
    """Returns where ``target``'s classes lie among ``logits``' dimensions: 1, or -1 for class-last sequences.

    Decided by rank, as Composer does: a target of the logits' rank holds probabilities (class dimension 1, an
    integer one-hot target included); a target of one rank less holds class indices, which fit the logits
    without dim 1 (``[N, C, ...]`` against ``[N, ...]``) or, failing that, without the last dimension
    (sequence logits ``[B, S, V]`` against ``[B, S]``). Raises ValueError naming both shapes otherwise.
    """
    logits_shape, target_shape = tuple(logits.shape), tuple(target.shape)
    if logits.dim() < 2:
        raise ValueError(f"logits of shape {logits_shape}: expected [N, C, ...] or [B, S, V]")
    if target.dim() == logits.dim():
        if target_shape != logits_shape:
            raise ValueError(
                f"target of shape {target_shape} holds class probabilities (the logits' rank), so it must have "
                f"the logits' shape {logits_shape}"
            )
        return 1
    if target.dim() == logits.dim() - 1:
        if target_shape == logits_shape[:1] + logits_shape[2:]:
            return 1
        if target_shape == logits_shape[:-1]:
            return -1
    sequence = f", or {logits_shape[:-1]} for class-last sequence logits" if logits.dim() > 2 else ""
    raise ValueError(
        f"target of shape {target_shape} does not fit logits of shape {logits_shape}: expected class indices "
        f"shaped like the logits without their class dimension ({logits_shape[:1] + logits_shape[2:]}{sequence}) "
        "or probabilities shaped like the logits"
    )


def num_classes_of(target: Tensor, num_classes: int | None) -> int:
    """Returns ``num_classes`` when given, else the class count of probability targets ``[B, C, ...]``; raises
    ValueError for class-index targets without it."""
    if num_classes is not None:
        return num_classes
    if not target.is_floating_point() or target.dim() < 2:
        raise ValueError(
            f"num_classes is required when target holds class indices (target of shape {tuple(target.shape)} "
            f"and dtype {target.dtype}); probability targets [B, C, ...] give it themselves"
        )
    return target.shape[1]


def _out_of_range(target: Tensor, num_classes: int) -> ValueError:
    outside = target[(target < 0) | (target >= num_classes)]
    shown = int(outside[0]) if outside.numel() else "an index outside the classes"
    return ValueError(
        f"target holds class {shown}: class indices must lie in [0, {num_classes - 1}] for {num_classes} classes "
        "(the size of the logits' class dimension)"
    )


def ensure_targets_one_hot(target: Tensor, num_classes: int, *, class_last: bool = False) -> Tensor:
    """Returns ``target`` as class probabilities along dim 1 (floating targets are returned unchanged).

    Integer class indices of shape ``[B, ...]`` become float32 one-hot targets of shape ``[B, C, ...]``, or
    ``[B, ..., C]`` with ``class_last``; an index equal to ``IGNORE_INDEX`` (-100) becomes a row of zeros. Any
    other index outside ``[0, num_classes)`` raises ValueError when run eagerly.
    """
    if target.is_floating_point():
        dim = -1 if class_last else 1
        if target.shape[dim] != num_classes:
            raise ValueError(
                f"target of shape {tuple(target.shape)} holds probabilities over {target.shape[dim]} classes; "
                f"expected {num_classes} classes along dim {dim}"
            )
        return target
    if target.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise TypeError(f"target of dtype {target.dtype}: expected integer class indices or float probabilities")
    if not eager():
        # The same 0/1 values by comparison: F.one_hot checks its indices against num_classes, a
        # data-dependent test that some dynamo versions (2.11 among them) cannot trace. Eager calls keep the
        # check, so an out-of-range class still raises. IGNORE_INDEX matches no class: its row is zeros.
        classes = torch.arange(num_classes, device=target.device)
        if class_last:
            return (target.long().unsqueeze(-1) == classes).to(torch.float32)
        classes = classes.view((1, num_classes) + (1,) * (target.dim() - 1))
        return (target.long().unsqueeze(1) == classes).to(torch.float32)
    kept = target != IGNORE_INDEX
    try:
        one_hot = F.one_hot(target.long().where(kept, 0), num_classes).to(torch.float32)
    except RuntimeError as error:
        raise _out_of_range(target[kept], num_classes) from error
    one_hot = one_hot * kept.unsqueeze(-1)
    return one_hot.movedim(-1, 1) if one_hot.dim() > 2 and not class_last else one_hot
