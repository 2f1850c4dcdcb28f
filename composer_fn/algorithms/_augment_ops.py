"""Composer's 13 image augmentation primitives as batched tensor ops, and its augmentation sets.

Every primitive maps ``[B, C, H, W]`` images (``C`` is 1 or 3) to images of the same shape and dtype, with one
argument per sample (a ``[B]`` tensor), so that a batch can hold a different strength for every image:

- ``uint8`` images hold levels ``0..255`` and come back as ``uint8``, quantized after every op as PIL does
  (truncation after the colour blends and autocontrast; resampling is rounded where PIL truncates, so that
  exact maps such as a rotation by 0 degrees stay exact).
- floating images (``float32``, ``float16``, ``bfloat16``) are taken to lie in ``[0, 1]``; the work is done
  in ``float32`` and cast back. Ops that need the range clamp their output to ``[0, 1]`` (autocontrast,
  equalize, posterize and the four colour blends, as torchvision does); solarize inverts about 1 without
  clamping, and the geometric ops resample without clamping. Finite values outside ``[0, 1]`` (normalized
  images) give finite results, never NaN.

Arguments are in the images' own units: ``solarize`` thresholds are ``0..256`` for ``uint8`` and ``0..1`` for
floats, ``translate_*`` take whole pixels, ``rotate`` degrees (counter-clockwise about the image centre), the
shears a factor (about the top-left corner, as PIL's affine transform in Composer), the colour ops an enhance
factor (1 leaves the image unchanged). The geometric ops follow PIL's bilinear affine transform: a target
pixel whose source point falls outside the image is 0, one inside is interpolated from its clamped neighbours.
The tone ops equal torchvision's bit for bit on ``uint8`` and ``float32``; the colour blends use torchvision's
formulas.

How a batch with a different op per image is computed (``apply_op``):

- eagerly, the samples are sorted into groups and each group runs on its own samples only: rotate and the shears
  share one ``grid_sample`` with per-sample matrices; for ``uint8`` every op that maps each channel's levels
  through a table (autocontrast, equalize, posterize, solarize, contrast, brightness) is one group, whose
  per-sample, per-channel tables are gathered once over its images; the other colour ops are one ``lerp``
  towards a degenerate image, the translations a gather of whole rows or columns. On the CPU the bookkeeping
  on small arrays (the sort, the draws, the sampling grids, the shift indices) runs in NumPy, whose calls cost a
  fraction of torch's, with the same arithmetic (tests hold both forms equal bit for bit);
- under ``torch.compile`` (static shapes, no data-dependent indexing) every group is computed for the whole
  batch, with neutral arguments (factor 1, offset 0, identity matrix) for the samples of other groups, and
  ``torch.where`` keeps each sample's own result.

Both paths run the same per-element arithmetic and give the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core import random as R
from composer_fn.core.host import readable_on_host

__all__ = [
    "PRIMITIVES",
    "IDENTITY",
    "augmentation_sets",
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
    "apply_op",
    "draw_ops",
    "op_arguments",
    "KeyedTransform",
]

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

_ORIGINAL = ("color_original", "contrast_original", "brightness_original", "sharpness_original")

augmentation_sets: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "all": PRIMITIVES,
        # Leaves out the ops that overlap the ImageNet-C/CIFAR-10-C corruptions (the colour blends).
        "safe": PRIMITIVES[:COLOR],
        # The colour blends with the original AugMix strength sampling.
        "original": PRIMITIVES[:COLOR] + _ORIGINAL,
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


def _per_sample(values: Tensor | float, images: Tensor, name: str) -> Tensor:
    batch = images.shape[0]
    values_t = torch.as_tensor(values, device=images.device)
    if values_t.dim() == 0:
        values_t = values_t.expand(batch)
    if values_t.shape != (batch,):
        raise ValueError(f"{name} of shape {tuple(values_t.shape)}: expected ({batch},), one value per image")
    if values_t.is_complex() or values_t.dtype == torch.bool:
        raise TypeError(f"{name} of dtype {values_t.dtype}: expected real numbers")
    return values_t.to(torch.float32)


def _rows(mask: Tensor) -> Tensor:
    return mask.view(-1, 1, 1, 1)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _chose(op: Tensor, ops: tuple[int, ...]) -> Tensor:
    mask = op == ops[0]
    for other in ops[1:]:
        mask = mask | (op == other)
    return mask


def _select(mask: Tensor, chosen: Tensor, other: Tensor) -> Tensor:
    """Returns ``chosen`` where ``mask`` holds, else ``other``, for finite values.

    ``lerp`` at weight exactly 0 or 1 returns an end point bit for bit, and on the CPU it runs several times
    faster than ``torch.where`` over image-sized masks.
    """
    return torch.lerp(other, chosen, mask.to(other.dtype))


def _work(images: Tensor) -> Tensor:
    return images if images.dtype == torch.float32 else images.to(torch.float32)


def to_levels(values: Tensor) -> Tensor:
    """Returns float ``values`` already within ``[0, 255]`` as ``uint8``, truncated like ``.to(torch.uint8)``.

    Through int32: the same bits, several times faster on the CPU than the direct cast.
    """
    return values.to(torch.int32).to(torch.uint8)


def _cast(values: Tensor, images: Tensor) -> Tensor:
    """Returns float ``values`` in the images' dtype (in ``[0, 255]`` when that is ``uint8``)."""
    return to_levels(values) if images.dtype == torch.uint8 else values.to(images.dtype)


