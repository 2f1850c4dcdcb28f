"""The training batches of a run, one a step.

``Feed`` reads the training loader epoch by epoch (``loaders.epoch_batches``: the loader is told the epoch, and a
resumed run starts mid-epoch), refuses what cannot be a batch or an epoch of the loader's length, describes each
batch (``BatchMeta``; under several processes, the global batch as one process would see it) and moves it to the
run's device. It holds the epoch's iterator and nothing of the run's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch

from composer_fn.core.state import BatchMeta, batch_input, batch_meta
from composer_fn.core.time import Timestamp
from composer_fn.trainer.build import to_device
from composer_fn.trainer.first_batch import check_batch_kind
from composer_fn.trainer.loaders import epoch_batches, global_meta

__all__ = ["Feed", "Fed"]


class Fed(NamedTuple):
    """A batch as the loader gave it (``raw``), on the run's device (``batch``), and described: this process's share
    (``local``) and the global batch the run's clock and host hooks see (``meta``)."""

    raw: Any
    batch: Any
    local: BatchMeta
    meta: BatchMeta


class Feed:
    """The batches of ``loader`` for a run, ``steps_per_epoch`` an epoch (see the module docstring)."""

    def __init__(
        self,
        loader: Iterable[Any],
        steps_per_epoch: int,
        input_key: int | str | None,
        device: torch.device,
        processes: int,
    ) -> None:
        self._loader = loader
        self._steps_per_epoch = steps_per_epoch
        self._input_key = input_key
        self._device = device if device.type != "cpu" else None
        self._processes = processes
        self._batches: Iterator[Any] | None = None
        self._read = 0  # the epoch's batches read so far, the skipped ones of a resumed run included
        self._described: tuple[Any, Any, BatchMeta] = (None, None, BatchMeta(0))

    def next(self, timestamp: Timestamp, check: Callable[[Any], None] | None = None) -> Fed:
        """Returns the batch at ``timestamp`` (its epoch's ``batch_in_epoch``-th): a loader that runs out before its
        length, or yields something other than a tuple, list or mapping, is refused; ``check`` sees the batch as
        the loader gave it before it is described. Within an epoch, the next batch is read whatever ``timestamp``."""
        if self._batches is None:
            self._batches = epoch_batches(self._loader, timestamp.epoch, timestamp.batch_in_epoch)
            self._read = timestamp.batch_in_epoch
        raw = next(self._batches, None)
        if raw is None:
            given = self._read
            raise ValueError(
                f"train_dataloader yielded {f'only {given} batches' if given else 'no batch'} in epoch "
                f"{timestamp.epoch} although its length is {self._steps_per_epoch}: its __len__ must count the "
                "batches it yields in an epoch (the run's length in epochs is counted with it)"
            )
        self._read += 1
        check_batch_kind(raw, "train_dataloader")
        if check is not None:
            check(raw)
        # Batches of one shape and dtype share their description (most of a run's batches).
        given = batch_input(raw, self._input_key)
        shape, dtype = getattr(given, "shape", None), getattr(given, "dtype", None)
        if shape is None or (shape, dtype) != self._described[:2]:
            self._described = (shape, dtype, batch_meta(raw, self._input_key))
        local = self._described[2]
        # Under several processes, host hooks and the run's clock see the global batch, as one process would.
        meta = (
            local
            if self._processes == 1
            else global_meta(self._loader, local, self._read - 1, self._processes)
        )
        return Fed(raw, raw if self._device is None else to_device(raw, self._device), local, meta)

    def end_epoch(self, epoch: int) -> None:
        """Ends ``epoch``: a loader that yields more batches than its length is refused."""
        if self._batches is not None and next(self._batches, None) is not None:
            raise ValueError(
                f"train_dataloader yielded more than its length, {self._steps_per_epoch} batches, in epoch "
                f"{epoch}: its __len__ must count the batches it yields in an epoch"
            )
        self._batches = None

    def close(self) -> None:
        """Lets go of the epoch's iterator (the run ended, or stopped within an epoch)."""
        self._batches = None
