"""An in-memory loader over equal-length tensors, with keyed shuffling and mid-epoch resumption."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from composer_fn.core.random import fold_in, key, permutation
from composer_fn.core.validate import flag, integer

__all__ = ["GlobalBatches", "TensorLoader", "epoch_order", "rank_slice"]


def epoch_order(root: Tensor, epoch: int, size: int, shuffle: bool) -> Tensor:
    """Returns the ``int64`` sample indices of ``epoch``: ``permutation(fold_in(root, epoch), size)`` when
    ``shuffle``, else ``arange(size)``. Every loader of the package visits its epochs in this order."""
    epoch = integer("epoch", epoch, minimum=0)
    if shuffle:
        return permutation(fold_in(root, epoch), size)
    return torch.arange(size, dtype=torch.int64)


def rank_slice(batch: int, batch_size: int, rank: int, world_size: int, size: int) -> slice:
    """Returns rank ``rank``'s part of the ``batch``-th global batch of an epoch's order: the ``rank``-th
    contiguous run of ``batch_size`` of it, cut at ``size`` (short or empty at the end of the epoch)."""
    begin = min(batch * batch_size * world_size + rank * batch_size, size)
    return slice(begin, min(begin + batch_size, size))


class GlobalBatches:
    """What a loader that cuts each epoch's order into global batches shared by ranks knows of its epochs (the part
    ``TensorLoader`` and ``hf.DatasetLoader`` share): its ``_size`` rows, ``batch_size`` a rank, ``world_size``
    ranks, ``drop_last``, and the epoch it is told (``_epoch``)."""

    _size: int
    _epoch: int
    batch_size: int
    world_size: int
    drop_last: bool

    @property
    def dataset_size(self) -> int:
        """Returns the number of samples (rows) the loader holds."""
        return self._size

    @property
    def epoch(self) -> int:
        """Returns the epoch whose order ``__iter__`` follows."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose order the next ``__iter__`` follows."""
        self._epoch = integer("epoch", epoch, minimum=0)

    @property
    def global_batch_size(self) -> int:
        """Returns the number of samples a step takes across all ranks: ``batch_size * world_size``."""
        return self.batch_size * self.world_size

    def global_samples(self, batch_in_epoch: int) -> int:
        """Returns the number of samples all ranks' ``batch_in_epoch``-th batches of an epoch hold together."""
        return max(0, min(self.global_batch_size, self._size - batch_in_epoch * self.global_batch_size))

    def __len__(self) -> int:
        """Returns the number of batches in one epoch (the same on every rank)."""
        if self.drop_last:
            return self._size // self.global_batch_size
        return math.ceil(self._size / self.global_batch_size)


