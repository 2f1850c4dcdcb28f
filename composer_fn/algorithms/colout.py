"""ColOut: drop a random fraction of the rows and of the columns of the images (Composer's ``ColOut``).

An ``H x W`` image keeps ``int((1 - p_row) * H)`` rows and ``int((1 - p_col) * W)`` columns (Composer's
formula), chosen at random and kept in their original order, so the result is a smaller image of the same
content: cheaper to train on, and a mild augmentation. Image-like targets (segmentation masks with the
input's height and width) can lose the same rows and columns (``resize_target``).

The kept counts depend only on ``H``, ``W`` and the fractions, so the output shape is static; which rows are
kept comes from the key (the first entries of a keyed permutation, sorted), which compiles without breaks.
At the first batch the model's forward runs on fake tensors at the cut size: a model that fails there is
refused before the first step, naming the size.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from composer_fn.algorithms._batch_transform import BatchTransform
from composer_fn.algorithms._keys import check_key
from composer_fn.algorithms._shapes import check_resizable, shape_failure
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import HostHook, no_change, register
from composer_fn.core.event import Event
from composer_fn.core.host import readable_on_host
from composer_fn.core.state import BatchMeta, State, Static, batch_get, batch_set, target_key_of
from composer_fn.core.time import Timestamp

__all__ = ["ColOut", "ColOutParams", "ColOutTransform", "colout_params", "colout_apply", "colout_batch"]


class ColOutParams(NamedTuple):
    """The kept rows and columns of one ColOut, as increasing ``int64`` indices."""

    rows: Tensor
    cols: Tensor


def _check_resize_target(resize_target: bool | str) -> None:
    if not isinstance(resize_target, bool) and resize_target != "auto":
        raise ValueError(f"resize_target={resize_target!r} must be True, False or 'auto'")


def _check_fractions(p_row: object, p_col: object) -> None:
    # A fraction of 1 drops every row (or column): the image would vanish.
    hint = "the fraction to drop; 1 would drop them all"
    validate.real("p_row", p_row, minimum=0.0, maximum=1.0, open_above=True, hint=hint)
    validate.real("p_col", p_col, minimum=0.0, maximum=1.0, open_above=True, hint=hint)


def _kept(words: Tensor, count: int) -> Tensor:
    # The first `count` entries of a keyed permutation, in increasing order.
    return torch.sort(torch.argsort(words, stable=True)[:count]).values


def colout_params(
    key: R.Key, height: int, width: int, *, p_row: float = 0.15, p_col: float = 0.15
) -> ColOutParams:
    """Returns which rows and columns an ``height x width`` image keeps, drawn from ``key``.

    ``int((1 - p_row) * height)`` rows and ``int((1 - p_col) * width)`` columns are kept, in increasing order.
    """
    check_key(key)
    _check_fractions(p_row, p_col)
    height = validate.integer("height", height, minimum=1)
    width = validate.integer("width", width, minimum=1)
    rows, cols = int((1 - p_row) * height), int((1 - p_col) * width)
    for name, fraction, side, size, kept in (("p_row", p_row, "height", height, rows), ("p_col", p_col, "width", width, cols)):
        if kept < 1:
            raise ValueError(
                f"{name}={fraction!r} keeps int((1 - {name}) * {side}) = 0 of {size} {'rows' if name == 'p_row' else 'columns'}: "
                f"the image would vanish; lower {name}"
            )
    # One call for both axes: the rows' permutation is R.permutation(key, height), the columns' sorts the
    # next `width` words of the same stream.
    words = R.bits(key, (height + width,))
    return ColOutParams(
        _kept(words[:height], rows),
        _kept(words[height:], cols),
    )


def colout_apply(input: Tensor, params: ColOutParams) -> Tensor:
    """Returns ``input [..., H, W]`` restricted to the kept rows and columns: ``[..., H', W']``, dtype kept."""
    if input.dim() < 2:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected [..., H, W]")
    rows, cols = params.rows.to(input.device), params.cols.to(input.device)
    for name, kept, axis, size in (("rows", rows, "H", input.shape[-2]), ("cols", cols, "W", input.shape[-1])):
        if readable_on_host(kept) and kept.numel() and int(kept.max()) >= size:
            raise ValueError(
                f"params.{name} holds index {int(kept.max())}, outside input of shape {tuple(input.shape)} "
                f"({axis}={size}): draw the params with colout_params for this input's height and width"
            )
    return input.index_select(-2, rows).index_select(-1, cols)


def _pil_module() -> Any:
    # An object can only be a PIL image if PIL.Image has been imported: no import is needed to ask.
    return sys.modules.get("PIL.Image")


def _is_image(value: Any) -> bool:
    module = _pil_module()
    return module is not None and isinstance(value, module.Image)


def _spatial(value: Any) -> tuple[int, int]:
    if _is_image(value):
        return value.height, value.width
    if isinstance(value, Tensor) and value.dim() >= 2:
        return value.shape[-2], value.shape[-1]
    described = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
    raise TypeError(f"sample item {described}: expected a tensor [..., H, W] or a PIL image")


def _rank(value: Any) -> int:
    # A PIL image counts as one [C, H, W] image.
    return 3 if _is_image(value) else int(value.dim())


def _colout_item(value: Any, params: ColOutParams) -> Any:
    if not _is_image(value):
        return colout_apply(value, params)
    pixels = np.asarray(value)
    kept = np.ascontiguousarray(pixels[params.rows.numpy()][:, params.cols.numpy()])
    result = _pil_module().fromarray(kept)
    if value.mode == "P":
        result.putpalette(value.getpalette())
    if result.mode != value.mode:
        raise TypeError(
            f"PIL image of mode {value.mode!r} does not round-trip through an array; convert it first"
        )
    return result


def _image_like(input: Tensor, target: Tensor) -> bool:
    # Composer's 'auto' rule for a batch (a target of rank > 2 with the input's height and width), counted
    # from the input's rank so that it also holds for one image ([C, H, W] with a [H, W] mask).
    return target.dim() >= input.dim() - 1 and target.shape[-2:] == input.shape[-2:]


def _should_resize_target(input: Any, target: Any, resize_target: bool | str) -> bool:
    if isinstance(resize_target, bool):
        return resize_target
    if isinstance(input, Tensor) and isinstance(target, Tensor):
        return _image_like(input, target)
    if _is_image(target):
        return (target.height, target.width) == _spatial(input)
    return (
        isinstance(target, Tensor)
        and target.dim() >= _rank(input) - 1
        and tuple(target.shape[-2:]) == _spatial(input)
    )


def colout_batch(
    sample: Any,
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: bool | str = "auto",
    *,
    key: R.Key,
) -> Any:
    """Returns ``sample`` with the same random rows and columns dropped from its images (Composer's ``colout_batch``).

    ``sample`` is a tensor (``[C, H, W]`` or ``[N, C, H, W]``), a PIL image, or an ``(input, target)`` pair of
    them; the result has the same form. The target loses the same rows and columns when ``resize_target`` is
    True, or when it is ``'auto'`` and the target is image-like (the input's height and width); otherwise it
    is returned unchanged (Composer returns the input alone in that case).
    """
    check_key(key)
    _check_resize_target(resize_target)
    paired = isinstance(sample, tuple | list)
    items = list(sample) if paired else [sample]
    if not 1 <= len(items) <= 2:
        raise ValueError(f"sample holds {len(items)} items: expected an input or an (input, target) pair")
    input = items[0]
    if isinstance(input, Tensor) and input.dim() not in (3, 4):
        raise ValueError(
            f"sample's input of shape {tuple(input.shape)}: expected one image [C, H, W] or a batch [N, C, H, W]"
        )
    if len(items) == 2 and isinstance(input, Tensor) and input.dim() == 4:
        target = items[1]
        if isinstance(target, Tensor) and (target.dim() == 0 or target.shape[0] != input.shape[0]):
            raise ValueError(
                f"sample's target of shape {tuple(target.shape)} does not fit its input of shape "
                f"{tuple(input.shape)}: a batch needs one target per image, {input.shape[0]} along dim 0"
            )
    height, width = _spatial(input)
    params = colout_params(key, height, width, p_row=p_row, p_col=p_col)
    result = [_colout_item(input, params)]
    if len(items) == 2:
        target = items[1]
        result.append(
            _colout_item(target, params) if _should_resize_target(input, target, resize_target) else target
        )
    if not paired:
        return result[0]
    return tuple(result) if isinstance(sample, tuple) else result


class ColOutTransform:
    """A dataset transform dropping random rows and columns of one image (or an ``(input, target)`` pair).

    Deterministic: the ``n``-th call (from 0) of this object in DataLoader worker ``w`` (``w = 0`` outside
    workers) uses the key ``fold_in(fold_in(key(seed), w), n)``. Each worker counts its own calls on its own
    copy of the transform; with ``persistent_workers=False`` the copies, and so the counts, start afresh
    every epoch, so the sequence of draws repeats per epoch (shuffling assigns them to other images); pass
    ``persistent_workers=True`` for new draws each epoch.

    Args:
        p_row: fraction of rows to drop.
        p_col: fraction of columns to drop.
        resize_target: drop the same rows and columns from the target (True, False or ``'auto'``).
        seed: the root seed of the transform's keys.
    """

    def __init__(
        self, p_row: float = 0.15, p_col: float = 0.15, resize_target: bool | str = "auto", seed: int = 0
    ) -> None:
        _check_fractions(p_row, p_col)
        _check_resize_target(resize_target)
        self.p_row, self.p_col, self.resize_target = p_row, p_col, resize_target
        self.seed = seed
        self._root = R.key(seed)
        self._calls = 0

    def __repr__(self) -> str:
        return (
            f"ColOutTransform(p_row={self.p_row!r}, p_col={self.p_col!r}, "
            f"resize_target={self.resize_target!r}, seed={self.seed!r})"
        )

    def __call__(self, sample: Any) -> Any:
        """Returns ``sample`` with random rows and columns dropped (see ``colout_batch``)."""
        worker = get_worker_info()
        key = R.fold_in(R.fold_in(self._root, worker.id if worker is not None else 0), self._calls)
        self._calls += 1
        return colout_batch(sample, self.p_row, self.p_col, self.resize_target, key=key)


@register
@dataclass(frozen=True)
class ColOut(BatchTransform):
    """Drops random rows and columns of the input images after the loader (Composer's ``ColOut``).

    Args:
        p_row: fraction of rows to drop.
        p_col: fraction of columns to drop.
        batch: must be True: drop the same rows and columns from every image of the batch. Composer's
            ``batch=False`` adds a dataset transform, which an algorithm here cannot do: put
            ``ColOutTransform`` in the dataset instead.
        resize_target: drop the same rows and columns from the target (True, False or ``'auto'``: when the
            target has the input's height and width).
        input_key: where the input sits in the batch.
        target_key: where the target sits in the batch.
    """

    algorithm_name = "colout"
    checks_at = frozenset({Event.BATCH_START})

    p_row: float = 0.15
    p_col: float = 0.15
    batch: bool = True
    resize_target: bool | str = "auto"
    input_key: int | str = 0
    target_key: int | str = 1

    def __post_init__(self) -> None:
        _check_fractions(self.p_row, self.p_col)
        _check_resize_target(self.resize_target)
        validate.batch_key("input_key", self.input_key)
        validate.batch_key("target_key", self.target_key)
        if not self.batch:
            raise ValueError(
                "ColOut(batch=False) would add a transform to the dataset, which an algorithm cannot do here: "
                f"add ColOutTransform(p_row={self.p_row!r}, p_col={self.p_col!r}, "
                f"resize_target={self.resize_target!r}, seed=...) to your dataset's transforms instead"
            )

    def changes_nothing(self) -> str | None:
        why = "no row and no column is dropped"
        instead = "p_row or p_col above 0 (Composer's default is 0.15)"
        dropped = self.p_row != 0 or self.p_col != 0
        return None if dropped else no_change("ColOut", "p_row=0, p_col=0", why, instead)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {**super().host_hooks(), Event.INIT: self._check_model, Event.BATCH_START: self._check_size}

    def _check_model(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        check_resizable(static.module, "ColOut drops rows and columns of the images, which makes them smaller", "ColOut")
        return static, state

    def _check_size(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        # The smaller images tried once before the first step: a model that cannot take them (a window that must
        # tile the feature map, an auxiliary head's kernel larger than it) is refused now, naming the size.
        # The batch's metadata describes the model's input: an input_key elsewhere cuts another item, not checked.
        if meta is None or meta.tokens or len(meta.input_shape) < 3 or self.input_key != 0:
            return static, state
        height, width = meta.input_shape[-2], meta.input_shape[-1]
        kept = (int((1 - self.p_row) * height), int((1 - self.p_col) * width))
        if kept == (height, width) or min(kept) < 1:
            return static, state
        shapes = [(2, *meta.input_shape[1:]), (2, *meta.input_shape[1:-2], *kept)]
        failure = shape_failure(static.module, state.params, state.buffers, shapes)
        if failure is not None:
            raise ValueError(
                f"ColOut(p_row={self.p_row}, p_col={self.p_col}) cuts the {height}x{width} images to "
                f"{kept[0]}x{kept[1]}, but {type(static.module).__name__} fails on {kept[0]}x{kept[1]} inputs "
                f"({failure[2]}); lower p_row and p_col, or leave ColOut out for this model"
            )
        return static, state

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        return colout_apply(input, self._kept(key, input))

    def transform_batch(self, key: R.Key, batch: Any) -> Any:
        input = batch_get(batch, self.input_key)
        params = self._kept(key, input)
        dropped = batch_set(batch, self.input_key, colout_apply(input, params))
        if self.resize_target is not False:
            target = batch_get(batch, target_key_of(batch, self.target_key))
            if self.resize_target is True or _image_like(input, target):
                dropped = batch_set(dropped, target_key_of(batch, self.target_key), colout_apply(target, params))
        return dropped

    def _kept(self, key: R.Key, input: Tensor) -> ColOutParams:
        return colout_params(key, input.shape[-2], input.shape[-1], p_row=self.p_row, p_col=self.p_col)
