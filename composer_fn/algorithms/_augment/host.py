"""The eager CPU fast paths and when they may run: NumPy twins of the tensor bookkeeping, and torch's bincount.

On arrays of a few hundred ids or a few thousand grid points, NumPy's calls cost a fraction of torch's; each
twin runs the same arithmetic as its tensor form, so the two give the same bits. Only the dispatch layer
consults this module.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.algorithms._augment.primitives import (
    IDENTITY,
    PRIMITIVES,
    ROTATE,
    SHEAR_X,
    SHEAR_Y,
    TRANSLATE_X,
    TRANSLATE_Y,
    unknown_ops,
)
from composer_fn.algorithms._augment.strength import SET_TABLES, draw
from composer_fn.core.host import readable_on_host


def readable(tensor: Tensor, other: Tensor) -> bool:
    """Whether both tensors can be read on the host as they are: the NumPy twins may then run."""
    return readable_on_host(tensor) and readable_on_host(other)


def compiling() -> bool:
    """Whether ``torch.compile`` is tracing: every group then runs over the whole batch, in static shapes."""
    return torch.compiler.is_compiling()


def histogram(index: Tensor, bins: int) -> Tensor:
    """Returns the int64 count of every flat position in ``index`` over ``bins`` bins, eagerly.

    The same counts as ``tone.histogram``; bincount is several times faster eagerly but has a data-dependent
    shape to dynamo.
    """
    return torch.bincount(index, minlength=bins)


def draw_ops(
    uniforms: Tensor, choice: Tensor, severity: float, augmentation_set: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns ``strength.draw_ops``'s ``(op, magnitude, sign)`` from CPU tensors, drawn in NumPy."""
    rows, op_ids = SET_TABLES[augmentation_set]
    choice_np = choice.numpy()
    magnitude, sign = draw(uniforms.numpy(), np.asarray(rows, dtype=np.float32)[choice_np], severity, np)
    return torch.from_numpy(np.asarray(op_ids)[choice_np]), torch.from_numpy(magnitude), torch.from_numpy(sign)


def sort_by_group(
    op: Tensor, value: Tensor, rank: tuple[int, ...]
) -> tuple[list[int], Tensor, Tensor, Tensor, Tensor]:
    """Returns ``dispatch.sort_by_group``'s counts, order, sorted ``op`` and ``value`` and inverse order, from CPU
    tensors, sorted in NumPy.

    Raises ValueError for op ids outside ``[IDENTITY, len(PRIMITIVES))``.
    """
    op_np, value_np = op.numpy(), value.numpy()
    if ((op_np < IDENTITY) | (op_np >= len(PRIMITIVES))).any():
        raise unknown_ops(op_np.tolist())
    counts = np.bincount(op_np + 1, minlength=len(PRIMITIVES) + 1).tolist()
    order = np.argsort(np.asarray(rank)[op_np + 1], kind="stable")
    unsort = np.empty_like(order)
    unsort[order] = np.arange(order.size)
    arrays = (order, op_np[order], value_np[order], unsort)
    return counts, *(torch.from_numpy(array) for array in arrays)


def shift(images: Tensor, op: Tensor, value: Tensor, ops: tuple[int, ...]) -> Tensor:
    """Returns ``geometry.shift`` of CPU tensors: the indices in NumPy, and a zero row or column to gather from
    outside."""
    op_np, value_np = op.numpy(), value.numpy()
    batch, channels, height, width = images.shape
    out = images
    if TRANSLATE_Y in ops:
        source = np.arange(height) + np.where(op_np == TRANSLATE_Y, value_np, 0.0).astype(np.int64)[:, None]
        planes = np.arange(batch * channels).reshape(batch, channels, 1) * height
        # Rows from outside the image read the appended zero row.
        rows = np.where((source >= 0) & (source < height), source, -1)[:, None, :] + planes
        rows = np.where(rows < planes, batch * channels * height, rows)
        flat = torch.cat((out.reshape(-1, width), out.new_zeros(1, width)))
        out = flat.index_select(0, torch.from_numpy(rows.reshape(-1))).view(images.shape)
    if TRANSLATE_X in ops:
        source = np.arange(width) + np.where(op_np == TRANSLATE_X, value_np, 0.0).astype(np.int64)[:, None]
        # Columns from outside the image read the appended zero column.
        columns = np.where((source >= 0) & (source < width), source, width)
        index = torch.from_numpy(columns).view(batch, 1, 1, width).expand(batch, channels, height, width)
        out = F.pad(out, (0, 1)).gather(3, index)
    return out


def sampling_grid(op: Tensor, value: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """Returns ``geometry.sampling_grid`` of CPU tensors: the same float32 arithmetic in NumPy, whose calls on
    small arrays and comparisons cost a fraction of torch's (cos and sin stay torch's, so that every bit agrees)."""
    op_np, value_np = op.numpy(), value.numpy()
    is_rotate = op_np == ROTATE
    radians = torch.from_numpy(np.where(is_rotate, value_np, 0.0).astype(np.float64)) * (-math.pi / 180.0)
    cos, sin = torch.cos(radians).to(torch.float32).numpy(), torch.sin(radians).to(torch.float32).numpy()
    centre_x, centre_y = np.float32(width / 2.0), np.float32(height / 2.0)
    zero = np.zeros_like(value_np)
    a = np.where(is_rotate, cos, np.float32(1.0))
    b = np.where(is_rotate, sin, np.where(op_np == SHEAR_X, value_np, zero))
    d = np.where(is_rotate, -sin, np.where(op_np == SHEAR_Y, value_np, zero))
    e = a
    c = np.where(is_rotate, centre_x - a * centre_x - b * centre_y, zero)
    f = np.where(is_rotate, centre_y - d * centre_x - e * centre_y, zero)
    a, b, c, d, e, f = (m.reshape(-1, 1, 1) for m in (a, b, c, d, e, f))
    xs = np.arange(width, dtype=np.float32).reshape(1, 1, width) + np.float32(0.5)
    ys = np.arange(height, dtype=np.float32).reshape(1, height, 1) + np.float32(0.5)
    one, scale_x, scale_y = np.float32(1.0), np.float32(2.0 / width), np.float32(2.0 / height)
    along_x = ((a * xs + c) * scale_x - one) + (b * ys) * scale_x
    along_y = ((d * xs + f) * scale_y - one) + (e * ys) * scale_y
    grid = np.empty((op_np.shape[0], height, width, 2), dtype=np.float32)
    grid[..., 0] = along_x
    grid[..., 1] = along_y
    inside = along_x >= -one
    inside &= along_x < one
    inside &= along_y >= -one
    inside &= along_y < one
    return torch.from_numpy(grid), torch.from_numpy(inside)
