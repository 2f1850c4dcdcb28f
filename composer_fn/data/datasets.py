"""One entry point for every image data set read from disk, by name."""

from __future__ import annotations

from pathlib import Path

from composer_fn.data.cifar import CIFAR_DATASETS, load_cifar_task
from composer_fn.data.folder import FolderTask, load_image_folder_task
from composer_fn.data.idx import IDX_DATASETS, load_idx_task
from composer_fn.data.images import ImageTask

__all__ = ["DATASETS", "load_dataset"]

DATASETS: tuple[str, ...] = (*IDX_DATASETS, *CIFAR_DATASETS, "imagefolder")
"""The names ``load_dataset`` accepts."""


def load_dataset(
    name: str,
    root: str | Path | None = None,
    *,
    standardize: bool = True,
    image_size: int | tuple[int, int] | None = None,
    batch_size: int | None = None,
    num_workers: int | None = None,
    seed: int | None = None,
) -> ImageTask | FolderTask:
    """Returns data set ``name`` (one of ``DATASETS``) found under ``root``.

    IDX data sets (``load_idx_task``) and CIFAR (``load_cifar_task``, fine labels) are read into memory and give
    an ``ImageTask``; ``"imagefolder"`` reads the folder ``root`` (required) with ``load_image_folder_task`` and
    gives a ``FolderTask``. ``image_size``, ``batch_size`` (64 by default), ``num_workers`` (0) and ``seed`` (0)
    concern the image folder only, and are refused for the others: the in-memory tasks are batched by whoever
    consumes them (``TensorLoader``).
    """
    if name in IDX_DATASETS or name in CIFAR_DATASETS:
        given = {"image_size": image_size, "batch_size": batch_size, "num_workers": num_workers, "seed": seed}
        for argument, value in given.items():
            if value is not None:
                raise ValueError(
                    f"{argument}={value!r}: {name!r} is read into memory whole, and {argument} concerns the "
                    "'imagefolder' data set only; expected it left out (batch the task's tensors with "
                    "composer_fn.data.TensorLoader(task.train, batch_size, seed=...))"
                )
    if name in IDX_DATASETS:
        return load_idx_task(name, root, standardize=standardize)
    if name in CIFAR_DATASETS:
        return load_cifar_task(name, root, standardize=standardize)
    if name == "imagefolder":
        if root is None:
            raise ValueError(
                "root=None: the 'imagefolder' data set needs its folder as root (--data-dir), holding one "
                "subfolder per class, or train/ and val/ folders of them"
            )
        return load_image_folder_task(
            root,
            standardize=standardize,
            image_size=image_size,
            batch_size=64 if batch_size is None else batch_size,
            num_workers=0 if num_workers is None else num_workers,
            seed=0 if seed is None else seed,
        )
    raise ValueError(
        f"name={name!r} is not a known data set: expected one of {', '.join(map(repr, DATASETS))}"
    )
