"""The record of an image classification task held in memory, and its construction from ``uint8`` pixels.

Every reader of a real format on disk (IDX, CIFAR binary) ends in ``image_task``: the per-channel mean and
standard deviation come from the training part only, so no statistic of the held-out images leaks into the
inputs, and both parts are standardised with them. Statistics are exact: each channel's 256-bin histogram of
the training pixels is counted in integers, and the moments are taken from it in ``float64``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from composer_fn.core.validate import flag

__all__ = [
    "ImageTask",
    "DatasetNotFoundError",
    "image_task",
    "channel_histograms",
    "histogram_statistics",
    "channel_statistics",
    "pixel_tables",
    "pixels_to_float",
]

_LEVELS = 256
_MAX_PIXEL = 255.0
# Pixels of one channel converted per step: NumPy buffers a strided output, and a buffer of this size stays in
# the cache (several times faster than whole-array steps).
_CHUNK_VALUES = 1 << 16


class DatasetNotFoundError(FileNotFoundError):
    """A data set's files are in none of the folders searched; the message names them and how to get the files."""


@dataclass(frozen=True, eq=False)
class ImageTask:
    """An image classification task in memory: float images and labels, split into training and held-out parts.

    ``train`` and ``heldout`` are ``(images float32 [N, C, H, W], labels int64 [N])``; the images are
    standardised per channel with ``mean`` and ``std`` (``(x / 255 - mean) / std``), or are ``x / 255`` in
    ``[0, 1]`` when built with ``standardize=False``. ``mean`` and ``std`` (population, ``correction=0``) are
    those of the training pixels in ``[0, 1]`` scale, one per channel, whatever ``standardize`` was.
    ``classes[i]`` names label ``i``; ``pixels`` holds the ``uint8 [N, C, H, W]`` training and held-out images
    as read.
    """

    train: tuple[Tensor, Tensor]
    heldout: tuple[Tensor, Tensor]
    num_classes: int
    image_shape: tuple[int, int, int]
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pixels: tuple[Tensor, Tensor]


def channel_histograms(pixels: Tensor) -> np.ndarray:
    """Returns the ``int64 [C, 256]`` counts of each value in each channel of ``uint8 [N, C, H, W]`` pixels."""
    _require_pixels("pixels", pixels)
    return np.stack(
        [torch.bincount(pixels[:, c].reshape(-1), minlength=_LEVELS).numpy() for c in range(pixels.shape[1])]
    )


