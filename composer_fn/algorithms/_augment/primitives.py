"""The primitives' op ids and groups, Composer's augmentation sets, and the image batches the ops accept."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

PRIMITIVES: tuple[str, ...] = (
    "autocontrast",
    "equalize",
    "posterize",
    "rotate",
    "solarize",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "color",
    "contrast",
    "brightness",
    "sharpness",
)
"""The primitives in Composer's order; an op id is a position in this tuple."""

(
    AUTOCONTRAST,
    EQUALIZE,
    POSTERIZE,
    ROTATE,
    SOLARIZE,
    SHEAR_X,
    SHEAR_Y,
    TRANSLATE_X,
    TRANSLATE_Y,
    COLOR,
    CONTRAST,
    BRIGHTNESS,
    SHARPNESS,
) = range(len(PRIMITIVES))

IDENTITY = -1
"""The op id that leaves a sample unchanged."""

ORIGINAL = ("color_original", "contrast_original", "brightness_original", "sharpness_original")
"""The colour ops under the original AugMix strength sampling."""

augmentation_sets: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "all": PRIMITIVES,
        # Leaves out the ops that overlap the ImageNet-C/CIFAR-10-C corruptions (the colour blends).
        "safe": PRIMITIVES[:COLOR],
        # The colour blends with the original AugMix strength sampling.
        "original": PRIMITIVES[:COLOR] + ORIGINAL,
    }
)
"""Composer's augmentation sets by name: the names of their ops (``*_original`` are sampling variants)."""

TONE_OPS = (AUTOCONTRAST, EQUALIZE, POSTERIZE, SOLARIZE)
BLEND_OPS = (COLOR, CONTRAST, BRIGHTNESS, SHARPNESS)
# The ops that map each channel's levels through a per-image table: for uint8 images they are computed as one.
# Equalize comes first: its samples' flat levels are then the group's first ones.
LOOKUP_OPS = (EQUALIZE, AUTOCONTRAST, POSTERIZE, SOLARIZE, CONTRAST, BRIGHTNESS)
WARP_OPS = (ROTATE, SHEAR_X, SHEAR_Y)
SHIFT_OPS = (TRANSLATE_X, TRANSLATE_Y)

DTYPES = (torch.uint8, torch.float32, torch.float16, torch.bfloat16)


def check_images(images: Tensor, name: str = "images") -> None:
    """Raises TypeError/ValueError unless ``images`` is a ``[B, 1 or 3, H, W]`` tensor of a supported dtype."""
    if not isinstance(images, Tensor):
        raise TypeError(f"{name} of type {type(images).__name__}: expected a torch.Tensor")
    if images.dtype not in DTYPES:
        raise TypeError(f"{name} of dtype {images.dtype}: expected one of uint8, float32, float16, bfloat16")
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{name} of shape {tuple(images.shape)}: expected [B, C, H, W] with C = 1 or 3")


def unknown_ops(op_ids: list[int]) -> ValueError:
    """Returns the error for a batch of op ids ``op_ids`` that holds ids outside ``[IDENTITY, len(PRIMITIVES))``."""
    return ValueError(f"op holds {op_ids}: expected ids in [-1, {len(PRIMITIVES) - 1}]")
