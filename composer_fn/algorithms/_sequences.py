"""Cutting a batch of token sequences to another length, as sequence length warm-up and ALiBi's training on
shorter sequences do: every per-token tensor alike, per-example tensors left as they are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from composer_fn.core import validate

__all__ = ["set_batch_sequence_length"]


def set_batch_sequence_length(
    batch: Any, curr_seq_len: int, truncate: bool = True, preserve_end_of_sequence: bool = False
) -> Any:
    """Returns ``batch`` with every sequence (dim 1) of length ``curr_seq_len``; ``batch`` is unchanged.

    ``batch`` is a mapping, tuple or list (a NamedTuple stays one) of tensors. Its tokens are ``"input_ids"``
    in a mapping that holds them, else its first tensor of two or more dimensions, of shape ``[B, S, ...]``.
    The sequences are the tensors whose first two dimensions are that ``(B, S)``: the tokens, their
    ``attention_mask``, ``token_type_ids`` and per-token labels, cut alike so that each token keeps its mask and
    label. The other tensors hold one value per example (``[B]`` classification labels, ``[B, K]`` multi-label
    targets) and stay as they are; a tensor that is neither raises ValueError. When ``curr_seq_len >= S`` the
    batch is returned as it is. A floating-point tensor of four or more dimensions marks an image batch,
    which raises ValueError rather than pass through unchanged.

    - ``truncate=True``: every sequence becomes ``t[:, :curr_seq_len]``. With ``preserve_end_of_sequence``, the
      last token of each row is kept: its value moves to position ``min(end, curr_seq_len - 1)``, where
      ``end`` is ``attention_mask.sum(1) - 1`` for a mapping batch (which must hold ``"attention_mask"``, as in
      Composer) and ``S - 1`` for a tuple or list batch (no mask: every position is a token).
    - ``truncate=False``: every sequence (all of shape ``[B, S]``) is flattened, cut to the largest multiple
      of ``curr_seq_len`` and reshaped to ``[B * S // curr_seq_len, curr_seq_len]``; tokens that stand at the
      same position in two tensors (a token, its mask and its label) stay together. A re-cut row mixes
      examples, so a batch holding one value per example is refused. ``preserve_end_of_sequence`` is ignored.
    """
    curr_seq_len = validate.integer("curr_seq_len", curr_seq_len, minimum=1)
    validate.flag("truncate", truncate)
    validate.flag("preserve_end_of_sequence", preserve_end_of_sequence)
    names, tensors = _items(batch)
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.is_floating_point() and tensor.dim() >= 4:
            raise ValueError(
                f"batch item {name!r} is a floating-point tensor of shape {tuple(tensor.shape)}, an image batch: "
                "sequence length warmup cuts token sequences [batch, sequence, ...] and would leave images as they "
                "are; use it with sequence models only"
            )
    tokens_name, tokens = _tokens(batch, names, tensors)
    rows, sequence_length = tokens.shape[:2]
    is_sequence = [t.dim() >= 2 and t.shape[:2] == (rows, sequence_length) for t in tensors]
    for name, tensor, sequence in zip(names, tensors, is_sequence, strict=True):
        if not sequence and (tensor.dim() == 0 or tensor.shape[0] != rows):
            raise ValueError(
                f"batch item {name!r} has shape {tuple(tensor.shape)} and batch item {tokens_name!r} "
                f"{tuple(tokens.shape)}, the tokens: expected a sequence [{rows}, {sequence_length}, ...] (cut with the tokens) "
                f"or one value per example [{rows}, ...] (kept)"
            )
    if curr_seq_len >= sequence_length:
        return batch
    if truncate:
        if preserve_end_of_sequence:
            ends = _sequence_ends(batch, rows, sequence_length, tokens.device)
            resized = [
                _truncate_keeping_end(t, curr_seq_len, ends) if sequence else t
                for t, sequence in zip(tensors, is_sequence, strict=True)
            ]
        else:
            resized = [
                t[:, :curr_seq_len].contiguous() if sequence else t
                for t, sequence in zip(tensors, is_sequence, strict=True)
            ]
    else:
        for name, tensor, sequence in zip(names, tensors, is_sequence, strict=True):
            if not sequence or tensor.dim() != 2:
                raise ValueError(
                    f"batch item {name!r} has shape {tuple(tensor.shape)}: truncate=False re-cuts the rows of the "
                    f"tokens {tokens_name!r} {tuple(tokens.shape)} across examples, so every tensor must have "
                    "their shape; one value per example (a classification label) cannot follow a re-cut row. "
                    "Use truncate=True, or keep only token-aligned items in the batch"
                )
        kept = rows * sequence_length // curr_seq_len * curr_seq_len
        resized = [t.reshape(-1)[:kept].reshape(-1, curr_seq_len) for t in tensors]
    return _rebuilt(batch, names, resized)


def _tokens(batch: Any, names: list[Any], tensors: list[Tensor]) -> tuple[Any, Tensor]:
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), Tensor) and batch["input_ids"].dim() >= 2:
        return "input_ids", batch["input_ids"]
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.dim() >= 2:
            return name, tensor
    shapes = {name: tuple(t.shape) for name, t in zip(names, tensors, strict=True)}
    raise ValueError(
        f"batch holds no sequence-shaped tensor (shapes {shapes}): expected token ids [batch, sequence, ...]"
    )


def _items(batch: Any) -> tuple[list[Any], list[Tensor]]:
    if isinstance(batch, Mapping):
        names, values = list(batch.keys()), list(batch.values())
    elif isinstance(batch, tuple | list):
        names, values = list(range(len(batch))), list(batch)
    else:
        raise TypeError(f"batch of type {type(batch).__name__}: expected a mapping, tuple or list of tensors")
    if not values:
        raise ValueError("batch is empty: expected at least one tensor")
    for name, value in zip(names, values, strict=True):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"batch item {name!r} is a {type(value).__name__}: expected every item to be a tensor"
            )
    return names, values


def _rebuilt(batch: Any, names: list[Any], tensors: list[Tensor]) -> Any:
    if isinstance(batch, Mapping):
        return dict(zip(names, tensors, strict=True))
    if isinstance(batch, list):
        return type(batch)(tensors)
    return type(batch)(*tensors) if hasattr(batch, "_fields") else tuple(tensors)


def _sequence_ends(batch: Any, rows: int, sequence_length: int, device: torch.device) -> Tensor:
    if isinstance(batch, Mapping):
        if "attention_mask" not in batch:
            raise ValueError(
                'preserve_end_of_sequence=True needs the mapping batch to hold "attention_mask" (whose row sums '
                f"locate the last token); its keys are {list(batch)}"
            )
        ends: Tensor = batch["attention_mask"].sum(dim=1).long() - 1
        return ends
    return torch.full((rows,), sequence_length - 1, dtype=torch.int64, device=device)


def _truncate_keeping_end(tensor: Tensor, length: int, ends: Tensor) -> Tensor:
    rows = torch.arange(tensor.shape[0], device=tensor.device)
    ends = ends.to(tensor.device)
    # index_put is out of place: the cut copy gets the end values, the input keeps its own.
    return tensor[:, :length].index_put((rows, ends.clamp(max=length - 1)), tensor[rows, ends])
