"""Keyed synthetic images: determinism, shapes and learnability."""

import pytest
import torch

from composer_fn.core.random import fold_in, key
from composer_fn.data import synthetic_images


def test_same_key_gives_bitwise_the_same_images_and_labels() -> None:
    first = synthetic_images(key(7), 64, num_classes=5, shape=(3, 8, 8))
    second = synthetic_images(key(7), 64, num_classes=5, shape=(3, 8, 8))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_different_keys_give_different_tasks() -> None:
    first, _ = synthetic_images(key(0), 32, shape=(1, 4, 4))
    second, _ = synthetic_images(fold_in(key(0), 1), 32, shape=(1, 4, 4))
    assert not torch.equal(first, second)


def test_shapes_and_dtypes_follow_the_arguments() -> None:
    images, labels = synthetic_images(key(1), 50, num_classes=4, shape=(2, 5, 6))
    assert images.shape == (50, 2, 5, 6) and images.dtype == torch.float32
    assert labels.shape == (50,) and labels.dtype == torch.int64
    assert 0 <= labels.min().item() and labels.max().item() < 4


def test_fewer_samples_are_a_prefix_of_more() -> None:
    small = synthetic_images(key(3), 10, shape=(1, 4, 4))
    large = synthetic_images(key(3), 40, shape=(1, 4, 4))
    assert torch.equal(small[0], large[0][:10]) and torch.equal(small[1], large[1][:10])


def test_without_noise_every_sample_is_its_class_mean() -> None:
    images, labels = synthetic_images(key(2), 200, num_classes=3, shape=(4,), noise=0.0)
    for label in range(3):
        members = images[labels == label]
        assert len(members) > 0 and torch.equal(members, members[:1].expand_as(members))


def test_nearest_class_mean_classifies_the_noisy_task() -> None:
    images, labels = synthetic_images(key(4), 400, num_classes=10, shape=(3, 8, 8), noise=1.0)
    flat = images.flatten(1)
    means = torch.stack([flat[labels == c].mean(0) for c in range(10)])
    predicted = torch.cdist(flat, means).argmin(1)
    assert (predicted == labels).float().mean().item() > 0.95


def test_sampling_does_not_touch_the_global_random_state() -> None:
    before = torch.random.get_rng_state()
    synthetic_images(key(5), 16)
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"num_samples": 0}, "num_samples"),
        ({"num_classes": 0}, "num_classes"),
        ({"shape": (3, 0, 4)}, "shape"),
        ({"shape": ()}, "shape"),
        ({"noise": -1.0}, "noise"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(arguments: dict, name: str) -> None:
    call = {"num_samples": 8, **arguments}
    with pytest.raises(ValueError, match=name):
        synthetic_images(key(0), **call)
