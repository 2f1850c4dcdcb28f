"""IDX files: exact round trips, header-checked refusals, and the MNIST-family data sets in every layout."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from composer_fn.data import DatasetNotFoundError, ImageTask, load_dataset, load_idx_task, read_idx, write_idx
from composer_fn.data.idx import IDX_DATASETS, find_idx_files

DTYPES = {
    np.uint8: torch.uint8,
    np.int8: torch.int8,
    np.int16: torch.int16,
    np.int32: torch.int32,
    np.float32: torch.float32,
    np.float64: torch.float64,
}


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from(list(DTYPES)),
    shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5),
    gzipped=st.booleans(),
)
def test_write_then_read_gives_back_the_same_values_dtype_and_shape(
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    dtype: type,
    shape: tuple[int, ...],
    gzipped: bool,
) -> None:
    values = data.draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(np.dtype(dtype), allow_nan=False)))
    path = tmp_path_factory.mktemp("idx") / ("values.idx.gz" if gzipped else "values.idx")
    write_idx(path, torch.from_numpy(values))
    read = read_idx(path)
    assert read.dtype == DTYPES[dtype] and tuple(read.shape) == shape
    np.testing.assert_array_equal(read.numpy(), values)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == gzipped


def test_the_header_is_big_endian_as_the_format_says(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    write_idx(path, torch.tensor([1, 258], dtype=torch.int16))
    assert path.read_bytes() == bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0, 1, 1, 2])


def test_gzip_is_recognised_by_its_magic_even_without_the_suffix(tmp_path: Path) -> None:
    values = torch.arange(12, dtype=torch.uint8).view(3, 4)
    write_idx(tmp_path / "a.gz", values)
    (tmp_path / "renamed").write_bytes((tmp_path / "a.gz").read_bytes())
    assert torch.equal(read_idx(tmp_path / "renamed"), values)
    # And the other way: an unpacked file that kept its .gz name is read as it is.
    write_idx(tmp_path / "raw", values)
    (tmp_path / "unpacked-images-idx3-ubyte.gz").write_bytes((tmp_path / "raw").read_bytes())
    assert torch.equal(read_idx(tmp_path / "unpacked-images-idx3-ubyte.gz"), values)


def test_read_values_are_writable_and_fresh(tmp_path: Path) -> None:
    write_idx(tmp_path / "v", torch.zeros(3, dtype=torch.int32))
    values = read_idx(tmp_path / "v")
    values += 1
    assert torch.equal(read_idx(tmp_path / "v"), torch.zeros(3, dtype=torch.int32))


def _valid_bytes() -> bytes:
    return bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2]) + bytes(range(8))


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x08\x00\x00\x00\x08\x08\x02\x00\x00\x00"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty", b"", "empty"),
        ("truncated", _valid_bytes()[:-3], "but the file holds 5 bytes of data: truncated"),
        ("trailing", _valid_bytes() + b"\x00\x01", "2 bytes past the end"),
        ("header-cut", bytes([0, 0, 8, 3, 0, 0, 0, 2]), "truncated"),
        ("picture.png", PNG, "not an IDX file"),
        ("notes.txt", b"hello, these are not images\n", "not an IDX file"),
        ("bad-type", bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 0]), "type code 0x07"),
        ("rank-zero", bytes([0, 0, 8, 0]), "rank 0"),
        ("zero-dimension", bytes([0, 0, 8, 2, 0, 0, 0, 0, 0, 0, 0, 3]), "dimension of 0"),
        ("corrupt.gz", gzip.compress(_valid_bytes(), mtime=0)[:-12] + b"garbage!", "gzip"),
    ],
)
def test_malformed_files_are_refused_naming_the_file_and_the_fault(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as raised:
        read_idx(path)
    assert str(path) in str(raised.value)


def test_the_truncation_message_gives_the_expected_and_held_sizes(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 8, 3, 0, 0, 0xEA, 0x60, 0, 0, 0, 28, 0, 0, 0, 28]) + bytes(1000))
    with pytest.raises(ValueError) as raised:
        read_idx(path)
    assert str(raised.value) == (
        f"{path}: IDX header says 60000×28×28 uint8 (47040000 bytes) but the file holds 1000 bytes of data: truncated"
    )


def _fake_images(count: int, offset: int, height: int = 28, width: int = 28) -> torch.Tensor:
    index = torch.arange(count * height * width, dtype=torch.int64).view(count, height, width)
    return ((index * 7 + offset * 13) % 251).to(torch.uint8)


def _write_dataset(
    folder: Path, name: str, train: int = 12, heldout: int = 6, gz: bool = True, labels: tuple | None = None
) -> tuple[torch.Tensor, ...]:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = IDX_DATASETS[name]
    classes = len(dataset.classes)
    train_images, heldout_images = _fake_images(train, 0), _fake_images(heldout, 1)
    train_labels = torch.arange(train, dtype=torch.uint8) % classes + dataset.first_label
    heldout_labels = (torch.arange(heldout, dtype=torch.uint8) * 3) % classes + dataset.first_label
    if labels is not None:
        train_labels = torch.tensor(labels, dtype=torch.uint8)
    suffix = ".gz" if gz else ""
    for stem, values in zip(
        dataset.files, (train_images, train_labels, heldout_images, heldout_labels), strict=True
    ):
        write_idx(folder / f"{stem}{suffix}", values)
    return train_images, train_labels, heldout_images, heldout_labels


@pytest.mark.parametrize("layout", ["FashionMNIST/raw", "FashionMNIST", "."])
@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_loads_from_every_layout(tmp_path: Path, layout: str, gz: bool) -> None:
    train_images, train_labels, heldout_images, heldout_labels = _write_dataset(
        tmp_path / layout, "fashion-mnist", gz=gz
    )
    task = load_idx_task("fashion-mnist", tmp_path)
    assert isinstance(task, ImageTask)
    assert task.image_shape == (1, 28, 28) and task.num_classes == 10
    assert task.classes[0] == "T-shirt/top" and task.classes[9] == "Ankle boot"
    assert task.train[0].shape == (12, 1, 28, 28) and task.train[0].dtype == torch.float32
    assert task.heldout[0].shape == (6, 1, 28, 28)
    assert torch.equal(task.train[1], train_labels.long()) and task.train[1].dtype == torch.int64
    assert torch.equal(task.heldout[1], heldout_labels.long())
    assert torch.equal(task.pixels[0], train_images.unsqueeze(1))
    assert torch.equal(task.pixels[1], heldout_images.unsqueeze(1))


def test_standardisation_uses_the_training_pixels_only(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "mnist")
    task = load_idx_task("mnist", tmp_path)
    train = task.pixels[0].double() / 255
    assert task.mean == pytest.approx((train.mean().item(),), abs=1e-12)
    assert task.std == pytest.approx((train.std(correction=0).item(),), abs=1e-12)
    expected = ((task.pixels[1].double() / 255 - task.mean[0]) / task.std[0]).float()
    assert torch.allclose(task.heldout[0], expected, atol=1e-6, rtol=0)
    assert abs(task.train[0].double().mean().item()) < 1e-6
    assert abs(task.train[0].double().std(correction=0).item() - 1) < 1e-6

    files = find_idx_files("mnist", tmp_path)
    heldout = read_idx(files["test-images"])
    heldout[0, 0, 0] = 255 - heldout[0, 0, 0]
    write_idx(files["test-images"], heldout)
    changed = load_idx_task("mnist", tmp_path)
    assert changed.mean == task.mean and changed.std == task.std
    assert not torch.equal(changed.heldout[0], task.heldout[0])


def test_unstandardised_images_are_the_pixels_over_255(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "kmnist")
    task = load_idx_task("kmnist", tmp_path, standardize=False)
    assert torch.equal(task.train[0], task.pixels[0].float() / 255)
    assert torch.equal(task.heldout[0], task.pixels[1].float() / 255)
    assert task.classes == ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")


def test_emnist_images_are_transposed_and_letters_labels_start_at_zero(tmp_path: Path) -> None:
    train_images, train_labels, _, _ = _write_dataset(tmp_path / "EMNIST" / "raw", "emnist-letters")
    task = load_idx_task("emnist-letters", tmp_path, standardize=False)
    assert torch.equal(task.pixels[0][:, 0], train_images.transpose(1, 2))
    assert torch.equal(task.train[1], train_labels.long() - 1)
    assert task.train[1].min() == 0 and task.num_classes == 26 and task.classes[0] == "a"


def test_emnist_class_lists_have_torchvision_s_lengths() -> None:
    lengths = {name: len(IDX_DATASETS[name].classes) for name in IDX_DATASETS if name.startswith("emnist")}
    assert lengths == {
        "emnist-balanced": 47,
        "emnist-byclass": 62,
        "emnist-bymerge": 47,
        "emnist-digits": 10,
        "emnist-letters": 26,
        "emnist-mnist": 10,
    }
    assert IDX_DATASETS["emnist-balanced"].classes[36:] == (
        "a",
        "b",
        "d",
        "e",
        "f",
        "g",
        "h",
        "n",
        "q",
        "r",
        "t",
    )


def test_raw_files_are_preferred_to_gzipped_ones(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "mnist", gz=True)
    _write_dataset(tmp_path, "mnist", gz=False)
    assert all(not path.name.endswith(".gz") for path in find_idx_files("mnist", tmp_path).values())


def test_a_missing_dataset_names_every_folder_looked_in_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as raised:
        load_idx_task("kmnist", tmp_path)
    message = str(raised.value)
    for folder in (tmp_path / "KMNIST" / "raw", tmp_path / "KMNIST", tmp_path):
        assert str(folder) in message
    assert "torchvision.datasets.KMNIST(root, download=True)" in message and "\n" not in message
    assert isinstance(raised.value, FileNotFoundError)


def test_a_partial_folder_says_which_files_are_missing(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "mnist")
    next(tmp_path.glob("t10k-labels*")).unlink()
    with pytest.raises(DatasetNotFoundError, match="missing t10k-labels-idx1-ubyte"):
        load_idx_task("mnist", tmp_path)


def test_fashion_mnist_without_root_points_at_the_debian_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("composer_fn.data.idx.DEBIAN_FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion-mnist") as raised:
        load_idx_task("fashion-mnist")
    assert str(tmp_path / "absent") in str(raised.value)


def test_labels_out_of_range_or_miscounted_are_refused_naming_the_file(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "mnist", labels=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: holds labels in \[0, 10\]"):
        load_idx_task("mnist", tmp_path)
    _write_dataset(tmp_path, "mnist", labels=(0, 1, 2))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: .*expected uint8 labels \[12\]"):
        load_idx_task("mnist", tmp_path)


def test_load_dataset_dispatches_by_name_and_refuses_unknown_names(tmp_path: Path) -> None:
    _write_dataset(tmp_path / "MNIST" / "raw", "mnist")
    task = load_dataset("mnist", tmp_path, standardize=False)
    assert isinstance(task, ImageTask) and task.classes == tuple("0123456789")
    with pytest.raises(ValueError, match="'cifar10'"):
        load_dataset("svhn", tmp_path)
    with pytest.raises(ValueError, match="data-dir"):
        load_dataset("imagefolder")
    # What only an image folder takes is refused for a data set read into memory, not ignored.
    for argument, value in (("image_size", 16), ("batch_size", 0), ("num_workers", 2), ("seed", 3)):
        with pytest.raises(ValueError, match=rf"^{argument}={value}: .mnist. is read into memory whole, .*TensorLoader"):
            load_dataset("mnist", tmp_path, **{argument: value})


def test_loading_does_not_touch_the_global_random_state(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "mnist")
    before = torch.random.get_rng_state()
    load_idx_task("mnist", tmp_path)
    assert torch.equal(torch.random.get_rng_state(), before)
