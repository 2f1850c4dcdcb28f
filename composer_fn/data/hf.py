"""Hugging Face ``datasets`` as training and evaluation data.

``DatasetLoader`` gives a ``datasets.Dataset`` (Arrow tables, memory-mapped from local arrow, parquet, JSON-lines,
CSV or text files) the guarantees ``TensorLoader`` gives tensors: the order of an epoch is a pure function of the
seed and the epoch; under several processes each takes its slice of every global batch, so the ranks' batches of
a step, concatenated, are one process's batch of the global size; and a resumed run starts mid-epoch by computing
the epoch's order and gathering from its batch on, never reading what the batches before it held. A
``datasets.IterableDataset`` (streamed from local files) trains too: each process reads the stream and keeps its
slice of each global batch; being a stream, it is read from its start to resume mid-epoch.

``packed_text`` tokenizes a text column with a ``transformers`` tokenizer (the model's) or a ``tokenizers``
``Tokenizer`` (one trained on the corpus) and packs the tokens into rows of exactly ``sequence_length``, the
documents joined by the end-of-text token.

``datasets`` is an extra (``pip install -e '.[datasets]'``), imported only here; nothing is downloaded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from composer_fn.core.extras import install_command
from composer_fn.core.random import host_bits, host_fold_in, host_key, key
from composer_fn.core.validate import flag, integer
from composer_fn.data.loader import GlobalBatches, _rank_and_world_size, epoch_order, rank_slice

__all__ = ["DatasetLoader", "packed_text"]


def _datasets() -> Any:
    try:
        import datasets
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"Hugging Face datasets need the datasets package: {install_command('datasets')}"
        ) from None
    return datasets


class DatasetLoader(GlobalBatches):
    """Batches of rows of a Hugging Face ``datasets.Dataset`` (or ``IterableDataset``) as dicts of tensors, in an
    order that is a pure function of seed and epoch (see the module docstring).

    Each batch maps every column of ``columns`` to a tensor of its rows (``int64`` token ids, ``float32``
    features, as the column holds them); rows of one column must share a shape (pack or pad text first:
    ``packed_text``). Like ``TensorLoader``, ``batch_size`` is each rank's, the loader does not advance its epoch
    on its own (``set_epoch``), and without ``drop_last`` the epoch's last global batch may be short (the higher
    ranks' shares short or empty). ``rank`` and ``world_size`` default to the process group's, else torchrun's,
    else 0 and 1.

    Args:
        dataset: a ``datasets.Dataset`` or ``datasets.IterableDataset``.
        batch_size: rows per batch (per rank).
        columns: the columns each batch holds, in order; None for every column.
        shuffle: visit each epoch in a keyed permutation of the rows (a ``Dataset``), or through a keyed shuffle
            buffer of ``buffer_size`` rows (an ``IterableDataset``, epoch by epoch), else in order.
        drop_last: leave out the epoch's last global batch when it is short.
        seed: the root of the epochs' orders.
        rank: this process's place among the processes sharing each global batch.
        world_size: the number of processes sharing each global batch.
        buffer_size: an ``IterableDataset``'s shuffle buffer.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        columns: Sequence[str] | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        buffer_size: int = 10_000,
    ) -> None:
        datasets = _datasets()
        if not isinstance(dataset, datasets.Dataset | datasets.IterableDataset):
            raise TypeError(
                f"dataset of type {type(dataset).__name__}: expected a datasets.Dataset or datasets.IterableDataset "
                "(datasets.load_dataset(..., split='train')), not a DatasetDict: pick a split"
            )
        self.batch_size = integer("batch_size", batch_size, minimum=1)
        self.shuffle = flag("shuffle", shuffle)
        self.drop_last = flag("drop_last", drop_last)
        self.buffer_size = integer("buffer_size", buffer_size, minimum=1)
        self.seed = seed
        self._root = key(seed)  # validates seed
        self._epoch = 0
        self.rank, self.world_size = _rank_and_world_size(rank, world_size)
        names = list(dataset.column_names or []) if dataset.column_names is not None else None
        if columns is None:
            if names is None:
                raise ValueError("dataset's columns are not known before reading it: pass columns=[...]")
            columns = names
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns) or not columns:
            raise TypeError(f"columns={columns!r}: expected a non-empty list of column names")
        missing = [c for c in columns if names is not None and c not in names]
        if missing:
            raise ValueError(f"columns={list(columns)!r}: the dataset has no column {missing[0]!r}; it has {names}")
        self.columns = tuple(columns)
        self.streamed = isinstance(dataset, datasets.IterableDataset)
        if not self.streamed and buffer_size != 10_000:
            raise ValueError(
                f"buffer_size={buffer_size!r} applies to a datasets.IterableDataset's shuffle buffer; a datasets.Dataset "
                "is shuffled by a keyed permutation of all its rows: drop buffer_size"
            )
        self.dataset = dataset.select_columns(list(self.columns)).with_format("torch")
        self._size = dataset.num_rows if not self.streamed else _count_rows(self.dataset)
        if self._size < 1:
            raise ValueError("dataset has no rows: expected at least one")

    def order(self, epoch: int) -> Tensor:
        """Returns the ``int64`` row indices of ``epoch`` in the order they are visited (a ``Dataset``'s)."""
        return epoch_order(self._root, epoch, self._size, self.shuffle)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        """Returns an iterator over the batches of the selected epoch."""
        return self.iter_from(self._epoch, 0)

    def iter_from(self, epoch: int, batch_in_epoch: int) -> Iterator[dict[str, Tensor]]:
        """Returns an iterator over the batches of ``epoch`` from batch ``batch_in_epoch`` on.

        A ``Dataset``'s skipped batches are never read: resuming mid-epoch costs one permutation, at any batch. A
        stream is read from its start, its skipped rows passed over. ``batch_in_epoch`` may equal ``len(self)``."""
        epoch = integer("epoch", epoch, minimum=0)
        stop = len(self)
        integer("batch_in_epoch", batch_in_epoch, minimum=0, maximum=stop)
        if self.streamed:
            return self._streamed(epoch, batch_in_epoch, stop)
        return self._gathered(self.order(epoch), batch_in_epoch, stop)

    def _gathered(self, order: Tensor, start: int, stop: int) -> Iterator[dict[str, Tensor]]:
        for batch in range(start, stop):
            indices = order[rank_slice(batch, self.batch_size, self.rank, self.world_size, self._size)]
            if len(indices) == 0:
                yield self._empty()
                continue
            yield self._tensors(self.dataset[indices.tolist()])

    def _streamed(self, epoch: int, start: int, stop: int) -> Iterator[dict[str, Tensor]]:
        stream = self.dataset
        if self.shuffle:
            # datasets' shuffle buffer takes an integer seed: the epoch's key, folded from the run's seed.
            drawn = host_bits(host_fold_in(host_key(self.seed), epoch), 1)[0]
            stream = stream.shuffle(seed=drawn, buffer_size=self.buffer_size)
        rows = iter(stream)
        for batch in range(stop):
            size = self.global_samples(batch)
            taken = list(itertools.islice(rows, size))
            if len(taken) < size:
                raise ValueError(
                    f"dataset's stream ended after {batch * self.global_batch_size + len(taken)} rows in epoch {epoch}; "
                    f"it held {self._size} when the loader was built: expected a stream of the same rows every epoch"
                )
            if batch < start:
                continue
            share = taken[rank_slice(0, self.batch_size, self.rank, self.world_size, size)]
            if not share:
                yield self._empty()
                continue
            yield self._tensors({c: [row[c] for row in share] for c in self.columns})

    def _tensors(self, rows: dict[str, Any]) -> dict[str, Tensor]:
        batch = {}
        for column in self.columns:
            value = rows[column]
            if isinstance(value, list):
                if not all(isinstance(v, Tensor) for v in value) or len({tuple(v.shape) for v in value}) > 1:
                    raise ValueError(
                        f"column {column!r} holds rows of different lengths or of values that are not numbers: a batch "
                        "needs one shape; pack text into rows of one length (composer_fn.data.packed_text) or pad it"
                    )
                value = torch.stack(value)
            batch[column] = value
        return batch

    def _empty(self) -> dict[str, Tensor]:
        # A rank's empty share of a short last batch: the columns' row shapes, no rows.
        first = self._tensors(self.dataset[:1]) if not self.streamed else self._tensors({c: [next(iter(self.dataset))[c]] for c in self.columns})
        return {name: value[:0] for name, value in first.items()}

    def __repr__(self) -> str:
        kind = "IterableDataset" if self.streamed else "Dataset"
        return (
            f"DatasetLoader({kind}, dataset_size={self._size}, columns={list(self.columns)}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed}, epoch={self._epoch}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )


def _count_rows(stream: Any) -> int:
    return sum(1 for _ in stream)


def packed_text(
    dataset: Any,
    tokenizer: Any,
    sequence_length: int,
    *,
    column: str = "text",
    separator: int | None = None,
    batch_size: int = 1000,
) -> Any:
    """Returns ``dataset``'s text column tokenized and packed into rows of exactly ``sequence_length`` tokens: the
    columns ``input_ids`` and ``labels`` (the same ids: a causal language model shifts them itself) and
    ``attention_mask`` (ones).

    The documents are joined by ``separator`` (default: the tokenizer's end-of-text id, ``eos_token_id``, when
    it has one) and cut into consecutive rows, ``batch_size`` documents at a time; the tokens left over at the end
    of each group of documents (fewer than a row) are dropped. ``tokenizer`` is a ``transformers`` tokenizer or a
    ``tokenizers.Tokenizer``. The result is a pure function of the dataset and the tokenizer, cached by ``datasets``
    beside the dataset's files.
    """
    datasets = _datasets()
    if not isinstance(dataset, datasets.Dataset | datasets.IterableDataset):
        raise TypeError(f"dataset of type {type(dataset).__name__}: expected a datasets.Dataset or IterableDataset")
    length = integer("sequence_length", sequence_length, minimum=1)
    integer("batch_size", batch_size, minimum=1)
    names = dataset.column_names
    if names is not None and column not in names:
        raise ValueError(f"column={column!r}: the dataset has no such column; it has {names}")
    encode = _encoder(tokenizer)
    if separator is None:
        separator = getattr(tokenizer, "eos_token_id", None)
    if separator is not None:
        integer("separator", separator, minimum=0)

    def pack(documents: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        tokens: list[int] = []
        for ids in encode([str(text) for text in documents[column]]):
            tokens.extend(ids)
            if separator is not None:
                tokens.append(separator)
        rows = [tokens[i : i + length] for i in range(0, len(tokens) - length + 1, length)]
        return {"input_ids": rows, "labels": [list(row) for row in rows], "attention_mask": [[1] * length for _ in rows]}

    return dataset.map(pack, batched=True, batch_size=batch_size, remove_columns=names)


def _encoder(tokenizer: Any) -> Any:
    # A tokenizers.Tokenizer encodes batches (Encoding.ids); a transformers tokenizer is called.
    if hasattr(tokenizer, "encode_batch") and not callable(tokenizer):
        return lambda texts: [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    if callable(tokenizer):
        return lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]
    raise TypeError(
        f"tokenizer of type {type(tokenizer).__name__}: expected a transformers tokenizer (AutoTokenizer) or a "
        "tokenizers.Tokenizer"
    )
