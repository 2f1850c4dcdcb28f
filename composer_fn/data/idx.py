"""IDX files (MNIST's format) and the data sets stored in it: MNIST, Fashion-MNIST, KMNIST and EMNIST.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the rank), the rank's dimensions as
big-endian ``uint32``, then the values in row-major order, big-endian. ``read_idx`` checks every part of that
against the file's length, so a truncated download, a file with bytes after its data, or another format
altogether is refused with the file's path and what was wrong, never read as noise.

The data sets are looked for where torchvision keeps them (``<root>/<Name>/raw``, ``<root>/<Name>``) or in a
flat folder, each file raw or gzipped; Fashion-MNIST is also found in ``/usr/share/datasets/fashion-mnist``,
where the Debian package ``dataset-fashion-mnist`` installs it. The split is the files' own: the 60,000
``train`` images train, the ``t10k`` (EMNIST: ``test``) images are held out.
"""

from __future__ import annotations

import gzip
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from composer_fn.core.validate import choice, flag
from composer_fn.data.images import DatasetNotFoundError, ImageTask, image_task

__all__ = [
    "IdxDataset",
    "IDX_DATASETS",
    "IDX_TYPES",
    "DEBIAN_FASHION_MNIST",
    "read_idx",
    "write_idx",
    "find_idx_files",
    "load_idx_task",
]

IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
"""The IDX type codes and the big-endian NumPy types of their values."""

_TORCH_CODES = {
    torch.uint8: 0x08,
    torch.int8: 0x09,
    torch.int16: 0x0B,
    torch.int32: 0x0C,
    torch.float32: 0x0D,
    torch.float64: 0x0E,
}
_GZIP_MAGIC = b"\x1f\x8b"

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
"""Where the Debian package ``dataset-fashion-mnist`` installs the four gzipped IDX files."""

_DIGITS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")
_UPPER = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_LOWER = tuple("abcdefghijklmnopqrstuvwxyz")
# EMNIST's "bymerge" and "balanced" splits fold the lowercase letters that look like their capitals into them.
_MERGED = frozenset("cijklmopsuvwxyz")


@dataclass(frozen=True)
class IdxDataset:
    """Where a data set in IDX files lives and how to read it.

    ``folder`` is torchvision's folder name; ``files`` the stems of the training images, training labels,
    held-out images and held-out labels; ``transposed`` marks images stored with height and width swapped
    (EMNIST); ``first_label`` is the value of the first class in the label files (1 for EMNIST letters).
    ``source`` says how to get the files.
    """

    folder: str
    files: tuple[str, str, str, str]
    classes: tuple[str, ...]
    source: str
    transposed: bool = False
    first_label: int = 0


def _torchvision_files(prefix: str, test: str) -> tuple[str, str, str, str]:
    return (
        f"{prefix}train-images-idx3-ubyte",
        f"{prefix}train-labels-idx1-ubyte",
        f"{prefix}{test}-images-idx3-ubyte",
        f"{prefix}{test}-labels-idx1-ubyte",
    )


def _emnist(split: str, classes: tuple[str, ...], first_label: int = 0) -> IdxDataset:
    return IdxDataset(
        folder="EMNIST",
        files=_torchvision_files(f"emnist-{split}-", "test"),
        classes=classes,
        source="torchvision.datasets.EMNIST(root, split=" + repr(split) + ", download=True) on a connected "
        "machine, then pass that root as --data-dir",
        transposed=True,
        first_label=first_label,
    )


