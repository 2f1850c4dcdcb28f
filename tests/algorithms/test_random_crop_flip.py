"""RandomCropFlip: each image is torchvision's pad-crop-flip of itself at its own draw; draws are keyed, per image,
and the input is left unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.algorithms.random_crop_flip import (
    PADDING_MODES,
    RandomCropFlip,
    random_crop_flip_apply,
    random_crop_flip_batch,
    random_crop_flip_params,
)
from composer_fn.core import random as R

DTYPES = (torch.uint8, torch.float32, torch.float64, torch.bfloat16)


def _images(seed: int, batch: int, channels: int, height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    x = R.uniform(R.key(seed), (batch, channels, height, width), low=1.0, high=2.0) * 100
    return x.to(dtype)


def _reference(image: torch.Tensor, row: int, column: int, flip: bool, padding: int, fill: float, mode: str) -> torch.Tensor:
    # One image at a time, the way torchvision's RandomCrop(padding) then RandomHorizontalFlip do it.
    height, width = image.shape[-2:]
    source = image.double()
    if mode == "constant":
        padded = F.pad(source, (padding,) * 4, value=fill)
    else:
        padded = F.pad(source[None], (padding,) * 4, mode=mode)[0]
    crop = padded[:, row : row + height, column : column + width]
    return (crop.flip(-1) if flip else crop).to(image.dtype)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 5),
    channels=st.integers(1, 3),
    height=st.integers(3, 9),
    width=st.integers(3, 9),
    padding=st.integers(0, 2),
    flip_p=st.sampled_from([0.0, 0.5, 1.0]),
    mode=st.sampled_from(PADDING_MODES),
    dtype=st.sampled_from(DTYPES),
)
def test_each_image_is_the_reference_crop_and_flip_of_itself(
    seed, batch, channels, height, width, padding, flip_p, mode, dtype
) -> None:
    images = _images(seed, batch, channels, height, width, dtype)
    before = images.clone()
    params = random_crop_flip_params(R.key(seed), batch, padding=padding, flip_p=flip_p)
    out = random_crop_flip_apply(images, params, padding=padding, fill=7.0, padding_mode=mode)
    assert torch.equal(images, before)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert ((params.offsets >= 0) & (params.offsets <= 2 * padding)).all()
    if flip_p in (0.0, 1.0):
        assert bool(params.flips.all()) == (flip_p == 1.0) and bool(params.flips.any()) == (flip_p == 1.0)
    for index in range(batch):
        row, column = params.offsets[index].tolist()
        expected = _reference(images[index], row, column, bool(params.flips[index]), padding, 7.0, mode)
        assert torch.equal(out[index], expected)


def test_the_same_key_gives_the_same_batch_and_images_draw_apart() -> None:
    images = _images(0, 64, 1, 8, 8, torch.float32)
    first = random_crop_flip_batch(images, key=R.key(5))
    assert torch.equal(first, random_crop_flip_batch(images, key=R.key(5)))
    assert not torch.equal(first, random_crop_flip_batch(images, key=R.key(6)))
    params = random_crop_flip_params(R.key(5), 64)
    # Per image: offsets over all of 0..8 on both axes, about half of the images mirrored.
    assert set(params.offsets.flatten().tolist()) == set(range(9))
    assert 16 <= int(params.flips.sum()) <= 48


def test_without_padding_a_flip_only_mirrors_so_every_pixel_is_kept() -> None:
    images = _images(1, 6, 3, 5, 7, torch.float32)
    out = random_crop_flip_batch(images, key=R.key(2), padding=0, flip_p=1.0)
    assert torch.equal(out, images.flip(-1))
    assert torch.equal(random_crop_flip_batch(images, key=R.key(2), padding=0, flip_p=0.0), images)


def test_one_image_and_a_pil_image_are_taken() -> None:
    from PIL import Image

    image = _images(3, 1, 3, 6, 6, torch.uint8)[0]
    out = random_crop_flip_batch(image, key=R.key(0))
    assert out.shape == image.shape and out.dtype == torch.uint8
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    assert random_crop_flip_batch(pil, key=R.key(0)).size == pil.size


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"padding": -1}, "padding=-1"),
        ({"flip_p": 1.5}, "flip_p=1.5"),
        ({"padding_mode": "wrap"}, "padding_mode='wrap' must be one of 'constant', 'reflect', 'replicate'"),
    ],
)
def test_bad_hyperparameters_are_refused_naming_them(arguments, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RandomCropFlip(**arguments)


def test_reflection_wider_than_the_image_is_refused() -> None:
    images = _images(0, 2, 1, 3, 3, torch.float32)
    params = random_crop_flip_params(R.key(0), 2, padding=3)
    with pytest.raises(ValueError, match="padding=3 with padding_mode='reflect' needs images larger than it; they are 3x3"):
        random_crop_flip_apply(images, params, padding=3, padding_mode="reflect")
