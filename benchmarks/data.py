"""Data loading throughput on the CPU: our readers and loaders next to torchvision's on the same bytes.

Three pairs, each timed as samples per second over one shuffled training epoch in batches of 256, from the
files on disk to float batches (load and parse time included on both sides):

- Fashion-MNIST (IDX): ``load_idx_task`` + ``TensorLoader`` vs ``torchvision.datasets.FashionMNIST`` +
  ``ToTensor``/``Normalize`` + ``DataLoader``. Both read the same uncompressed files in
  ``<tmp>/FashionMNIST/raw`` (torchvision reads only raw ones): the real data when the Debian package
  ``dataset-fashion-mnist`` is installed, else 60,000 + 10,000 synthetic images.
- CIFAR-10 (binary version, ``--cifar-images`` synthetic training images): ``load_cifar_task`` +
  ``TensorLoader`` vs a map-style ``Dataset`` over ``np.memmap`` views of the same files whose samples go
  through ``ToTensor``/``Normalize`` and a ``DataLoader``. torchvision's own ``CIFAR10`` reads the pickled
  python version, which we do not read, so this is the nearest torchvision-style reader of the same bytes.
- An image folder (``--folder-images`` 32×32 PNGs in 10 classes): ``load_image_folder_task``'s training
  ``FolderLoader`` vs ``torchvision.datasets.ImageFolder`` (its default PIL loader) + ``ToTensor``/``Normalize``
  + ``DataLoader``, each with 0 and 2 worker processes, timed two ways: an epoch of loaders built beforehand
  (both with persistent workers), and an epoch including the set-up (scanning the folder, starting the
  workers; ours also computes the training statistics, one more decode of each training image, where theirs
  is given fixed constants). Both sides deliver the same samples: the training part of the fixed split (all
  images but every fifth), in batches of 256, the last incomplete one dropped.

- A Hugging Face ``datasets`` table (``--token-rows`` rows of 128 token ids, saved to disk and memory-mapped back,
  as ``datasets.load_from_disk`` gives it): our ``DatasetLoader`` vs a torch ``DataLoader`` over the same table
  (``with_format("torch")``, shuffled, default collation). A second table times a start mid-epoch, at an early, a
  middle and a late batch ``k``: the time to the first batch of ``iter_from(0, k)`` for ours, and of the ``DataLoader``'s
  epoch with its first ``k`` batches passed over (what a loader without ``iter_from`` does to resume).

Rounds rotate the order of the contenders; tables show the median rate and the ratio ours / theirs.
One intra-op thread by default.

    .venv/bin/python benchmarks/data.py [--threads 1] [--rounds 3] [--cifar-images 10000] [--folder-images 2000]
        [--token-rows 20000]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _peer import environment, format_table, pin_threads, write_json

from composer_fn.core import random as R
from composer_fn.data import TensorLoader, load_cifar_task, load_idx_task, load_image_folder_task, write_idx
from composer_fn.data.cifar import write_cifar_batch
from composer_fn.data.digits import HELDOUT_EVERY
from composer_fn.data.idx import DEBIAN_FASHION_MNIST, IDX_DATASETS

BATCH = 256
Contender = Callable[[], int]
"""Runs one epoch and returns the number of samples it yielded."""


def _synthetic_pixels(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return R.randint(R.key(seed), 0, 256, shape).to(torch.uint8)


def write_fashion_mnist(root: Path) -> str:
    """Writes the four uncompressed Fashion-MNIST IDX files under ``root/FashionMNIST/raw``; returns their source."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    stems = IDX_DATASETS["fashion-mnist"].files
    if all((DEBIAN_FASHION_MNIST / f"{stem}.gz").is_file() for stem in stems):
        for stem in stems:
            (raw / stem).write_bytes(gzip.decompress((DEBIAN_FASHION_MNIST / f"{stem}.gz").read_bytes()))
        return f"the real Fashion-MNIST from {DEBIAN_FASHION_MNIST}"
    for stem, count, part in zip(stems, (60000, 60000, 10000, 10000), range(4), strict=True):
        shape = (count, 28, 28) if part % 2 == 0 else (count,)
        values = (
            _synthetic_pixels(part, shape)
            if part % 2 == 0
            else R.randint(R.key(part), 0, 10, shape).to(torch.uint8)
        )
        write_idx(raw / stem, values)
    return "synthetic Fashion-MNIST-shaped files (dataset-fashion-mnist is not installed)"


def write_cifar10(root: Path, images: int) -> None:
    """Writes ``images`` synthetic training images as five batches and a fifth of that as the test batch."""
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    per_batch = images // 5
    for index, name in enumerate([f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]):
        pixels = _synthetic_pixels(10 + index, (per_batch, 3, 32, 32))
        labels = R.randint(R.key(20 + index), 0, 10, (per_batch,))
        write_cifar_batch(folder / name, pixels, labels)


