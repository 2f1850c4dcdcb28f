"""The real Fashion-MNIST, where the Debian package ``dataset-fashion-mnist`` has installed it."""

from __future__ import annotations

import pytest
import torch

from composer_fn.data import load_idx_task
from composer_fn.data.idx import DEBIAN_FASHION_MNIST

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(),
    reason=f"{DEBIAN_FASHION_MNIST} is absent: the Debian package dataset-fashion-mnist is not installed "
    "(apt-get install dataset-fashion-mnist)",
)


def test_fashion_mnist_has_60000_training_and_10000_heldout_images_balanced_over_ten_classes() -> None:
    task = load_idx_task("fashion-mnist")
    assert task.train[0].shape == (60000, 1, 28, 28) and task.heldout[0].shape == (10000, 1, 28, 28)
    assert task.image_shape == (1, 28, 28) and task.num_classes == 10
    assert torch.equal(torch.bincount(task.train[1]), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(task.heldout[1]), torch.full((10,), 1000))
    assert task.mean[0] == pytest.approx(0.2860, abs=1e-4) and task.std[0] == pytest.approx(0.3530, abs=1e-4)
