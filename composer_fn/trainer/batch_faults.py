"""Why a training step failed on its batch: read only after the step raised (nothing is checked on the way of a
step that runs), by comparing the batch with the first one and with what the default loss takes, and the model's
outputs on it with what the loss reads, so that the error names the batch, its item and what was expected instead
of torch's message from deep inside the loss."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from composer_fn.core.state import batch_target, held_logits
from composer_fn.trainer.outputs import causal_shift, model_loss

__all__ = ["BatchForm", "batch_form", "batch_fault", "output_fault"]


@dataclass(frozen=True)
class BatchForm:
    """A batch's items (index or key) with each tensor's shape past the batch dimension and dtype."""

    kind: str
    items: tuple[tuple[int | str, tuple[int, ...] | None, torch.dtype | None], ...]


def _items(batch: Any) -> list[tuple[int | str, Any]]:
    if isinstance(batch, Mapping):
        return list(batch.items())
    if isinstance(batch, tuple | list):
        return list(enumerate(batch))
    return []


def batch_form(batch: Any) -> BatchForm:
    """Returns the form of ``batch`` (a tuple/list or mapping of tensors)."""
    items = tuple(
        (key, tuple(value.shape[1:]), value.dtype) if isinstance(value, Tensor) else (key, None, None)
        for key, value in _items(batch)
    )
    return BatchForm("mapping" if isinstance(batch, Mapping) else type(batch).__name__, items)


def _shape(trailing: tuple[int, ...]) -> str:
    return "[" + ", ".join(["B", *map(str, trailing)]) + "]"


def batch_fault(
    batch: Any, first: BatchForm | None, target_key: int | str | None, default_loss: bool, check_classes: Callable[[], None]
) -> str | None:
    """Returns what is wrong with ``batch`` (against ``first``, the first batch's form; against what the default loss
    takes, with ``default_loss``), or None when nothing is found; ``check_classes()`` raises ValueError for a class
    the model has no output for."""
    form = batch_form(batch)
    if first is not None and (form.kind != first.kind or [k for k, *_ in form.items] != [k for k, *_ in first.items]):
        return (
            f"it is a {form.kind} of items {[k for k, *_ in form.items]}, and the first batch was a {first.kind} of "
            f"items {[k for k, *_ in first.items]}; expected every batch to hold the same items"
        )
    tensors = [(key, value) for key, value in _items(batch) if isinstance(value, Tensor) and value.dim() > 0]
    lengths = {key: value.shape[0] for key, value in tensors}
    if len(set(lengths.values())) > 1:
        held = ", ".join(f"item {key!r} {length}" for key, length in lengths.items())
        return f"its items hold different numbers of samples ({held}); expected one sample per row of each item"
    if first is not None:
        for (key, shape, dtype), (_, first_shape, first_dtype) in zip(form.items, first.items, strict=True):
            if dtype is not None and first_dtype is not None and dtype != first_dtype:
                return f"item {key!r} is {dtype}, and the first batch's was {first_dtype}; expected the same dtype in every batch"
            if shape is not None and first_shape is not None and shape != first_shape:
                return (
                    f"item {key!r} has shape {_shape(shape)}, and the first batch's had {_shape(first_shape)}; expected "
                    "the same shape past the batch dimension in every batch"
                )
    if default_loss:
        key = target_key if target_key is not None else ("labels" if isinstance(batch, Mapping) else 1)
        target = dict(_items(batch)).get(key)
        if isinstance(target, Tensor):
            if target.is_floating_point() and target.dim() < 2:
                return (
                    f"item {key!r} (the targets) is {target.dtype} of shape {list(target.shape)}: the default loss takes "
                    "class indices (int64 [B]) or class probabilities (float [B, C])"
                )
            if not target.is_floating_point() and target.dtype != torch.int64:
                return f"item {key!r} (the targets) is {target.dtype}: the default loss takes int64 class indices (.long())"
            if not target.is_floating_point() and target.dim() == 2 and target.shape[1] == 1:
                return f"item {key!r} (the targets) has shape {list(target.shape)}: expected [B] class indices (.squeeze(1))"
    try:
        check_classes()
    except ValueError as error:
        return str(error)
    return None


def _described(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"shape {list(value.shape)} ({value.dtype})"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of keys {list(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def output_fault(outputs: Any, batch: Any, target_key: int | str | None, default_loss: bool, causal: bool) -> str | None:
    """Returns what is wrong with the model's ``outputs`` on ``batch`` for the loss (with ``default_loss``, the
    trainer's: the model's own ``loss``, else cross-entropy of its logits against the targets at ``target_key``;
    ``causal``: logits at ``t`` against the label at ``t + 1``), or None when nothing is found."""
    expected = "expected a logits tensor, or a mapping or record holding 'logits' (or the model's own 'loss')"
    if outputs is None:
        return f"the model returned None on it: {expected}"
    if not default_loss or model_loss(outputs) is not None or isinstance(outputs, tuple | list):
        return None  # a tuple: the default loss says itself what it reads of one
    logits = held_logits(outputs)
    if logits is None:
        return f"the model returned {_described(outputs)} on it, holding neither 'loss' nor 'logits': {expected}"
    key = target_key if target_key is not None else ("labels" if isinstance(batch, Mapping) else 1)
    try:
        target = batch_target(batch, target_key)
    except KeyError:
        return None
    if not isinstance(target, Tensor) or target.dim() == 0:
        return None
    paired, target = causal_shift(logits, target, causal)
    if paired.dim() == 0 or paired.shape[0] != target.shape[0]:
        return (
            f"the model's logits on it have {_described(logits)}, for targets (item {key!r}) of {_described(target)}: "
            f"expected one row of logits per sample ({target.shape[0]})"
        )
    if not target.is_floating_point() and paired.dim() != target.dim() + 1:
        return (
            f"the model's logits on it have {_described(logits)}, for class-index targets (item {key!r}) of "
            f"{_described(target)}: expected logits with one more dimension than the targets (the classes: [B, C] "
            "for targets [B])"
        )
    if target.is_floating_point() and paired.shape != target.shape:
        return (
            f"the model's logits on it have {_described(logits)}, for class-probability targets (item {key!r}) of "
            f"{_described(target)}: expected the targets' shape"
        )
    return None
