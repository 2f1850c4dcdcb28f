"""Keyed synthetic image classification: a learnable task generated from a key, with no files."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from composer_fn.core.random import Key, fold_in, normal, randint
from composer_fn.core.validate import integer, is_integer, real
from composer_fn.nn.init import require_key

__all__ = ["synthetic_images"]

_CLASS_MEANS, _LABELS, _NOISE = 0, 1, 2


def synthetic_images(
    key: Key,
    num_samples: int,
    *,
    num_classes: int = 10,
    shape: Sequence[int] = (3, 32, 32),
    noise: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Returns ``(images, labels)``: ``float32 [num_samples, *shape]`` and ``int64 [num_samples]``.

    Each class has a mean image drawn from a standard normal; a sample is its class mean plus ``noise`` times
    standard normal noise. The same key gives bitwise the same tensors. The class means depend only on
    ``key``, ``num_classes`` and ``shape``, and a call with fewer samples returns a prefix of one with more,
    so for training and held-out parts of one task draw a single set and split it: a different key is a
    different task.
    """
    require_key(key)
    num_samples = integer("num_samples", num_samples, minimum=1)
    if not is_integer(num_classes) or not 1 <= num_classes <= 2**24:
        raise ValueError(f"num_classes={num_classes!r} must be an int in [1, 2**24]")
    num_classes = int(num_classes)
    dims = tuple(shape)
    if not dims or not all(is_integer(d) and d >= 1 for d in dims):
        raise ValueError(f"shape={shape!r} must be a non-empty sequence of positive ints, e.g. (3, 32, 32)")
    dims = tuple(int(d) for d in dims)
    noise = real("noise", noise, minimum=0.0)

    class_means = normal(fold_in(key, _CLASS_MEANS), (num_classes, *dims))
    labels = randint(fold_in(key, _LABELS), 0, num_classes, num_samples)
    images = class_means[labels] + noise * normal(fold_in(key, _NOISE), (num_samples, *dims))
    return images.to(torch.float32), labels
