"""The tone ops (autocontrast, equalize, posterize, solarize), and the level tables of ``uint8`` images.

For ``uint8`` images every op of ``LOOKUP_OPS`` (the tone ops, contrast and brightness) maps each channel's
256 levels through a table: the per-sample, per-channel tables are built on the 256 levels (tiny) and gathered
once over the image. Floats use the formulas.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.algorithms._augment.blends import blend_table
from composer_fn.algorithms._augment.levels import in_float32, ramp, rows, select, to_levels
from composer_fn.algorithms._augment.primitives import AUTOCONTRAST, EQUALIZE, LOOKUP_OPS, POSTERIZE, SOLARIZE

Histogram = Callable[[Tensor, int], Tensor]
"""Counts the flat positions ``index`` (int32) into ``bins`` int64 bins."""


def histogram(index: Tensor, bins: int) -> Tensor:
    """Returns the int64 count of every flat position in ``index`` over ``bins`` bins, in static shapes."""
    wide = index.to(torch.int64)
    ones = torch.ones((), dtype=torch.int64, device=index.device).expand_as(wide)
    return torch.zeros(bins, dtype=torch.int64, device=index.device).scatter_add(0, wide, ones)


def flat_levels(levels: Tensor) -> Tensor:
    """Returns the int32 position of each ``uint8`` level in a flat ``[B * C * 256]`` table."""
    batch, channels = levels.shape[:2]
    offsets = torch.arange(batch * channels, dtype=torch.int32, device=levels.device) * 256
    # uint8 + int32 promotes to int32: one pass.
    return (levels + offsets.view(batch, channels, 1, 1)).view(-1)


def look_up(levels: Tensor, table: Tensor, index: Tensor) -> Tensor:
    """Returns ``table[b, c, levels[b, c, h, w]]`` for a ``[B, C or 1, 256]`` table."""
    flat = table.expand(levels.shape[0], levels.shape[1], 256).reshape(-1)
    return flat.index_select(0, index).view(levels.shape)


def autocontrast_range(images: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """Returns each channel's darkest level and its range over ``bound`` (0 and 1 for a constant channel)."""
    # torchvision's arithmetic, so that uint8 results agree with it bit for bit; uint8 levels are reduced as
    # they are and converted after (exactly).
    flat = images.flatten(2)
    low, high = in_float32(flat.amin(dim=2, keepdim=True)), in_float32(flat.amax(dim=2, keepdim=True))
    constant = high == low
    inverse_scale = (high - low) * (1.0 / bound)
    return torch.where(constant, 0.0, low), torch.where(constant, 1.0, inverse_scale)


def autocontrast_table(images: Tensor) -> Tensor:
    """Returns autocontrast's ``[B, C, 256]`` float table for ``uint8`` images."""
    low, inverse_scale = autocontrast_range(images, 255.0)
    return ((ramp(images.device) - low) / inverse_scale).clamp(0.0, 255.0)


