"""Applies a different op to every image of a batch, choosing between the eager grouped computation (with the
host's NumPy twins on the CPU) and the whole-batch computation that ``torch.compile`` traces.

- Eagerly, the samples are sorted into groups and each group runs on its own samples only: rotate and the
  shears share one ``grid_sample`` with per-sample matrices; for ``uint8`` every op that maps each channel's
  levels through a table (autocontrast, equalize, posterize, solarize, contrast, brightness) is one group, whose
  per-sample, per-channel tables are gathered once over its images; the other colour ops are one ``lerp``
  towards a degenerate image, the translations a gather of whole rows or columns. On the CPU the bookkeeping on
  small arrays (the sort, the draws, the sampling grids, the shift indices) runs in NumPy (``host``), whose
  calls cost a fraction of torch's, with the same arithmetic (tests hold both forms equal bit for bit).
- Under ``torch.compile`` (static shapes, no data-dependent indexing) every group is computed for the whole
  batch, with neutral arguments (factor 1, offset 0, identity matrix) for the samples of other groups, and
  ``torch.where`` keeps each sample's own result.

Both paths run the same per-element arithmetic and give the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from composer_fn.algorithms._augment import blends, geometry, host, strength, tone
from composer_fn.algorithms._augment.levels import chose, rows
from composer_fn.algorithms._augment.primitives import (
    BLEND_OPS,
    COLOR,
    IDENTITY,
    LOOKUP_OPS,
    PRIMITIVES,
    SHARPNESS,
    SHIFT_OPS,
    TONE_OPS,
    WARP_OPS,
    unknown_ops,
)

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


def draw_ops(
    uniforms: Tensor, choice: Tensor, severity: float, augmentation_set: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns ``strength.draw_ops``'s ``(op, magnitude, sign)``: drawn in NumPy from CPU tensors outside tracing,
    otherwise in tensor code."""
    if host.readable(uniforms, choice):
        return host.draw_ops(uniforms, choice, severity, augmentation_set)
    return strength.draw_ops(uniforms, choice, severity, augmentation_set)


def apply_op(images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns the batch with op ``op[i]`` (an id into ``PRIMITIVES``, or ``IDENTITY``) applied to sample ``i``.

    ``value[i]`` is that op's argument in the images' units (see the package docstring). The input is never
    written to; the result is always a new tensor.
    """
    uint8 = images.dtype == torch.uint8
    if host.compiling():
        tone_ops = LOOKUP_OPS if uint8 else TONE_OPS
        blend_ops = (COLOR, SHARPNESS) if uint8 else BLEND_OPS
        out = torch.where(rows(chose(op, tone_ops)), tone.tone(images, op, value), images)
        out = torch.where(rows(chose(op, blend_ops)), blends.blend(images, op, value), out)
        out = torch.where(rows(chose(op, SHIFT_OPS)), geometry.shift(images, op, value), out)
        height, width = images.shape[-2:]
        warped = geometry.resample(images, *geometry.sampling_grid(op, value, height, width))
        return torch.where(rows(chose(op, WARP_OPS)), warped, out)
    groups = _UINT8_GROUPS if uint8 else _FLOAT_GROUPS
    counts, order, op_by_group, value_by_group, unsort = _sort_by_group(op, value, _RANKS[groups])
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
    op: Tensor, value: Tensor, rank: tuple[int, ...]
) -> tuple[list[int], Tensor, Tensor, Tensor, Tensor]:
    """Returns the samples' count per op (indexed by ``op + 1``), the stable order that lists them by ``rank``
    (group after group and op after op), ``op`` and ``value`` in that order, and the order's inverse.

    Raises ValueError for op ids outside ``[IDENTITY, len(PRIMITIVES))``.
    """
    if host.readable(op, value):
        return host.sort_by_group(op, value, rank)
    if bool(((op < IDENTITY) | (op >= len(PRIMITIVES))).any()):
        raise unknown_ops(op.tolist())
    counts = torch.bincount(op + 1, minlength=len(PRIMITIVES) + 1).tolist()
    order = torch.argsort(torch.tensor(rank, device=op.device)[op + 1], stable=True)
    return counts, order, op.index_select(0, order), value.index_select(0, order), torch.argsort(order)


def _run_group(runs: list[tuple[int, int]], images: Tensor, op: Tensor, value: Tensor) -> Tensor:
    """Returns one group's samples, sorted by op, eagerly: ``runs`` lists its ops and their counts in order."""
    group_id = runs[0][0]
    if group_id in WARP_OPS:
        height, width = images.shape[-2:]
        if host.readable(op, value):
            return geometry.resample(images, *host.sampling_grid(op, value, height, width))
        return geometry.resample(images, *geometry.sampling_grid(op, value, height, width))
    if group_id in SHIFT_OPS:
        if host.readable(op, value):
            return host.shift(images, op, value, (group_id,))
        return geometry.shift(images, op, value, (group_id,))
    if images.dtype == torch.uint8 and group_id in LOOKUP_OPS:
        return tone.look_up_runs(images, value, runs, host.histogram)
    if group_id in TONE_OPS:
        return tone.tone_op(images, group_id, value, host.histogram)
    if group_id in BLEND_OPS:
        return blends.blend_op(images, group_id, value)
    return images.clone()
