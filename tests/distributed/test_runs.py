"""Checkpoints move between world sizes, autoresume agrees across processes, and 'auto' microbatching retries
a batch that ran out of memory on any process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from composer_fn.core.random import key
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.loggers import InMemoryLogger
from composer_fn.models.cnn import SmallCNN
from composer_fn.optim import sgd
from composer_fn.trainer import Trainer
from composer_fn.trainer.distributed import World, check_loader
from tests.distributed.launch import run_ranks

DATA = synthetic_images(key(3), 64, num_classes=4, shape=(1, 8, 8))


class Limited(SmallCNN):
    """A SmallCNN that, like a device out of memory, fails a forward of more than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__(1, 4, width=4)
        self.limit = limit

    def forward(self, images: Tensor) -> Tensor:
        if self.training and images.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (a test device of {self.limit} samples)")
        return super().forward(images)


def _trainer(rank: int, world: int, **arguments: Any) -> Trainer:
    loader = TensorLoader(DATA, 8 if world > 1 else 16, seed=2, rank=rank, world_size=world)
    return Trainer(
        arguments.pop("model", None) or SmallCNN(1, 4, width=4),
        loader,
        max_duration=arguments.pop("max_duration", "10ba"),
        optimizer=sgd(0.1, momentum=0.9),
        progress_bar=False,
        **arguments,
    )


def _params(trainer: Trainer) -> dict[str, Tensor]:
    return {**trainer.state.params, **trainer.state.buffers}


def _two_process_runs(rank: int, folder: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    # Saved by two processes: only rank 0 writes.
    written = _trainer(rank, 2, save_folder=Path(folder, "two"), save_interval="5ba")
    written.fit()
    results["two"] = _params(written)
    # Resumed, by autoresume, from what one process saved at batch 5.
    resumed = _trainer(rank, 2, save_folder=Path(folder, "one"), autoresume=True)
    results["resumed_at"] = resumed.timestamp.batch
    resumed.fit()
    results["from_one"] = _params(resumed)
    # 'auto': rank 1's device holds 4 samples, rank 0's all 8; both settle on 4.
    logger = InMemoryLogger()
    auto = _trainer(rank, 2, model=Limited(4 if rank == 1 else 100), device_train_microbatch_size="auto", loggers=[logger])
    auto.fit()
    records = [r for r in logger.records if r["kind"] == "microbatch"]
    results["auto"] = (_params(auto), auto.device_train_microbatch_size, records)
    fixed = _trainer(rank, 2, model=Limited(100), device_train_microbatch_size=4)
    fixed.fit()
    results["fixed"] = _params(fixed)
    return results


def test_checkpoints_and_autoresume_move_between_world_sizes_and_auto_microbatching_agrees(tmp_path: Path) -> None:
    # One process with the two processes' batches as microbatches: the reference at every world size.
    reference = _trainer(0, 1, device_train_microbatch_size=8)
    reference.fit()
    expected = _params(reference)
    saved = _trainer(0, 1, device_train_microbatch_size=8, save_folder=tmp_path / "one", max_duration="5ba")
    saved.fit()

    ranks = run_ranks(_two_process_runs, 2, tmp_path, str(tmp_path))

    for rank, results in enumerate(ranks):
        for name, value in expected.items():
            assert torch.equal(results["two"][name], value), f"rank {rank}, two processes: {name}"
            assert torch.equal(results["from_one"][name], value), f"rank {rank}, resumed from one process: {name}"
        assert results["resumed_at"] == 5
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["ep1-ba5.pt", "ep2-ba10.pt", "latest.pt"]

    # And back: one process resumes what two processes saved at batch 5.
    resumed = _trainer(0, 1, device_train_microbatch_size=8, load_path=tmp_path / "two" / "ep1-ba5.pt")
    resumed.fit()
    for name, value in expected.items():
        assert torch.equal(_params(resumed)[name], value), f"one process resumed from two: {name}"

    # 'auto': both processes retried the first batch at 4 and kept it, so both equal two processes run at 4 (and
    # one process at 4 up to the rounding of a sum of two microbatches a process).
    at_four = _trainer(0, 1, device_train_microbatch_size=4, model=Limited(100))
    at_four.fit()
    for rank, results in enumerate(ranks):
        params, size, records = results["auto"]
        assert size == 4
        assert [(r["step"], r["device_train_microbatch_size"]) for r in records] == [(0, 4)]
        for name, value in results["fixed"].items():
            assert torch.equal(params[name], value), f"rank {rank}, auto: {name}"
            torch.testing.assert_close(params[name], _params(at_four)[name], rtol=0, atol=1e-6)


def test_auto_microbatching_in_one_process_halves_until_it_fits_and_equals_that_size() -> None:
    logger = InMemoryLogger()
    auto = _trainer(0, 1, model=Limited(5), device_train_microbatch_size="auto", loggers=[logger])
    auto.fit()
    assert auto.device_train_microbatch_size == 4
    assert [r["device_train_microbatch_size"] for r in logger.records if r["kind"] == "microbatch"] == [8, 4]
    fixed = _trainer(0, 1, model=Limited(5), device_train_microbatch_size=4)
    fixed.fit()
    for name, value in _params(fixed).items():
        assert torch.equal(_params(auto)[name], value), name


def test_auto_microbatching_that_cannot_fit_one_sample_says_so() -> None:
    with pytest.raises(RuntimeError, match="device_train_microbatch_size=1"):
        _trainer(0, 1, model=Limited(0), device_train_microbatch_size="auto").fit()


def test_a_dataloader_without_a_distributed_sampler_is_refused_under_several_processes() -> None:
    dataset = torch.utils.data.TensorDataset(*DATA)
    with pytest.raises(ValueError, match="sampler=torch.utils.data.DistributedSampler"):
        check_loader(torch.utils.data.DataLoader(dataset, batch_size=4), "train_dataloader", World(0, 2))
    padded = torch.utils.data.DistributedSampler(torch.utils.data.Subset(dataset, range(63)), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="count twice"):
        check_loader(torch.utils.data.DataLoader(dataset, sampler=padded), "eval_dataloader", World(0, 2), evaluation=True)
    check_loader(torch.utils.data.DataLoader(dataset, batch_size=4), "train_dataloader", World(0, 1))
