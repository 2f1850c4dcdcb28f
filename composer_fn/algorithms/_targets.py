"""Target handling shared by the label-mixing algorithms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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
    one_hot = F.one_hot(target.long(), num_classes).to(torch.float32)
    return one_hot.movedim(-1, 1) if one_hot.dim() > 2 else one_hot
