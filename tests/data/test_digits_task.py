"""The digits task: fixed split, normalisation, shapes and cache safety."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from composer_fn.data import DigitsTask, load_digits_task


@pytest.fixture(scope="module")
def task() -> DigitsTask:
    return load_digits_task()


def test_split_has_1437_training_and_360_heldout_samples(task: DigitsTask) -> None:
    assert task.train[0].shape[0] == task.train[1].shape[0] == 1437
    assert task.heldout[0].shape[0] == task.heldout[1].shape[0] == 360
    assert task.num_classes == 10


def test_heldout_samples_are_exactly_those_with_index_divisible_by_five(task: DigitsTask) -> None:
    bunch = load_digits()
    heldout = np.arange(len(bunch.target)) % 5 == 0
    np.testing.assert_array_equal(task.heldout[1].numpy(), bunch.target[heldout])
    np.testing.assert_array_equal(task.train[1].numpy(), bunch.target[~heldout])
    pixels = bunch.images / 16.0
    mean, std = pixels[~heldout].mean(), pixels[~heldout].std()
    np.testing.assert_allclose(task.heldout[0][:, 0].numpy(), (pixels[heldout] - mean) / std, atol=1e-5)
    np.testing.assert_allclose(task.train[0][:, 0].numpy(), (pixels[~heldout] - mean) / std, atol=1e-5)


def test_images_are_float32_nchw_and_labels_int64(task: DigitsTask) -> None:
    for images, labels in (task.train, task.heldout):
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        assert tuple(images.shape[1:]) == task.image_shape == (1, 8, 8)
        assert set(labels.unique().tolist()) == set(range(10))


def test_training_images_are_standardised(task: DigitsTask) -> None:
    assert abs(task.train[0].mean().item()) < 1e-5
    assert abs(task.train[0].std().item() - 1.0) < 1e-3
    # The held-out part is standardised with the training statistics, not its own.
    assert abs(task.heldout[0].mean().item()) < 0.1


def test_upsample_enlarges_the_images_and_keeps_the_standardisation() -> None:
    task = load_digits_task(upsample=4)
    assert task.image_shape == (1, 32, 32)
    assert tuple(task.train[0].shape) == (1437, 1, 32, 32)
    assert tuple(task.heldout[0].shape) == (360, 1, 32, 32)
    assert abs(task.train[0].mean().item()) < 1e-5
    assert abs(task.train[0].std().item() - 1.0) < 1e-3


@pytest.mark.parametrize("upsample", [0, -1, 2.0, "2", True, None])
def test_invalid_upsample_raises_naming_the_argument(upsample: object) -> None:
    with pytest.raises(ValueError, match="upsample"):
        load_digits_task(upsample=upsample)  # type: ignore[arg-type]


def test_each_call_returns_fresh_tensors(task: DigitsTask) -> None:
    first = load_digits_task()
    first.train[0].fill_(123.0)
    first.train[1].zero_()
    first.heldout[0].mul_(0.0)
    second = load_digits_task()
    assert torch.equal(second.train[0], task.train[0])
    assert torch.equal(second.train[1], task.train[1])
    assert torch.equal(second.heldout[0], task.heldout[0])


def test_loading_does_not_touch_the_global_random_state() -> None:
    before = torch.random.get_rng_state()
    load_digits_task(upsample=2)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_unstandardised_pixels_lie_in_the_unit_range_and_map_affinely_to_the_standardised_ones(
    task: DigitsTask,
) -> None:
    raw = load_digits_task(standardize=False)
    images = torch.cat([raw.train[0], raw.heldout[0]])
    assert images.dtype == torch.float32 and images.min() == 0.0 and images.max() == 1.0
    assert torch.equal(raw.train[1], task.train[1]) and torch.equal(raw.heldout[1], task.heldout[1])
    mean = raw.train[0].double().mean()
    std = raw.train[0].double().std(correction=0)
    assert torch.allclose(((raw.heldout[0].double() - mean) / std).float(), task.heldout[0], atol=1e-5)
