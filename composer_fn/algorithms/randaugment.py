"""RandAugment: apply ``depth`` ops drawn at random, each at a random strength (Cubuk et al., 2019).

For every image and every one of the ``depth`` steps an op is drawn uniformly from the augmentation set and
its strength from Composer's severity mapping (``_augment.draw_ops``). ``randaugment_params`` makes the
draws, ``randaugment_apply`` applies them to a whole batch at once: one pass per op group and step, no loop
over images, static shapes under ``torch.compile``.

The algorithm augments the device batch at AFTER_DATALOADER with draws from the step's key; Composer adds a
PIL transform to the dataset at FIT_START instead. ``RandAugmentTransform`` is the per-image transform for
data-loader workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from composer_fn.algorithms import _augment as ops
from composer_fn.algorithms._batch_transform import BatchTransform
from composer_fn.algorithms._keys import check_key
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import no_change, register

__all__ = [
    "RandAugment",
    "RandAugmentParams",
    "RandAugmentTransform",
    "randaugment_params",
    "randaugment_apply",
    "randaugment_batch",
    "randaugment_image",
]


class RandAugmentParams(NamedTuple):
    """The draws of one RandAugment over a batch, each ``[B, depth]``.

    Attributes:
        op: the op of each image and step, an index into ``PRIMITIVES`` (``IDENTITY``, -1, for none).
        magnitude: its unsigned argument: posterize bits, rotate degrees, solarize threshold in ``uint8``
            levels, shear factor, translation as a fraction of the image side, colour enhance factor.
        sign: +1 or -1, the direction of the geometric ops (always +1 for the others).
    """

    op: Tensor
    magnitude: Tensor
    sign: Tensor


def randaugment_params(
    key: R.Key, batch_size: int, *, depth: int = 2, severity: float = 9, augmentation_set: str = "all"
) -> RandAugmentParams:
    """Returns the ops and strengths for ``batch_size`` images, drawn from ``key`` on the key's device."""
    check_key(key)
    _check(severity, depth, augmentation_set)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    # One stream of words for every draw (each eager sampler call is tens of small ops): per image and step,
    # the first word picks the op, the next four give its strength and sign; the same arithmetic as
    # R.randint and R.uniform.
    words = R.bits(key, (batch_size, depth, 5))
    choice = (words[..., 0] * len(ops.augmentation_sets[augmentation_set])) >> 32
    uniforms = (words[..., 1:] >> 8).to(torch.float32) * 2.0**-24
    return RandAugmentParams(*ops.draw_ops(uniforms, choice, severity, augmentation_set))


def randaugment_apply(images: Tensor, params: RandAugmentParams) -> Tensor:
    """Returns the batch with each image's ops applied in order (deterministic; see ``_augment``).

    ``images`` is ``[B, C, H, W]`` (``C`` 1 or 3), ``uint8`` or floating in ``[0, 1]``; the result has its
    shape and dtype. The input is never written to.
    """
    ops.check_images(images)
    batch = images.shape[0]
    for name, value in zip(RandAugmentParams._fields, params, strict=True):
        if value.dim() != 2 or value.shape[0] != batch or value.shape != params.op.shape:
            raise ValueError(
                f"params.{name} of shape {tuple(value.shape)}: expected [{batch}, depth] like params.op"
            )
    op = params.op.to(images.device)
    value = ops.op_arguments(op, params.magnitude, params.sign, images)
    out = images.clone() if op.shape[1] == 0 else images
    for step in range(op.shape[1]):
        out = ops.apply_op(out, op[:, step], value[:, step])
    return out


