"""The element arithmetic every op shares: float32 working copies, casts back to levels, per-sample selection."""

from __future__ import annotations

import torch
from torch import Tensor


def in_float32(images: Tensor) -> Tensor:
    """Returns the images in float32, the precision every op computes in (the images themselves if float32)."""
    return images if images.dtype == torch.float32 else images.to(torch.float32)


def to_levels(values: Tensor) -> Tensor:
    """Returns float ``values`` already within ``[0, 255]`` as ``uint8``, truncated like ``.to(torch.uint8)``.

    Through int32: the same bits, several times faster on the CPU than the direct cast.
    """
    return values.to(torch.int32).to(torch.uint8)


def cast(values: Tensor, images: Tensor) -> Tensor:
    """Returns float ``values`` in the images' dtype (in ``[0, 255]`` when that is ``uint8``)."""
    return to_levels(values) if images.dtype == torch.uint8 else values.to(images.dtype)


def bound(images: Tensor) -> float:
    """Returns the images' brightest level: 255 for ``uint8``, 1 for floats."""
    return 255.0 if images.dtype == torch.uint8 else 1.0


def ramp(device: torch.device) -> Tensor:
    """Returns the 256 ``uint8`` levels as float32: the identity table."""
    return torch.arange(256, dtype=torch.float32, device=device)


def rows(mask: Tensor) -> Tensor:
    """Returns a per-sample ``[B]`` tensor viewed as ``[B, 1, 1, 1]``, to broadcast over images."""
    return mask.view(-1, 1, 1, 1)


def chose(op: Tensor, ops: tuple[int, ...]) -> Tensor:
    """Returns the mask of the samples whose op is one of ``ops``."""
    mask = op == ops[0]
    for other in ops[1:]:
        mask = mask | (op == other)
    return mask


def select(mask: Tensor, chosen: Tensor, other: Tensor) -> Tensor:
    """Returns ``chosen`` where ``mask`` holds, else ``other``, for finite values.

    ``lerp`` at weight exactly 0 or 1 returns an end point bit for bit, and on the CPU it runs several times
    faster than ``torch.where`` over image-sized masks.
    """
    return torch.lerp(other, chosen, mask.to(other.dtype))
