"""The 13 primitives one at a time: each applies its op to every image of a batch, with one argument per image
(a ``[B]`` tensor, or one number for all)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from composer_fn.algorithms._augment.dispatch import apply_op
from composer_fn.algorithms._augment.primitives import AUTOCONTRAST, EQUALIZE, PRIMITIVES, check_images

Primitive = Callable[[Tensor, Tensor | float], Tensor]
"""A primitive with an argument: ``(images, argument) -> images``."""


def _per_sample(values: Tensor | float, images: Tensor, name: str) -> Tensor:
    """Returns ``values`` as one float32 argument per image, a number repeated for every image."""
    batch = images.shape[0]
    values_t = torch.as_tensor(values, device=images.device)
    if values_t.dim() == 0:
        values_t = values_t.expand(batch)
    if values_t.shape != (batch,):
        raise ValueError(f"{name} of shape {tuple(values_t.shape)}: expected ({batch},), one value per image")
    if values_t.is_complex() or values_t.dtype == torch.bool:
        raise TypeError(f"{name} of dtype {values_t.dtype}: expected real numbers")
    return values_t.to(torch.float32)


def _apply_to_all(images: Tensor, op_id: int, value: Tensor | float, name: str) -> Tensor:
    """Returns the images with op ``op_id`` applied to each, at its argument ``value`` (called ``name``)."""
    check_images(images)
    op = torch.full((images.shape[0],), op_id, dtype=torch.int64, device=images.device)
    return apply_op(images, op, _per_sample(value, images, name))


def _primitive(name: str, argument: str, doc: str) -> Primitive:
    """Returns the primitive called ``name``, whose second (positional) argument is ``argument``, documented by
    ``doc``."""
    op_id = PRIMITIVES.index(name)

    def primitive(images: Tensor, value: Tensor | float, /) -> Tensor:
        return _apply_to_all(images, op_id, value, argument)

    primitive.__name__ = primitive.__qualname__ = name
    primitive.__doc__ = doc
    return primitive


def autocontrast(images: Tensor) -> Tensor:
    """Returns each channel of each image stretched so that its darkest level is 0 and its brightest the maximum.

    A constant channel is left unchanged (floats are clamped to ``[0, 1]``). Equals torchvision's
    ``autocontrast`` bit for bit on ``uint8`` and ``float32``.
    """
    return _apply_to_all(images, AUTOCONTRAST, 0.0, "none")


def equalize(images: Tensor) -> Tensor:
    """Returns each channel of each image histogram-equalized with PIL's lookup table (``ImageOps.equalize``).

    Floats are binned into 256 levels as torchvision does and come back as multiples of 1/255.
    """
    return _apply_to_all(images, EQUALIZE, 0.0, "none")


posterize = _primitive(
    "posterize",
    "bits",
    """Returns the images with each level reduced to its ``bits[i]`` most significant bits (0 to 8).

    ``uint8``: ``x & mask``; floats: ``floor(x * 2**bits) / 2**bits`` clamped to ``[0, 1)`` (torchvision's).
    """,
)
solarize = _primitive(
    "solarize",
    "threshold",
    """Returns the images with every level at or above ``threshold[i]`` inverted (``max - x``).

    ``threshold`` is in the images' units: ``0..256`` for ``uint8`` (256 changes nothing), ``0..1`` for floats.
    """,
)
rotate = _primitive(
    "rotate",
    "degrees",
    "Returns the images rotated counter-clockwise by ``degrees[i]`` about their centre, 0 where nothing maps.",
)
shear_x = _primitive(
    "shear_x",
    "factor",
    "Returns the images sheared horizontally: target ``(x, y)`` samples source ``(x + factor * y, y)``.",
)
shear_y = _primitive(
    "shear_y",
    "factor",
    "Returns the images sheared vertically: target ``(x, y)`` samples source ``(x, y + factor * x)``.",
)
translate_x = _primitive(
    "translate_x",
    "pixels",
    "Returns the images shifted left by ``pixels[i]`` whole pixels (right when negative), 0 where nothing maps.",
)
translate_y = _primitive(
    "translate_y",
    "pixels",
    "Returns the images shifted up by ``pixels[i]`` whole pixels (down when negative), 0 where nothing maps.",
)
color = _primitive(
    "color",
    "factor",
    "Returns ``lerp(gray, image, factor)``: 0 gives grayscale, 1 the image, more saturates (PIL's Color).",
)
contrast = _primitive(
    "contrast",
    "factor",
    "Returns ``lerp(mean gray level, image, factor)`` per image (PIL's Contrast).",
)
brightness = _primitive(
    "brightness",
    "factor",
    "Returns ``factor * image``, clipped to the range (PIL's Brightness).",
)
sharpness = _primitive(
    "sharpness",
    "factor",
    "Returns ``lerp(smoothed, image, factor)`` with PIL's SMOOTH filter inside, the border unchanged.",
)
