"""Prediction: the model's outputs on each batch of a loader, checked against what the model trained on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core.event import Event
from composer_fn.core.state import State, batch_input
from composer_fn.trainer.checks import check_predict_input
from composer_fn.trainer.first_batch import SetUp, outputs_of

__all__ = ["check_predict_loader", "predictions", "holding"]


def check_predict_loader(dataloader: object) -> None:
    """Raises TypeError for a ``dataloader`` that is not an iterable of batches (a string, a tensor of rows)."""
    if isinstance(dataloader, str | bytes) or not isinstance(dataloader, Iterable):
        raise TypeError(
            f"dataloader of type {type(dataloader).__name__}: expected an iterable of batches (a loader, a list of "
            "batches, or a list of input tensors)"
        )
    if isinstance(dataloader, Tensor):
        raise TypeError(
            f"dataloader is a tensor of shape {tuple(dataloader.shape)}, whose rows would be taken as batches: "
            "pass a list of batches, e.g. [inputs]"
        )


def predictions(
    setup: SetUp,
    step: Callable[[State, Any], Any],
    state: Callable[[], State],
    dataloader: Iterable[Any],
    to_device: Callable[[Any], Any],
    on_event: Callable[[Event], None],
) -> list[Any]:
    """Returns ``step``'s outputs of the state (``state()``, read at each batch) on each batch of ``dataloader`` (moved by ``to_device``), on the CPU,
    calling ``on_event`` at PREDICT_BATCH_START and PREDICT_BATCH_END. A batch is as in training, or its input
    tensor alone; inputs that cannot be the model's are refused naming the batch (``check_predict_input``)."""
    outputs: list[Any] = []
    for index, batch in enumerate(map(to_device, dataloader)):
        # A batch of inputs alone is the loader's whole batch, not a tuple to index.
        batch = holding(batch, setup.input_key) if isinstance(batch, Tensor) else batch
        if not isinstance(batch, tuple | list | Mapping):
            raise TypeError(
                f"predict: dataloader's batch {index} is a {type(batch).__name__}: expected a tensor of inputs, or a "
                f"tuple, list or mapping holding them at input_key={setup.input_key!r}"
            )
        inputs = batch_input(batch, setup.input_key)
        check_predict_input(inputs, index, setup.input_key, setup.trained_input, setup.static.module)
        on_event(Event.PREDICT_BATCH_START)
        result = outputs_of(setup, step, state(), batch, f"predict's dataloader batch {index}")
        outputs.append(pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, Tensor) else t, result))
        on_event(Event.PREDICT_BATCH_END)
    return outputs


def holding(inputs: Tensor, input_key: int | str | None) -> Any:
    """Returns a batch holding ``inputs`` alone at ``input_key`` (None: item 0)."""
    key = input_key if input_key is not None else 0
    if isinstance(key, str):
        return {key: inputs}
    return (inputs,) if key in (0, -1) else (*([None] * key), inputs) if key > 0 else (inputs, *([None] * (-key - 1)))
