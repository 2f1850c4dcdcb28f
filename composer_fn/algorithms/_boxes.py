"""Boxes on images, shared by CutOut and CutMix: their size limits, their masks, and the bits eager code masks.

A box is ``(row start, column start, row end, column end)``, end exclusive, as an integer tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from composer_fn.core import validate
from composer_fn.core.host import eager

__all__ = ["MAX_SIDE", "box_mask", "check_sides", "integer_view"]

MAX_SIDE = 2**23
"""The longest image side that box draws accept."""

_SAME_SIZE_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def check_sides(height: int, width: int) -> None:
    """Raises ValueError unless ``height`` and ``width`` are ints in ``[1, MAX_SIDE]``."""
    for name, size in (("height", height), ("width", width)):
        if not (type(size) is int and 1 <= size <= MAX_SIDE):
            validate.integer(name, size, minimum=1, maximum=MAX_SIDE)


def box_mask(boxes: Tensor, height: int, width: int) -> Tensor:
    """Returns the bool mask ``[..., height, width]`` that is True inside each box of ``boxes [..., 4]``.

    Boxes are ``(row start, column start, row end, column end)``, end exclusive; an empty box masks nothing.
    The mask is the outer product of two ``arange`` comparisons: no loop, no data-dependent shape.
    """
    if boxes.shape[-1:] != (4,) or boxes.is_floating_point():
        raise ValueError(
            f"boxes of shape {tuple(boxes.shape)} and dtype {boxes.dtype}: expected integer [..., 4]"
        )
    rows = torch.arange(height, device=boxes.device)
    cols = torch.arange(width, device=boxes.device)
    in_rows = (rows >= boxes[..., 0, None]) & (rows < boxes[..., 2, None])
    in_cols = (cols >= boxes[..., 1, None]) & (cols < boxes[..., 3, None])
    if not eager():
        return in_rows[..., :, None] & in_cols[..., None, :]
    # Eagerly, the outer product in uint8 (0/1 bytes, the bool layout) vectorizes; the CPU kernel on bool
    # tensors is about four times slower. Compiled code fuses the plain form instead.
    return (in_rows.to(torch.uint8)[..., :, None] & in_cols.to(torch.uint8)[..., None, :]).view(torch.bool)


def integer_view(input: Tensor) -> torch.dtype | None:
    """Returns the integer dtype of ``input``'s element size when eager CPU code may mask its bits, else None.

    The bitwise forms only pay off in eager CPU code; compiled code and GPUs fuse the plain op, and bool and
    complex tensors keep it too.
    """
    if not eager() or input.device.type != "cpu" or input.dtype == torch.bool or input.is_complex():
        return None
    return _SAME_SIZE_INTEGERS.get(input.element_size())
