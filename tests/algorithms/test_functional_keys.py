"""A functional call given a seed where a key belongs is refused with the fix: pass composer_fn.random.key(seed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import composer_fn
from composer_fn import functional as fn
from composer_fn import random as R

_images = R.uniform(R.key(0), (2, 3, 8, 8))
_labels = torch.tensor([0, 1])

CALLS: dict[str, Callable[[Any], Any]] = {
    "cutout_batch": lambda key: fn.cutout_batch(_images, key=key),
    "cutout_params": lambda key: fn.cutout_params(key, 2, 8, 8),
    "colout_batch": lambda key: fn.colout_batch(_images, key=key),
    "colout_params": lambda key: fn.colout_params(key, 8, 8),
    "cutmix_batch": lambda key: fn.cutmix_batch(_images, _labels, key=key, num_classes=2),
    "cutmix_params": lambda key: fn.cutmix_params(key, 2, 8, 8),
    "mixup_batch": lambda key: fn.mixup_batch(_images, _labels, key=key, num_classes=2),
    "mixup_params": lambda key: fn.mixup_params(key, 2),
    "randaugment_batch": lambda key: fn.randaugment_batch(_images, key=key),
    "randaugment_image": lambda key: fn.randaugment_image(_images[0], key=key),
    "randaugment_params": lambda key: fn.randaugment_params(key, 2),
    "augmix_batch": lambda key: fn.augmix_batch(_images, key=key),
    "augmix_image": lambda key: fn.augmix_image(_images[0], key=key),
    "augmix_params": lambda key: fn.augmix_params(key, 2),
    "crop_params": lambda key: fn.crop_params(key, 8, 8, 4, 4),
    "resize_batch": lambda key: fn.resize_batch(_images, _labels, 0.5, mode="crop", key=key),
    "select_indices": lambda key: fn.select_indices(key, R.uniform(R.key(1), (4,)), 0.5),
    "select_using_loss": lambda key: fn.select_using_loss(
        _images, _labels, lambda x: x.flatten(1)[:, :2], F.cross_entropy, key=key
    ),
}


@pytest.mark.parametrize("name", CALLS)
def test_a_seed_given_as_key_is_refused_with_the_key_to_pass(name) -> None:
    with pytest.raises(
        TypeError, match=r"key=123 is a seed, not a key: pass key=composer_fn\.random\.key\(123\)"
    ):
        CALLS[name](123)
    CALLS[name](composer_fn.random.key(123))


@pytest.mark.parametrize("name", ["cutout_batch", "mixup_params", "select_indices"])
def test_a_tensor_that_is_not_a_key_is_refused_naming_its_dtype_and_shape(name) -> None:
    with pytest.raises(
        TypeError, match=r"key=a tensor of dtype torch.float32 and shape \(3,\) must be a key"
    ):
        CALLS[name](torch.zeros(3))
