"""The embedded digits task: scikit-learn's bundled 8×8 handwritten digits, no download needed.

The data are the 1797 images of ``sklearn.datasets.load_digits`` (grayscale, integer values 0..16, ten
classes), which ship inside the scikit-learn wheel. The split is fixed and never random: sample ``i`` (in
scikit-learn's order) is held out if and only if ``i % 5 == 0``, which gives 360 held-out and 1437 training
samples. Every run, on every machine, therefore evaluates on the same images.

Pixels are divided by 16, optionally upsampled, then standardised with one scalar mean and one scalar standard
deviation computed on the training part only, so no statistic of the held-out images leaks into the inputs.
``standardize=False`` keeps the pixels in ``[0, 1]``, the form that image augmentations (RandAugment, AugMix)
take.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core.validate import flag, integer

__all__ = ["DigitsTask", "load_digits_task", "HELDOUT_EVERY"]

HELDOUT_EVERY = 5
"""Sample ``i`` is held out iff ``i % HELDOUT_EVERY == 0``."""

_NATIVE_SIZE = 8
_MAX_PIXEL = 16.0


@dataclass(frozen=True, eq=False)
class DigitsTask:
    """The digits task: images (standardised unless asked otherwise) and labels, split into training and held-out parts.

    ``train`` and ``heldout`` are ``(images, labels)`` with images ``float32 [N, 1, H, W]`` and labels
    ``int64 [N]``; ``image_shape`` is ``(1, H, W)``. ``mean`` and ``std`` (one channel) are the training images'
    in ``[0, 1]`` scale, which standardisation uses, whatever ``standardize`` was; ``classes[i]`` names label ``i``.
    """

    train: tuple[Tensor, Tensor]
    heldout: tuple[Tensor, Tensor]
    num_classes: int
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    classes: tuple[str, ...] = tuple("0123456789")


@functools.lru_cache(maxsize=1)
def _bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    # The import is deferred so that importing composer_fn.data does not pay for scikit-learn.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.array(bunch.images, dtype=np.float64)
    labels = np.array(bunch.target, dtype=np.int64)
    # The cache hands out the same arrays on every call: make them read-only so nobody can corrupt them.
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_digits_task(*, upsample: int = 1, standardize: bool = True) -> DigitsTask:
    """Returns the digits task with images of side ``8 * upsample``, as fresh tensors on the CPU.

    ``upsample`` (an int ≥ 1) enlarges the images by bilinear interpolation before standardisation, so the
    training images have mean 0 and standard deviation 1 at every size. With ``standardize=False`` the
    pixels stay in ``[0, 1]`` instead.
    """
    integer("upsample", upsample, minimum=1, hint="the factor applied to the 8x8 images")
    flag("standardize", standardize)
    raw_images, raw_labels = _bundled_digits()
    images = torch.tensor(raw_images, dtype=torch.float64).unsqueeze(1) / _MAX_PIXEL
    labels = torch.tensor(raw_labels, dtype=torch.int64)
    if upsample > 1:
        images = F.interpolate(images, scale_factor=upsample, mode="bilinear", align_corners=False)

    heldout_mask = torch.arange(len(labels)) % HELDOUT_EVERY == 0
    train_images = images[~heldout_mask]
    mean, std = float(train_images.mean()), float(train_images.std(correction=0))
    if standardize:
        images = (images - train_images.mean()) / train_images.std(correction=0)
    images = images.to(torch.float32)

    side = _NATIVE_SIZE * upsample
    return DigitsTask(
        train=(images[~heldout_mask], labels[~heldout_mask]),
        heldout=(images[heldout_mask], labels[heldout_mask]),
        num_classes=10,
        image_shape=(1, side, side),
        mean=(mean,),
        std=(std,),
    )
