"""CIFAR-10 and CIFAR-100 in their binary version (``cifar-10-binary.tar.gz``, ``cifar-100-binary.tar.gz``).

A CIFAR-10 file is a run of 3073-byte records: one label byte, then the 32×32 image as 1024 red, 1024 green and
1024 blue bytes (row-major), which is already ``[3, 32, 32]``. A CIFAR-100 record has a coarse label byte and a
fine label byte before the same 3072 pixel bytes. The files are read whole and reshaped, never parsed record by
record. The python (pickled) version, which torchvision downloads, is not read: unpickling runs code.

The split is the files' own: ``data_batch_1..5.bin`` (``train.bin``) train, ``test_batch.bin``
(``test.bin``) is held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from composer_fn.core.validate import choice, flag
from composer_fn.data.images import DatasetNotFoundError, ImageTask, image_task

__all__ = [
    "CifarDataset",
    "CIFAR_DATASETS",
    "IMAGE_BYTES",
    "read_cifar_batch",
    "write_cifar_batch",
    "load_cifar_task",
]

IMAGE_BYTES = 3 * 32 * 32
"""The pixel bytes of one record."""

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
    "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger",
    "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip
CIFAR100_COARSE_CLASSES = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "large_omnivores_and_herbivores",
    "medium_mammals", "non-insect_invertebrates", "people", "reptiles", "small_mammals", "trees",
    "vehicles_1", "vehicles_2",
)  # fmt: skip


@dataclass(frozen=True)
class CifarDataset:
    """Where a CIFAR binary version lives: its folder, files, class-name files and label bytes per record.

    ``names`` maps a label mode (``"fine"``, ``"coarse"``) to the file listing its class names and the standard
    names used when that file is absent; ``label_byte`` maps it to the label's position in a record.
    """

    folder: str
    train: tuple[str, ...]
    heldout: str
    label_bytes: int
    names: dict[str, tuple[str, tuple[str, ...]]]
    label_byte: dict[str, int]
    archive: str


CIFAR_DATASETS: dict[str, CifarDataset] = {
    "cifar10": CifarDataset(
        folder="cifar-10-batches-bin",
        train=tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        heldout="test_batch.bin",
        label_bytes=1,
        names={"fine": ("batches.meta.txt", CIFAR10_CLASSES)},
        label_byte={"fine": 0},
        archive="cifar-10-binary.tar.gz",
    ),
    "cifar100": CifarDataset(
        folder="cifar-100-binary",
        train=("train.bin",),
        heldout="test.bin",
        label_bytes=2,
        names={
            "fine": ("fine_label_names.txt", CIFAR100_CLASSES),
            "coarse": ("coarse_label_names.txt", CIFAR100_COARSE_CLASSES),
        },
        label_byte={"coarse": 0, "fine": 1},
        archive="cifar-100-binary.tar.gz",
    ),
}
"""Our names of the CIFAR data sets and the layout of their binary versions."""


def read_cifar_batch(path: str | Path, label_bytes: int) -> tuple[Tensor, Tensor]:
    """Returns ``(images uint8 [N, 3, 32, 32], labels uint8 [N, label_bytes])`` of the binary CIFAR file at ``path``.

    ``label_bytes`` is 1 for CIFAR-10 and 2 (coarse, fine) for CIFAR-100. A file that is empty or whose size is
    not a multiple of the record size raises ``ValueError`` naming ``path``.
    """
    path = Path(path)
    record = label_bytes + IMAGE_BYTES
    size = path.stat().st_size
    if size == 0 or size % record:
        fault = "empty" if size == 0 else f"{size % record} bytes past the last whole record"
        raise ValueError(
            f"{path}: the file holds {size} bytes: expected a non-zero multiple of the {record}-byte record "
            f"({label_bytes} label byte{'s' if label_bytes > 1 else ''} + {IMAGE_BYTES} pixel bytes); {fault}"
        )
    records = np.fromfile(path, dtype=np.uint8).reshape(-1, record)
    images = np.ascontiguousarray(records[:, label_bytes:]).reshape(-1, 3, 32, 32)
    labels = np.ascontiguousarray(records[:, :label_bytes])
    return torch.from_numpy(images), torch.from_numpy(labels)


def write_cifar_batch(path: str | Path, images: Tensor, labels: Tensor, coarse: Tensor | None = None) -> None:
    """Writes a binary CIFAR file at ``path``: CIFAR-10 records, or CIFAR-100 records when ``coarse`` is given.

    ``images`` is ``uint8 [N, 3, 32, 32]``; ``labels`` (the fine labels) and ``coarse`` hold ``N`` values in
    ``[0, 255]``.
    """
    if (
        not isinstance(images, Tensor)
        or images.dtype != torch.uint8
        or tuple(images.shape[1:]) != (3, 32, 32)
    ):
        described = (
            f"{images.dtype} [{', '.join(map(str, images.shape))}]" if isinstance(images, Tensor) else images
        )
        raise ValueError(f"images is {described}: expected uint8 [N, 3, 32, 32]")
    columns = [] if coarse is None else [coarse]
    columns.append(labels)
    for argument, column in zip(
        ("coarse", "labels") if coarse is not None else ("labels",), columns, strict=True
    ):
        if column.shape != (len(images),) or (
            len(column) and not 0 <= int(column.min()) <= int(column.max()) <= 255
        ):
            raise ValueError(
                f"{argument} has shape {tuple(column.shape)}: expected {len(images)} labels in [0, 255], one per image"
            )
    label_bytes = torch.stack([c.to(torch.uint8) for c in columns], dim=1)
    records = torch.cat([label_bytes, images.reshape(len(images), IMAGE_BYTES)], dim=1)
    Path(path).write_bytes(records.contiguous().numpy().tobytes())


def _find(name: str, dataset: CifarDataset, root: str | Path | None) -> Path:
    needed = (*dataset.train, dataset.heldout)
    folders = [] if root is None else [Path(root) / dataset.folder, Path(root)]
    for folder in folders:
        if all((folder / file).is_file() for file in needed):
            return folder
    where = f"looked in {'; '.join(map(str, folders))}" if folders else "no root (--data-dir) was given"
    raise DatasetNotFoundError(
        f"{name}: the binary files {', '.join(needed)} were not found: {where}. To get them: download the binary "
        f"version {dataset.archive} from https://www.cs.toronto.edu/~kriz/cifar.html and extract it under "
        f"--data-dir (it unpacks to {dataset.folder}/). torchvision.datasets.{name.upper()}(download=True) "
        "fetches the pickled python version, which is not read"
    )


def _class_names(folder: Path, file: str, standard: tuple[str, ...]) -> tuple[str, ...]:
    path = folder / file
    if not path.is_file():
        return standard
    names = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(names) != len(standard):
        raise ValueError(f"{path}: lists {len(names)} class names: expected {len(standard)}, one per line")
    return names


def load_cifar_task(
    name: str, root: str | Path | None = None, *, standardize: bool = True, label_mode: str = "fine"
) -> ImageTask:
    """Returns the ``ImageTask`` of ``"cifar10"`` or ``"cifar100"`` (binary version), images ``[N, 3, 32, 32]``.

    The files are looked for in ``<root>/cifar-10-batches-bin`` (``cifar-100-binary``), then in ``<root>``.
    ``label_mode`` picks CIFAR-100's 100 ``"fine"`` or 20 ``"coarse"`` classes (CIFAR-10 has only ``"fine"``).
    Class names come from the data's name files when present, else are the standard ones. Statistics come from
    the training part only; see ``image_task``.
    """
    dataset = CIFAR_DATASETS[choice("name", name, tuple(CIFAR_DATASETS))]
    label_mode = choice("label_mode", label_mode, tuple(dataset.names))
    flag("standardize", standardize)
    folder = _find(name, dataset, root)
    names_file, standard = dataset.names[label_mode]
    classes = _class_names(folder, names_file, standard)
    parts = []
    for files in (dataset.train, (dataset.heldout,)):
        batches = []
        for file in files:
            images, labels = read_cifar_batch(folder / file, dataset.label_bytes)
            column = labels[:, dataset.label_byte[label_mode]]
            if int(column.max()) >= len(classes):
                raise ValueError(
                    f"{folder / file}: holds {label_mode} labels up to {int(column.max())}: expected labels in "
                    f"[0, {len(classes) - 1}] for the {len(classes)} {label_mode} classes of {name}"
                )
            batches.append((images, column.to(torch.int64)))
        parts += [torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])]
    train_pixels, train_labels, heldout_pixels, heldout_labels = parts
    return image_task(train_pixels, train_labels, heldout_pixels, heldout_labels, classes, standardize=standardize)
