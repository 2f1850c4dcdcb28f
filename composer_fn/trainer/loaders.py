"""What the Trainer asks of a loader beyond iteration and length, as named protocols.

Any iterable of batches with ``__len__`` trains. A loader that also follows one of these protocols is told more:
``EpochAware`` (``set_epoch(epoch)`` before each epoch, as ``composer_fn.data.TensorLoader`` and torch's
``DistributedSampler`` take it; a torch ``DataLoader``'s sampler is told too), ``Resumable`` (``iter_from(epoch,
batch)``: a resumed run starts mid-epoch without replaying batches), ``GloballyCounted`` (``global_samples(batch)``:
the samples of a global batch under several processes, when the shares differ) and ``Batched`` (``batch_size``:
a process's batch, known before the first one).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from composer_fn.core.state import BatchMeta
from composer_fn.core.validate import is_integer

__all__ = ["EpochAware", "Resumable", "GloballyCounted", "Batched", "epoch_batches", "global_meta", "declared_batch_size"]


@runtime_checkable
class EpochAware(Protocol):
    """A loader (or sampler) whose order depends on the epoch it is told."""

    def set_epoch(self, epoch: int) -> None:
        """Takes the epoch the next pass belongs to."""


@runtime_checkable
class Resumable(Protocol):
    """A loader that can start a pass mid-epoch."""

    def iter_from(self, epoch: int, batch: int) -> Iterable[Any]:
        """Returns the batches of ``epoch`` from its ``batch``-th on."""


@runtime_checkable
class GloballyCounted(Protocol):
    """A loader that knows how many samples all processes hold in a batch of the epoch."""

    def global_samples(self, batch: int) -> int:
        """Returns the samples of the epoch's ``batch``-th global batch, over every process."""


@runtime_checkable
class Batched(Protocol):
    """A loader that declares a process's batch size."""

    batch_size: int | None


def epoch_batches(loader: Iterable[Any], epoch: int, start: int = 0) -> Iterator[Any]:
    """Returns the batches of ``epoch`` from its ``start``-th on: the loader (and a torch ``DataLoader``'s sampler) is
    told the epoch first; a ``Resumable`` one starts there, any other is read from its first batch and skips."""
    sampler = getattr(loader, "sampler", None)
    for told in (loader, sampler):
        if isinstance(told, EpochAware):
            told.set_epoch(epoch)
    if start and isinstance(loader, Resumable):
        return iter(loader.iter_from(epoch, start))
    return itertools.islice(iter(loader), start, None)


def global_meta(loader: Iterable[Any], meta: BatchMeta, batch: int, processes: int) -> BatchMeta:
    """Returns ``meta`` of this process's share of the epoch's ``batch``-th batch as one process would see the global
    batch: its samples (``GloballyCounted``, else the share times ``processes``), input shape and tokens."""
    total = loader.global_samples(batch) if isinstance(loader, GloballyCounted) else meta.batch_size * processes
    tokens = meta.tokens * total // meta.batch_size if meta.batch_size else 0
    return BatchMeta(total, (total, *meta.input_shape[1:]) if meta.input_shape else (), tokens)


def declared_batch_size(loader: object) -> int | None:
    """Returns a process's batch as ``loader`` declares it (``Batched``), or None where it declares none."""
    size = loader.batch_size if isinstance(loader, Batched) else None
    return int(size) if is_integer(size) and size > 0 else None
