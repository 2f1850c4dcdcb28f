"""Target handling shared by the label-mixing algorithms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core.state import State


def check_mixing(alpha: float, per_sample: bool, interpolate_loss: bool) -> None:
    """Raises ValueError for a label-mixing algorithm's hyperparameters that cannot work together."""
    if alpha < 0:
        raise ValueError(f"alpha={alpha!r} must be non-negative")
    if per_sample and interpolate_loss:
        raise ValueError(
            "per_sample=True with interpolate_loss=True: a per-example weight cannot interpolate the "
            "batch-mean loss; use interpolate_loss=False (mixed targets) or per_sample=False"
        )


def draws_at_rest(state: State, per_sample: bool) -> Tensor:
    """Returns a label-mixing algorithm's ``State.algos`` entry between steps: 0-d, or empty per sample.

    Per-example draws live in the state only from BATCH_START to the step; at rest the entry is empty, so a
    checkpoint has the same shape whatever the batch size.
    """
    return torch.zeros((0,) if per_sample else (), dtype=torch.float32, device=state.step.device)


def ensure_targets_one_hot(target: Tensor, num_classes: int) -> Tensor:
    """Returns ``target`` as class probabilities along dim 1 (floating targets are returned unchanged).

    Integer class indices of shape ``[B, ...]`` become float32 one-hot targets of shape ``[B, C, ...]``.
    """
    if target.is_floating_point():
        if target.shape[1] != num_classes:
            raise ValueError(
                f"target of shape {tuple(target.shape)} holds probabilities over {target.shape[1]} classes; "
                f"expected {num_classes} classes along dim 1"
            )
        return target
    if target.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise TypeError(f"target of dtype {target.dtype}: expected integer class indices or float probabilities")
    if torch.compiler.is_compiling():
        # The same 0/1 values by comparison: F.one_hot checks its indices against num_classes, a
        # data-dependent test that some dynamo versions (2.11 among them) cannot trace. Eager calls keep the
        # check, so an out-of-range class still raises.
        classes = torch.arange(num_classes, device=target.device)
        classes = classes.view((1, num_classes) + (1,) * (target.dim() - 1))
        return (target.long().unsqueeze(1) == classes).to(torch.float32)
    one_hot = F.one_hot(target.long(), num_classes).to(torch.float32)
    return one_hot.movedim(-1, 1) if one_hot.dim() > 2 else one_hot