def write_folder(root: Path, images: int) -> None:
    """Writes ``images`` 32×32 RGB PNGs spread over 10 class folders (smooth pictures, as photos compress)."""
    import warnings

    from torchvision.io import write_png

    warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision")
    grid = torch.linspace(0, 1, 32)
    for index in range(images):
        folder = root / f"class_{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        phase = R.uniform(R.key(100 + index), (3, 1, 1)) * 6.28
        picture = 127.5 + 127.5 * torch.sin(
            grid.view(1, 32, 1) * (3 + index % 7) + grid.view(1, 1, 32) * 5 + phase
        )
        noise = R.uniform(R.key(10_000 + index), (3, 32, 32)) * 24
        write_png((picture * 0.9 + noise).clamp(0, 255).to(torch.uint8), str(folder / f"{index:05d}.png"))


def _epoch(batches: Any) -> int:
    samples = 0
    for images, labels in batches:
        samples += len(labels)
        assert images.dtype == torch.float32
    return samples


def ours_in_memory(load: Callable[[], Any]) -> Contender:
    def run() -> int:
        task = load()
        return _epoch(TensorLoader(task.train, BATCH, shuffle=True, drop_last=False, seed=0))

    return run


def torchvision_fashion_mnist(root: Path) -> Contender:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])

    def run() -> int:
        dataset = datasets.FashionMNIST(str(root), train=True, transform=transform, download=False)
        generator = torch.Generator().manual_seed(0)
        return _epoch(
            torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=generator)
        )

    return run


class MemmapCifar(torch.utils.data.Dataset):
    """CIFAR-10 binary records read through ``np.memmap``, one record per sample, as a torchvision-style dataset."""

    def __init__(self, folder: Path, transform: Any) -> None:
        self.records = [
            np.memmap(folder / f"data_batch_{i}.bin", dtype=np.uint8, mode="r").reshape(-1, 3073)
            for i in range(1, 6)
        ]
        self.per_file = len(self.records[0])
        self.transform = transform

    def __len__(self) -> int:
        return self.per_file * len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        record = self.records[index // self.per_file][index % self.per_file]
        # ToTensor takes height × width × channels, as a decoded picture is laid out.
        image = record[1:].reshape(3, 32, 32).transpose(1, 2, 0)
        return self.transform(np.ascontiguousarray(image)), int(record[0])


def torchvision_cifar(root: Path) -> Contender:
    from torchvision import transforms

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))]
    )

    def run() -> int:
        dataset = MemmapCifar(root / "cifar-10-batches-bin", transform)
        generator = torch.Generator().manual_seed(0)
        return _epoch(
            torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=generator)
        )

    return run


def ours_folder(root: Path, workers: int, *, setup: bool) -> Contender:
    """Returns a runner of one epoch of our training FolderLoader: built inside the run (``setup``), or once."""
    built = None if setup else load_image_folder_task(root, batch_size=BATCH, num_workers=workers)
    epochs = iter(range(1_000_000))

    def run() -> int:
        task = built or load_image_folder_task(root, batch_size=BATCH, num_workers=workers)
        task.train.set_epoch(next(epochs))
        return _epoch(task.train)

    if built is not None:
        run()  # starts the workers
    return run


def torchvision_folder(root: Path, workers: int, *, setup: bool) -> Contender:
    """Returns a runner of one epoch of ImageFolder + DataLoader: built inside the run (``setup``), or once."""
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]
    )

    def build() -> torch.utils.data.DataLoader:
        images = datasets.ImageFolder(str(root), transform=transform)
        # The same training images as ours (all but every fifth), in batches of the same size.
        dataset = torch.utils.data.Subset(images, [i for i in range(len(images)) if i % HELDOUT_EVERY != 0])
        generator = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            generator=generator,
            persistent_workers=workers > 0 and not setup,
        )

    built = None if setup else build()

    def run() -> int:
        return _epoch(built or build())

    if built is not None:
        run()
    return run


def write_token_table(root: Path, rows: int) -> Any:
    """Returns a ``datasets`` table of ``rows`` rows of 128 keyed token ids, saved under ``root`` and read back
    memory-mapped."""
    import datasets

    ids = R.randint(R.key(7), 0, 50_000, (rows, 128))
    datasets.Dataset.from_dict({"input_ids": ids.numpy(), "labels": ids.numpy()}).save_to_disk(str(root / "tokens"))
    return datasets.load_from_disk(str(root / "tokens"))


def _token_epoch(batches: Any) -> int:
    rows = 0
    for batch in batches:
        rows += len(batch["input_ids"])
        assert batch["input_ids"].dtype == torch.int64
    return rows


def ours_datasets(table: Any) -> Contender:
    from composer_fn.data.hf import DatasetLoader

    epochs = iter(range(1_000_000))

    def run() -> int:
        loader = DatasetLoader(table, BATCH, seed=0)
        loader.set_epoch(next(epochs))
        return _token_epoch(loader)

    return run


def torch_datasets(table: Any) -> Contender:
    def run() -> int:
        generator = torch.Generator().manual_seed(0)
        return _token_epoch(torch.utils.data.DataLoader(table.with_format("torch"), batch_size=BATCH, shuffle=True, generator=generator))

    return run


