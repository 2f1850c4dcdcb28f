"""What the image augmentations accept: PIL images come back as PIL images, float64 and single images keep
their dtype and shape, float images outside [0, 1] are refused, and the per-image transforms run in
data-loader worker processes with the same draws on every run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from composer_fn.algorithms.augmix import AugmentAndMixTransform
from composer_fn.algorithms.randaugment import RandAugmentTransform
from composer_fn.core import random as R
from composer_fn.functional import (
    augmix_batch,
    augmix_image,
    cutout_batch,
    randaugment_batch,
    randaugment_image,
)

seeds = st.integers(0, 2**32 - 1)
sides = st.integers(2, 7)

AUGMENTATIONS: dict[str, Callable[..., Any]] = {
    "cutout_batch": cutout_batch,
    "randaugment_image": randaugment_image,
    "augmix_image": augmix_image,
}


def _pixels(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return R.randint(R.fold_in(R.key(seed), 0), 0, 256, shape).to(torch.uint8)


@pytest.mark.parametrize("name", AUGMENTATIONS)
@pytest.mark.parametrize("mode", ["L", "RGB"])
@settings(max_examples=10, deadline=None)
@given(seed=seeds, height=sides, width=sides)
def test_a_pil_image_gives_the_pil_image_of_its_tensors_augmentation(name, mode, seed, height, width) -> None:
    augment = AUGMENTATIONS[name]
    channels = 1 if mode == "L" else 3
    image = _pixels(seed, (channels, height, width))
    pil = Image.fromarray((image[0] if mode == "L" else image.permute(1, 2, 0)).numpy(), mode=mode)
    out = augment(pil, key=R.key(seed))
    assert isinstance(out, Image.Image) and out.mode == mode and out.size == (width, height)
    array = torch.from_numpy(np.array(out))
    expected = augment(image, key=R.key(seed))
    assert torch.equal(array.unsqueeze(0) if mode == "L" else array.permute(2, 0, 1), expected)


@pytest.mark.parametrize("name", AUGMENTATIONS)
@pytest.mark.parametrize("shape", [(3, 5, 6), (2, 3, 5, 6)], ids=["image", "batch"])
@settings(max_examples=10, deadline=None)
@given(seed=seeds)
def test_float64_images_keep_dtype_and_shape_and_match_float32(name, shape, seed) -> None:
    augment = AUGMENTATIONS[name]
    image = _pixels(seed, shape).double() / 255
    out = augment(image, key=R.key(seed))
    assert out.dtype == torch.float64 and out.shape == image.shape
    expected = augment(image.float(), key=R.key(seed)).double()
    if name == "cutout_batch":
        # CutOut zeroes pixels and keeps the others bit for bit, in any dtype.
        expected = torch.where(expected == 0, 0.0, image)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("augment", [randaugment_batch, augmix_batch, randaugment_image, augmix_image])
@pytest.mark.parametrize("low, high", [(-0.5, 1.0), (0.0, 255.0), (float("nan"), 0.5)])
def test_float_images_outside_the_unit_range_are_refused_naming_the_range(augment, low, high) -> None:
    images = torch.full((2, 3, 4, 4), 0.5)
    images[0, 0, 0, 0], images[1, 0, 0, 0] = low, high
    with pytest.raises(
        ValueError, match=r"input holds values in \[.*\]: .* floating-point images in \[0, 1\]"
    ):
        augment(images, key=R.key(0))


class _PilImages(torch.utils.data.Dataset):
    """Eight PIL images with a torchvision-style ``transform``, as a dataset hands them to a DataLoader."""

    def __init__(self, transform: Callable[[Image.Image], Image.Image]) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        image = Image.fromarray(_pixels(index, (6, 6, 3)).numpy())
        return torch.from_numpy(np.array(self.transform(image))).permute(2, 0, 1)


@pytest.mark.parametrize(
    "make",
    [lambda: RandAugmentTransform(seed=3), lambda: AugmentAndMixTransform(seed=3)],
    ids=["rand", "mix"],
)
def test_transforms_in_data_loader_workers_give_the_same_images_on_every_run(make) -> None:
    def run() -> torch.Tensor:
        loader = torch.utils.data.DataLoader(_PilImages(make()), batch_size=2, num_workers=2)
        return torch.cat(list(loader))

    first, second = run(), run()
    assert first.shape == (8, 3, 6, 6) and first.dtype == torch.uint8
    assert torch.equal(first, second)
    unaugmented = torch.stack([_pixels(i, (6, 6, 3)).permute(2, 0, 1) for i in range(8)])
    assert not torch.equal(first, unaugmented)
