"""Class targets as probabilities, shared by label smoothing and the label-mixing algorithms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core.host import eager


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
    if not eager():
        # The same 0/1 values by comparison: F.one_hot checks its indices against num_classes, a
        # data-dependent test that some dynamo versions (2.11 among them) cannot trace. Eager calls keep the
        # check, so an out-of-range class still raises.
        classes = torch.arange(num_classes, device=target.device)
        classes = classes.view((1, num_classes) + (1,) * (target.dim() - 1))
        return (target.long().unsqueeze(1) == classes).to(torch.float32)
    one_hot = F.one_hot(target.long(), num_classes).to(torch.float32)
    return one_hot.movedim(-1, 1) if one_hot.dim() > 2 else one_hot
