"""Autocast's dtype: the low-precision LayerNorm and GroupNorm layers normalize in it, and BlurPool's blur asks
for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["compute_dtype", "normalized_in_autocast_dtype", "low_precision_forward"]


def compute_dtype(input: Tensor) -> torch.dtype:
    """The dtype an autocast-listed op such as ``F.conv2d`` computes ``input`` in: autocast's, where autocast is on
    for the input's device (CPU or CUDA), else the input's own."""
    device = input.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return input.dtype


def normalized_in_autocast_dtype(
    norm: Callable[..., Tensor],
    input: Tensor,
    shape: int | Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> Tensor:
    """Returns ``norm(input, shape, weight, bias, eps)`` computed in the autocast dtype of ``input``'s device.

    ``norm`` is ``F.layer_norm`` (``shape``: the normalized shape) or ``F.group_norm`` (``shape``: the number of
    groups); ``input``, ``weight`` and ``bias`` are cast to the autocast dtype, for callers under autocast on
    that device. The norm runs with autocast turned off, so that it computes in the dtype it is given: CUDA
    autocast would run it in float32.
    """
    device = input.device.type
    dtype = torch.get_autocast_dtype(device)
    weight = None if weight is None else weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    with torch.autocast(device_type=device, enabled=False):
        return norm(input.to(dtype), shape, weight, bias, eps)


def low_precision_forward(
    full: type[nn.Module], layer: Any, input: Tensor, norm: Callable[..., Tensor], shape: int | Sequence[int]
) -> Tensor:
    """Returns the norm ``layer``'s output: in the autocast dtype under autocast, else ``full``'s forward.

    ``full`` is the torch layer ``layer`` derives from (``nn.LayerNorm``, ``nn.GroupNorm``); ``norm`` and ``shape``
    are as in ``normalized_in_autocast_dtype``.
    """
    if not torch.is_autocast_enabled(input.device.type):
        output: Tensor = full.forward(layer, input)
        return output
    return normalized_in_autocast_dtype(norm, input, shape, layer.weight, layer.bias, layer.eps)
