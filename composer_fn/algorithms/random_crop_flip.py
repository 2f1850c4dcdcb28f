"""RandomCropFlip: the standard image-classification augmentation, a random crop of the padded image and a random
horizontal flip, per image (torchvision's ``RandomCrop(size, padding)`` then ``RandomHorizontalFlip()``).

Each image is padded by ``padding`` pixels on every side (with ``fill``, or by reflecting or repeating its edge)
and cropped back to its size at an offset uniform over ``[0, 2 * padding]`` along each axis, then mirrored left to
right with probability ``flip_p``. Offsets and flips are drawn per image from the key as integers, and the crop is
one gather with static shapes, so the op compiles without graph breaks and runs on the device after the loader.
Drawn in the step from the microbatch's key, the draws of N processes are those of one process with N microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.algorithms._augment.inputs import on_pil_or_tensor
from composer_fn.algorithms._batch_transform import BatchTransform
from composer_fn.algorithms._keys import check_key
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register

__all__ = [
    "RandomCropFlip",
    "RandomCropFlipParams",
    "random_crop_flip_params",
    "random_crop_flip_apply",
    "random_crop_flip_batch",
    "PADDING_MODES",
]

PADDING_MODES = ("constant", "reflect", "replicate")
"""How the border is filled: with ``fill``, by reflecting the image at its edge, or by repeating the edge."""


class RandomCropFlipParams(NamedTuple):
    """Per image: the crop's ``(row, column)`` offset into the padded image, ``int64 [B, 2]`` in ``[0, 2 *
    padding]``, and whether it is mirrored, ``bool [B]``."""

    offsets: Tensor
    flips: Tensor


def random_crop_flip_params(key: R.Key, batch_size: int, *, padding: int = 4, flip_p: float = 0.5) -> RandomCropFlipParams:
    """Returns the offsets and flips of ``batch_size`` images, drawn from ``key``."""
    check_key(key)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    _check(padding, flip_p)
    padding = int(padding)
    offsets = R.randint(R.fold_in(key, 0), 0, 2 * padding + 1, (batch_size, 2))
    flips = R.uniform(R.fold_in(key, 1), (batch_size,)) < flip_p
    return RandomCropFlipParams(offsets, flips)


def random_crop_flip_apply(
    input: Tensor, params: RandomCropFlipParams, *, padding: int = 4, fill: float = 0.0, padding_mode: str = "constant"
) -> Tensor:
    """Returns each image of ``input [B, C, H, W]`` cropped from its padded self at its offset and mirrored where its
    flip says; dtype and shape kept, ``input`` unchanged."""
    if input.dim() != 4:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected a batch of images [B, C, H, W]")
    validate.choice("padding_mode", padding_mode, PADDING_MODES)
    padding = validate.integer("padding", padding, minimum=0, hint="pixels added on each side before the crop")
    batch, _, height, width = input.shape
    offsets, flips = params.offsets.to(input.device), params.flips.to(input.device)
    if offsets.shape != (batch, 2) or flips.shape != (batch,):
        raise ValueError(
            f"params for offsets {tuple(offsets.shape)} and flips {tuple(flips.shape)} do not fit a batch of {batch} "
            "images: expected [B, 2] and [B]"
        )
    if padding_mode == "reflect" and padding >= min(height, width):
        raise ValueError(f"padding={padding} with padding_mode='reflect' needs images larger than it; they are {height}x{width}")
    if padding:
        if padding_mode == "constant":
            padded = F.pad(input, (padding,) * 4, value=fill)
        else:
            # reflect and replicate pad floating-point tensors only: round-trip integer images through float.
            source = input if input.is_floating_point() else input.float()
            padded = F.pad(source, (padding,) * 4, mode=padding_mode).to(input.dtype)
    else:
        padded = input
    rows = offsets[:, 0, None] + torch.arange(height, device=input.device)  # [B, H]
    columns = offsets[:, 1, None] + torch.arange(width, device=input.device)  # [B, W]
    # A mirrored image reads its crop's columns right to left.
    columns = torch.where(flips[:, None], columns.flip(1), columns)
    gathered = padded.gather(2, rows[:, None, :, None].expand(-1, padded.shape[1], -1, padded.shape[3]))
    return gathered.gather(3, columns[:, None, None, :].expand(-1, padded.shape[1], height, -1))


def random_crop_flip_batch(
    input: Any,
    *,
    key: R.Key,
    padding: int = 4,
    flip_p: float = 0.5,
    fill: float = 0.0,
    padding_mode: str = "constant",
) -> Any:
    """Returns ``input`` (one image ``[C, H, W]``, a batch ``[N, C, H, W]`` or a PIL image) randomly cropped from its
    padded self and randomly mirrored, each image with its own draw from ``key``."""
    check_key(key)
    if not isinstance(input, Tensor):
        return on_pil_or_tensor(
            input,
            lambda image: random_crop_flip_batch(
                image, key=key, padding=padding, flip_p=flip_p, fill=fill, padding_mode=padding_mode
            ),
            "input",
        )
    if input.dim() not in (3, 4):
        raise ValueError(f"input of shape {tuple(input.shape)}: expected one image [C, H, W] or a batch [N, C, H, W]")
    batch = input if input.dim() == 4 else input[None]
    params = random_crop_flip_params(key, batch.shape[0], padding=padding, flip_p=flip_p)
    out = random_crop_flip_apply(batch, params, padding=padding, fill=fill, padding_mode=padding_mode)
    return out if input.dim() == 4 else out[0]


def _check(padding: int, flip_p: float) -> None:
    validate.integer("padding", padding, minimum=0, hint="pixels added on each side before the crop")
    validate.real("flip_p", flip_p, minimum=0.0, maximum=1.0, hint="a probability")


@register
@dataclass(frozen=True)
class RandomCropFlip(BatchTransform):
    """A random crop of each padded image and a random horizontal flip, after the loader, on the device.

    Args:
        padding: pixels added on each side before cropping back to the image's size (0: no crop).
        flip_p: the probability that an image is mirrored left to right (0: no flip).
        fill: the value of the padding with ``padding_mode='constant'``, in the input's units (for standardised
            inputs, ``-mean / std`` is black).
        padding_mode: ``'constant'``, ``'reflect'`` or ``'replicate'``.
        input_key: where the input sits in the batch.
    """

    algorithm_name = "random_crop_flip"

    padding: int = 4
    flip_p: float = 0.5
    fill: float = 0.0
    padding_mode: str = "constant"
    input_key: int | str = 0

    def __post_init__(self) -> None:
        _check(self.padding, self.flip_p)
        validate.real("fill", self.fill)
        validate.choice("padding_mode", self.padding_mode, PADDING_MODES)
        validate.batch_key("input_key", self.input_key)

    def changes_nothing(self) -> str | None:
        if self.padding == 0 and self.flip_p == 0:
            return (
                "RandomCropFlip(padding=0, flip_p=0) changes nothing: a crop of an unpadded image is the image and "
                "no image is flipped; use padding >= 1 or flip_p > 0, or leave RandomCropFlip out"
            )
        return None

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        params = random_crop_flip_params(key, input.shape[0], padding=self.padding, flip_p=self.flip_p)
        return random_crop_flip_apply(input, params, padding=self.padding, fill=self.fill, padding_mode=self.padding_mode)
