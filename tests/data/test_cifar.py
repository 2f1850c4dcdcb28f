"""CIFAR binary files: exact reads, size checks, class names and the missing-folder message."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from composer_fn.data import DatasetNotFoundError, ImageTask, load_cifar_task, load_dataset
from composer_fn.data.cifar import (
    CIFAR100_CLASSES,
    CIFAR100_COARSE_CLASSES,
    read_cifar_batch,
    write_cifar_batch,
)


def _images(count: int, offset: int) -> torch.Tensor:
    index = torch.arange(count * 3 * 32 * 32, dtype=torch.int64).view(count, 3, 32, 32)
    # Each channel has its own range, so per-channel statistics differ.
    channel_range = torch.tensor([256, 200, 120]).view(1, 3, 1, 1)
    return ((index * 31 + offset * 17) % channel_range).to(torch.uint8)


def _write_cifar10(folder: Path, per_batch: int = 4) -> tuple[torch.Tensor, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    images = [_images(per_batch, i) for i in range(6)]
    labels = [(torch.arange(per_batch) * (i + 3)) % 10 for i in range(6)]
    for i in range(5):
        write_cifar_batch(folder / f"data_batch_{i + 1}.bin", images[i], labels[i])
    write_cifar_batch(folder / "test_batch.bin", images[5], labels[5])
    return torch.cat(images[:5]), torch.cat(labels[:5]), images[5], labels[5]


def _write_cifar100(folder: Path) -> tuple[torch.Tensor, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    train_images, heldout_images = _images(10, 0), _images(5, 1)
    train_fine, heldout_fine = torch.arange(10) * 11 % 100, torch.arange(5) * 2 + 90
    train_coarse, heldout_coarse = torch.arange(10) % 20, torch.arange(5) + 15
    write_cifar_batch(folder / "train.bin", train_images, train_fine, coarse=train_coarse)
    write_cifar_batch(folder / "test.bin", heldout_images, heldout_fine, coarse=heldout_coarse)
    return train_images, train_fine, train_coarse, heldout_images, heldout_fine, heldout_coarse


def test_a_record_is_a_label_byte_then_the_channel_planes(tmp_path: Path) -> None:
    images = _images(2, 0)
    write_cifar_batch(tmp_path / "b.bin", images, torch.tensor([3, 7]))
    raw = (tmp_path / "b.bin").read_bytes()
    assert len(raw) == 2 * 3073 and raw[0] == 3 and raw[3073] == 7
    assert raw[1:1025] == images[0, 0].numpy().tobytes() and raw[2049:3073] == images[0, 2].numpy().tobytes()
    read_images, read_labels = read_cifar_batch(tmp_path / "b.bin", 1)
    assert torch.equal(read_images, images) and read_labels[:, 0].tolist() == [3, 7]


@pytest.mark.parametrize("layout", ["cifar-10-batches-bin", "."])
def test_cifar10_reads_back_exactly_from_both_layouts(tmp_path: Path, layout: str) -> None:
    train_images, train_labels, heldout_images, heldout_labels = _write_cifar10(tmp_path / layout)
    task = load_cifar_task("cifar10", tmp_path, standardize=False)
    assert isinstance(task, ImageTask)
    assert task.image_shape == (3, 32, 32) and task.num_classes == 10 and task.classes[0] == "airplane"
    assert torch.equal(task.pixels[0], train_images) and torch.equal(task.pixels[1], heldout_images)
    assert torch.equal(task.train[1], train_labels) and torch.equal(task.heldout[1], heldout_labels)
    assert torch.equal(task.train[0], train_images.float() / 255)


def test_cifar10_statistics_are_per_channel_and_from_the_training_part(tmp_path: Path) -> None:
    train_images, *_ = _write_cifar10(tmp_path)
    task = load_cifar_task("cifar10", tmp_path)
    pixels = train_images.double() / 255
    assert task.mean == pytest.approx(tuple(pixels.mean(dim=(0, 2, 3)).tolist()), abs=1e-12)
    assert task.std == pytest.approx(tuple(pixels.std(dim=(0, 2, 3), correction=0).tolist()), abs=1e-12)
    assert len(set(task.mean)) == 3
    channel_means = task.train[0].double().mean(dim=(0, 2, 3))
    assert torch.allclose(channel_means, torch.zeros(3, dtype=torch.float64), atol=1e-6)


def test_class_names_come_from_the_meta_file_when_present(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    names = [f"class{i}" for i in range(10)]
    (tmp_path / "batches.meta.txt").write_text("\n".join(names) + "\n\n")
    assert load_cifar_task("cifar10", tmp_path).classes == tuple(names)
    (tmp_path / "batches.meta.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"batches.meta.txt: lists 2 class names: expected 10"):
        load_cifar_task("cifar10", tmp_path)


def test_cifar100_gives_fine_or_coarse_labels(tmp_path: Path) -> None:
    train_images, train_fine, train_coarse, heldout_images, heldout_fine, heldout_coarse = _write_cifar100(
        tmp_path / "cifar-100-binary"
    )
    fine = load_cifar_task("cifar100", tmp_path)
    assert fine.num_classes == 100 and fine.classes == CIFAR100_CLASSES and len(set(CIFAR100_CLASSES)) == 100
    assert torch.equal(fine.train[1], train_fine) and torch.equal(fine.heldout[1], heldout_fine)
    assert torch.equal(fine.pixels[0], train_images) and torch.equal(fine.pixels[1], heldout_images)
    coarse = load_cifar_task("cifar100", tmp_path, label_mode="coarse")
    assert coarse.num_classes == 20 and coarse.classes == CIFAR100_COARSE_CLASSES
    assert torch.equal(coarse.train[1], train_coarse) and torch.equal(coarse.heldout[1], heldout_coarse)
    with pytest.raises(ValueError, match="label_mode='coarse'"):
        load_cifar_task("cifar10", tmp_path, label_mode="coarse")


def test_a_size_that_is_not_a_whole_number_of_records_is_refused_naming_the_file(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(path.read_bytes() + b"\x00" * 5)
    with pytest.raises(
        ValueError, match=r"holds 12297 bytes: expected a non-zero multiple of the 3073-byte"
    ) as raised:
        load_cifar_task("cifar10", tmp_path)
    assert str(path) in str(raised.value)


def test_an_empty_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    path = tmp_path / "test_batch.bin"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty") as raised:
        load_cifar_task("cifar10", tmp_path)
    assert str(path) in str(raised.value)


def test_labels_beyond_the_classes_are_refused_naming_the_file(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    write_cifar_batch(tmp_path / "test_batch.bin", _images(2, 0), torch.tensor([1, 10]))
    with pytest.raises(ValueError, match=r"test_batch.bin: holds fine labels up to 10"):
        load_cifar_task("cifar10", tmp_path)


def test_a_missing_folder_names_where_it_looked_and_the_binary_archive(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as raised:
        load_cifar_task("cifar100", tmp_path)
    message = str(raised.value)
    assert str(tmp_path / "cifar-100-binary") in message and "cifar-100-binary.tar.gz" in message
    with pytest.raises(DatasetNotFoundError, match="no root"):
        load_dataset("cifar10")