class TensorLoader(GlobalBatches):
    """Batches of rows from tensors held in memory, in an order that is a pure function of seed and epoch.

    The order of epoch ``e`` is ``permutation(fold_in(key(seed), e), n)`` when ``shuffle`` is true and
    ``arange(n)`` otherwise, so any epoch, and any batch within it, can be replayed without replaying the
    ones before it. Like ``DistributedSampler``, the loader does not advance its epoch on its own: call
    ``set_epoch`` before iterating each epoch. Batches are copies (``index_select``), never views, so a
    consumer that edits a batch in place cannot change the data.

    Across processes, ``batch_size`` is each rank's: the epoch's order is cut into global batches of
    ``batch_size * world_size`` samples, and rank ``r`` takes the ``r``-th slice of ``batch_size`` of each. The
    ranks' batches of a step, concatenated in rank order, are the one-process loader's batch of the global size
    (disjoint, covering the epoch, no sample repeated), which is what makes a run independent of its number of
    processes. Every rank has the same number of batches; without ``drop_last`` the epoch's last global batch
    may be short, and then the higher ranks' last batches are short or empty. ``rank`` and ``world_size``
    default to the initialised process group's, else to torchrun's ``RANK`` and ``WORLD_SIZE``, else 0 and 1.

    Args:
        tensors: the tensors to take rows from, a tuple or a list, sharing one length along dim 0; each batch is
            a tuple of their rows, in this order.
        batch_size: rows per batch (per rank).
        shuffle: visit each epoch in a keyed permutation of the rows, else in order.
        drop_last: leave out the epoch's last global batch when it is short.
        seed: the root of the epochs' permutations.
        rank: this process's place among the processes sharing each global batch.
        world_size: the number of processes sharing each global batch.
    """

    def __init__(
        self,
        tensors: tuple[Tensor, ...] | list[Tensor],
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not isinstance(tensors, tuple | list) or not tensors or not all(isinstance(t, Tensor) for t in tensors):
            raise TypeError(
                f"tensors={_describe(tensors)} must be a non-empty tuple (or list) of tensors, e.g. (images, labels)"
            )
        tensors = tuple(tensors)
        lengths = [t.shape[0] if t.dim() > 0 else None for t in tensors]
        size = lengths[0]
        if size is None or size < 1 or any(length != size for length in lengths):
            raise ValueError(
                f"tensors have lengths {lengths} along dim 0: expected tensors of at least one dimension "
                "sharing one length >= 1"
            )
        self.tensors = tensors
        self.batch_size = integer("batch_size", batch_size, minimum=1)
        self.shuffle = flag("shuffle", shuffle)
        self.drop_last = flag("drop_last", drop_last)
        self.seed = seed
        self._root = key(seed)  # validates seed
        self._epoch = 0
        self._size = size
        self.rank, self.world_size = _rank_and_world_size(rank, world_size)

    def order(self, epoch: int) -> Tensor:
        """Returns the ``int64`` sample indices of ``epoch`` in the order they are visited."""
        return epoch_order(self._root, epoch, self._size, self.shuffle)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        """Returns an iterator over the batches of the selected epoch."""
        return self.iter_from(self._epoch, 0)

    def iter_from(self, epoch: int, batch_in_epoch: int) -> Iterator[tuple[Tensor, ...]]:
        """Returns an iterator over the batches of ``epoch`` from batch ``batch_in_epoch`` on.

        The skipped batches are never gathered, so resuming in the middle of an epoch costs one permutation.
        ``batch_in_epoch`` may equal ``len(self)``, which yields nothing (a run saved at the end of an epoch).
        """
        epoch = integer("epoch", epoch, minimum=0)
        num_batches = len(self)
        integer("batch_in_epoch", batch_in_epoch, minimum=0, maximum=num_batches)
        return self._batches(self.order(epoch), batch_in_epoch, num_batches)

    def _batches(self, order: Tensor, start: int, stop: int) -> Iterator[tuple[Tensor, ...]]:
        # One copy of the order per device, so that each batch costs exactly one gather per tensor.
        order_on = {device: order.to(device) for device in {t.device for t in self.tensors}}
        for batch in range(start, stop):
            part = rank_slice(batch, self.batch_size, self.rank, self.world_size, self._size)
            yield tuple(t.index_select(0, order_on[t.device][part]) for t in self.tensors)

    def __repr__(self) -> str:
        return (
            f"TensorLoader(dataset_size={self._size}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, seed={self.seed}, epoch={self._epoch}, rank={self.rank}, "
            f"world_size={self.world_size})"
        )


def _rank_and_world_size(rank: object, world_size: object) -> tuple[int, int]:
    """Returns the checked ``(rank, world_size)``: as given, else the process group's or torchrun's, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"rank={rank!r}, world_size={world_size!r}: give both or neither")
    if rank is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank, world_size = _environment_int("RANK"), _environment_int("WORLD_SIZE")
        else:
            rank, world_size = 0, 1
    size = integer("world_size", world_size, minimum=1)
    return integer("rank", rank, minimum=0, maximum=size - 1, hint=f"a rank of world_size={size}"), size


def _environment_int(name: str) -> int:
    value = os.environ[name]
    if not value.isdigit():
        raise ValueError(f"environment variable {name}={value!r}: expected a whole number (torchrun sets it)")
    return int(value)


def _describe(value: object) -> str:
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {[type(v).__name__ for v in value]}"
    return type(value).__name__
