"""What the functional augmentations accept besides ``[B, C, H, W]`` batches: PIL images, float64 tensors,
and the range check of floating-point pixels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from composer_fn.algorithms._augment.primitives import check_images
from composer_fn.core.host import eager

__all__ = ["on_pil_or_tensor", "on_image_or_batch", "augment_batch"]


def on_pil_or_tensor(img: Any, augment: Callable[[Tensor], Tensor], name: str = "img") -> Any:
    """Returns ``augment(img)`` for a tensor; for a PIL image in mode ``L`` or ``RGB``, ``augment`` of its
    ``uint8 [C, H, W]`` tensor, converted back to a PIL image of the same mode."""
    if isinstance(img, Tensor):
        return augment(img)
    from PIL import Image

    if not isinstance(img, Image.Image) or img.mode not in ("L", "RGB"):
        raise TypeError(
            f"{name} of type {type(img).__name__}"
            f"{f' in mode {img.mode}' if isinstance(img, Image.Image) else ''}: expected a tensor "
            "[C, H, W] or [N, C, H, W], or a PIL image in mode L or RGB"
        )
    array = torch.from_numpy(np.array(img, dtype=np.uint8))
    out = augment(array.unsqueeze(0) if array.dim() == 2 else array.permute(2, 0, 1).contiguous())
    return Image.fromarray((out[0] if img.mode == "L" else out.permute(1, 2, 0)).contiguous().numpy())


def on_image_or_batch(img: Any, augment_batch: Callable[[Tensor], Tensor]) -> Any:
    """Returns ``augment_batch`` applied to a ``[B, C, H, W]`` batch, a single ``[C, H, W]`` image (as a batch of
    one) or a PIL image (as ``on_pil_or_tensor``), of the kind and shape given."""

    def augment(images: Tensor) -> Tensor:
        return augment_batch(images.unsqueeze(0))[0] if images.dim() == 3 else augment_batch(images)

    return on_pil_or_tensor(img, augment)


def _check_unit_range(images: Tensor, name: str, method: str) -> None:
    low, high = (float(v) for v in torch.aminmax(images.detach()))
    if not (0.0 <= low and high <= 1.0):
        raise ValueError(
            f"{name} holds values in [{low:g}, {high:g}]: {method} takes uint8 images or floating-point images "
            "in [0, 1] (pixels before normalisation); augment before Normalize, or pass uint8 images"
        )


def augment_batch(
    input: Tensor, augment: Callable[[Tensor], Tensor], method: str, name: str = "input"
) -> Tensor:
    """Returns ``augment(input)`` for a checked ``[B, C, H, W]`` batch, keeping ``input``'s dtype.

    ``float64`` images are augmented in ``float32`` and cast back. Eagerly, floating-point images outside
    ``[0, 1]`` (normalised pixels, which the ops would clamp) raise ValueError naming ``method``; a traced
    step cannot read values, so there the Trainer's first-batch check stands in.
    """
    if isinstance(input, Tensor) and input.dtype == torch.float64:
        return augment_batch(input.to(torch.float32), augment, method, name).to(torch.float64)
    check_images(input, name)
    if input.is_floating_point() and input.numel() and eager():
        _check_unit_range(input, name, method)
    # The ops address pixels in the contiguous layout (a permuted view, channels-last memory, is copied).
    return augment(input.contiguous())
