"""ProgressiveResizing: Composer's schedule, pinned sizes, crops that are sub-images, one compile per size."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms import ProgressiveResizing
from composer_fn.core import random as R
from composer_fn.core.dry_run import dry_run
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.functional import pinned_size, progressive_scale, resize_batch
from composer_fn.models import SmallCNN
from composer_fn.optim import sgd
from composer_fn.trainer import Trainer

fractions = st.floats(0.0, 1.0)


def composer_scale(elapsed: float, initial: float, delay: float, finetune: float) -> float:
    # Composer's ProgressiveResizing.apply, written out as it is there.
    if elapsed >= delay:
        frac = min([(elapsed - delay) / (1 - finetune - delay), 1])
    else:
        frac = 0.0
    return initial + (1 - initial) * frac


@given(fractions, st.floats(0.05, 1.0), st.floats(0.0, 0.6), st.floats(0.0, 0.39))
def test_the_scale_follows_composers_schedule(elapsed, initial, delay, finetune) -> None:
    ours = progressive_scale(elapsed, initial_scale=initial, delay_fraction=delay, finetune_fraction=finetune)
    assert ours == pytest.approx(composer_scale(elapsed, initial, delay, finetune), abs=1e-12)


@pytest.mark.parametrize(
    ("elapsed", "scale"), [(0.0, 0.5), (0.49, 0.5), (0.5, 0.5), (0.65, 0.75), (0.8, 1.0), (0.95, 1.0)]
)
def test_the_default_schedule_in_a_table(elapsed: float, scale: float) -> None:
    assert progressive_scale(elapsed) == pytest.approx(scale)


@given(st.integers(1, 64), st.integers(1, 64), st.floats(0.01, 1.0), st.integers(1, 8))
def test_pinned_widths_are_multiples_of_the_increment_and_keep_the_aspect(height, width, scale, increment) -> None:
    new_height, new_width = pinned_size(height, width, scale, increment)
    if scale >= 1:
        assert (new_height, new_width) == (height, width)
        return
    assert 1 <= new_width <= width and 1 <= new_height <= height
    assert new_width % increment == 0 or new_width == width
    assert new_height == max(height * new_width // width, 1)


@given(st.integers(0, 2**32 - 1), st.integers(2, 12), st.integers(2, 12), st.floats(0.2, 0.99))
def test_a_crop_is_a_block_of_the_input_and_resize_has_the_scaled_shape(seed, height, width, scale) -> None:
    images = R.normal(R.key(seed), (3, 2, height, width))
    target = torch.arange(3)
    if min(int(scale * height), int(scale * width)) < 1:
        with pytest.raises(ValueError, match="scale_factor"):
            resize_batch(images, target, scale, "crop", key=R.key(seed))
        return
    cropped, same_target = resize_batch(images, target, scale, "crop", key=R.key(seed))
    crop_h, crop_w = int(scale * height), int(scale * width)
    assert cropped.shape == (3, 2, crop_h, crop_w) and same_target is target
    blocks = [
        (top, left)
        for top in range(height - crop_h + 1)
        for left in range(width - crop_w + 1)
        if torch.equal(images[..., top : top + crop_h, left : left + crop_w], cropped)
    ]
    assert blocks, "the crop is not a block of the input"
    again, _ = resize_batch(images, target, scale, "crop", key=R.key(seed))
    assert torch.equal(again, cropped)
    resized, _ = resize_batch(images, target, scale, "resize")
    assert resized.shape == (3, 2, crop_h, crop_w)


def test_every_crop_position_is_reachable() -> None:
    images = torch.arange(16.0).reshape(1, 1, 4, 4)
    corners = {
        float(resize_batch(images, torch.zeros(1), 0.5, "crop", key=R.key(seed))[0][0, 0, 0, 0]) for seed in range(200)
    }
    assert corners == {0.0, 1.0, 2.0, 4.0, 5.0, 6.0, 8.0, 9.0, 10.0}


def test_full_scale_is_the_identity_and_masks_stay_class_indices() -> None:
    images = R.normal(R.key(0), (2, 3, 8, 8))
    masks = R.randint(R.key(1), 0, 5, (2, 8, 8))
    same, same_masks = resize_batch(images, masks, 1.0, "resize", resize_targets=True)
    assert same is images and same_masks is masks
    small, small_masks = resize_batch(images, masks, 0.5, "resize", resize_targets=True)
    assert small.shape == (2, 3, 4, 4) and small_masks.shape == (2, 4, 4) and small_masks.dtype == masks.dtype
    assert set(small_masks.unique().tolist()) <= set(masks.unique().tolist())


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="mode='bilinear'"):
        ProgressiveResizing(mode="bilinear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initial_scale=0"):
        ProgressiveResizing(initial_scale=0)
    with pytest.raises(ValueError, match="delay_fraction=0.9"):
        ProgressiveResizing(delay_fraction=0.9, finetune_fraction=0.2)
    with pytest.raises(ValueError, match="key="):
        resize_batch(torch.zeros(1, 1, 4, 4), torch.zeros(1), 0.5, "crop")


def test_a_run_compiles_one_step_per_size_and_the_dry_run_predicts_them() -> None:
    images, labels = synthetic_images(R.key(0), 64, num_classes=4, shape=(3, 16, 16))
    loader = TensorLoader((images, labels), 8, seed=0)
    algorithm = ProgressiveResizing(initial_scale=0.25, size_increment=4)
    trainer = Trainer(
        SmallCNN(in_channels=3, num_classes=4, width=4),
        loader,
        max_duration="5ep",
        optimizer=sgd(0.05),
        algorithms=[algorithm],
        compile="eager",
        progress_bar=False,
    )
    trainer.fit()
    report = dry_run([algorithm], "5ep", steps_per_epoch=8, batch_size=8, input_shape=(8, 3, 16, 16))
    # Widths 4, 8, 12, 16 over the ramp: one graph each.
    assert report.compiled_steps == 4
    assert trainer.compiles == report.compiled_steps


@pytest.mark.parametrize(("input_side", "target_side", "scale", "expected"), [(32, 16, 0.5, 8), (32, 32, 0.5, 16), (8, 16, 0.25, 4)])
def test_resize_mode_scales_the_target_in_its_own_resolution(input_side, target_side, scale, expected) -> None:
    images = R.uniform(R.key(0), (2, 3, input_side, input_side))
    masks = torch.arange(2 * target_side * target_side).remainder(5).reshape(2, target_side, target_side)
    maps = R.uniform(R.key(1), (2, 4, target_side, target_side))
    _, resized_masks = resize_batch(images, masks, scale, mode="resize", resize_targets=True)
    _, resized_maps = resize_batch(images, maps, scale, mode="resize", resize_targets=True)
    assert resized_masks.shape == (2, expected, expected) and resized_masks.dtype == masks.dtype
    assert resized_maps.shape == (2, 4, expected, expected)
