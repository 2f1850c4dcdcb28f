"""CutMix: paste a box of another example into each example and mix the targets by area (Yun et al., 2019).

λ ~ Beta(α, α) sets the box: its sides are ``int(H * sqrt(1 - λ))`` by ``int(W * sqrt(1 - λ))`` pixels before
Composer's rounding (the half side is rounded down on each side of the centre) and clipping at the border.
The centre is uniform over the pixels or, with ``uniform_sampling``, uniform over the positions that make
every pixel equally likely to be pasted over (the centre may then lie up to half a side outside the image).
After clipping, the weight of the original example is set to the exact unmixed fraction
``area = 1 - box pixels / (H * W)`` (Composer's adjusted λ), so
``y_mix = area * y + (1 - area) * y[indices]``.

Composer draws one box for the batch; ``per_sample=True`` draws a λ and a box for each example. Boxes are
integer tensors and the paste is ``where(mask, x[indices], x)`` with the mask built from ``arange``
comparisons: vectorized, static shapes, about the same cost in both modes.

λ is drawn on the host from the step's key (BATCH_START) and handed to the traced step as a tensor; the box
centre and the permutation are drawn inside the traced step from the same key, so the algorithm reproduces
``cutmix_params(key, ...)`` bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from composer_fn.algorithms._boxes import box_mask, check_sides, integer_view
from composer_fn.algorithms._keys import check_key
from composer_fn.algorithms._label_mixing import LabelMixing, check_batch, check_indices, check_num_classes
from composer_fn.algorithms._targets import ensure_targets_one_hot, num_classes_of
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register
from composer_fn.core.host import readable_on_host
from composer_fn.core.state import State, StepCtx, batch_get, target_key_of

__all__ = [
    "CutMix",
    "CutMixParams",
    "cutmix_params",
    "cutmix_boxes",
    "cutmix_apply",
    "cutmix_targets",
    "cutmix_batch",
    "draw_cutmix_lambda",
]

_CACHED_BYTES = 8 * 2**20
"""Above this many bytes of input, eager CPU selects make one pass instead of three (measured at 3 MB and 38 MB)."""
_TILE_BYTES = 2 * 2**20
"""The size of the tiles a large per-example paste works in: a few examples, well within the caches."""
_MIN_TILE = 4
"""The fewest examples in a tile (a 224×224 RGB float image is 0.6 MB)."""


class CutMixParams(NamedTuple):
    """The draws of one CutMix.

    Attributes:
        bbox: ``int64 [4]`` (one box for the batch) or ``[B, 4]`` (one per example) in Composer's order
            ``(x1, y1, x2, y2)``: the box covers rows ``x1:x2`` and columns ``y1:y2`` (Composer slices
            ``input[..., x1:x2, y1:y2]``).
        indices: ``int64 [B]``, the permutation: example ``b`` receives the box of example ``indices[b]``.
        area: ``float32``, 0-d or ``[B]``: the unmixed fraction ``1 - box pixels / (H * W)``, the weight of
            the original example's target (Composer's adjusted λ).
    """

    bbox: Tensor
    indices: Tensor
    area: Tensor


def draw_cutmix_lambda(key: R.HostKey, alpha: float, batch_size: int | None = None) -> Tensor:
    """Returns λ ~ Beta(α, α) drawn from the host key as float32: 0-d, or ``[batch_size]`` draws.

    ``alpha == 0`` gives λ = 0, Composer's convention (the largest box, not the identity).
    """
    validate.real("alpha", alpha, minimum=0.0)
    shape = () if batch_size is None else (batch_size,)
    if alpha == 0:
        return torch.zeros(shape, dtype=torch.float32)
    draws = R.host_rng(key).beta(alpha, alpha, size=batch_size)
    return torch.tensor(draws, dtype=torch.float32)


def _cut_ratio(cutmix_lambda: Tensor) -> Tensor:
    # float64, as Composer's NumPy arithmetic; both the host and the traced path go through here.
    return torch.sqrt(1.0 - cutmix_lambda.to(torch.float64))


def _unmixed_area(bbox: Tensor, height: int, width: int) -> Tensor:
    pasted = (bbox[..., 2] - bbox[..., 0]) * (bbox[..., 3] - bbox[..., 1])
    return (1.0 - pasted.to(torch.float64) / (height * width)).to(torch.float32)


def _box_along(words: Tensor, cut: Tensor, size: Tensor, uniform_sampling: bool) -> tuple[Tensor, Tensor]:
    # Rows and columns at once: the last dimension of every argument is (rows, columns).
    if uniform_sampling:
        # Composer's randint(-cut // 2, size + cut // 2): a span of size + cut positions.
        centre = ((words * (size + cut)) >> 32) - (cut + 1) // 2
    else:
        centre = (words * size) >> 32
    half = cut // 2
    zero = torch.zeros_like(size)
    return torch.clamp(centre - half, zero, size), torch.clamp(centre + half, zero, size)


def cutmix_boxes(
    key: R.Key, batch_size: int, height: int, width: int, cut_ratio: Tensor, *, uniform_sampling: bool = False
) -> CutMixParams:
    """Returns the CutMix draws for boxes of side ratio ``cut_ratio`` (0-d: one box; ``[B]``: one per example).

    The traced half of CutMix: the permutation and the box centres come from ``key`` with tensor ops only,
    so it runs inside a compiled step. Box sides are ``floor(cut_ratio * H)`` by ``floor(cut_ratio * W)``.
    """
    check_key(key)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    check_sides(height, width)
    if cut_ratio.dim() > 1 or (cut_ratio.dim() == 1 and cut_ratio.shape[0] != batch_size):
        raise ValueError(f"cut_ratio of shape {tuple(cut_ratio.shape)}: expected () or ({batch_size},)")
    ratio = cut_ratio.to(device=key.device, dtype=torch.float64).reshape(-1, 1)
    sides = torch.tensor((height, width), dtype=torch.int64, device=key.device)
    cuts = torch.floor(ratio * sides).to(torch.int64)
    # One stream of words for everything (each eager sampler call costs tens of small ops): the first
    # batch_size words sorted give exactly R.permutation(key, batch_size), the next ones the box centres.
    words = R.bits(key, (batch_size + 2 * ratio.shape[0],))
    indices = torch.argsort(words[:batch_size], stable=True)
    start, end = _box_along(words[batch_size:].reshape(-1, 2), cuts, sides, uniform_sampling)
    # (row start, column start, row end, column end)
    bbox = torch.cat((start, end), dim=-1)
    if cut_ratio.dim() == 0:
        bbox = bbox[0]
    return CutMixParams(bbox, indices, _unmixed_area(bbox, height, width))


def cutmix_params(
    key: R.Key,
    batch_size: int,
    height: int,
    width: int,
    *,
    alpha: float = 1.0,
    uniform_sampling: bool = False,
    per_sample: bool = False,
    length: float | None = None,
) -> CutMixParams:
    """Returns the CutMix draws for a batch: λ from the host mirror of ``key``, box and permutation from ``key``.

    With ``length`` (a fraction in [0, 1]) the box sides are ``int(length * H)`` by ``int(length * W)`` and no
    λ is drawn. ``per_sample`` draws a λ and a box for each example instead of one for the batch.
    """
    check_key(key)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    height = validate.integer("height", height, minimum=1)
    width = validate.integer("width", width, minimum=1)
    if length is not None:
        length = validate.real("length", length, minimum=0.0, maximum=1.0, hint="a fraction of H and of W")
    if not per_sample:
        return _one_box_params(key, batch_size, height, width, alpha, uniform_sampling, length)
    shape = (batch_size,)
    if length is None:
        cutmix_lambda = draw_cutmix_lambda(R.to_host(key), alpha, batch_size if per_sample else None)
        ratio = _cut_ratio(cutmix_lambda)
    else:
        if not 0.0 <= length <= 1.0:
            raise ValueError(f"length={length!r} must lie in [0, 1] (a fraction of H and of W)")
        ratio = torch.full(shape, length, dtype=torch.float64)
    return cutmix_boxes(key, batch_size, height, width, ratio, uniform_sampling=uniform_sampling)


def _one_box_params(
    key: R.Key,
    batch_size: int,
    height: int,
    width: int,
    alpha: float,
    uniform_sampling: bool,
    length: float | None,
) -> CutMixParams:
    # The same arithmetic as cutmix_boxes on Python numbers (the words from the host mirror of the key), so
    # the draws are equal bit for bit; about twenty tiny tensor ops fewer, a third of the op on the CPU.
    check_sides(height, width)
    host = R.to_host(key)
    if length is None:
        ratio = math.sqrt(1.0 - float(draw_cutmix_lambda(host, alpha)))
    elif not 0.0 <= length <= 1.0:
        raise ValueError(f"length={length!r} must lie in [0, 1] (a fraction of H and of W)")
    else:
        ratio = float(length)
    row_word, col_word = R.host_bits(host, 2, start=batch_size)
    row_start, row_end = _host_box_along(row_word, math.floor(ratio * height), height, uniform_sampling)
    col_start, col_end = _host_box_along(col_word, math.floor(ratio * width), width, uniform_sampling)
    pasted = (row_end - row_start) * (col_end - col_start)
    return CutMixParams(
        torch.tensor((row_start, col_start, row_end, col_end), dtype=torch.int64, device=key.device),
        R.permutation(key, batch_size),
        torch.tensor(1.0 - pasted / (height * width), dtype=torch.float32, device=key.device),
    )


def _host_box_along(word: int, cut: int, size: int, uniform_sampling: bool) -> tuple[int, int]:
    centre = ((word * (size + cut)) >> 32) - (cut + 1) // 2 if uniform_sampling else (word * size) >> 32
    half = cut // 2
    return min(max(centre - half, 0), size), min(max(centre + half, 0), size)


def _host_box(bbox: Tensor) -> list[int] | None:
    # One box readable on the host without a device sync or a trace: eager code pastes it by slicing.
    if bbox.dim() != 1 or not readable_on_host(bbox):
        return None
    return [int(v) for v in bbox.tolist()]


def _bitwise_select_(out: Tensor, mask: Tensor, input: Tensor, bits: torch.dtype) -> Tensor:
    # input ^ ((input ^ out) & mask), written into `out`: torch.where's bits, about twice as fast in cache.
    plain = input.view(bits)
    result = out.view(bits)
    result.bitwise_xor_(plain)
    result.mul_(mask)
    result.bitwise_xor_(plain)
    return out


def _select_into(mask: Tensor, source: Tensor, input: Tensor) -> Tensor:
    """Returns ``torch.where(mask, source, input)``, bit for bit, reusing ``source`` (a fresh tensor) as the result."""
    bits = integer_view(input)
    if bits is None:
        return torch.where(mask, source, input)
    if input.numel() * input.element_size() > _CACHED_BYTES:
        # Beyond the caches one pass wins: torch.where written into `source`, which the caller made for this
        # call (3.5x faster than the three bitwise passes below at 64x3x224x224).
        return torch.where(mask, source, input, out=source)
    return _bitwise_select_(source, mask, input, bits)


def _box_ones(boxes: Tensor, height: int, width: int, bits: torch.dtype) -> Tensor:
    """Returns integers ``[B, H, W]`` of dtype ``bits``: 1 inside each example's box of ``boxes [B, 4]``, else 0.

    The outer product of the row and column patterns in ``bits`` itself: the CPU's bool and byte kernels for
    a broadcast product are about twice as slow as the 32-bit ones, and multiplying by a mask of the
    images' own width is faster than by a bool one.
    """
    rows = torch.arange(height, device=boxes.device)
    cols = torch.arange(width, device=boxes.device)
    in_rows = ((rows >= boxes[:, 0, None]) & (rows < boxes[:, 2, None])).to(bits)
    in_cols = ((cols >= boxes[:, 1, None]) & (cols < boxes[:, 3, None])).to(bits)
    return in_rows[:, :, None] * in_cols[:, None, :]


def _paste_per_example(input: Tensor, indices: Tensor, bbox: Tensor) -> Tensor:
    """Returns ``torch.where(mask, input[indices], input)`` bit for bit: each example's box from its partner.

    A batch larger than the caches is done in tiles of a few examples (``_TILE_BYTES``), each gathered into
    its place in the result and selected while it is still in cache: three passes over memory instead of the
    five of a whole gather followed by a whole select.
    """
    batch_size, (height, width) = input.shape[0], input.shape[-2:]
    shape = (batch_size,) + (1,) * (input.dim() - 3) + (height, width)
    bits = integer_view(input)
    if bits is None or not input.is_contiguous():
        mask = box_mask(bbox, height, width).reshape(shape)
        return torch.where(mask, input.index_select(0, indices), input)
    ones = _box_ones(bbox, height, width, bits).reshape(shape)
    example_bytes = input[0].numel() * input.element_size()
    if batch_size * example_bytes <= _CACHED_BYTES:
        return _bitwise_select_(input.index_select(0, indices), ones, input, bits)
    tile = max(_MIN_TILE, _TILE_BYTES // max(example_bytes, 1))
    mixed = torch.empty_like(input)
    for start in range(0, batch_size, tile):
        block = mixed[start : start + tile]
        torch.index_select(input, 0, indices[start : start + tile], out=block)
        _bitwise_select_(block, ones[start : start + tile], input[start : start + tile], bits)
    return mixed


def cutmix_apply(input: Tensor, params: CutMixParams) -> Tensor:
    """Returns ``input [B, ..., H, W]`` with each box replaced by the same box of ``input[indices]``.

    Works for any dtype (images in uint8, dense targets of class indices); the result has ``input``'s dtype.
    """
    if input.dim() < 3:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected [B, ..., H, W]")
    bbox, indices = params.bbox.to(input.device), params.indices.to(input.device)
    batch_size, (height, width) = input.shape[0], input.shape[-2:]
    if indices.shape != (batch_size,):
        raise ValueError(
            f"indices of shape {tuple(indices.shape)}: expected ({batch_size},), one per example"
        )
    box = _host_box(params.bbox)
    if box is not None:
        # One box known on the host: copy the batch and paste the permuted box into it (a slice copy, no
        # mask). The same values as the masked select below.
        row_start, col_start, row_end, col_end = box
        mixed = input.clone()
        if row_start < row_end and col_start < col_end:
            region = input[..., row_start:row_end, col_start:col_end]
            mixed[..., row_start:row_end, col_start:col_end] = region.index_select(0, indices)
        return mixed
    if bbox.dim() == 2:
        if bbox.shape[0] != batch_size:
            raise ValueError(f"bbox of shape {tuple(bbox.shape)}: expected [4] or [{batch_size}, 4]")
        return _paste_per_example(input, indices, bbox)
    if bbox.dim() != 1:
        raise ValueError(f"bbox of shape {tuple(bbox.shape)}: expected [4] or [{batch_size}, 4]")
    # index_select rather than input[indices]: the same values, a third of the time on the CPU.
    return _select_into(box_mask(bbox, height, width), input.index_select(0, indices), input)


def cutmix_targets(target: Tensor, params: CutMixParams, num_classes: int) -> Tensor:
    """Returns ``area * y + (1 - area) * y[indices]`` with ``y`` the one-hot (or soft) targets.

    For class targets; dense targets (one value per pixel) get the box pasted instead, with ``cutmix_apply``.
    """
    check_num_classes(num_classes)
    check_indices(params.indices, target.shape[0] if target.dim() else 0, "target")
    probabilities = ensure_targets_one_hot(target, num_classes)
    area = params.area.to(device=probabilities.device, dtype=probabilities.dtype)
    if area.dim() == 1:
        area = area.reshape((-1,) + (1,) * (probabilities.dim() - 1))
    permuted = probabilities.index_select(0, params.indices.to(probabilities.device))
    return torch.lerp(probabilities, permuted, 1.0 - area)


def _is_dense(target: Tensor, input: Tensor) -> bool:
    # Composer's rule: a target with the input's height and width holds one value per pixel.
    return target.dim() > 2 and target.shape[-2:] == input.shape[-2:]


def _bbox_tensor(bbox: Sequence[int] | Tensor, batch_size: int, height: int, width: int) -> Tensor:
    box = torch.as_tensor(bbox)
    if box.is_floating_point() or box.shape not in ((4,), (batch_size, 4)):
        raise ValueError(
            f"bbox={bbox!r}: expected 4 integers (x1, y1, x2, y2) or an integer tensor [{batch_size}, 4]"
        )
    box = box.to(torch.int64)
    x1, y1, x2, y2 = box.unbind(-1)
    if not bool(((0 <= x1) & (x1 <= x2) & (x2 <= height) & (0 <= y1) & (y1 <= y2) & (y2 <= width)).all()):
        raise ValueError(
            f"bbox={bbox!r} must satisfy 0 <= x1 <= x2 <= H={height} (rows) and 0 <= y1 <= y2 <= W={width} (columns)"
        )
    return box


def cutmix_batch(
    input: Tensor,
    target: Tensor,
    length: float | None = None,
    alpha: float = 1.0,
    bbox: Sequence[int] | Tensor | None = None,
    indices: Tensor | None = None,
    uniform_sampling: bool = False,
    *,
    key: R.Key | None = None,
    num_classes: int | None = None,
    per_sample: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns ``(mixed inputs, mixed targets, area, bbox)`` for a batch: the whole of CutMix.

    Composer's ``cutmix_batch`` returns the permuted targets and leaves mixing them to the caller; this one
    returns the finished targets: ``area * y + (1 - area) * y[indices]`` for class targets, the pasted box
    for dense targets (same height and width as the input). ``area`` is the unmixed fraction (Composer's
    adjusted λ), ``bbox`` the box in Composer's ``(x1, y1, x2, y2)`` order (rows ``x1:x2``, columns
    ``y1:y2``). Draws not given explicitly (``bbox``, ``indices``) come from ``key``; a ``bbox`` of shape
    ``[B, 4]`` gives one box per example. Class-index targets need ``num_classes``.
    """
    if key is not None:
        check_key(key)
    if num_classes is not None:
        check_num_classes(num_classes)
    if bbox is not None and length is not None:
        raise ValueError(f"give length or bbox, not both; got length={length!r} and bbox={bbox!r}")
    if input.dim() < 3:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected [B, C, H, W]")
    check_batch(input, target)
    batch_size, (height, width) = input.shape[0], input.shape[-2:]
    if (bbox is None or indices is None) and key is None:
        raise ValueError("key is required unless both bbox= and indices= are given")
    if bbox is None:
        assert key is not None
        params = cutmix_params(
            key,
            batch_size,
            height,
            width,
            alpha=alpha,
            uniform_sampling=uniform_sampling,
            per_sample=per_sample,
            length=length,
        )
        if indices is not None:
            params = params._replace(indices=torch.as_tensor(indices))
    else:
        box = _bbox_tensor(bbox, batch_size, height, width)
        if indices is None:
            assert key is not None
            indices = R.permutation(key, batch_size)
        params = CutMixParams(box, torch.as_tensor(indices), _unmixed_area(box, height, width))
    # The box stays where it was drawn for the paste (on the host it pastes by slicing, without a sync).
    pasting = params._replace(indices=params.indices.to(input.device), area=params.area.to(input.device))
    mixed = cutmix_apply(input, pasting)
    params = pasting._replace(bbox=params.bbox.to(input.device))
    if _is_dense(target, input):
        return mixed, cutmix_apply(target, pasting), params.area, params.bbox
    return mixed, cutmix_targets(target, params, num_classes_of(target, num_classes)), params.area, params.bbox


