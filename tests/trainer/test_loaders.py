"""What the Trainer tells a loader: the epoch (to the loader, or to a torch DataLoader's sampler), where a resumed
epoch starts, and the batch size it declares."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from composer_fn import optim
from composer_fn.core.state import BatchMeta
from composer_fn.data import TensorLoader
from composer_fn.trainer import Trainer
from composer_fn.trainer.loaders import declared_batch_size, epoch_batches, global_meta


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 4, generator=generator), torch.arange(32) % 3)


def _distributed_loader() -> DataLoader:
    dataset = _dataset()
    return DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=5))


def test_a_torch_dataloaders_distributed_sampler_is_told_each_epoch_as_torch_documents() -> None:
    loader = _distributed_loader()
    orders = []
    for epoch in range(3):
        batches = list(epoch_batches(loader, epoch))
        reference = DistributedSampler(loader.dataset, num_replicas=1, rank=0, seed=5)
        reference.set_epoch(epoch)
        expected = list(reference)
        assert torch.equal(torch.cat([targets for _, targets in batches]), torch.arange(32)[expected] % 3)
        orders.append(expected)
    assert orders[0] != orders[1] != orders[2]


def test_a_run_on_a_torch_dataloader_shuffles_each_epoch_anew() -> None:
    loader = _distributed_loader()
    Trainer(
        torch.nn.Linear(4, 3), loader, max_duration="2ep", optimizer=optim.sgd(0.1), progress_bar=False
    ).fit()
    assert loader.sampler.epoch == 1


def test_a_resumable_loader_starts_mid_epoch_and_another_skips_to_the_same_batches() -> None:
    data = _dataset().tensors
    resumable = TensorLoader(data, 8, seed=0)
    plain = list(epoch_batches(TensorLoader(data, 8, seed=0), 1))
    for start in range(4):
        got = list(epoch_batches(resumable, 1, start))
        assert len(got) == 4 - start
        assert all(torch.equal(a[0], b[0]) for a, b in zip(got, plain[start:], strict=True))


def test_declared_batch_sizes_and_the_global_meta() -> None:
    assert declared_batch_size(TensorLoader(_dataset().tensors, 8)) == 8
    assert declared_batch_size(DataLoader(_dataset(), batch_size=None)) is None
    assert declared_batch_size([(torch.zeros(2), torch.zeros(2))]) is None
    meta = global_meta([], BatchMeta(8, (8, 4), 32), 0, 3)
    assert meta == BatchMeta(24, (24, 4), 96)