def _bound(images: Tensor) -> float:
    return 255.0 if images.dtype == torch.uint8 else 1.0


def _ramp(device: torch.device) -> Tensor:
    return torch.arange(256, dtype=torch.float32, device=device)


# ---------------------------------------------------------------------------------------------- tone ops
# For uint8 images every tone op maps each channel's 256 levels through a table: the per-sample, per-channel
# tables are built on the 256 levels (tiny) and gathered once over the image. Floats use the formulas.
def _flat_levels(levels: Tensor) -> Tensor:
    """Returns the int32 position of each ``uint8`` level in a flat ``[B * C * 256]`` table."""
    batch, channels = levels.shape[:2]
    offsets = torch.arange(batch * channels, dtype=torch.int32, device=levels.device) * 256
    # uint8 + int32 promotes to int32: one pass.
    return (levels + offsets.view(batch, channels, 1, 1)).view(-1)


def _look_up(levels: Tensor, table: Tensor, index: Tensor) -> Tensor:
    """Returns ``table[b, c, levels[b, c, h, w]]`` for a ``[B, C or 1, 256]`` table."""
    flat = table.expand(levels.shape[0], levels.shape[1], 256).reshape(-1)
    return flat.index_select(0, index).view(levels.shape)


def _autocontrast_range(images: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    # torchvision's arithmetic, so that uint8 results agree with it bit for bit; uint8 levels are reduced as
    # they are and converted after (exactly).
    flat = images.flatten(2)
    low, high = _work(flat.amin(dim=2, keepdim=True)), _work(flat.amax(dim=2, keepdim=True))
    constant = high == low
    inverse_scale = (high - low) * (1.0 / bound)
    return torch.where(constant, 0.0, low), torch.where(constant, 1.0, inverse_scale)


def _autocontrast_table(images: Tensor) -> Tensor:
    low, inverse_scale = _autocontrast_range(images, 255.0)
    return ((_ramp(images.device) - low) / inverse_scale).clamp(0.0, 255.0)


def _equalize_table(levels: Tensor, index: Tensor) -> Tensor:
    """Returns PIL's equalization lookup table ``[B, C, 256]`` (float32) for ``uint8`` levels."""
    batch, channels, height, width = levels.shape
    bins = batch * channels * 256
    if _compiling():
        wide = index.to(torch.int64)
        hist = torch.zeros(bins, dtype=torch.int64, device=levels.device).scatter_add(
            0, wide, torch.ones((), dtype=torch.int64, device=levels.device).expand_as(wide)
        )
    else:
        # The same counts; bincount is several times faster eagerly but has a data-dependent shape to dynamo.
        hist = torch.bincount(index, minlength=bins)
    hist = hist.view(batch, channels, 256)
    cumulative = hist.cumsum(dim=2)
    # The last non-empty bin is where the cumulative histogram first reaches its maximum.
    last = hist.gather(2, cumulative.argmax(dim=2, keepdim=True))
    step = torch.div(height * width - last, 255, rounding_mode="floor")
    # PIL's table: level l maps to (cumulative[l - 1] + step // 2) // step (0 for l = 0). The integers are far
    # below 2**53, so float64 division and floor give the integer quotient exactly, and run several times faster.
    below = F.pad(cumulative[..., :-1], (1, 0)).to(torch.float64)
    table = torch.floor((below + (step // 2).to(torch.float64)) / step.clamp(min=1).to(torch.float64))
    return torch.where(step == 0, _ramp(levels.device), table.clamp_(0.0, 255.0).to(torch.float32))


def _posterize_table(bits: Tensor, device: torch.device) -> Tensor:
    quantum = torch.exp2(8.0 - bits.clamp(0.0, 8.0)).view(-1, 1, 1)
    return torch.floor(_ramp(device) / quantum) * quantum


def _solarize_table(threshold: Tensor, device: torch.device) -> Tensor:
    ramp = _ramp(device)
    return torch.where(ramp >= threshold.view(-1, 1, 1), 255.0 - ramp, ramp)


def _blend_table(images: Tensor, op_id: int, factor: Tensor) -> Tensor:
    """Returns the table of a colour op whose degenerate image is constant per image: contrast or brightness."""
    ramp = _ramp(images.device)
    if op_id == CONTRAST:
        degenerate = _degenerate(_work(images), CONTRAST, True).view(-1, 1, 1).expand(-1, 1, 256)
    else:
        degenerate = torch.zeros((), device=images.device).expand(factor.shape[0], 1, 256)
    # The per-element arithmetic of ``_enhance``, on the 256 levels.
    return torch.lerp(degenerate, ramp.expand_as(degenerate), factor.view(-1, 1, 1)).clamp_(0.0, 255.0)


def _table(images: Tensor, op_id: int, value: Tensor, index: Tensor | None = None) -> Tensor:
    """Returns the ``[B, C or 1, 256]`` float table of a lookup op over ``uint8`` images (``LOOKUP_OPS``)."""
    if op_id == AUTOCONTRAST:
        return _autocontrast_table(images)
    if op_id == EQUALIZE:
        return _equalize_table(images, _flat_levels(images) if index is None else index)
    if op_id == POSTERIZE:
        return _posterize_table(value, images.device)
    if op_id == SOLARIZE:
        return _solarize_table(value, images.device)
    return _blend_table(images, op_id, value)


def _autocontrast_float(work: Tensor) -> Tensor:
    low, inverse_scale = _autocontrast_range(work, 1.0)
    return ((work - low.unsqueeze(-1)) / inverse_scale.unsqueeze(-1)).clamp(0.0, 1.0)


def _equalize_float(work: Tensor) -> Tensor:
    # torchvision's binning of [0, 1] into 256 levels, and back.
    levels = to_levels(work.clamp(0.0, 1.0) * 255.999)
    index = _flat_levels(levels)
    return _look_up(levels, _equalize_table(levels, index), index) * (1.0 / 255.0)


def _posterize_float(work: Tensor, bits: Tensor) -> Tensor:
    count = torch.exp2(bits.clamp(0.0, 8.0)).view(-1, 1, 1, 1)
    return torch.minimum(torch.floor(work * count).clamp(min=0.0), count - 1.0) * (1.0 / count)


def _solarize_float(work: Tensor, threshold: Tensor) -> Tensor:
    return _select(work >= threshold.view(-1, 1, 1, 1), 1.0 - work, work)


def _tone_op(images: Tensor, op_id: int, value: Tensor) -> Tensor:
    """Returns one tone op applied to every sample of floating images."""
    work = _work(images)
    if op_id == AUTOCONTRAST:
        out = _autocontrast_float(work)
    elif op_id == EQUALIZE:
        out = _equalize_float(work)
    elif op_id == POSTERIZE:
        out = _posterize_float(work, value)
    else:
        out = _solarize_float(work, value)
    return out.to(images.dtype)


def _look_up_runs(images: Tensor, value: Tensor, runs: list[tuple[int, int]]) -> Tensor:
    """Returns ``uint8`` images sorted by op, ``runs`` of ``(op, count)`` in order, each through its op's table."""
    channels = images.shape[1]
    index = _flat_levels(images)
    tables, start = [], 0
    for op_id, count in runs:
        members = slice(start, start + count)
        start += count
        if op_id == EQUALIZE and start == count:
            # The first samples' flat positions are the group's first ones.
            table = _table(images[members], op_id, value, index[: images[members].numel()])
        else:
            table = _table(images[members], op_id, value[members])
        tables.append(table.expand(count, channels, 256))
    table = tables[0] if len(tables) == 1 else torch.cat(tables)
    return _look_up(images, to_levels(table), index)


def _tone(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns each sample's tone op, computed for every sample and selected (other samples pass unchanged).

    For ``uint8`` images the ops are ``LOOKUP_OPS`` (contrast and brightness included), otherwise ``TONE_OPS``.
    """
    if images.dtype == torch.uint8:
        batch, channels = images.shape[:2]
        pick = op.view(-1, 1, 1)
        index = _flat_levels(images)
        table = _ramp(images.device).expand(batch, channels, 256)
        for op_id in LOOKUP_OPS:
            table = torch.where(pick == op_id, _table(images, op_id, value, index), table)
        return _look_up(images, to_levels(table), index)
    work = _work(images)
    pick = _rows(op)
    out = _select(pick == AUTOCONTRAST, _autocontrast_float(work), work)
    out = _select(pick == EQUALIZE, _equalize_float(work), out)
    out = _select(pick == POSTERIZE, _posterize_float(work, value), out)
    out = _select(pick == SOLARIZE, _solarize_float(work, value), out)
    return out.to(images.dtype)


# --------------------------------------------------------------------------------------------- colour blends
def _grayscale(work: Tensor, quantize: bool) -> Tensor:
    if work.shape[1] == 1:
        return work
    red, green, blue = work.unbind(dim=1)
    gray = (red * 0.2989 + green * 0.587 + blue * 0.114).unsqueeze(1)
    return torch.floor(gray) if quantize else gray


def _smoothed(work: Tensor, quantize: bool) -> Tensor:
    """Returns PIL's SMOOTH filter (3x3, weight 5 in the centre, 1 around, over 13) inside, the image on its border."""
    height, width = work.shape[-2:]
    if height <= 2 or width <= 2:
        return work
    # Shifted sums instead of a depthwise conv2d: several times faster on the CPU.
    # In-place updates touch only tensors created here, never the input.
    rows = work[..., :, :-2] + work[..., :, 1:-1]
    rows += work[..., :, 2:]
    inner = rows[..., :-2, :] + rows[..., 1:-1, :]
    inner += rows[..., 2:, :]
    inner += 4.0 * work[..., 1:-1, 1:-1]
    inner *= 1.0 / 13.0
    if quantize:
        inner.round_()
    smoothed = work.clone()
    smoothed[..., 1:-1, 1:-1] = inner
    return smoothed


def _degenerate(work: Tensor, op_id: int, quantize: bool) -> Tensor:
    """Returns the image each colour op blends with: gray, mean gray, black or smoothed."""
    if op_id == COLOR:
        return _grayscale(work, quantize)
    if op_id == CONTRAST:
        return _grayscale(work, quantize).mean(dim=(1, 2, 3), keepdim=True)
    if op_id == SHARPNESS:
        return _smoothed(work, quantize)
    return torch.zeros((), dtype=work.dtype, device=work.device)


def _enhance(images: Tensor, work: Tensor, degenerate: Tensor, factor: Tensor) -> Tensor:
    # lerp returns its end point exactly at weight 1, so a factor of 1 gives the image back bit for bit.
    blended = torch.lerp(degenerate.expand_as(work), work, factor.view(-1, 1, 1, 1))
    return _cast(blended.clamp_(0.0, _bound(images)), images)


def _blend_op(images: Tensor, op_id: int, value: Tensor) -> Tensor:
    """Returns one colour op applied to every sample (PIL's ImageEnhance)."""
    work = _work(images)
    return _enhance(images, work, _degenerate(work, op_id, images.dtype == torch.uint8), value)


def _blend(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns each sample's colour op, computed for every sample and selected (others pass unchanged)."""
    work = _work(images)
    pick = _rows(op)
    quantize = images.dtype == torch.uint8
    # Each sample's degenerate image is one of the terms, the others weighted by exactly 0; brightness blends
    # with black (no term).
    degenerate = torch.zeros((), dtype=torch.float32, device=images.device)
    for op_id in (COLOR, CONTRAST, SHARPNESS):
        degenerate = degenerate + _degenerate(work, op_id, quantize) * (pick == op_id)
    return _enhance(images, work, degenerate, torch.where(_chose(op, BLEND_OPS), value, 1.0))


# --------------------------------------------------------------------------------------------- geometric ops
def _affine(op: Tensor, value: Tensor, height: int, width: int) -> tuple[Tensor, ...]:
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


def _shift(images: Tensor, op: Tensor, value: Tensor, ops: tuple[int, ...] = SHIFT_OPS) -> Tensor:
    """Returns each sample translated by a whole number of pixels, 0 where nothing maps.

    Bilinear resampling at whole-pixel offsets is a copy, so this gathers the levels themselves, exactly and in
    the images' own dtype: whole rows for vertical shifts, one gather along the rows for horizontal ones.
    ``ops`` says which of the two translations the batch may hold.
    """
    if readable_on_host(op) and readable_on_host(value):
        return _shift_numpy(images, op.numpy(), value.numpy(), ops)
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


def _shift_numpy(images: Tensor, op: np.ndarray, value: np.ndarray, ops: tuple[int, ...]) -> Tensor:
    """``_shift`` eagerly on the CPU: the indices in NumPy, and a zero row or column to gather from outside."""
    batch, channels, height, width = images.shape
    out = images
    if TRANSLATE_Y in ops:
        source = np.arange(height) + np.where(op == TRANSLATE_Y, value, 0.0).astype(np.int64)[:, None]
        planes = np.arange(batch * channels).reshape(batch, channels, 1) * height
        # Rows from outside the image read the appended zero row.
        rows = np.where((source >= 0) & (source < height), source, -1)[:, None, :] + planes
        rows = np.where(rows < planes, batch * channels * height, rows)
        flat = torch.cat((out.reshape(-1, width), out.new_zeros(1, width)))
        out = flat.index_select(0, torch.from_numpy(rows.reshape(-1))).view(images.shape)
    if TRANSLATE_X in ops:
        source = np.arange(width) + np.where(op == TRANSLATE_X, value, 0.0).astype(np.int64)[:, None]
        # Columns from outside the image read the appended zero column.
        columns = np.where((source >= 0) & (source < width), source, width)
        index = torch.from_numpy(columns).view(batch, 1, 1, width).expand(batch, channels, height, width)
        out = F.pad(out, (0, 1)).gather(3, index)
    return out


def _geometric(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns each sample resampled through its affine matrix (bilinear, 0 outside the source image)."""
    height, width = images.shape[-2:]
    if readable_on_host(op) and readable_on_host(value):
        grid, inside = _sampling_grid_numpy(op.numpy(), value.numpy(), height, width)
    else:
        grid, inside = _sampling_grid(op, value, height, width)
    out = (
        F.grid_sample(_work(images), grid, mode="bilinear", padding_mode="border", align_corners=False)
        * inside.unsqueeze(1).to(torch.float32)
    )
    if images.dtype == torch.uint8:
        # Rounded (PIL truncates): the normalized coordinates are exact only to float rounding, and rounding
        # keeps exact maps such as a rotation by 0 degrees exact.
        return to_levels(out.round_())
    return out.to(images.dtype)


def _sampling_grid(op: Tensor, value: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """Returns ``grid_sample``'s ``[B, H, W, 2]`` grid of normalized source points and where they fall inside.

    ``align_corners=False`` maps ``[-1, 1]`` onto the image's outer edges. Each coordinate is the sum of an x term
    ``[B, 1, W]`` and a y term ``[B, H, 1]``, written into the grid (two strided copies cost a fraction of
    stacking). PIL's bilinear filter: a point inside the image interpolates its neighbours clamped to the image
    (border padding), a point outside gives 0.
    """
    a, b, c, d, e, f = (m.view(-1, 1, 1) for m in _affine(op, value, height, width))
    xs = torch.arange(width, dtype=torch.float32, device=op.device).view(1, 1, width) + 0.5
    ys = torch.arange(height, dtype=torch.float32, device=op.device).view(1, height, 1) + 0.5
    along_x = ((a * xs + c) * (2.0 / width) - 1.0) + (b * ys) * (2.0 / width)
    along_y = ((d * xs + f) * (2.0 / height) - 1.0) + (e * ys) * (2.0 / height)
    grid = torch.empty(op.shape[0], height, width, 2, device=op.device)
    grid[..., 0] = along_x
    grid[..., 1] = along_y
    inside = (along_x >= -1.0) & (along_x < 1.0) & (along_y >= -1.0) & (along_y < 1.0)
    return grid, inside


def _sampling_grid_numpy(op: np.ndarray, value: np.ndarray, height: int, width: int) -> tuple[Tensor, Tensor]:
    """``_sampling_grid`` eagerly on the CPU: the same float32 arithmetic in NumPy, whose calls on small arrays
    and comparisons cost a fraction of torch's (cos and sin stay torch's, so that every bit agrees)."""
    is_rotate = op == ROTATE
    radians = torch.from_numpy(np.where(is_rotate, value, 0.0).astype(np.float64)) * (-math.pi / 180.0)
    cos, sin = torch.cos(radians).to(torch.float32).numpy(), torch.sin(radians).to(torch.float32).numpy()
    centre_x, centre_y = np.float32(width / 2.0), np.float32(height / 2.0)
    zero = np.zeros_like(value)
    a = np.where(is_rotate, cos, np.float32(1.0))
    b = np.where(is_rotate, sin, np.where(op == SHEAR_X, value, zero))
    d = np.where(is_rotate, -sin, np.where(op == SHEAR_Y, value, zero))
    e = a
    c = np.where(is_rotate, centre_x - a * centre_x - b * centre_y, zero)
    f = np.where(is_rotate, centre_y - d * centre_x - e * centre_y, zero)
    a, b, c, d, e, f = (m.reshape(-1, 1, 1) for m in (a, b, c, d, e, f))
    xs = np.arange(width, dtype=np.float32).reshape(1, 1, width) + np.float32(0.5)
    ys = np.arange(height, dtype=np.float32).reshape(1, height, 1) + np.float32(0.5)
    one, scale_x, scale_y = np.float32(1.0), np.float32(2.0 / width), np.float32(2.0 / height)
    along_x = ((a * xs + c) * scale_x - one) + (b * ys) * scale_x
    along_y = ((d * xs + f) * scale_y - one) + (e * ys) * scale_y
    grid = np.empty((op.shape[0], height, width, 2), dtype=np.float32)
    grid[..., 0] = along_x
    grid[..., 1] = along_y
    inside = along_x >= -one
    inside &= along_x < one
    inside &= along_y >= -one
    inside &= along_y < one
    return torch.from_numpy(grid), torch.from_numpy(inside)


# ------------------------------------------------------------------------------------------------ dispatch
# How eager dispatch groups the ops: each group is one computation over its samples (sorted by op inside it).
_FLOAT_GROUPS: tuple[tuple[int, ...], ...] = (
    *((op_id,) for op_id in TONE_OPS + BLEND_OPS + SHIFT_OPS),
    WARP_OPS,
    (IDENTITY,),
)
_UINT8_GROUPS: tuple[tuple[int, ...], ...] = (
    LOOKUP_OPS,
    (COLOR,),
    (SHARPNESS,),
    *((op_id,) for op_id in SHIFT_OPS),
    WARP_OPS,
    (IDENTITY,),
)


def _rank(groups: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """Returns each op's place (indexed by ``op + 1``) when the ops are listed group after group."""
    order = [op_id for group in groups for op_id in group]
    return tuple(order.index(op_id) for op_id in range(IDENTITY, len(PRIMITIVES)))


_RANKS = {groups: _rank(groups) for groups in (_UINT8_GROUPS, _FLOAT_GROUPS)}


def apply_op(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns the batch with op ``op[i]`` (an id into ``PRIMITIVES``, or ``IDENTITY``) applied to sample ``i``.

    ``value[i]`` is that op's argument in the images' units (see the module docstring). The input is never
    written to; the result is always a new tensor.
    """
    uint8 = images.dtype == torch.uint8
    if _compiling():
        tone_ops = LOOKUP_OPS if uint8 else TONE_OPS
        blend_ops = (COLOR, SHARPNESS) if uint8 else BLEND_OPS
        out = torch.where(_rows(_chose(op, tone_ops)), _tone(images, op, value), images)
        out = torch.where(_rows(_chose(op, blend_ops)), _blend(images, op, value), out)
        out = torch.where(_rows(_chose(op, SHIFT_OPS)), _shift(images, op, value), out)
        return torch.where(_rows(_chose(op, WARP_OPS)), _geometric(images, op, value), out)
    groups = _UINT8_GROUPS if uint8 else _FLOAT_GROUPS
    counts, order, op_by_group, value_by_group, unsort = _sort_by_group(op, value, groups)
    # Each group's ops, with their sample counts, in the order of the sort.
    runs = [[(op_id, counts[op_id + 1]) for op_id in group if counts[op_id + 1]] for group in groups]
    runs = [group for group in runs if group]
    if len(runs) == 1 and len(runs[0]) == 1:
        return _run_group(runs[0], images, op, value)
    # Sorted once by group and op, each group is a slice (a view): one gather of the images rather than one per
    # group.
    images_by_group = images.index_select(0, order)
    pieces, start = [], 0
    for group in runs:
        count = sum(member_count for _, member_count in group)
        members = slice(start, start + count)
        start += count
        if group[0][0] == IDENTITY:
            # Copied into the result below, like every piece: no copy of its own.
            pieces.append(images_by_group[members])
        else:
            pieces.append(_run_group(group, images_by_group[members], op_by_group[members], value_by_group[members]))
    if uint8:
        # index_copy_ crawls over one-byte elements; concatenating and un-permuting is cheap at one byte.
        return torch.cat(pieces).index_select(0, unsort)
    # Floats are copied into the one full-size result: large allocations are costly on the CPU (every page
    # is faulted in on first touch).
    out = torch.empty_like(images)
    start = 0
    for piece in pieces:
        out.index_copy_(0, order[start : start + piece.shape[0]], piece)
        start += piece.shape[0]
    return out


def _sort_by_group(
    op: Tensor, value: Tensor, groups: tuple[tuple[int, ...], ...]
) -> tuple[list[int], Tensor, Tensor, Tensor, Tensor]:
    """Returns the samples' count per op (indexed by ``op + 1``), the stable order that lists them group after
    group and op after op, ``op`` and ``value`` in that order, and the order's inverse.

    Raises ValueError for op ids outside ``[IDENTITY, len(PRIMITIVES))``.
    """
    rank = _RANKS[groups]
    if readable_on_host(op) and readable_on_host(value):
        # The same bookkeeping in NumPy: on arrays of a few hundred ids its calls cost a fraction of torch's.
        op_np, value_np = op.numpy(), value.numpy()
        if ((op_np < IDENTITY) | (op_np >= len(PRIMITIVES))).any():
            raise ValueError(f"op holds {op_np.tolist()}: expected ids in [-1, {len(PRIMITIVES) - 1}]")
        counts = np.bincount(op_np + 1, minlength=len(PRIMITIVES) + 1).tolist()
        order_np = np.argsort(np.asarray(rank)[op_np + 1], kind="stable")
        unsort_np = np.empty_like(order_np)
        unsort_np[order_np] = np.arange(order_np.size)
        arrays = (order_np, op_np[order_np], value_np[order_np], unsort_np)
        return counts, *(torch.from_numpy(array) for array in arrays)
    if bool(((op < IDENTITY) | (op >= len(PRIMITIVES))).any()):
        raise ValueError(f"op holds {op.tolist()}: expected ids in [-1, {len(PRIMITIVES) - 1}]")
    counts = torch.bincount(op + 1, minlength=len(PRIMITIVES) + 1).tolist()
    order = torch.argsort(torch.tensor(rank, device=op.device)[op + 1], stable=True)
    return counts, order, op.index_select(0, order), value.index_select(0, order), torch.argsort(order)


def _run_group(runs: list[tuple[int, int]], images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns one group's samples, sorted by op: ``runs`` lists its ops and their counts in order."""
    group_id = runs[0][0]
    if group_id in WARP_OPS:
        return _geometric(images, op, value)
    if group_id in SHIFT_OPS:
        return _shift(images, op, value, (group_id,))
    if images.dtype == torch.uint8 and group_id in LOOKUP_OPS:
        return _look_up_runs(images, value, runs)
    if group_id in TONE_OPS:
        return _tone_op(images, group_id, value)
    if group_id in BLEND_OPS:
        return _blend_op(images, group_id, value)
    return images.clone()


def _single(images: Tensor, op_id: int, value: Tensor | float, name: str) -> Tensor:
    check_images(images)
    op = torch.full((images.shape[0],), op_id, dtype=torch.int64, device=images.device)
    return apply_op(images, op, _per_sample(value, images, name))


def autocontrast(images: Tensor) -> Tensor:
    """Returns each channel of each image stretched so that its darkest level is 0 and its brightest the maximum.

    A constant channel is left unchanged (floats are clamped to ``[0, 1]``). Equals torchvision's
    ``autocontrast`` bit for bit on ``uint8`` and ``float32``.
    """
    return _single(images, AUTOCONTRAST, 0.0, "none")


def equalize(images: Tensor) -> Tensor:
    """Returns each channel of each image histogram-equalized with PIL's lookup table (``ImageOps.equalize``).

    Floats are binned into 256 levels as torchvision does and come back as multiples of 1/255.
    """
    return _single(images, EQUALIZE, 0.0, "none")


def posterize(images: Tensor, bits: Tensor | float) -> Tensor:
    """Returns the images with each level reduced to its ``bits[i]`` most significant bits (0 to 8).

    ``uint8``: ``x & mask``; floats: ``floor(x * 2**bits) / 2**bits`` clamped to ``[0, 1)`` (torchvision's).
    """
    return _single(images, POSTERIZE, bits, "bits")


def solarize(images: Tensor, threshold: Tensor | float) -> Tensor:
    """Returns the images with every level at or above ``threshold[i]`` inverted (``max - x``).

    ``threshold`` is in the images' units: ``0..256`` for ``uint8`` (256 changes nothing), ``0..1`` for floats.
    """
    return _single(images, SOLARIZE, threshold, "threshold")


def rotate(images: Tensor, degrees: Tensor | float) -> Tensor:
    """Returns the images rotated counter-clockwise by ``degrees[i]`` about their centre, 0 where nothing maps."""
    return _single(images, ROTATE, degrees, "degrees")


def shear_x(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns the images sheared horizontally: target ``(x, y)`` samples source ``(x + factor * y, y)``."""
    return _single(images, SHEAR_X, factor, "factor")


def shear_y(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns the images sheared vertically: target ``(x, y)`` samples source ``(x, y + factor * x)``."""
    return _single(images, SHEAR_Y, factor, "factor")


def translate_x(images: Tensor, pixels: Tensor | float) -> Tensor:
    """Returns the images shifted left by ``pixels[i]`` whole pixels (right when negative), 0 where nothing maps."""
    return _single(images, TRANSLATE_X, pixels, "pixels")


def translate_y(images: Tensor, pixels: Tensor | float) -> Tensor:
    """Returns the images shifted up by ``pixels[i]`` whole pixels (down when negative), 0 where nothing maps."""
    return _single(images, TRANSLATE_Y, pixels, "pixels")


def color(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns ``lerp(gray, image, factor)``: 0 gives grayscale, 1 the image, more saturates (PIL's Color)."""
    return _single(images, COLOR, factor, "factor")


def contrast(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns ``lerp(mean gray level, image, factor)`` per image (PIL's Contrast)."""
    return _single(images, CONTRAST, factor, "factor")


def brightness(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns ``factor * image``, clipped to the range (PIL's Brightness)."""
    return _single(images, BRIGHTNESS, factor, "factor")


def sharpness(images: Tensor, factor: Tensor | float) -> Tensor:
    """Returns ``lerp(smoothed, image, factor)`` with PIL's SMOOTH filter inside, the border unchanged."""
    return _single(images, SHARPNESS, factor, "factor")


# ------------------------------------------------------------------------------ Composer's strength sampling
def check_severity(severity: float, augmentation_set: str) -> None:
    """Raises ValueError unless ``0 <= severity <= 10`` and ``augmentation_set`` names a set."""
    if isinstance(severity, bool) or not isinstance(severity, int | float) or not 0 <= severity <= 10:
        raise ValueError(f"severity={severity!r} must be a number in [0, 10]")
    if augmentation_set not in augmentation_sets:
        raise ValueError(
            f"augmentation_set={augmentation_set!r} must be one of {', '.join(augmentation_sets)}"
        )


# Composer's severity -> magnitude mapping, per op: (scale, floored, offset, factor, kind). For kind 0 the argument
# is ``offset + factor * g(level * scale)``, with ``g`` the floor when ``floored`` (Composer's int_parameter) and
# the identity otherwise (float_parameter); kind 1 is the colour ops' symmetric factor, kind 2 brightness's.
_MAPPING: Mapping[str, tuple[float, float, float, float, float]] = MappingProxyType(
    {
        "autocontrast": (0.0, 0.0, 0.0, 1.0, 0.0),
        "equalize": (0.0, 0.0, 0.0, 1.0, 0.0),
        "posterize": (0.4, 1.0, 4.0, -1.0, 0.0),  # 4 - int_parameter(level, 4)
        "rotate": (3.0, 1.0, 0.0, 1.0, 0.0),  # int_parameter(level, 30) degrees
        "solarize": (25.6, 1.0, 256.0, -1.0, 0.0),  # 256 - int_parameter(level, 256)
        "shear_x": (0.03, 0.0, 0.0, 1.0, 0.0),  # float_parameter(level, 0.3)
        "shear_y": (0.03, 0.0, 0.0, 1.0, 0.0),
        # int_parameter(level, side / 3): kept as a fraction of the side, floored to pixels at apply time.
        "translate_x": (1.0 / 30.0, 0.0, 0.0, 1.0, 0.0),
        "translate_y": (1.0 / 30.0, 0.0, 0.0, 1.0, 0.0),
        "color": (0.0, 0.0, 0.0, 0.0, 1.0),
        "contrast": (0.0, 0.0, 0.0, 0.0, 1.0),
        "brightness": (0.0, 0.0, 0.0, 0.0, 2.0),  # the symmetric factor, times 0.75 above 1
        "sharpness": (0.0, 0.0, 0.0, 0.0, 1.0),
        # float_parameter(level, 1.8) + 0.1
        **{name: (0.18, 0.0, 0.1, 1.0, 0.0) for name in _ORIGINAL},
    }
)

_SIGNED = frozenset({"rotate", "shear_x", "shear_y", "translate_x", "translate_y"})


def _set_table(augmentation_set: str) -> tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]:
    """Returns the set's rows of ``_MAPPING`` plus its signed flag and ±1, and its members' op ids."""
    names = augmentation_sets[augmentation_set]
    rows = tuple((*_MAPPING[name], float(name in _SIGNED), -1.0, 1.0) for name in names)
    return rows, tuple(PRIMITIVES.index(name.removesuffix("_original")) for name in names)


_SET_TABLES = {name: _set_table(name) for name in augmentation_sets}


def draw_ops(
    uniforms: Tensor, choice: Tensor, severity: float, augmentation_set: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns ``(op, magnitude, sign)`` for ops chosen uniformly from the set, as Composer samples them.

    ``choice`` holds indices into the set; ``uniforms`` (shape ``choice.shape + (4,)``, in ``[0, 1)``) give the
    level ``U(0.1, severity)``, the sign (negative when above 0.5, for the ops Composer flips) and the colour
    ops' symmetric factor: ``U(1, severity)`` or ``U(1 - 0.09 severity, 1)``, each with probability 1/2.
    """
    rows, op_ids = _SET_TABLES[augmentation_set]
    if readable_on_host(uniforms) and readable_on_host(choice):
        # The same float32 arithmetic in NumPy: its calls on these small arrays cost a fraction of torch's.
        choice_np = choice.numpy()
        magnitude_np, sign_np = _draw(uniforms.numpy(), np.asarray(rows, dtype=np.float32)[choice_np], severity, np)
        return (
            torch.from_numpy(np.asarray(op_ids)[choice_np]),
            torch.from_numpy(magnitude_np),
            torch.from_numpy(sign_np),
        )
    table = torch.tensor(rows, dtype=torch.float32, device=choice.device)
    magnitude, sign = _draw(uniforms, table[choice], severity, torch)
    return torch.tensor(op_ids, device=choice.device)[choice], magnitude, sign


def _draw(uniforms: Any, coefficients: Any, severity: float, xp: Any) -> tuple[Any, Any]:
    """Returns the magnitude and sign from ``uniforms`` and each draw's row of ``_set_table`` (float32 arrays of
    ``xp``, torch or NumPy: Python scalars take the arrays' dtype in both, so both give the same bits)."""
    level = 0.1 + (severity - 0.1) * uniforms[..., 0]
    symmetric = xp.where(
        uniforms[..., 2] > 0.5,
        1.0 + (severity - 1.0) * uniforms[..., 3],
        (1.0 - 0.09 * severity) + (0.09 * severity) * uniforms[..., 3],
    )
    scale, floored, offset, factor, kind, signed, minus, plus = (coefficients[..., i] for i in range(8))
    scaled = level * scale
    linear = offset + factor * xp.where(floored > 0.5, xp.floor(scaled), scaled)
    colour = xp.where((kind > 1.5) & (symmetric > 1.0), symmetric * 0.75, symmetric)
    magnitude = xp.where(kind > 0.5, colour, linear)
    sign = xp.where((signed > 0.5) & (uniforms[..., 1] > 0.5), minus, plus)
    return magnitude, sign


def op_arguments(op: Tensor, magnitude: Tensor, sign: Tensor, images: Tensor) -> Tensor:
    """Returns the signed op arguments in the images' units: translations in pixels, thresholds in levels."""
    height, width = images.shape[-2:]
    signed = magnitude.to(images.device, torch.float32) * sign.to(images.device, torch.float32)
    op = op.to(images.device)
    value = torch.where(op == TRANSLATE_X, torch.trunc(signed * width), signed)
    value = torch.where(op == TRANSLATE_Y, torch.trunc(signed * height), value)
    if images.dtype != torch.uint8:
        value = torch.where(op == SOLARIZE, value * (1.0 / 255.0), value)
    return value


class KeyedTransform:
    """A per-image transform for data-loader workers whose draws come from a key, an index or a call counter."""

    def __init__(self, seed: int) -> None:
        root = R.host_key(seed)
        self._indexed = R.host_fold_in(root, 0)
        self._counted = R.host_fold_in(root, 1)
        self._calls = 0

    def _key(self, index: int | None, key: R.Key | None) -> R.Key:
        if key is not None:
            return key
        if index is not None:
            return R.from_host(R.host_fold_in(self._indexed, index))
        info = torch.utils.data.get_worker_info()
        stream = R.host_fold_in(self._counted, 0 if info is None else info.id)
        self._calls += 1
        return R.from_host(R.host_fold_in(stream, self._calls - 1))

    def __call__(self, img: Any, index: int | None = None, *, key: R.Key | None = None) -> Any:
        """Returns the augmented image, of the kind given.

        Each call draws from, in order of precedence: the ``key`` given; ``fold_in(fold_in(key(seed), 0), index)``
        when an ``index`` is given (e.g. ``epoch * len(dataset) + i``, so that every epoch differs); otherwise
        ``fold_in(fold_in(fold_in(key(seed), 1), worker), n)`` where ``worker`` is the data-loader worker's id
        (0 outside workers) and ``n`` counts this copy's calls. The counter makes a plain ``transform(img)`` (as
        ``torchvision.transforms.Compose`` calls it) deterministic for a given loader order; note that workers
        that are not persistent start each epoch from the transform's counter as it was in the main process, so
        they replay the same draws every epoch: pass ``index`` or use ``persistent_workers=True``.

        Accepts a ``[C, H, W]`` tensor (``uint8`` or float in ``[0, 1]``) or a PIL image in mode ``L`` or ``RGB``,
        and returns the same kind.
        """
        draw_key = self._key(index, key)
        if isinstance(img, Tensor):
            if img.dim() != 3:
                raise ValueError(f"img of shape {tuple(img.shape)}: expected one [C, H, W] image")
            return self._augment(img.unsqueeze(0), draw_key)[0]
        from PIL import Image

        if not isinstance(img, Image.Image) or img.mode not in ("L", "RGB"):
            raise TypeError(
                f"img of type {type(img).__name__}: expected a [C, H, W] tensor or an L/RGB PIL image"
            )
        array = torch.from_numpy(np.array(img, dtype=np.uint8))
        batch = (array.unsqueeze(0) if array.dim() == 2 else array.permute(2, 0, 1)).unsqueeze(0)
        out = self._augment(batch, draw_key)[0]
        return Image.fromarray((out[0] if img.mode == "L" else out.permute(1, 2, 0)).contiguous().numpy())

    def _augment(self, batch: Tensor, key: R.Key) -> Tensor:
        """Returns the augmented ``[1, C, H, W]`` batch (each transform defines it)."""
        raise NotImplementedError
