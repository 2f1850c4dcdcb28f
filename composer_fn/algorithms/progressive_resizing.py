"""Progressive resizing: train on downsampled images first and grow them to full size (fast.ai; Composer).

The scale stays ``initial_scale`` until ``delay_fraction`` of the run, rises linearly to 1 by
``1 - finetune_fraction``, and stays at 1 for the rest. The width is pinned to a multiple of
``size_increment`` (the height follows in proportion), so a run visits only a handful of sizes. The size is a
shape-affecting choice: it is the algorithm's plan key, so each size compiles one step and is reused.

``'resize'`` downsamples by nearest-neighbour interpolation, ``'crop'`` takes one random crop of the batch (its
corner drawn from the step's key). Targets are resized too with ``resize_targets`` (segmentation masks).

Some models accept one input size only: a vision transformer whose position embeddings have one entry per
patch of that size (torchvision's ``VisionTransformer``, timm's with a strict ``PatchEmbed``, Hugging Face's
ViT and DeiT). At INIT the record looks for such a declared size in the model and refuses to start, naming the
module and its size. A timm model built with ``dynamic_img_size=True`` interpolates its position embeddings
and is accepted.

Other models fail at sizes they declare nowhere: attention biases laid out for one resolution (timm's LeViT),
windows that must tile every stage's feature map (torchvision's MaxViT), or an auxiliary head whose kernel
outgrows a small feature map (torchvision's Inception v3). So at the first batch the record runs the model's
forward on every size the run can visit, from the full size down (``size_failure``), on fake tensors (shapes
without values: nothing is computed) where they serve, and refuses to start at the largest size that fails,
naming it, the model's error, and the ``initial_scale`` whose sizes all pass. A model that fails at its full
size too says nothing this way (its own step will say why), so nothing is refused on another cause.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._keys import check_key
from composer_fn.algorithms._shapes import check_resizable, fixed_input_size, shape_failure
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, HostHook, no_change, register
from composer_fn.core.event import Event
from composer_fn.core.host import readable_on_host
from composer_fn.core.state import BatchMeta, State, Static, StepCtx, batch_get, batch_set, target_key_of
from composer_fn.core.time import Timestamp

__all__ = [
    "ProgressiveResizing",
    "CropParams",
    "progressive_scale",
    "pinned_size",
    "crop_params",
    "crop_apply",
    "resize_apply",
    "fixed_input_size",
    "visited_sizes",
    "size_failure",
    "resize_batch",
]

ResizeMode = Literal["resize", "crop"]
MODES: tuple[str, ...] = ("resize", "crop")


def progressive_scale(
    elapsed: float, *, initial_scale: float = 0.5, delay_fraction: float = 0.5, finetune_fraction: float = 0.2
) -> float:
    """Returns the scale after ``elapsed`` of the run: flat, then linear to 1, then 1 (Composer's schedule)."""
    validate.real("elapsed", elapsed, minimum=0.0, maximum=1.0, hint="a fraction of the run")
    _check_schedule(initial_scale, delay_fraction, finetune_fraction)
    if elapsed < delay_fraction:
        return initial_scale
    ramp = 1.0 - finetune_fraction - delay_fraction
    progress = 1.0 if ramp <= 0 else min((elapsed - delay_fraction) / ramp, 1.0)
    return initial_scale + (1.0 - initial_scale) * progress


def _check_schedule(initial_scale: object, delay_fraction: object, finetune_fraction: object) -> None:
    validate.real("initial_scale", initial_scale, minimum=0.0, maximum=1.0, open_below=True)
    validate.real("delay_fraction", delay_fraction, minimum=0.0, maximum=1.0)
    validate.real("finetune_fraction", finetune_fraction, minimum=0.0, maximum=1.0)
    if delay_fraction + finetune_fraction > 1:  # type: ignore[operator]
        raise ValueError(
            f"delay_fraction={delay_fraction!r} with finetune_fraction={finetune_fraction!r}: each must lie in "
            "[0, 1] and their sum may not exceed 1"
        )


def pinned_size(height: int, width: int, scale: float, size_increment: int = 4) -> tuple[int, int]:
    """Returns ``(height, width)`` at ``scale`` with the width rounded to a multiple of ``size_increment``.

    The height keeps the aspect ratio (rounded down). Unlike Composer, a width that would round to zero is
    held at one increment (capped at the full width), so small images never vanish.
    """
    height = validate.integer("height", height, minimum=1)
    width = validate.integer("width", width, minimum=1)
    scale = validate.real("scale", scale, minimum=0.0, open_below=True, hint="a fraction of the image's size")
    size_increment = validate.integer("size_increment", size_increment, minimum=1)
    if scale >= 1.0:
        return height, width
    pinned = round(width * scale / size_increment) * size_increment
    pinned = min(max(pinned, size_increment), width)
    return max((height * pinned) // width, 1), pinned


class CropParams(NamedTuple):
    """Where one crop of the batch starts: row and column of its top-left corner (0-d int64 tensors)."""

    top: Tensor
    left: Tensor


def crop_params(key: R.Key, height: int, width: int, crop_height: int, crop_width: int) -> CropParams:
    """Returns a uniformly drawn corner for a ``crop_height`` x ``crop_width`` crop of a ``height`` x ``width`` image.

    Every position that keeps the crop inside the image is possible, the last one included.
    """
    check_key(key)
    height = validate.integer("height", height, minimum=1)
    width = validate.integer("width", width, minimum=1)
    crop_height = validate.integer("crop_height", crop_height, minimum=1, maximum=height, hint="at most the height")
    crop_width = validate.integer("crop_width", crop_width, minimum=1, maximum=width, hint="at most the width")
    top = R.randint(R.fold_in(key, 0), 0, height - crop_height + 1, ())
    left = R.randint(R.fold_in(key, 1), 0, width - crop_width + 1, ())
    return CropParams(top, left)


def crop_apply(images: Tensor, params: CropParams, crop_height: int, crop_width: int) -> Tensor:
    """Returns ``images[..., top:top + crop_height, left:left + crop_width]`` (one crop for the whole batch)."""
    if images.dim() < 2:
        raise ValueError(f"images of shape {tuple(images.shape)}: expected [..., H, W]")
    hint_height, hint_width = f"at most the images' height {images.shape[-2]}", f"at most their width {images.shape[-1]}"
    crop_height = validate.integer("crop_height", crop_height, minimum=1, maximum=images.shape[-2], hint=hint_height)
    crop_width = validate.integer("crop_width", crop_width, minimum=1, maximum=images.shape[-1], hint=hint_width)
    if readable_on_host(params.top) and readable_on_host(params.left):
        top, left = int(params.top), int(params.left)
        if not (0 <= top <= images.shape[-2] - crop_height and 0 <= left <= images.shape[-1] - crop_width):
            raise ValueError(
                f"params (top={top}, left={left}) put a {crop_height}x{crop_width} crop outside images of shape "
                f"{tuple(images.shape)}: draw them with crop_params for this size"
            )
    rows = params.top.to(images.device) + torch.arange(crop_height, device=images.device)
    columns = params.left.to(images.device) + torch.arange(crop_width, device=images.device)
    return images.index_select(-2, rows).index_select(-1, columns)


def resize_apply(images: Tensor, height: int, width: int) -> Tensor:
    """Returns ``images`` ``[N, C, H, W]`` resized to ``height`` x ``width`` by nearest-neighbour interpolation."""
    if images.dim() < 3:
        raise ValueError(f"images of shape {tuple(images.shape)}: expected [N, C, H, W] (or [N, H, W])")
    height = validate.integer("height", height, minimum=1)
    width = validate.integer("width", width, minimum=1)
    if images.shape[-2:] == (height, width):
        return images
    return F.interpolate(images, size=(height, width), mode="nearest")


def _resize_target(target: Tensor, height: int, width: int) -> Tensor:
    if target.dim() == 3:
        # Class-index masks [N, H, W]: add a channel to interpolate, then restore the dtype and shape.
        return resize_apply(target.unsqueeze(1).float(), height, width).squeeze(1).to(target.dtype)
    return resize_apply(target, height, width)


def _resized(
    input: Tensor,
    target: Tensor,
    size: tuple[int, int],
    mode: str,
    resize_targets: bool,
    key: R.Key | None,
) -> tuple[Tensor, Tensor]:
    height, width = input.shape[-2], input.shape[-1]
    new_height, new_width = size
    if (new_height, new_width) == (height, width):
        return input, target
    if mode == "resize":
        if not resize_targets:
            return resize_apply(input, new_height, new_width), target
        # The target is scaled in its own resolution, which may differ from the input's.
        target_height, target_width = target.shape[-2], target.shape[-1]
        target_size = (max(target_height * new_height // height, 1), max(target_width * new_width // width, 1))
        return resize_apply(input, new_height, new_width), _resize_target(target, *target_size)
    assert key is not None
    params = crop_params(key, height, width, new_height, new_width)
    if not resize_targets:
        return crop_apply(input, params, new_height, new_width), target
    # The target's crop covers the same region, in the target's own resolution.
    target_height, target_width = target.shape[-2], target.shape[-1]
    target_params = CropParams(
        params.top * target_height // height, params.left * target_width // width
    )
    target_size = (target_height * new_height // height, target_width * new_width // width)
    return crop_apply(input, params, new_height, new_width), crop_apply(target, target_params, *target_size)


def resize_batch(
    input: Tensor,
    target: Tensor,
    scale_factor: float,
    mode: ResizeMode = "resize",
    resize_targets: bool = False,
    *,
    key: R.Key | None = None,
) -> tuple[Tensor, Tensor]:
    """Returns ``(input, target)`` with height and width scaled by ``scale_factor`` (Composer's ``resize_batch``).

    ``'resize'`` interpolates (nearest), ``'crop'`` takes one random crop of ``int(scale * H) x int(scale * W)``
    for the whole batch, its corner drawn from ``key``. ``scale_factor >= 1`` returns the batch unchanged.
    Targets are resized only with ``resize_targets`` (``[N, H, W]`` masks or ``[N, C, H, W]`` maps), by the
    same factor in their own resolution: a ``16 x 16`` target of a ``32 x 32`` input becomes ``8 x 8`` when
    the input becomes ``16 x 16`` (``new_size * target_size // input_size``, at least 1).
    """
    if key is not None:
        check_key(key)
    validate.choice("mode", mode, MODES)
    if input.dim() < 3:
        raise ValueError(f"input of shape {tuple(input.shape)}: expected at least [N, H, W] to resize")
    if resize_targets and target.dim() < 3:
        raise ValueError(f"target of shape {tuple(target.shape)}: resize_targets needs [N, H, W] or [N, C, H, W]")
    if resize_targets and target.shape[0] != input.shape[0]:
        raise ValueError(
            f"target of shape {tuple(target.shape)} does not fit input of shape {tuple(input.shape)}: "
            f"resize_targets needs one target per image, {input.shape[0]} along dim 0"
        )
    validate.flag("resize_targets", resize_targets)
    scale_factor = validate.real("scale_factor", scale_factor, minimum=0.0, open_below=True)
    if mode == "crop" and key is None and scale_factor < 1:
        raise ValueError("mode='crop' draws the crop's corner: pass key=")
    if scale_factor >= 1:
        return input, target
    size = (int(scale_factor * input.shape[-2]), int(scale_factor * input.shape[-1]))
    if min(size) < 1:
        raise ValueError(f"scale_factor={scale_factor!r} shrinks {tuple(input.shape[-2:])} to nothing")
    return _resized(input, target, size, mode, resize_targets, key)


def visited_sizes(height: int, width: int, initial_scale: float, size_increment: int = 4) -> list[tuple[int, int]]:
    """Returns every ``(height, width)`` that ``pinned_size`` gives for a scale in ``[initial_scale, 1]``,
    largest first: the full size, then each multiple of ``size_increment`` down to the initial width."""
    low = pinned_size(height, width, initial_scale, size_increment)[1]
    widths = sorted({width, *range(low, width, size_increment)} if low < width else {width}, reverse=True)
    return [(height, width) if w == width else (max((height * w) // width, 1), w) for w in widths]


def size_failure(
    module: nn.Module,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    input_shape: Sequence[int],
    sizes: Sequence[tuple[int, int]],
) -> tuple[tuple[int, int], tuple[int, int] | None, str] | None:
    """Returns ``(size, smallest passing size or None, error)`` for the first of ``sizes`` (largest first, the
    first the full size) at which ``module`` fails on inputs like ``input_shape`` (two samples, its last two dims
    set to the size); None when every size passes, or when the first fails too (see ``shape_failure``).
    """
    shapes = [(2, *input_shape[1:-2], *size) for size in sizes]
    failure = shape_failure(module, params, buffers, shapes)
    if failure is None:
        return None
    shape, passed, error = failure
    return (shape[-2], shape[-1]), None if passed is None else (passed[-2], passed[-1]), error


@register
@dataclass(frozen=True)
class ProgressiveResizing(Algorithm):
    """Trains on smaller images early in the run and grows them to full size (Composer's ``ProgressiveResizing``).

    Args:
        mode: ``'resize'`` (nearest interpolation) or ``'crop'`` (one random crop per batch).
        initial_scale: the scale until ``delay_fraction``, in (0, 1].
        finetune_fraction: the final fraction of the run trained at full size.
        delay_fraction: the fraction of the run before the scale starts to rise.
        size_increment: the width is a multiple of this.
        resize_targets: also resize the targets (segmentation).
        input_key: where the input sits in the batch.
        target_key: where the target sits in the batch.
    """

    checks_at = frozenset({Event.BATCH_START})

    mode: ResizeMode = "resize"
    initial_scale: float = 0.5
    finetune_fraction: float = 0.2
    delay_fraction: float = 0.5
    size_increment: int = 4
    resize_targets: bool = False
    input_key: int | str = 0
    target_key: int | str = 1

    def __post_init__(self) -> None:
        validate.choice("mode", self.mode, MODES)
        _check_schedule(self.initial_scale, self.delay_fraction, self.finetune_fraction)
        validate.integer("size_increment", self.size_increment, minimum=1)
        validate.flag("resize_targets", self.resize_targets)
        validate.batch_key("input_key", self.input_key)
        validate.batch_key("target_key", self.target_key)

    def changes_nothing(self) -> str | None:
        why = "the images start at full size and stay there"
        instead = "initial_scale < 1 (Composer's default is 0.5)"
        resized = self.initial_scale != 1
        return None if resized else no_change("ProgressiveResizing", "initial_scale=1", why, instead)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.INIT: self._check_model, Event.BATCH_START: self._check_sizes}

    def _check_sizes(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        # Every size the run can visit, tried once before the first step: a model that cannot take one is refused
        # now, naming it, rather than failing inside its own code when the run gets there.
        # The batch's metadata describes the model's input: an input_key elsewhere resizes another item, not checked.
        if self.initial_scale == 1 or meta is None or len(meta.input_shape) < 3 or self.input_key != 0:
            return static, state
        height, width = meta.input_shape[-2], meta.input_shape[-1]
        sizes = visited_sizes(height, width, self.initial_scale, self.size_increment)
        failure = size_failure(static.module, state.params, state.buffers, meta.input_shape, sizes)
        if failure is None:
            return static, state
        (low_height, low_width), passed, error = failure
        smallest = sizes[-1]
        fix = (
            f"use initial_scale={math.ceil(passed[1] / width * 100) / 100} or more (its sizes all pass), or leave "
            "ProgressiveResizing out"
            if passed is not None
            else "leave ProgressiveResizing out for this model"
        )
        raise ValueError(
            f"ProgressiveResizing(initial_scale={self.initial_scale}) trains on images from {smallest[0]}x"
            f"{smallest[1]} up to {height}x{width}, but {type(static.module).__name__} fails on {low_height}x"
            f"{low_width} inputs ({error}); {fix}"
        )

    def _check_model(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        if self.initial_scale < 1:
            check_resizable(
                static.module,
                f"ProgressiveResizing(initial_scale={self.initial_scale}) trains on images smaller than full size",
                "ProgressiveResizing",
            )
        return static, state

    def scale(self, timestamp: Timestamp) -> float:
        """Returns the unpinned scale at ``timestamp`` (from ``timestamp.elapsed``)."""
        return progressive_scale(
            timestamp.elapsed,
            initial_scale=self.initial_scale,
            delay_fraction=self.delay_fraction,
            finetune_fraction=self.finetune_fraction,
        )

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        scale = self.scale(timestamp)
        if meta is not None and len(meta.input_shape) >= 3:
            return ("size", *pinned_size(meta.input_shape[-2], meta.input_shape[-1], scale, self.size_increment))
        return ("scale", scale)

    def traced_hooks(self, plan_key: Hashable = ("scale", 1.0)) -> Mapping[Event, Hook]:
        return {Event.AFTER_DATALOADER: functools.partial(self._resize, plan_key)}

    def _resize(self, plan_key: Hashable, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        input = batch_get(ctx.batch, self.input_key)
        target = batch_get(ctx.batch, target_key_of(ctx.batch, self.target_key))
        assert isinstance(plan_key, tuple)
        height, width = input.shape[-2], input.shape[-1]
        if plan_key[0] == "size":
            size = (int(plan_key[1]), int(plan_key[2]))
        else:
            size = pinned_size(height, width, float(plan_key[1]), self.size_increment)
        key = R.algorithm_key(ctx.key, self.name) if self.mode == "crop" else None
        new_input, new_target = _resized(input, target, size, self.mode, self.resize_targets, key)
        batch = batch_set(ctx.batch, self.input_key, new_input)
        if self.resize_targets:
            batch = batch_set(batch, target_key_of(batch, self.target_key), new_target)
        return state, ctx.replace(batch=batch)