def randaugment_batch(
    input: Tensor, severity: float = 9, depth: int = 2, augmentation_set: str = "all", *, key: R.Key
) -> Tensor:
    """Returns RandAugment of a ``[B, C, H, W]`` batch, every image with its own draws from ``key``.

    ``input`` is ``uint8``, or floating (``float64`` included, augmented in ``float32``) in ``[0, 1]``: run
    eagerly, a floating batch outside that range raises ValueError. The result has the input's dtype.
    """
    check_key(key)
    _check(severity, depth, augmentation_set)
    return ops.augment_batch(
        input, lambda images: _randaugment(images, severity, depth, augmentation_set, key), "RandAugment"
    )


def _randaugment(images: Tensor, severity: float, depth: int, augmentation_set: str, key: R.Key) -> Tensor:
    ops.check_images(images, "input")
    params = randaugment_params(
        key, images.shape[0], depth=depth, severity=severity, augmentation_set=augmentation_set
    )
    return randaugment_apply(images, params)


def randaugment_image(
    img: Any, severity: float = 9, depth: int = 2, augmentation_set: str = "all", *, key: R.Key
) -> Any:
    """Returns RandAugment of one ``[C, H, W]`` image, a ``[B, C, H, W]`` batch or a PIL image, drawn from ``key``.

    The result is of the kind given: a PIL image (mode ``L`` or ``RGB``) for a PIL image, else a tensor of
    the input's shape and dtype (see ``randaugment_batch`` for the dtypes and range).
    """
    check_key(key)
    return ops.on_image_or_batch(img, lambda images: randaugment_batch(images, severity, depth, augmentation_set, key=key))


def _check(severity: float, depth: int, augmentation_set: str) -> None:
    ops.check_severity(severity, augmentation_set)
    validate.integer("depth", depth, minimum=0)


class RandAugmentTransform(ops.KeyedTransform):
    """RandAugment of one image per call, for data-loader workers (Composer's ``RandAugmentTransform``).

    Args:
        severity: strength of the ops, in [0, 10].
        depth: number of ops applied in sequence.
        augmentation_set: ``"all"``, ``"safe"`` or ``"original"``.
        seed: the root of the draws; ``__call__`` says how each call's key derives from it.
    """

    def __init__(
        self, severity: float = 9, depth: int = 2, augmentation_set: str = "all", seed: int = 0
    ) -> None:
        _check(severity, depth, augmentation_set)
        super().__init__(seed)
        self.severity, self.depth, self.augmentation_set = severity, depth, augmentation_set

    def _augment(self, batch: Tensor, key: R.Key) -> Tensor:
        return randaugment_batch(batch, self.severity, self.depth, self.augmentation_set, key=key)

    def __repr__(self) -> str:
        return f"RandAugmentTransform(severity={self.severity!r}, depth={self.depth!r}, augmentation_set={self.augmentation_set!r})"


@register
@dataclass(frozen=True)
class RandAugment(BatchTransform):
    """Augments the input batch with RandAugment on the device (Composer's ``RandAugment``).

    Args:
        severity: strength of the ops, in [0, 10] (M in the paper).
        depth: number of ops applied to each image in sequence (N in the paper).
        augmentation_set: ``"all"``; ``"safe"`` leaves out the colour ops that overlap ImageNet-C/CIFAR-10-C;
            ``"original"`` samples the colour ops' strength as the original AugMix code did.
        input_key: where the images sit in the batch: ``uint8``, or floats in ``[0, 1]`` (normalize after).
    """

    algorithm_name = "randaugment"
    input_range = (0.0, 1.0)

    severity: float = 9
    depth: int = 2
    augmentation_set: str = "all"
    input_key: int | str = 0

    def __post_init__(self) -> None:
        _check(self.severity, self.depth, self.augmentation_set)
        validate.batch_key("input_key", self.input_key)

    def changes_nothing(self) -> str | None:
        why, instead = "each image goes through 0 ops", "depth >= 1 (Composer's default is 2)"
        return no_change("RandAugment", "depth=0", why, instead) if self.depth == 0 else None

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        # The values of a traced batch cannot be read; the Trainer checks the first batch's range instead.
        return _randaugment(input, self.severity, self.depth, self.augmentation_set, key)
