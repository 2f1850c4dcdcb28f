"""The geometric ops: rotate and the shears through PIL's bilinear affine transform, the translations by whole
pixels; 0 wherever a target pixel's source point falls outside the image."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.algorithms._augment.levels import in_float32, to_levels
from composer_fn.algorithms._augment.primitives import (
    ROTATE,
    SHEAR_X,
    SHEAR_Y,
    SHIFT_OPS,
    TRANSLATE_X,
    TRANSLATE_Y,
)


def affine(op: Tensor, value: Tensor, height: int, width: int) -> tuple[Tensor, ...]:
    """Returns the per-sample matrices ``(a, b, c, d, e, f)`` of PIL's affine transform for rotate and shears.

    A target point ``(x, y)`` (pixel centres at half-integers) samples the source point
    ``(a x + b y + c, d x + e y + f)``.
    """
    is_rotate = op == ROTATE
    # cos/sin in float64, rounded once: float32 versions differ between compiled and eager kernels.
    radians = torch.where(is_rotate, value, 0.0).to(torch.float64) * (-math.pi / 180.0)
    cos, sin = torch.cos(radians).to(torch.float32), torch.sin(radians).to(torch.float32)
    centre_x, centre_y = width / 2.0, height / 2.0
    zero = torch.zeros_like(value)
    a = torch.where(is_rotate, cos, 1.0)
    b = torch.where(is_rotate, sin, torch.where(op == SHEAR_X, value, zero))
    d = torch.where(is_rotate, -sin, torch.where(op == SHEAR_Y, value, zero))
    e = a
    c = torch.where(is_rotate, centre_x - a * centre_x - b * centre_y, zero)
    f = torch.where(is_rotate, centre_y - d * centre_x - e * centre_y, zero)
    return a, b, c, d, e, f


def sampling_grid(op: Tensor, value: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """Returns ``grid_sample``'s ``[B, H, W, 2]`` grid of normalized source points and where they fall inside.

    ``align_corners=False`` maps ``[-1, 1]`` onto the image's outer edges. Each coordinate is the sum of an x term
    ``[B, 1, W]`` and a y term ``[B, H, 1]``, written into the grid (two strided copies cost a fraction of
    stacking). PIL's bilinear filter: a point inside the image interpolates its neighbours clamped to the image
    (border padding), a point outside gives 0.
    """
    a, b, c, d, e, f = (m.view(-1, 1, 1) for m in affine(op, value, height, width))
    xs = torch.arange(width, dtype=torch.float32, device=op.device).view(1, 1, width) + 0.5
    ys = torch.arange(height, dtype=torch.float32, device=op.device).view(1, height, 1) + 0.5
    along_x = ((a * xs + c) * (2.0 / width) - 1.0) + (b * ys) * (2.0 / width)
    along_y = ((d * xs + f) * (2.0 / height) - 1.0) + (e * ys) * (2.0 / height)
    grid = torch.empty(op.shape[0], height, width, 2, device=op.device)
    grid[..., 0] = along_x
    grid[..., 1] = along_y
    inside = (along_x >= -1.0) & (along_x < 1.0) & (along_y >= -1.0) & (along_y < 1.0)
    return grid, inside


def resample(images: Tensor, grid: Tensor, inside: Tensor) -> Tensor:
    """Returns each sample resampled at its ``grid`` of source points (bilinear), 0 where not ``inside``."""
    out = (
        F.grid_sample(in_float32(images), grid, mode="bilinear", padding_mode="border", align_corners=False)
        * inside.unsqueeze(1).to(torch.float32)
    )
    if images.dtype == torch.uint8:
        # Rounded (PIL truncates): the normalized coordinates are exact only to float rounding, and rounding
        # keeps exact maps such as a rotation by 0 degrees exact.
        return to_levels(out.round_())
    return out.to(images.dtype)


def shift(images: Tensor, op: Tensor, value: Tensor, ops: tuple[int, ...] = SHIFT_OPS) -> Tensor:
    """Returns each sample translated by a whole number of pixels, 0 where nothing maps.

    Bilinear resampling at whole-pixel offsets is a copy, so this gathers the levels themselves, exactly and in
    the images' own dtype: whole rows for vertical shifts, one gather along the rows for horizontal ones.
    ``ops`` says which of the two translations the batch may hold.
    """
    batch, channels, height, width = images.shape
    out = images
    zero = torch.zeros((), dtype=images.dtype, device=images.device)
    if TRANSLATE_Y in ops:
        source = torch.arange(height, device=images.device) + torch.where(op == TRANSLATE_Y, value, 0.0).to(
            torch.int64
        ).view(-1, 1)
        inside = ((source >= 0) & (source < height)).view(batch, 1, height, 1)
        planes = torch.arange(batch * channels, device=images.device).view(batch, channels, 1) * height
        rows = (planes + source.clamp(0, height - 1).view(batch, 1, height)).view(-1)
        out = torch.where(inside, out.reshape(-1, width).index_select(0, rows).view(images.shape), zero)
    if TRANSLATE_X in ops:
        source = torch.arange(width, device=images.device) + torch.where(op == TRANSLATE_X, value, 0.0).to(
            torch.int64
        ).view(-1, 1)
        inside = ((source >= 0) & (source < width)).view(batch, 1, 1, width)
        index = source.clamp(0, width - 1).view(batch, 1, 1, width).expand(images.shape)
        out = torch.where(inside, out.gather(3, index), zero)
    return out