@register
@dataclass(frozen=True)
class CutMix(LabelMixing[CutMixParams]):
    """Pastes a box of a permuted example into each example and mixes the targets by area (Composer's ``CutMix``).

    Args:
        alpha: the Beta(α, α) concentration of λ; the box side ratio is ``sqrt(1 - λ)``.
        interpolate_loss: instead of mixing the targets, replace the loss by
            ``area * loss(y) + (1 - area) * loss(y[indices])`` (equal for cross-entropy).
        uniform_sampling: draw box centres so that every pixel is equally likely to be pasted over.
        per_sample: draw a λ and a box for each example; by default one serves the whole batch, as in
            Composer. Needs mixed targets: per-example weights cannot interpolate a batch-mean loss.
        input_key: where the input sits in the batch.
        target_key: where the target sits in the batch.
    """

    algorithm_name = "cutmix"

    alpha: float = 1.0
    interpolate_loss: bool = False
    uniform_sampling: bool = False
    per_sample: bool = False
    input_key: int | str = 0
    target_key: int | str = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        validate.flag("uniform_sampling", self.uniform_sampling)

    def draw(self, key: R.HostKey, batch_size: int | None) -> Tensor:
        return draw_cutmix_lambda(key, self.alpha, batch_size)

    def mix_inputs(self, key: R.Key, input: Tensor, draws: Tensor) -> tuple[Tensor, CutMixParams]:
        sizes = (input.shape[0], input.shape[-2], input.shape[-1])
        params = cutmix_boxes(key, *sizes, _cut_ratio(draws), uniform_sampling=self.uniform_sampling)
        return cutmix_apply(input, params), params

    def mix_targets(self, target: Tensor, input: Tensor, pairing: CutMixParams, num_classes: int) -> Tensor:
        if _is_dense(target, input):
            return cutmix_apply(target, pairing)
        return cutmix_targets(target, pairing, num_classes)

    def mix_losses(self, loss: Tensor, partner_loss: Tensor, pairing: CutMixParams) -> Tensor:
        return torch.lerp(partner_loss, loss, pairing.area.to(loss.dtype))

    def _mix_loss(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        if _is_dense(batch_get(ctx.batch, target_key_of(ctx.batch, self.target_key)), batch_get(ctx.batch, self.input_key)):
            raise ValueError(
                "CutMix(interpolate_loss=True) cannot interpolate the loss of dense (per-pixel) targets"
            )
        return super()._mix_loss(state, ctx)