def time_to_batch(table: Any, batches: Sequence[int], rounds: int) -> dict[int, tuple[float, float]]:
    """Returns, for each start ``batch``, the median seconds to the first batch of an epoch started there: ours
    (``iter_from``), and a ``DataLoader``'s that passes over the batches before it. Ours are all timed first, so
    that none follows the other's long pass over the table."""
    import itertools

    from composer_fn.data.hf import DatasetLoader

    ours: dict[int, list[float]] = {batch: [] for batch in batches}
    theirs: dict[int, list[float]] = {batch: [] for batch in batches}
    for _ in range(rounds):
        for batch in batches:
            started = time.perf_counter()
            next(iter(DatasetLoader(table, BATCH, seed=0).iter_from(0, batch)))
            ours[batch].append(time.perf_counter() - started)
    for _ in range(rounds):
        for batch in batches:
            started = time.perf_counter()
            loader = torch.utils.data.DataLoader(table.with_format("torch"), batch_size=BATCH, shuffle=True)
            next(itertools.islice(iter(loader), batch, None))
            theirs[batch].append(time.perf_counter() - started)
    return {batch: (statistics.median(ours[batch]), statistics.median(theirs[batch])) for batch in batches}


def measure(pairs: dict[str, tuple[Contender, Contender]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Returns samples/s of ours and theirs for every pair, one sample per round, the order rotating."""
    rates: dict[str, dict[str, list[float]]] = {name: {"ours": [], "theirs": []} for name in pairs}
    runs = [
        (name, side, runner)
        for name, pair in pairs.items()
        for side, runner in zip(("ours", "theirs"), pair, strict=True)
    ]
    for round_index in range(rounds):
        shift = round_index % len(runs)
        for name, side, runner in runs[shift:] + runs[:shift]:
            started = time.perf_counter()
            samples = runner()
            rates[name][side].append(samples / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cifar-images", type=int, default=10_000)
    parser.add_argument("--folder-images", type=int, default=2_000)
    parser.add_argument("--token-rows", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    args = parser.parse_args()
    pin_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as temporary:
        root = Path(temporary)
        source = write_fashion_mnist(root)
        write_cifar10(root, args.cifar_images)
        write_folder(root / "folder", args.folder_images)
        pairs = {
            "Fashion-MNIST IDX: load_idx_task + TensorLoader | FashionMNIST + ToTensor/Normalize + DataLoader": (
                ours_in_memory(lambda: load_idx_task("fashion-mnist", root)),
                torchvision_fashion_mnist(root),
            ),
            "CIFAR-10 binary: load_cifar_task + TensorLoader | memmap Dataset + ToTensor/Normalize + DataLoader": (
                ours_in_memory(lambda: load_cifar_task("cifar10", root)),
                torchvision_cifar(root),
            ),
        }
        for workers in (0, 2):
            for setup in (False, True):
                what = "setup + first epoch" if setup else "an epoch"
                name = f"PNG folder, {workers} workers, {what}: FolderLoader | ImageFolder (PIL) + ToTensor/Normalize + DataLoader"
                pairs[name] = (
                    ours_folder(root / "folder", workers, setup=setup),
                    torchvision_folder(root / "folder", workers, setup=setup),
                )
        table = write_token_table(root, args.token_rows)
        name = "datasets table of token rows: DatasetLoader | DataLoader over the table (with_format('torch'))"
        pairs[name] = (ours_datasets(table), torch_datasets(table))
        rates = measure(pairs, args.rounds)
        batches = -(-args.token_rows // BATCH)
        starts = time_to_batch(table, (1, batches // 2, batches - 1), args.rounds)
    print(
        f"one shuffled training epoch from the files, batches of {BATCH}, CPU, {args.threads} thread(s), torch "
        f"{torch.__version__}; Fashion-MNIST: {source}; CIFAR-10: {args.cifar_images} synthetic images; folder: "
        f"{args.folder_images} 32×32 PNGs; median of {args.rounds} rounds"
    )
    rows = []
    for name, sides in rates.items():
        ours, theirs = (statistics.median(sides[side]) for side in ("ours", "theirs"))
        task, contenders = name.split(": ", 1)
        rows.append((task, contenders, f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.2f}×"))
    print(
        format_table(
            ("data", "ours | theirs", "ours samples/s", "theirs samples/s", "ours/theirs"), rows, "<<>>>"
        )
    )
    print(f"\nstarting an epoch of the datasets table ({batches} batches of {BATCH}) at batch k: seconds to its first batch")
    print(
        format_table(
            ("k", "ours (iter_from)", "DataLoader, passing over k batches", "theirs/ours"),
            [(str(k), f"{ours:.4f}", f"{theirs:.4f}", f"{theirs / ours:.0f}×") for k, (ours, theirs) in starts.items()],
            ">>>>",
        )
    )
    if args.json is not None:
        write_json(
            args.json,
            {"environment": environment(args.threads), "rates": rates, "fashion_mnist": source, "starts": starts},
        )


if __name__ == "__main__":
    main()
