"""Image folders: exact decoding, the fixed split, layouts, world-size invariance, resumption and workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler
from torchvision.io import write_png
from torchvision.transforms.v2.functional import resize

from composer_fn.data import (
    DatasetNotFoundError,
    FolderLoader,
    FolderTask,
    UnreadableImage,
    load_dataset,
    load_image_folder_task,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities:DeprecationWarning"
)

CLASSES = ("cat", "dog", "eel")


def _image(index: int, channels: int, height: int, width: int) -> torch.Tensor:
    grid = torch.arange(channels * height * width, dtype=torch.int64).view(channels, height, width)
    return ((grid * 37 + index * 101 + grid // (height * width) * 60) % 256).to(torch.uint8)


def _write_folder(
    root: Path, per_class: int = 5, channels: int = 3, sizes: tuple[tuple[int, int], ...] = ((8, 8),)
) -> list[torch.Tensor]:
    """Writes ``per_class`` PNGs per class and returns the images in ImageFolder's order (class, file name)."""
    written = []
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            index = label * per_class + i
            image = _image(index, channels, *sizes[index % len(sizes)])
            write_png(image, str(root / name / f"img_{i:03d}.png"))
            written.append(image)
    return written


def _all_batches(loader: FolderLoader, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch)
    return list(loader)


def test_the_split_holds_out_every_fifth_image_and_decodes_exactly(tmp_path: Path) -> None:
    written = _write_folder(tmp_path)
    task = load_image_folder_task(tmp_path, standardize=False, batch_size=4, eval_batch_size=2)
    assert isinstance(task, FolderTask)
    assert task.classes == CLASSES and task.num_classes == 3 and task.image_shape == (3, 8, 8)
    labels = torch.arange(15) // 5
    heldout = [i for i in range(15) if i % 5 == 0]
    train = [i for i in range(15) if i % 5 != 0]
    images, got_labels = (torch.cat(parts) for parts in zip(*task.heldout, strict=True))
    assert torch.equal(images, torch.stack([written[i] for i in heldout]).float() / 255)
    assert torch.equal(got_labels, labels[heldout])
    assert task.train.dataset_size == 12 and len(task.train) == 3
    order = task.train.order(0)
    images, got_labels = (torch.cat(parts) for parts in zip(*_all_batches(task.train, 0), strict=True))
    assert torch.equal(images, torch.stack([written[train[i]] for i in order]).float() / 255)
    assert torch.equal(got_labels, labels[train][order])


