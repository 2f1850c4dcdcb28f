"""Image folders (one subfolder per class, torchvision's ``ImageFolder`` layout) read by worker processes.

Layout: when ``<root>/train`` exists it trains and the first of ``<root>/val``, ``<root>/test``,
``<root>/validation`` is held out (both with the same class subfolders). Otherwise ``<root>`` itself holds the
class subfolders and the split is fixed, never random: sample ``i`` of ``ImageFolder``'s sorted order is held
out iff ``i % 5 == 0``, as in the digits task.

Images are decoded by ``torchvision.io.decode_image`` (PNG, JPEG, GIF, WebP): all in grayscale when the first
training image has one channel (or gray and alpha), all in RGB otherwise. Images whose size differs from
``image_size`` (by default the first training image's) are resized with antialiasing. A batch's images become
``float32`` as ``(x / 255 - mean) / std`` per channel (``x / 255`` with ``standardize=False``), through one
256-entry table per channel, as in ``image_task``. The statistics come from the training part only: exact over
all its images when it has at most ``STATISTICS_IMAGES``, else over that many evenly spaced ones.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, Subset

from composer_fn.core.random import key
from composer_fn.core.validate import flag, integer, is_integer
from composer_fn.data.digits import HELDOUT_EVERY
from composer_fn.data.images import DatasetNotFoundError, histogram_statistics, pixel_tables, pixels_to_float
from composer_fn.data.loader import _rank_and_world_size, epoch_order, rank_slice

__all__ = [
    "FolderTask",
    "FolderLoader",
    "UnreadableImage",
    "GlobalBatchSampler",
    "load_image_folder_task",
    "IMAGE_EXTENSIONS",
    "STATISTICS_IMAGES",
    "HELDOUT_FOLDERS",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".webp")
"""The file name endings read as images (case-insensitive): what ``torchvision.io.decode_image`` decodes."""

STATISTICS_IMAGES = 4096
"""The most training images the per-channel mean and standard deviation are computed over."""

HELDOUT_FOLDERS = ("val", "test", "validation")
"""Beside ``train/``, the held-out folder is the first of these that exists."""

_LEVELS = 256
_STATISTICS_CHUNK = 256


@dataclass(frozen=True, eq=False)
class FolderTask:
    """An image folder task: loaders of ``(images float32 [B, C, H, W], labels int64 [B])`` batches.

    ``train`` shuffles (keyed by the seed) and drops the last incomplete global batch; ``heldout`` visits every
    held-out image once, in order. ``classes[i]`` names label ``i`` (the sorted subfolder names); ``mean`` and
    ``std`` are the training part's per-channel statistics in ``[0, 1]`` scale.
    """

    train: FolderLoader
    heldout: FolderLoader
    num_classes: int
    image_shape: tuple[int, int, int]
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]


class GlobalBatchSampler(DistributedSampler):
    """This rank's share of world-size-invariant global batches, as a ``DistributedSampler``.

    The order of epoch ``e`` is ``permutation(fold_in(key(seed), e), n)`` with ``shuffle``, else ``arange(n)``
    (``TensorLoader``'s). It is cut into global batches of ``batch_size * num_replicas``, and rank ``r`` takes
    the ``r``-th contiguous slice of ``batch_size`` of each; unlike ``DistributedSampler``'s interleaving, the
    ranks' batches of a step concatenated in rank order are the one-process global batch. With ``drop_last``
    the last incomplete global batch is dropped; without it every sample is visited once (``total_size`` is the
    data set's length, nothing is repeated) and the higher ranks' last slices may be short or empty.

    ``__iter__`` yields this rank's indices of the epoch set by ``set_epoch`` and ``__len__`` counts them, as a
    ``DistributedSampler`` does; ``batches`` yields them grouped by step, empty groups included.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        rank, world_size = _rank_and_world_size(rank, world_size)
        super().__init__(
            dataset,
            num_replicas=world_size,
            rank=rank,
            shuffle=flag("shuffle", shuffle),
            drop_last=flag("drop_last", drop_last),
        )
        self.batch_size = integer("batch_size", batch_size, minimum=1)
        self.seed = seed
        self._root = key(seed)  # validates seed
        self.dataset_size = len(dataset)
        global_batch = batch_size * world_size
        if drop_last:
            self.num_batches = self.dataset_size // global_batch
            self.total_size = self.num_batches * global_batch
            self.num_samples = self.num_batches * batch_size
        else:
            self.num_batches = math.ceil(self.dataset_size / global_batch)
            self.total_size = self.dataset_size
            whole, rest = divmod(self.dataset_size, global_batch)
            self.num_samples = whole * batch_size + max(0, min(batch_size, rest - rank * batch_size))

    def order(self, epoch: int) -> Tensor:
        """Returns the ``int64`` sample indices of ``epoch`` in the order they are visited."""
        return epoch_order(self._root, epoch, self.dataset_size, self.shuffle)

    def batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """Returns an iterator over this rank's index lists of ``epoch``'s batches from batch ``start`` on."""
        order = self.order(epoch)
        for batch in range(start, self.num_batches):
            yield order[rank_slice(batch, self.batch_size, self.rank, self.num_replicas, self.dataset_size)].tolist()

    def __iter__(self) -> Iterator[int]:
        return (index for batch in self.batches(self.epoch) for index in batch)

    def __len__(self) -> int:
        return self.num_samples


class _EpochBatches:
    """The batch sampler a ``DataLoader`` draws from: the chosen epoch's batches from the chosen one on, or, for a
    one-off pass, the given index lists."""

    def __init__(self, sampler: GlobalBatchSampler) -> None:
        self.sampler = sampler
        self.epoch = 0
        self.start = 0
        self.lists: list[list[int]] | None = None

    def __iter__(self) -> Iterator[list[int]]:
        if self.lists is not None:
            return iter(self.lists)
        return self.sampler.batches(self.epoch, self.start)

    def __len__(self) -> int:
        if self.lists is not None:
            return len(self.lists)
        return self.sampler.num_batches - self.start


class FolderLoader:
    """Batches of a map-style data set read by ``DataLoader`` workers, in the order ``TensorLoader`` would use.

    ``dataset[i]`` returns one sample and ``collate_fn`` (run in the workers) turns a list of samples into a
    batch; it must also turn an empty list into an empty batch, which a rank receives when its slice of the
    epoch's last global batch is empty. ``transform_batch``, when set, maps each batch in this process (after
    the workers hand it over: e.g. ``uint8`` to ``float32``, which keeps the transfer four times smaller).
    Sharding follows ``GlobalBatchSampler`` (``sampler``): ``batch_size`` is each rank's, the ranks' batches of
    a step concatenated in rank order are the one-process batch of ``global_batch_size``, and every rank has
    ``len(self)`` batches. With ``drop_last`` (what training uses, since a rank cannot be handed an empty
    training batch) the last incomplete global batch is dropped. ``num_workers > 0`` reads with that many
    persistent worker processes; the batches are bitwise those of ``num_workers=0``. Call ``set_epoch`` before
    iterating each epoch; one iteration at a time per loader.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        collate_fn: Callable[[list[Any]], Any],
        transform_batch: Callable[[Any], Any] | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if len(dataset) < 1:
            raise ValueError(f"dataset holds {len(dataset)} samples: expected at least one")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.transform_batch = transform_batch
        self.num_workers = integer("num_workers", num_workers, minimum=0)
        self.pin_memory = flag("pin_memory", pin_memory)
        self.sampler = GlobalBatchSampler(
            dataset,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )
        self._batches = _EpochBatches(self.sampler)
        self._passes = 0
        self.dataloader = DataLoader(
            dataset,
            batch_sampler=self._batches,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            persistent_workers=num_workers > 0,
            # Only the workers' seeds come from it, and nothing random happens in them: a private generator keeps
            # the DataLoader off torch's global random state.
            generator=torch.Generator().manual_seed(0),
        )

    batch_size = property(lambda self: self.sampler.batch_size, doc="Returns each rank's batch size.")
    shuffle = property(
        lambda self: self.sampler.shuffle, doc="Returns whether each epoch's order is shuffled."
    )
    drop_last = property(
        lambda self: self.sampler.drop_last, doc="Returns whether the last short batch is dropped."
    )
    seed = property(lambda self: self.sampler.seed, doc="Returns the seed of the epochs' orders.")
    rank = property(lambda self: self.sampler.rank, doc="Returns this process's rank.")
    world_size = property(lambda self: self.sampler.num_replicas, doc="Returns the number of processes.")

    @property
    def dataset_size(self) -> int:
        """Returns the number of samples in the data set."""
        return self.sampler.dataset_size

    @property
    def epoch(self) -> int:
        """Returns the epoch whose order ``__iter__`` follows."""
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next ``__iter__`` follows."""
        self.sampler.set_epoch(integer("epoch", epoch, minimum=0))

    @property
    def global_batch_size(self) -> int:
        """Returns the number of samples a step takes across all ranks: ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    def global_samples(self, batch_in_epoch: int) -> int:
        """Returns the number of samples all ranks' ``batch_in_epoch``-th batches of an epoch hold together."""
        if batch_in_epoch >= len(self):
            return 0
        return max(
            0, min(self.global_batch_size, self.dataset_size - batch_in_epoch * self.global_batch_size)
        )

    def __len__(self) -> int:
        """Returns the number of batches in one epoch (the same on every rank)."""
        return self.sampler.num_batches

    def order(self, epoch: int) -> Tensor:
        """Returns the ``int64`` sample indices of ``epoch`` in the order they are visited."""
        return self.sampler.order(epoch)

    def __iter__(self) -> Iterator[Any]:
        """Returns an iterator over the batches of the selected epoch."""
        return self.iter_from(self.epoch, 0)

    def iter_from(self, epoch: int, batch_in_epoch: int) -> Iterator[Any]:
        """Returns an iterator over the batches of ``epoch`` from batch ``batch_in_epoch`` on.

        The skipped batches' samples are never read. ``batch_in_epoch`` may equal ``len(self)``, which yields
        nothing (a run saved at the end of an epoch).
        """
        self._batches.epoch = integer("epoch", epoch, minimum=0)
        self._batches.start = integer("batch_in_epoch", batch_in_epoch, minimum=0, maximum=len(self))
        self._batches.lists = None
        batches = self._pass(iter(self.dataloader))
        if self.transform_batch is None:
            return batches
        return map(self.transform_batch, batches)

    def _pass(self, batches: Iterator[Any]) -> Iterator[Any]:
        # Persistent workers serve one pass at a time: a new pass resets the one in flight, whose batches would
        # silently come from the new pass's order. The older pass is stopped with an error instead.
        if self.num_workers == 0:
            return batches
        self._passes += 1
        return self._checked_pass(batches, self._passes)

    def _checked_pass(self, batches: Iterator[Any], mine: int) -> Iterator[Any]:
        while True:
            # Checked before and after each batch is taken: a newer pass may have started, or even ended, meanwhile.
            self._check_pass(mine)
            batch = next(batches, None)
            self._check_pass(mine)
            if batch is None:
                return
            yield batch

    def _check_pass(self, mine: int) -> None:
        if self._passes != mine:
            raise RuntimeError(
                "a FolderLoader pass was started while another was in progress; its worker processes serve one pass "
                "at a time: finish (or drop) one before starting the next, or use a loader with num_workers=0"
            )

    def read(self, index_lists: Sequence[Sequence[int]]) -> Iterator[Any]:
        """Returns an iterator over the workers' batches of ``index_lists`` (not transformed), in order.

        For one-off passes over chosen samples, such as statistics, by the same worker processes; it does not
        change the epoch or the order of the batches that ``__iter__`` yields.
        """
        self._batches.lists = [list(indices) for indices in index_lists]
        return self._pass(iter(self.dataloader))

    def in_order(self, batch_size: int | None = None) -> FolderLoader:
        """Returns a loader of the same samples in the data set's own order, every one of them (no shuffle), in
        batches of ``batch_size`` (this loader's by default)."""
        return FolderLoader(
            self.dataset,
            self.batch_size if batch_size is None else batch_size,
            collate_fn=self.collate_fn,
            transform_batch=self.transform_batch,
            shuffle=False,
            seed=self.seed,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            rank=self.rank,
            world_size=self.world_size,
        )

    def __repr__(self) -> str:
        return (
            f"FolderLoader(dataset_size={self.dataset_size}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, seed={self.seed}, epoch={self.epoch}, num_workers={self.num_workers}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )


class UnreadableImage(ValueError):
    """An image file that cannot be decoded, named with its path.

    Raised in a worker process, a ``DataLoader`` raises it again in the main process built from a message that
    holds the worker's whole traceback; its own line, the last one, is all it keeps.
    """

    def __init__(self, message: str) -> None:
        marker = f"{type(self).__name__}: "
        if "Original Traceback" in message and marker in message:
            message = message.rsplit(marker, 1)[1].strip()
        super().__init__(message)


class _Decode:
    """Reads one image file as ``uint8 [C, H, W]`` in ``mode`` (gray, rgb or unchanged), resized to ``size``."""

    def __init__(self, mode: str, size: tuple[int, int] | None) -> None:
        self.mode = mode
        self.size = size

    def __call__(self, path: str) -> Tensor:
        # Deferred so that importing composer_fn.data does not pay for torchvision; after the first call the
        # import is a dictionary look-up.
        from torchvision.io import ImageReadMode, decode_image

        try:
            image = decode_image(path, mode=getattr(ImageReadMode, self.mode.upper()))
        except (RuntimeError, ValueError, OSError) as error:
            raise UnreadableImage(
                f"{path}: cannot be decoded as an image ({error}): expected a PNG, JPEG, GIF or WebP file"
            ) from None
        if image.dim() == 4:  # an animated GIF: its first frame
            image = image[0]
        if image.dtype == torch.uint16:  # a 16-bit PNG: its 8 high bits, as 8-bit readers show it
            image = (image.to(torch.int32) >> 8).to(torch.uint8)
        if self.size is not None and tuple(image.shape[1:]) != self.size:
            from torchvision.transforms.v2.functional import resize

            image = resize(image, list(self.size), antialias=True)
        return image


class _StackPixels:
    """Stacks ``(uint8 image, label)`` samples into NumPy ``(uint8 [B, C, H, W], int64 [B])``; none, an empty batch.

    NumPy arrays travel from a worker inside the pickled message; tensors would each be shared through a file
    descriptor, which costs a round trip per tensor (milliseconds) and dominates batches of small images.
    """

    def __init__(self, image_shape: tuple[int, int, int]) -> None:
        self.image_shape = image_shape

    def __call__(self, samples: Sequence[tuple[Tensor, int]]) -> tuple[np.ndarray, np.ndarray]:
        if not samples:
            return np.empty((0, *self.image_shape), dtype=np.uint8), np.empty(0, dtype=np.int64)
        pixels = torch.stack([image for image, _ in samples]).numpy()
        return pixels, np.array([label for _, label in samples], dtype=np.int64)


class _ToFloat:
    """Maps a NumPy ``(uint8 pixels, labels)`` batch to tensors ``(float32 images, int64 labels)`` through
    per-channel tables."""

    def __init__(self, tables: np.ndarray, pin_memory: bool) -> None:
        self.tables = tables
        self.pin_memory = pin_memory

    def __call__(self, batch: tuple[np.ndarray, np.ndarray]) -> tuple[Tensor, Tensor]:
        pixels, labels = batch
        images = torch.empty(pixels.shape, dtype=torch.float32, pin_memory=self.pin_memory)
        pixels_to_float(torch.from_numpy(pixels), self.tables, out=images)
        targets = torch.from_numpy(labels)
        return images, targets.pin_memory() if self.pin_memory else targets


def _is_image(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


def _scan(folder: Path) -> Any:
    from torchvision.datasets import ImageFolder

    try:
        images = ImageFolder(str(folder), loader=_Decode("unchanged", None), is_valid_file=_is_image)
    except FileNotFoundError as error:
        raise DatasetNotFoundError(
            f"{folder}: {str(error).strip()} Expected one subfolder per class, each holding images "
            f"({', '.join(IMAGE_EXTENSIONS)})"
        ) from None
    if len(images.classes) < 2:
        raise ValueError(
            f"{folder}: holds one class subfolder ({images.classes[0]!r}): a classifier of one class is right by "
            "construction, so its held-out accuracy would say nothing; expected at least 2 class subfolders"
        )
    bad = [(path, why) for path, _ in images.samples if (why := _header_fault(path)) is not None]
    if bad:
        listed = "; ".join(f"{path}: {why}" for path, why in bad[:10])
        more = f"; and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise ValueError(
            f"{folder}: {len(bad)} of its {len(images.samples)} image files cannot be read as images: {listed}{more}. "
            "Expected PNG, JPEG, GIF or WebP files whose contents match their names; remove or replace them"
        )
    return images


_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)


def _header_fault(path: str) -> str | None:
    """Returns why the file at ``path`` is no image by its first bytes (empty, another format, a PNG header cut
    short), or None: the header read that checks every file of a folder before the first step."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(32)
    except OSError as error:
        return f"cannot be opened ({error.strerror or error})"
    if not head:
        return "empty"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return None
    kind = next((name for signature, name in _SIGNATURES if head.startswith(signature)), None)
    if kind is None:
        return f"not an image (it starts with bytes {head[:8].hex(' ')})"
    if kind == "PNG" and (len(head) < 29 or head[12:16] != b"IHDR"):
        return "a PNG whose header is cut short"
    return None


def _samples(dataset: Any) -> list[tuple[str, int]]:
    if isinstance(dataset, Subset):
        whole: Any = dataset.dataset
        return [whole.samples[i] for i in dataset.indices]
    samples: list[tuple[str, int]] = dataset.samples
    return samples


def _image_size(image_size: object) -> tuple[int, int] | None:
    if image_size is None:
        return None
    if is_integer(image_size) and image_size >= 1:
        return (int(image_size), int(image_size))
    if isinstance(image_size, tuple | list) and len(image_size) == 2 and all(is_integer(s) and s >= 1 for s in image_size):
        return (int(image_size[0]), int(image_size[1]))
    raise ValueError(f"image_size={image_size!r} must be None, an int >= 1 or a (height, width) pair of them")


def _training_statistics(loader: FolderLoader, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Returns the per-channel statistics of (at most ``STATISTICS_IMAGES`` evenly spaced) training images, read
    by the training loader's own workers."""
    size = loader.dataset_size
    if size <= STATISTICS_IMAGES:
        chosen = list(range(size))
    else:
        chosen = [i * size // STATISTICS_IMAGES for i in range(STATISTICS_IMAGES)]
    chunks = [chosen[start : start + _STATISTICS_CHUNK] for start in range(0, len(chosen), _STATISTICS_CHUNK)]
    counts = np.zeros((channels, _LEVELS), dtype=np.int64)
    for pixels, _ in loader.read(chunks):
        for channel in range(pixels.shape[1]):
            values = torch.from_numpy(pixels[:, channel].reshape(-1))
            counts[channel] += torch.bincount(values, minlength=_LEVELS).numpy()
    return histogram_statistics(counts)


def load_image_folder_task(
    root: str | Path,
    *,
    image_size: int | tuple[int, int] | None = None,
    batch_size: int = 64,
    eval_batch_size: int = 256,
    num_workers: int = 0,
    seed: int = 0,
    standardize: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
) -> FolderTask:
    """Returns the ``FolderTask`` of the image folder at ``root`` (see the module docstring for its layout).

    ``image_size`` (an int or ``(height, width)``; default: the first training image's) is the size every image
    is resized to. ``batch_size`` and ``eval_batch_size`` are per rank; ``rank`` and ``world_size`` default as
    ``TensorLoader``'s. ``num_workers`` processes decode the images of each loader. Raises
    ``DatasetNotFoundError`` for a missing or empty folder and ``ValueError`` naming the file for an image that
    cannot be decoded.
    """
    integer("batch_size", batch_size, minimum=1)
    integer("eval_batch_size", eval_batch_size, minimum=1)
    integer("num_workers", num_workers, minimum=0)
    flag("standardize", standardize)
    size = _image_size(image_size)
    root = Path(root)
    if not root.is_dir():
        raise DatasetNotFoundError(
            f"{root}: no such folder: expected a folder of class subfolders of images, or train/ and val/ "
            "(or test/, validation/) folders of them"
        )
    if (root / "train").is_dir():
        heldout_folder = next((root / name for name in HELDOUT_FOLDERS if (root / name).is_dir()), None)
        if heldout_folder is None:
            raise DatasetNotFoundError(
                f"{root}: has train/ but none of {', '.join(n + '/' for n in HELDOUT_FOLDERS)}: expected a held-out "
                "folder with the same class subfolders"
            )
        train_images, heldout_images = _scan(root / "train"), _scan(heldout_folder)
        if train_images.classes != heldout_images.classes:
            only_train = sorted(set(train_images.classes) - set(heldout_images.classes))
            only_heldout = sorted(set(heldout_images.classes) - set(train_images.classes))
            raise ValueError(
                f"{heldout_folder}: its classes differ from {root / 'train'}'s: only in train/ {only_train}, only in "
                f"{heldout_folder.name}/ {only_heldout}; expected the same class subfolders"
            )
        folders = [train_images, heldout_images]
        train_set: Any = train_images
        heldout_set: Any = heldout_images
    else:
        images = _scan(root)
        index = range(len(images))
        folders = [images]
        train_set = Subset(images, [i for i in index if i % HELDOUT_EVERY != 0])
        heldout_set = Subset(images, [i for i in index if i % HELDOUT_EVERY == 0])
        if len(train_set) == 0:
            raise ValueError(
                f"{root}: holds {len(images)} image(s): expected at least 2, since every {HELDOUT_EVERY}th is held out"
            )
    first_path = _samples(train_set)[0][0]
    first = _Decode("unchanged", None)(first_path)
    channels = 1 if first.shape[0] <= 2 else 3
    size = size or (int(first.shape[1]), int(first.shape[2]))
    decode = _Decode("gray" if channels == 1 else "rgb", size)
    for folder in folders:
        folder.loader = decode

    loader_world = _rank_and_world_size(rank, world_size)
    if len(train_set) < batch_size * loader_world[1]:
        raise ValueError(
            f"{root}: holds {len(train_set)} training images, fewer than one global batch of batch_size={batch_size} "
            f"× {loader_world[1]} processes: the training loader, which drops the last incomplete batch, would be "
            "empty; lower batch_size"
        )
    image_shape = (channels, *size)
    # Workers hand over uint8 pixels; this process turns them into floats once the statistics are known.
    make = functools.partial(
        FolderLoader,
        collate_fn=_StackPixels(image_shape),
        seed=seed,
        num_workers=num_workers,
        rank=loader_world[0],
        world_size=loader_world[1],
    )
    train = make(train_set, batch_size, shuffle=True, drop_last=True)
    heldout = make(heldout_set, eval_batch_size, shuffle=False, drop_last=False)
    mean, std = _training_statistics(train, channels)
    to_float = _ToFloat(
        pixel_tables(mean, std, standardize=standardize), pin_memory=torch.cuda.is_available()
    )
    train.transform_batch = heldout.transform_batch = to_float
    return FolderTask(
        train=train,
        heldout=heldout,
        num_classes=len(folders[0].classes),
        image_shape=image_shape,
        classes=tuple(folders[0].classes),
        mean=mean,
        std=std,
    )