def histogram_statistics(counts: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Returns the per-channel ``(mean, std)`` in ``[0, 1]`` scale of the pixels counted by ``counts [C, 256]``.

    ``std`` is the population standard deviation (``correction=0``); both are computed in ``float64``.
    """
    levels = np.arange(_LEVELS, dtype=np.float64) / _MAX_PIXEL
    means, stds = [], []
    for channel_counts in counts.astype(np.float64):
        total = channel_counts.sum()
        mean = float(channel_counts @ levels / total)
        means.append(mean)
        stds.append(float(np.sqrt(channel_counts @ (levels - mean) ** 2 / total)))
    return tuple(means), tuple(stds)


def channel_statistics(pixels: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Returns the per-channel ``(mean, std)`` of ``uint8 [N, C, H, W]`` pixels in ``[0, 1]`` scale.

    ``std`` is the population standard deviation (``correction=0``).
    """
    return histogram_statistics(channel_histograms(pixels))


def pixel_tables(mean: Sequence[float], std: Sequence[float], *, standardize: bool) -> np.ndarray:
    """Returns the ``float32 [C, 256]`` value of each byte in each channel: ``(k / 255 - mean) / std`` or ``k / 255``.

    The values are computed in ``float64`` and rounded once, so a byte maps to the same float in every reader.
    """
    levels = np.arange(_LEVELS, dtype=np.float64) / _MAX_PIXEL
    if not standardize:
        return np.stack([levels] * len(mean)).astype(np.float32)
    if min(std) == 0.0:
        raise ValueError(
            f"the training pixels have per-channel std {tuple(std)}: a constant channel cannot be standardised; "
            "pass standardize=False"
        )
    return np.stack([(levels - m) / s for m, s in zip(mean, std, strict=True)]).astype(np.float32)


def image_task(
    train_pixels: Tensor,
    train_labels: Tensor,
    heldout_pixels: Tensor,
    heldout_labels: Tensor,
    classes: Sequence[str],
    *,
    standardize: bool,
) -> ImageTask:
    """Returns the ``ImageTask`` of ``uint8 [N, C, H, W]`` pixels and ``int64 [N]`` labels in ``range(len(classes))``.

    Statistics come from ``train_pixels`` only. Each float image is ``table[c][x]``, where the 256-entry table of
    channel ``c`` holds ``(k / 255 - mean) / std`` (or ``k / 255``) computed in ``float64`` and rounded once to
    ``float32``; the conversion runs a few images at a time, so its temporaries stay small.
    """
    flag("standardize", standardize)
    _require_pixels("train_pixels", train_pixels)
    _require_pixels("heldout_pixels", heldout_pixels)
    if heldout_pixels.shape[1:] != train_pixels.shape[1:]:
        raise ValueError(
            f"heldout_pixels has images of shape {tuple(heldout_pixels.shape[1:])}: expected the training "
            f"images' {tuple(train_pixels.shape[1:])}"
        )
    classes = tuple(classes)
    if not classes or not all(isinstance(name, str) for name in classes):
        raise ValueError(f"classes={classes!r} must be a non-empty sequence of class names (str)")
    for argument, labels, pixels in (
        ("train_labels", train_labels, train_pixels),
        ("heldout_labels", heldout_labels, heldout_pixels),
    ):
        if labels.dtype != torch.int64 or labels.shape != (pixels.shape[0],):
            raise ValueError(
                f"{argument} has dtype {labels.dtype} and shape {tuple(labels.shape)}: expected int64 "
                f"[{pixels.shape[0]}], one label per image"
            )
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(classes):
            raise ValueError(
                f"{argument} holds labels in [{int(labels.min())}, {int(labels.max())}]: expected labels in "
                f"[0, {len(classes) - 1}] for {len(classes)} classes"
            )
    mean, std = channel_statistics(train_pixels)
    tables = pixel_tables(mean, std, standardize=standardize)
    channels, height, width = train_pixels.shape[1:]
    return ImageTask(
        train=(pixels_to_float(train_pixels, tables), train_labels),
        heldout=(pixels_to_float(heldout_pixels, tables), heldout_labels),
        num_classes=len(classes),
        image_shape=(channels, height, width),
        classes=classes,
        mean=mean,
        std=std,
        pixels=(train_pixels, heldout_pixels),
    )


def pixels_to_float(pixels: Tensor, tables: np.ndarray, *, out: Tensor | None = None) -> Tensor:
    """Returns ``float32`` images ``tables[c][pixels[:, c]]`` of ``uint8 [N, C, H, W]`` pixels (see ``pixel_tables``).

    ``out``, a contiguous ``float32`` CPU tensor of the pixels' shape (e.g. in pinned memory), receives the images.
    """
    array = pixels.numpy()
    if out is None:
        out = torch.empty(array.shape, dtype=torch.float32)
    images = out.numpy()
    chunk = max(1, _CHUNK_VALUES // math.prod(array.shape[2:]))
    for start in range(0, array.shape[0], chunk):
        for channel, table in enumerate(tables):
            # Every index is a byte, so "clip" never clips; it spares NumPy the bounds check.
            part = array[start : start + chunk, channel]
            np.take(table, part, out=images[start : start + chunk, channel], mode="clip")
    return out


def _require_pixels(argument: str, pixels: object) -> None:
    if (
        not isinstance(pixels, Tensor)
        or pixels.dtype != torch.uint8
        or pixels.dim() != 4
        or pixels.device.type != "cpu"
    ):
        described = (
            f"a {pixels.dtype} tensor of shape {tuple(pixels.shape)} on {pixels.device}"
            if isinstance(pixels, Tensor)
            else type(pixels).__name__
        )
        raise ValueError(f"{argument} is {described}: expected a uint8 CPU tensor [N, C, H, W]")
    if pixels.shape[0] < 1:
        raise ValueError(f"{argument} holds no images (shape {tuple(pixels.shape)}): expected at least one")