IDX_DATASETS: dict[str, IdxDataset] = {
    "mnist": IdxDataset(
        "MNIST",
        _torchvision_files("", "t10k"),
        _DIGITS,
        "torchvision.datasets.MNIST(root, download=True) on a connected machine, then pass that root as --data-dir",
    ),
    "fashion-mnist": IdxDataset(
        "FashionMNIST",
        _torchvision_files("", "t10k"),
        (
            "T-shirt/top",
            "Trouser",
            "Pullover",
            "Dress",
            "Coat",
            "Sandal",
            "Shirt",
            "Sneaker",
            "Bag",
            "Ankle boot",
        ),
        "apt-get install dataset-fashion-mnist, or torchvision.datasets.FashionMNIST(root, download=True) on a "
        "connected machine and --data-dir root",
    ),
    "kmnist": IdxDataset(
        "KMNIST",
        _torchvision_files("", "t10k"),
        ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
        "torchvision.datasets.KMNIST(root, download=True) on a connected machine, then pass that root as --data-dir",
    ),
    "emnist-balanced": _emnist("balanced", _DIGITS + _UPPER + tuple(c for c in _LOWER if c not in _MERGED)),
    "emnist-byclass": _emnist("byclass", _DIGITS + _UPPER + _LOWER),
    "emnist-bymerge": _emnist("bymerge", _DIGITS + _UPPER + tuple(c for c in _LOWER if c not in _MERGED)),
    "emnist-digits": _emnist("digits", _DIGITS),
    "emnist-letters": _emnist("letters", _LOWER, first_label=1),
    "emnist-mnist": _emnist("mnist", _DIGITS),
}
"""Our names of the IDX data sets, with torchvision's folder and file names and the class names by label."""

_PARTS = ("train-images", "train-labels", "test-images", "test-labels")


def read_idx(path: str | Path) -> Tensor:
    """Returns the values of the IDX file at ``path`` as a fresh tensor of the file's type and shape.

    The file is gunzipped when its bytes start with the gzip magic ``1f 8b``, whatever its name (an IDX file
    named ``.gz`` that a browser or a tool already unpacked is read as it is: IDX starts with two zero bytes). An
    empty, truncated, over-long, corrupt or foreign file raises ``ValueError`` naming ``path``.
    """
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(
                f"{path}: not a readable gzip stream ({error}): the download is corrupt or cut short"
            ) from None
    if not data:
        raise ValueError(
            f"{path}: the file is empty: expected an IDX file (a 4-byte magic number, dimensions, data)"
        )
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file: it starts with bytes {data[:4].hex(' ')}, expected two zero bytes, a type "
            "code and a rank (e.g. 00 00 08 03 for uint8 images)"
        )
    code, rank = data[2], data[3]
    if code not in IDX_TYPES:
        accepted = ", ".join(f"0x{c:02X} ({t.name})" for c, t in IDX_TYPES.items())
        raise ValueError(f"{path}: IDX type code 0x{code:02X} is unknown: expected one of {accepted}")
    if rank < 1:
        raise ValueError(f"{path}: IDX header gives rank 0: expected a rank of at least 1")
    header = 4 + 4 * rank
    if len(data) < header:
        raise ValueError(
            f"{path}: IDX header of rank {rank} needs {header} bytes but the file holds {len(data)}: truncated"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=rank, offset=4))
    dtype = IDX_TYPES[code]
    shape = "×".join(map(str, dims))
    if 0 in dims:
        raise ValueError(f"{path}: IDX header says {shape} {dtype.name}: a dimension of 0 holds no values")
    expected = math.prod(dims) * dtype.itemsize
    held = len(data) - header
    if held != expected:
        fault = "truncated" if held < expected else f"{held - expected} bytes past the end of the data"
        raise ValueError(
            f"{path}: IDX header says {shape} {dtype.name} ({expected} bytes) but the file holds {held} bytes "
            f"of data: {fault}"
        )
    values = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return torch.from_numpy(values.astype(dtype.newbyteorder("="), copy=True))


def write_idx(path: str | Path, values: Tensor) -> None:
    """Writes ``values`` (uint8, int8, int16, int32, float32 or float64; rank ≥ 1, no empty dimension) as an IDX
    file at ``path``, gzipped when the name ends in ``.gz``."""
    path = Path(path)
    if not isinstance(values, Tensor) or values.dtype not in _TORCH_CODES:
        described = f"a {values.dtype} tensor" if isinstance(values, Tensor) else type(values).__name__
        accepted = ", ".join(str(t).removeprefix("torch.") for t in _TORCH_CODES)
        raise ValueError(f"values is {described}: expected a tensor of one of the IDX types {accepted}")
    if not 1 <= values.dim() <= 255 or 0 in values.shape:
        raise ValueError(
            f"values has shape {tuple(values.shape)}: expected a rank of 1 to 255 and no dimension of 0"
        )
    code = _TORCH_CODES[values.dtype]
    header = bytes([0, 0, code, values.dim()]) + np.array(values.shape, dtype=">u4").tobytes()
    data = header + values.detach().cpu().contiguous().numpy().astype(IDX_TYPES[code]).tobytes()
    path.write_bytes(gzip.compress(data, compresslevel=6) if path.name.endswith(".gz") else data)