def test_statistics_come_from_the_training_images_and_standardise_them(tmp_path: Path) -> None:
    written = _write_folder(tmp_path)
    task = load_image_folder_task(tmp_path, batch_size=4)
    train = torch.stack([written[i] for i in range(15) if i % 5 != 0]).double() / 255
    assert task.mean == pytest.approx(tuple(train.mean(dim=(0, 2, 3)).tolist()), abs=1e-12)
    assert task.std == pytest.approx(tuple(train.std(dim=(0, 2, 3), correction=0).tolist()), abs=1e-12)
    images = torch.cat([batch[0] for batch in _all_batches(task.train, 0)]).double()
    assert torch.allclose(images.mean(dim=(0, 2, 3)), torch.zeros(3, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(
        images.std(dim=(0, 2, 3), correction=0), torch.ones(3, dtype=torch.float64), atol=1e-6
    )


def test_grayscale_images_stay_one_channel(tmp_path: Path) -> None:
    written = _write_folder(tmp_path, channels=1)
    task = load_image_folder_task(tmp_path, standardize=False, batch_size=4)
    assert task.image_shape == (1, 8, 8) and len(task.mean) == 1
    images, _ = next(iter(task.heldout))
    assert torch.equal(images, torch.stack([written[i] for i in (0, 5, 10)]).float() / 255)


def test_images_of_another_size_are_resized_to_the_first_one(tmp_path: Path) -> None:
    written = _write_folder(tmp_path, sizes=((8, 8), (12, 10)))
    task = load_image_folder_task(tmp_path, standardize=False, batch_size=4, eval_batch_size=3)
    assert tuple(written[1].shape) == task.image_shape == (3, 12, 10)  # the first training image's size
    images, _ = next(iter(task.heldout))
    assert tuple(written[0].shape) == (3, 8, 8) and tuple(written[5].shape) == (3, 12, 10)
    expected = [
        resize(written[0], [12, 10], antialias=True),
        written[5],
        resize(written[10], [12, 10], antialias=True),
    ]
    assert torch.equal(images, torch.stack(expected).float() / 255)
    resized = load_image_folder_task(tmp_path, image_size=(6, 5), standardize=False, batch_size=4)
    assert resized.image_shape == (3, 6, 5) and next(iter(resized.heldout))[0].shape == (3, 3, 6, 5)


def test_train_and_val_folders_give_the_split(tmp_path: Path) -> None:
    train = _write_folder(tmp_path / "train", per_class=2)
    val = _write_folder(tmp_path / "val", per_class=1, sizes=((8, 8),))
    task = load_image_folder_task(tmp_path, standardize=False, batch_size=2, eval_batch_size=8)
    assert task.train.dataset_size == 6 and task.heldout.dataset_size == 3
    images, labels = next(iter(task.heldout))
    assert torch.equal(images, torch.stack(val).float() / 255) and labels.tolist() == [0, 1, 2]
    train_pixels = torch.stack(train).double() / 255
    assert task.mean == pytest.approx(tuple(train_pixels.mean(dim=(0, 2, 3)).tolist()), abs=1e-12)


def test_train_and_val_folders_must_share_their_classes(tmp_path: Path) -> None:
    _write_folder(tmp_path / "train", per_class=2)
    _write_folder(tmp_path / "test", per_class=1)
    (tmp_path / "test" / "eel").rename(tmp_path / "test" / "fox")
    with pytest.raises(ValueError, match=r"only in train/ \['eel'\], only in test/ \['fox'\]"):
        load_image_folder_task(tmp_path, batch_size=2)


def test_a_train_folder_without_a_heldout_folder_is_refused(tmp_path: Path) -> None:
    _write_folder(tmp_path / "train", per_class=2)
    with pytest.raises(DatasetNotFoundError, match="val/, test/, validation/"):
        load_image_folder_task(tmp_path, batch_size=2)


@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_batches_concatenated_are_the_one_process_batch(tmp_path: Path, shuffle: bool) -> None:
    _write_folder(tmp_path, per_class=9, sizes=((4, 4),))
    whole = load_image_folder_task(tmp_path, batch_size=6, eval_batch_size=6, seed=3, rank=0, world_size=1)
    ranks = [
        load_image_folder_task(tmp_path, batch_size=3, eval_batch_size=3, seed=3, rank=r, world_size=2)
        for r in (0, 1)
    ]
    loaders = (
        [(whole.train, [r.train for r in ranks])]
        if shuffle
        else [(whole.heldout, [r.heldout for r in ranks])]
    )
    for one, shards in loaders:
        assert len(shards[0]) == len(shards[1]) == len(one)
        for epoch in range(3):
            expected = _all_batches(one, epoch)
            parts = [_all_batches(shard, epoch) for shard in shards]
            assert len(expected) == len(parts[0]) == len(parts[1])
            for step, batch in enumerate(expected):
                assert one.global_samples(step) == len(batch[1])
                for i in range(2):
                    assert torch.equal(batch[i], torch.cat([parts[0][step][i], parts[1][step][i]]))


def test_an_evaluation_rank_with_an_empty_last_slice_gets_an_empty_batch(tmp_path: Path) -> None:
    _write_folder(tmp_path, per_class=14, sizes=((4, 4),))  # 42 images: 9 held out
    ranks = [
        load_image_folder_task(tmp_path, batch_size=2, eval_batch_size=5, rank=r, world_size=2)
        for r in (0, 1)
    ]
    sizes = [[len(labels) for _, labels in task.heldout] for task in ranks]
    assert sizes == [[5], [4]]
    ranks = [
        load_image_folder_task(tmp_path, batch_size=2, eval_batch_size=3, rank=r, world_size=2)
        for r in (0, 1)
    ]
    batches = [list(task.heldout) for task in ranks]
    assert [[len(labels) for _, labels in b] for b in batches] == [[3, 3], [3, 0]]
    images, labels = batches[1][1]
    assert images.shape == (0, 3, 4, 4) and images.dtype == torch.float32 and labels.dtype == torch.int64


def test_the_sampler_is_a_distributed_sampler_the_trainer_accepts(tmp_path: Path) -> None:
    _write_folder(tmp_path, per_class=14, sizes=((4, 4),))
    task = load_image_folder_task(tmp_path, batch_size=2, eval_batch_size=4, rank=1, world_size=2)
    for loader in (task.train, task.heldout):
        assert isinstance(loader.sampler, DistributedSampler) and loader.sampler.num_replicas == 2
    sampler = task.heldout.sampler
    assert sampler.total_size == len(sampler.dataset) == 9
    sampler.set_epoch(0)
    assert (
        list(sampler) == [4, 5, 6, 7] and len(sampler) == 4
    )  # ranks take contiguous slices: 4..7, then none
    assert task.train.sampler.total_size == 32 and len(task.train.sampler) == 16


def test_iter_from_equals_skipping_batches(tmp_path: Path) -> None:
    _write_folder(tmp_path, per_class=9, sizes=((4, 4),))
    task = load_image_folder_task(tmp_path, batch_size=4, seed=5)
    full = _all_batches(task.train, 2)
    for start in (0, 2, len(task.train)):
        resumed = list(task.train.iter_from(2, start))
        assert len(resumed) == len(full) - start
        for got, expected in zip(resumed, full[start:], strict=True):
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert _all_batches(task.train, 1)[0][1].tolist() != full[0][1].tolist()


def test_workers_give_bitwise_the_same_batches(tmp_path: Path) -> None:
    _write_folder(tmp_path, per_class=9, sizes=((4, 4), (6, 5)))
    plain = load_image_folder_task(tmp_path, batch_size=4, seed=1)
    workers = load_image_folder_task(tmp_path, batch_size=4, seed=1, num_workers=2)
    assert workers.mean == plain.mean and workers.std == plain.std
    for epoch in (0, 1):
        for one, other in ((plain.train, workers.train), (plain.heldout, workers.heldout)):
            for got, expected in zip(_all_batches(other, epoch), _all_batches(one, epoch), strict=True):
                assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    resumed = list(workers.train.iter_from(1, 3))
    assert torch.equal(resumed[0][0], _all_batches(plain.train, 1)[3][0])


def test_an_empty_folder_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as raised:
        load_image_folder_task(tmp_path)
    assert str(tmp_path) in str(raised.value)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "notes.txt").write_text("no images here")
    with pytest.raises(DatasetNotFoundError, match="cat") as raised:
        load_image_folder_task(tmp_path)
    assert str(tmp_path) in str(raised.value)
    with pytest.raises(DatasetNotFoundError, match="no such folder"):
        load_image_folder_task(tmp_path / "absent")


def test_a_corrupt_image_is_refused_naming_its_path(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    corrupt = tmp_path / "dog" / "img_002.png"
    corrupt.write_bytes(corrupt.read_bytes()[:30])
    with pytest.raises(ValueError, match="cannot be decoded") as raised:
        load_image_folder_task(tmp_path, batch_size=4)
    assert str(corrupt) in str(raised.value)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_image_corrupt_past_its_header_is_named_in_one_line_whether_a_worker_read_it(tmp_path: Path, num_workers: int) -> None:
    # Corrupted after the folder was checked and its statistics read: found by the process that decodes it.
    _write_folder(tmp_path)
    task = load_image_folder_task(tmp_path, batch_size=4, num_workers=num_workers)
    corrupt = tmp_path / "dog" / "img_002.png"
    corrupt.write_bytes(corrupt.read_bytes()[:40])
    with pytest.raises(UnreadableImage) as raised:
        list(task.train)
    message = str(raised.value)
    assert message.startswith(f"{corrupt}: cannot be decoded as an image") and "\n" not in message, message
    assert "Traceback" not in message and "worker" not in message
    assert isinstance(raised.value, ValueError)


def test_every_file_of_a_folder_is_checked_before_the_first_step_naming_each_bad_one(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    # Held-out files (every fifth of ImageFolder's order: each class's first here), read only after training.
    text, empty = tmp_path / "cat" / "img_000.png", tmp_path / "dog" / "img_000.png"
    text.write_text("this is not a picture")
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"2 of its 15 image files cannot be read as images") as raised:
        load_image_folder_task(tmp_path, batch_size=4)
    message = str(raised.value)
    assert f"{text}: not an image (it starts with bytes 74 68 69 73" in message and f"{empty}: empty" in message


def test_a_folder_of_one_class_is_refused(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    for name in CLASSES[1:]:
        for file in (tmp_path / name).iterdir():
            file.unlink()
        (tmp_path / name).rmdir()
    with pytest.raises(ValueError, match=rf"holds one class subfolder \('{CLASSES[0]}'\): .*at least 2 class subfolders"):
        load_image_folder_task(tmp_path, batch_size=2)


def test_a_sixteen_bit_png_is_read_as_its_high_eight_bits(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    written = _write_folder(tmp_path, channels=1)
    deep = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000
    Image.fromarray(deep).save(tmp_path / CLASSES[0] / "img_001.png")
    task = load_image_folder_task(tmp_path, batch_size=4, standardize=False)
    images = torch.cat([batch[0] for batch in _all_batches(task.train, 0)] + [batch[0] for batch in _all_batches(task.heldout, 0)])
    expected = torch.from_numpy((deep >> 8).astype(np.uint8)).float() / 255
    assert len(images) == len(written)  # 12 training images in 3 batches of 4, and the 3 held out
    assert sum(torch.allclose(image[0], expected, rtol=0, atol=1e-6) for image in images) == 1


def test_a_training_part_smaller_than_a_global_batch_is_refused(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    with pytest.raises(ValueError, match="batch_size=7"):
        load_image_folder_task(tmp_path, batch_size=7, rank=0, world_size=2)


def test_load_dataset_reads_an_image_folder(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    task = load_dataset("imagefolder", tmp_path, batch_size=4, image_size=4)
    assert isinstance(task, FolderTask) and task.image_shape == (3, 4, 4)


def test_loading_and_iterating_do_not_touch_the_global_random_state(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    before = torch.random.get_rng_state()
    task = load_image_folder_task(tmp_path, batch_size=4)
    list(task.train)
    list(task.heldout)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_second_pass_over_a_loader_with_workers_stops_the_first_instead_of_changing_its_batches(tmp_path) -> None:
    root = tmp_path / "images"
    _write_folder(root, per_class=10, channels=1)
    loader = load_image_folder_task(root, batch_size=4, num_workers=1, standardize=False).train
    first = iter(loader)
    next(first)
    second = list(loader.iter_from(1, 0))
    assert len(second) == len(loader)
    with pytest.raises(RuntimeError, match="a FolderLoader pass was started while another was in progress"):
        next(first)
