"""CutOut: zero one or more square holes of each image (DeVries & Taylor, 2017).

A hole has side ``2 * (L // 2)`` pixels with ``L = int(length * min(H, W))`` (Composer's arithmetic: the half
side is rounded down on each side of the centre) and is clipped at the image border. Its centre is uniform
over the pixels, or, with ``uniform_sampling``, uniform over the positions that make every pixel equally
likely to be zeroed (the centre may then lie up to half a side outside the image).

Composer cuts the same holes out of every image of the batch; ``per_sample=True`` draws holes per image. The
holes are integer tensors drawn from the key and the mask is built by comparing ``arange`` against the box
bounds, so the whole op is a handful of vectorized tensor ops with static shapes (compiles without breaks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from composer_fn.algorithms._augment.inputs import on_pil_or_tensor
from composer_fn.algorithms._batch_transform import BatchTransform
from composer_fn.algorithms._boxes import box_mask, check_sides, integer_view
from composer_fn.algorithms._keys import check_key
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import no_change, register

__all__ = ["CutOut", "CutOutParams", "box_mask", "cutout_params", "cutout_apply", "cutout_batch"]


class CutOutParams(NamedTuple):
    """The holes of one CutOut, as ``(row start, column start, row end, column end)`` (end exclusive).

    ``boxes`` is ``int64 [num_holes, 4]`` when every image shares the holes, ``[B, num_holes, 4]`` per image.
    """

    boxes: Tensor


def _hole_side(height: int, width: int, length: float) -> int:
    return int(min(height, width) * length)


def _centres(words: Tensor, size: int, side: int, uniform_sampling: bool) -> Tensor:
    # Composer draws randint(size), or randint(-side // 2, size + side // 2) for uniform sampling; a 32-bit
    # word w picks low + floor(w * span / 2**32), as R.randint does.
    low = -((side + 1) // 2) if uniform_sampling else 0
    span = size + side if uniform_sampling else size
    return ((words * span) >> 32) + low


def cutout_params(
    key: R.Key,
    batch_size: int,
    height: int,
    width: int,
    *,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
    per_sample: bool = False,
) -> CutOutParams:
    """Returns the holes of a CutOut drawn from ``key``: one set for the batch, or one per image.

    ``length`` is the hole side as a fraction of ``min(height, width)``, in [0, 1]; 0 or ``num_holes = 0``
    gives no hole.
    """
    check_key(key)
    _check(num_holes=num_holes, length=length)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    check_sides(height, width)
    side = _hole_side(height, width, length)
    half = side // 2
    shape = (batch_size, num_holes) if per_sample else (num_holes,)
    words = R.bits(key, (2,) + shape)
    rows = _centres(words[0], height, side, uniform_sampling)
    cols = _centres(words[1], width, side, uniform_sampling)
    boxes = torch.stack(
        (
            (rows - half).clamp(0, height),
            (cols - half).clamp(0, width),
            (rows + half).clamp(0, height),
            (cols + half).clamp(0, width),
        ),
        dim=-1,
    )
    return CutOutParams(boxes)


def _keep_bits(boxes: Tensor, height: int, width: int, bits: torch.dtype) -> Tensor:
    """Returns integers ``[..., H, W]`` of dtype ``bits``: all ones outside every hole, 0 inside one.

    ``boxes`` is ``[..., holes, 4]`` with at least one hole. Built from per-row and per-column patterns with one ``|`` per hole over
    the image: no bool kernels.
    """
    rows = torch.arange(height, device=boxes.device)
    cols = torch.arange(width, device=boxes.device)
    # 1 -> all ones after negation, in signed and unsigned integers alike.
    off_rows = ((rows < boxes[..., 0, None]) | (rows >= boxes[..., 2, None])).to(bits).neg_()
    off_cols = ((cols < boxes[..., 1, None]) | (cols >= boxes[..., 3, None])).to(bits).neg_()
    keep = off_rows[..., :, None] | off_cols[..., None, :]
    # A static loop over the holes (a handful), never over the images.
    union = keep[..., 0, :, :]
    for hole in range(1, keep.shape[-3]):
        union = union & keep[..., hole, :, :]
    return union


def _batch_shape(boxes: Tensor, input: Tensor, mask: Tensor) -> Tensor:
    if boxes.dim() == 2:
        return mask
    height, width = input.shape[-2:]
    return mask.reshape((boxes.shape[0],) + (1,) * (input.dim() - 3) + (height, width))


def cutout_apply(input: Tensor, params: CutOutParams) -> Tensor:
    """Returns ``input [..., H, W]`` with every pixel inside a hole set to zero (dtype and shape kept).

    Holes of shape ``[num_holes, 4]`` apply to every image; ``[B, num_holes, 4]`` to image ``b`` of
    ``input [B, ..., H, W]``. Unlike Composer's multiplication by a 0/1 mask, a NaN or infinity inside a hole
    also becomes zero. ``input`` is floating-point or ``uint8`` (images); other integer dtypes (token ids,
    which a hole would overwrite with id 0) raise TypeError.
    """
    _check_pixels(input)
    boxes = params.boxes.to(input.device)
    if input.dim() < 2:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected [..., H, W]")
    if boxes.dim() == 3 and (input.dim() < 3 or input.shape[0] != boxes.shape[0]):
        raise ValueError(
            f"per-sample holes for {boxes.shape[0]} images do not fit input of shape {tuple(input.shape)}"
        )
    if boxes.dim() not in (2, 3):
        raise ValueError(f"boxes of shape {tuple(boxes.shape)}: expected [num_holes, 4] or [B, num_holes, 4]")
    if boxes.shape[-2] == 0:
        return input.clone()
    height, width = input.shape[-2:]
    bits = integer_view(input)
    if bits is None:
        mask = box_mask(boxes, height, width).any(dim=-3)
        return input.masked_fill(_batch_shape(boxes, input, mask), 0)
    # Eagerly on the CPU, masked_fill measured three to four times as slow as and-ing the bits with 0 (inside
    # a hole) or all ones (outside). Zero bits are +0 in every dtype.
    keep = _batch_shape(boxes, input, _keep_bits(boxes, height, width, bits))
    return input.view(bits).bitwise_and(keep).view(input.dtype)


def cutout_batch(
    input: Any,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
    *,
    key: R.Key,
    per_sample: bool = False,
) -> Any:
    """Returns ``input`` (one image ``[C, H, W]``, a batch ``[N, C, H, W]`` or a PIL image) with square holes zeroed.

    Composer's ``cutout_batch`` with an explicit ``key``; by default every image of the batch loses the same
    holes, as in Composer, and ``per_sample=True`` draws holes for each image. A PIL image (mode ``L`` or
    ``RGB``) gives a PIL image; a tensor keeps its shape and dtype (floating-point, ``float64`` included, or
    ``uint8``).
    """
    check_key(key)
    if not isinstance(input, Tensor):
        return on_pil_or_tensor(
            input,
            lambda image: cutout_batch(image, num_holes, length, uniform_sampling, key=key, per_sample=per_sample),
            "input",
        )
    if input.dim() not in (3, 4):
        raise ValueError(f"input of shape {tuple(input.shape)}: expected one image [C, H, W] or a batch [N, C, H, W]")
    _check_pixels(input)
    batch_size = input.shape[0] if input.dim() == 4 else 1
    params = cutout_params(
        key,
        batch_size,
        input.shape[-2],
        input.shape[-1],
        num_holes=num_holes,
        length=length,
        uniform_sampling=uniform_sampling,
        per_sample=per_sample and input.dim() == 4,
    )
    return cutout_apply(input, params)


def _check_pixels(input: Tensor) -> None:
    if not input.is_floating_point() and input.dtype not in (torch.uint8, torch.bool):
        raise TypeError(
            f"input of dtype {input.dtype}: CutOut zeroes pixels of floating-point or uint8 images; other integer "
            "inputs (token ids) would have ids overwritten with 0"
        )


def _check(*, num_holes: int, length: float) -> None:
    validate.integer("num_holes", num_holes, minimum=0)
    validate.real("length", length, minimum=0.0, maximum=1.0, hint="a fraction of min(H, W)")


@register
@dataclass(frozen=True)
class CutOut(BatchTransform):
    """Zeros square holes of the input images after the loader (Composer's ``CutOut``).

    Args:
        num_holes: how many holes per image (they may overlap).
        length: the hole side as a fraction of ``min(H, W)``, in [0, 1].
        uniform_sampling: draw centres so that every pixel is equally likely to be zeroed.
        per_sample: draw holes for each image; by default one set serves the whole batch, as in Composer.
        input_key: where the input sits in the batch.
    """

    algorithm_name = "cutout"

    num_holes: int = 1
    length: float = 0.5
    uniform_sampling: bool = False
    per_sample: bool = False
    input_key: int | str = 0

    def __post_init__(self) -> None:
        _check(num_holes=self.num_holes, length=self.length)
        validate.flag("uniform_sampling", self.uniform_sampling)
        validate.flag("per_sample", self.per_sample)
        validate.batch_key("input_key", self.input_key)

    def changes_nothing(self) -> str | None:
        if self.num_holes != 0 and self.length != 0:
            return None
        setting = "num_holes=0" if self.num_holes == 0 else "length=0"
        instead = "num_holes >= 1 and length > 0 (Composer's defaults are 1 and 0.5)"
        return no_change("CutOut", setting, "no pixel is ever zeroed", instead)

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        params = cutout_params(
            key,
            input.shape[0],
            input.shape[-2],
            input.shape[-1],
            num_holes=self.num_holes,
            length=self.length,
            uniform_sampling=self.uniform_sampling,
            per_sample=self.per_sample,
        )
        return cutout_apply(input, params)
