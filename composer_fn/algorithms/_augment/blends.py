"""The colour blends (color, contrast, brightness, sharpness): PIL's ImageEnhance as ``lerp`` towards a
degenerate image, with torchvision's formulas."""

from __future__ import annotations

import torch
from torch import Tensor

from composer_fn.algorithms._augment.levels import bound, cast, chose, in_float32, ramp, rows
from composer_fn.algorithms._augment.primitives import BLEND_OPS, COLOR, CONTRAST, SHARPNESS


def grayscale(work: Tensor, quantize: bool) -> Tensor:
    """Returns the luma of float32 images (floored for ``uint8`` levels); one channel is its own gray."""
    if work.shape[1] == 1:
        return work
    red, green, blue = work.unbind(dim=1)
    gray = (red * 0.2989 + green * 0.587 + blue * 0.114).unsqueeze(1)
    return torch.floor(gray) if quantize else gray


def smoothed(work: Tensor, quantize: bool) -> Tensor:
    """Returns PIL's SMOOTH filter (3x3, weight 5 in the centre, 1 around, over 13) inside, the image on its border."""
    height, width = work.shape[-2:]
    if height <= 2 or width <= 2:
        return work
    # Shifted sums instead of a depthwise conv2d: several times faster on the CPU.
    # In-place updates touch only tensors created here, never the input.
    sums = work[..., :, :-2] + work[..., :, 1:-1]
    sums += work[..., :, 2:]
    inner = sums[..., :-2, :] + sums[..., 1:-1, :]
    inner += sums[..., 2:, :]
    inner += 4.0 * work[..., 1:-1, 1:-1]
    inner *= 1.0 / 13.0
    if quantize:
        inner.round_()
    out = work.clone()
    out[..., 1:-1, 1:-1] = inner
    return out


def degenerate(work: Tensor, op_id: int, quantize: bool) -> Tensor:
    """Returns the image each colour op blends with: gray, mean gray, black or smoothed."""
    if op_id == COLOR:
        return grayscale(work, quantize)
    if op_id == CONTRAST:
        return grayscale(work, quantize).mean(dim=(1, 2, 3), keepdim=True)
    if op_id == SHARPNESS:
        return smoothed(work, quantize)
    return torch.zeros((), dtype=work.dtype, device=work.device)


def enhance(images: Tensor, work: Tensor, target: Tensor, factor: Tensor) -> Tensor:
    """Returns ``lerp(target, work, factor)`` per sample (``target`` the degenerate image), clamped to the range,
    in the images' dtype."""
    # lerp returns its end point exactly at weight 1, so a factor of 1 gives the image back bit for bit.
    blended = torch.lerp(target.expand_as(work), work, factor.view(-1, 1, 1, 1))
    return cast(blended.clamp_(0.0, bound(images)), images)


def blend_op(images: Tensor, op_id: int, value: Tensor) -> Tensor:
    """Returns one colour op applied to every sample (PIL's ImageEnhance)."""
    work = in_float32(images)
    return enhance(images, work, degenerate(work, op_id, images.dtype == torch.uint8), value)


def blend(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns each sample's colour op, computed for every sample and selected (others pass unchanged)."""
    work = in_float32(images)
    pick = rows(op)
    quantize = images.dtype == torch.uint8
    # Each sample's degenerate image is one of the terms, the others weighted by exactly 0; brightness blends
    # with black (no term).
    mixture = torch.zeros((), dtype=torch.float32, device=images.device)
    for op_id in (COLOR, CONTRAST, SHARPNESS):
        mixture = mixture + degenerate(work, op_id, quantize) * (pick == op_id)
    return enhance(images, work, mixture, torch.where(chose(op, BLEND_OPS), value, 1.0))


def blend_table(images: Tensor, op_id: int, factor: Tensor) -> Tensor:
    """Returns the ``[B, 1, 256]`` level table of contrast or brightness (whose degenerate image is constant per
    image) over ``uint8`` images."""
    levels = ramp(images.device)
    if op_id == CONTRAST:
        target = degenerate(in_float32(images), CONTRAST, True).view(-1, 1, 1).expand(-1, 1, 256)
    else:
        target = torch.zeros((), device=images.device).expand(factor.shape[0], 1, 256)
    # The per-element arithmetic of ``enhance``, on the 256 levels.
    return torch.lerp(target, levels.expand_as(target), factor.view(-1, 1, 1)).clamp_(0.0, 255.0)