def equalize_table(levels: Tensor, index: Tensor, count: Histogram) -> Tensor:
    """Returns PIL's equalization lookup table ``[B, C, 256]`` (float32) for ``uint8`` levels."""
    batch, channels, height, width = levels.shape
    hist = count(index, batch * channels * 256).view(batch, channels, 256)
    cumulative = hist.cumsum(dim=2)
    # The last non-empty bin is where the cumulative histogram first reaches its maximum.
    last = hist.gather(2, cumulative.argmax(dim=2, keepdim=True))
    step = torch.div(height * width - last, 255, rounding_mode="floor")
    # PIL's table: level l maps to (cumulative[l - 1] + step // 2) // step (0 for l = 0). The integers are far
    # below 2**53, so float64 division and floor give the integer quotient exactly, and run several times faster.
    below = F.pad(cumulative[..., :-1], (1, 0)).to(torch.float64)
    table = torch.floor((below + (step // 2).to(torch.float64)) / step.clamp(min=1).to(torch.float64))
    return torch.where(step == 0, ramp(levels.device), table.clamp_(0.0, 255.0).to(torch.float32))


def posterize_table(bits: Tensor, device: torch.device) -> Tensor:
    """Returns posterize's ``[B, 1, 256]`` float table: each level with ``bits[i]`` most significant bits."""
    quantum = torch.exp2(8.0 - bits.clamp(0.0, 8.0)).view(-1, 1, 1)
    return torch.floor(ramp(device) / quantum) * quantum


def solarize_table(threshold: Tensor, device: torch.device) -> Tensor:
    """Returns solarize's ``[B, 1, 256]`` float table: levels at or above ``threshold[i]`` inverted."""
    levels = ramp(device)
    return torch.where(levels >= threshold.view(-1, 1, 1), 255.0 - levels, levels)


def table(images: Tensor, op_id: int, value: Tensor, index: Tensor | None, count: Histogram) -> Tensor:
    """Returns the ``[B, C or 1, 256]`` float table of a lookup op over ``uint8`` images (``LOOKUP_OPS``)."""
    if op_id == AUTOCONTRAST:
        return autocontrast_table(images)
    if op_id == EQUALIZE:
        return equalize_table(images, flat_levels(images) if index is None else index, count)
    if op_id == POSTERIZE:
        return posterize_table(value, images.device)
    if op_id == SOLARIZE:
        return solarize_table(value, images.device)
    return blend_table(images, op_id, value)


def autocontrast_float(work: Tensor) -> Tensor:
    """Returns autocontrast of float32 images, clamped to ``[0, 1]``."""
    low, inverse_scale = autocontrast_range(work, 1.0)
    return ((work - low.unsqueeze(-1)) / inverse_scale.unsqueeze(-1)).clamp(0.0, 1.0)


def equalize_float(work: Tensor, count: Histogram) -> Tensor:
    """Returns equalize of float32 images, as multiples of 1/255."""
    # torchvision's binning of [0, 1] into 256 levels, and back.
    levels = to_levels(work.clamp(0.0, 1.0) * 255.999)
    index = flat_levels(levels)
    return look_up(levels, equalize_table(levels, index, count), index) * (1.0 / 255.0)


def posterize_float(work: Tensor, bits: Tensor) -> Tensor:
    """Returns posterize of float32 images: ``floor(x * 2**bits) / 2**bits`` clamped to ``[0, 1)``."""
    count = torch.exp2(bits.clamp(0.0, 8.0)).view(-1, 1, 1, 1)
    return torch.minimum(torch.floor(work * count).clamp(min=0.0), count - 1.0) * (1.0 / count)


def solarize_float(work: Tensor, threshold: Tensor) -> Tensor:
    """Returns solarize of float32 images: levels at or above ``threshold[i]`` inverted about 1."""
    return select(work >= threshold.view(-1, 1, 1, 1), 1.0 - work, work)


def tone_op(images: Tensor, op_id: int, value: Tensor, count: Histogram) -> Tensor:
    """Returns one tone op applied to every sample of floating images."""
    work = in_float32(images)
    if op_id == AUTOCONTRAST:
        out = autocontrast_float(work)
    elif op_id == EQUALIZE:
        out = equalize_float(work, count)
    elif op_id == POSTERIZE:
        out = posterize_float(work, value)
    else:
        out = solarize_float(work, value)
    return out.to(images.dtype)


def look_up_runs(images: Tensor, value: Tensor, runs: list[tuple[int, int]], count: Histogram) -> Tensor:
    """Returns ``uint8`` images sorted by op, ``runs`` of ``(op, count)`` in order, each through its op's table."""
    channels = images.shape[1]
    index = flat_levels(images)
    tables, start = [], 0
    for op_id, members_count in runs:
        members = slice(start, start + members_count)
        start += members_count
        if op_id == EQUALIZE and start == members_count:
            # The first samples' flat positions are the group's first ones.
            piece = table(images[members], op_id, value, index[: images[members].numel()], count)
        else:
            piece = table(images[members], op_id, value[members], None, count)
        tables.append(piece.expand(members_count, channels, 256))
    joined = tables[0] if len(tables) == 1 else torch.cat(tables)
    return look_up(images, to_levels(joined), index)


def tone(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns each sample's tone op, computed for every sample and selected (other samples pass unchanged).

    For ``uint8`` images the ops are ``LOOKUP_OPS`` (contrast and brightness included), otherwise ``TONE_OPS``.
    Static shapes throughout, for ``torch.compile``.
    """
    if images.dtype == torch.uint8:
        batch, channels = images.shape[:2]
        pick = op.view(-1, 1, 1)
        index = flat_levels(images)
        tables = ramp(images.device).expand(batch, channels, 256)
        for op_id in LOOKUP_OPS:
            tables = torch.where(pick == op_id, table(images, op_id, value, index, histogram), tables)
        return look_up(images, to_levels(tables), index)
    work = in_float32(images)
    pick = rows(op)
    out = select(pick == AUTOCONTRAST, autocontrast_float(work), work)
    out = select(pick == EQUALIZE, equalize_float(work, histogram), out)
    out = select(pick == POSTERIZE, posterize_float(work, value), out)
    out = select(pick == SOLARIZE, solarize_float(work, value), out)
    return out.to(images.dtype)