def find_idx_files(name: str, root: str | Path | None = None) -> dict[str, Path]:
    """Returns the paths of data set ``name``'s four IDX files, keyed ``train-images``, ``train-labels``,
    ``test-images``, ``test-labels``.

    Looks in ``<root>/<folder>/raw``, ``<root>/<folder>`` and ``<root>``, in that order (``folder`` is
    torchvision's name, e.g. ``FashionMNIST``), and, for ``"fashion-mnist"`` without ``root``, in
    ``/usr/share/datasets/fashion-mnist``. The first folder that holds all four files wins; each file may be
    raw or gzipped (raw preferred). Raises ``DatasetNotFoundError`` naming every folder searched otherwise.
    """
    dataset = IDX_DATASETS[choice("name", name, tuple(IDX_DATASETS))]
    if root is not None:
        base = Path(root)
        folders = [base / dataset.folder / "raw", base / dataset.folder, base]
    else:
        folders = [DEBIAN_FASHION_MNIST] if name == "fashion-mnist" else []
    searched = []
    for folder in folders:
        found = {}
        for part, stem in zip(_PARTS, dataset.files, strict=True):
            for candidate in (folder / stem, folder / f"{stem}.gz"):
                if candidate.is_file():
                    found[part] = candidate
                    break
        if len(found) == len(_PARTS):
            return found
        missing = [stem for part, stem in zip(_PARTS, dataset.files, strict=True) if part not in found]
        searched.append(f"{folder} (missing {', '.join(missing)})" if found else str(folder))
    where = f"looked in {'; '.join(searched)}" if searched else "no root (--data-dir) was given"
    raise DatasetNotFoundError(
        f"{name}: the IDX files {', '.join(dataset.files)} (each raw or .gz) were not found: {where}. "
        f"To get them: {dataset.source}"
    )


def load_idx_task(name: str, root: str | Path | None = None, *, standardize: bool = True) -> ImageTask:
    """Returns the ``ImageTask`` of IDX data set ``name`` (one of ``IDX_DATASETS``), images ``[N, 1, 28, 28]``.

    The files are found by ``find_idx_files(name, root)``. EMNIST images are transposed back to upright (as
    torchvision does) and EMNIST letters' labels 1..26 become 0..25. Statistics come from the training part
    only; see ``image_task``.
    """
    flag("standardize", standardize)
    dataset = IDX_DATASETS[choice("name", name, tuple(IDX_DATASETS))]
    paths = find_idx_files(name, root)
    parts = []
    for split in ("train", "test"):
        images_path, labels_path = paths[f"{split}-images"], paths[f"{split}-labels"]
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.dtype != torch.uint8 or images.dim() != 3:
            raise ValueError(
                f"{images_path}: holds {images.dtype} values of shape {tuple(images.shape)}: expected uint8 "
                "images [N, H, W]"
            )
        if labels.dtype != torch.uint8 or labels.dim() != 1 or len(labels) != len(images):
            raise ValueError(
                f"{labels_path}: holds {labels.dtype} values of shape {tuple(labels.shape)}: expected uint8 labels "
                f"[{len(images)}], one per image of {images_path}"
            )
        labels = labels.to(torch.int64) - dataset.first_label
        low, high = int(labels.min()) + dataset.first_label, int(labels.max()) + dataset.first_label
        if low < dataset.first_label or high >= dataset.first_label + len(dataset.classes):
            raise ValueError(
                f"{labels_path}: holds labels in [{low}, {high}]: expected labels in [{dataset.first_label}, "
                f"{dataset.first_label + len(dataset.classes) - 1}] for the {len(dataset.classes)} classes of {name}"
            )
        if dataset.transposed:
            images = images.transpose(1, 2).contiguous()
        parts += [images.unsqueeze(1), labels]
    train_pixels, train_labels, heldout_pixels, heldout_labels = parts
    return image_task(train_pixels, train_labels, heldout_pixels, heldout_labels, dataset.classes, standardize=standardize)
