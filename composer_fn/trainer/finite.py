"""The run's watch over its loss: the first step whose loss is NaN or infinite ends ``fit()`` with an error naming
it, found without reading the device at every step."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LossWatch"]

_FOLD = 256
"""Losses kept (device scalars) before they are folded into one device-side answer, with no host read."""


class LossWatch:
    """Keeps each step's loss as the step returned it and says, where the run reads the device anyway (a log step,
    a checkpoint, an evaluation, the end of ``fit``), which step's loss was first not finite.

    A gradient that is not finite shows in the next step's loss (the weights it updated are not), so that step
    is the one named after it.
    """

    def __init__(self) -> None:
        self._losses: list[Tensor] = []
        self._start = 0
        self._first: Tensor | None = None  # the first bad step so far (-1: none), on the device

    def add(self, step: int, loss: Tensor) -> None:
        """Keeps the loss of ``step`` (1-based: the step that ended at batch ``step``)."""
        if not self._losses:
            self._start = step
        self._losses.append(loss)
        if len(self._losses) == _FOLD:
            self._fold()

    def _fold(self) -> None:
        losses = torch.stack([loss.detach().reshape(-1)[:1].float() for loss in self._losses]).reshape(-1)
        bad = ~torch.isfinite(losses)
        found = torch.where(bad.any(), bad.to(torch.int64).argmax() + self._start, -1)
        self._first = found if self._first is None else torch.where(self._first >= 0, self._first, found)
        self._losses = []

    def first_bad(self) -> int | None:
        """Returns the first step whose loss was NaN or infinite, or None (reads the device once)."""
        if self._losses:
            self._fold()
        if self._first is None:
            return None
        first = int(self._first)
        return first if first >= 0 else None

    def check(self, where: str) -> None:
        """Raises ``FloatingPointError`` naming the first step whose loss was not finite, if any; ``where`` says
        what the check comes before (``'the checkpoint at step 40'``)."""
        first = self.first_bad()
        if first is None:
            return
        raise FloatingPointError(
            f"step {first}: the loss is NaN or infinite (found before {where}); the run stops here, before any "
            "checkpoint of it. Inputs that hold NaN or infinity, a learning rate too high for the model, or fp16 "
            "without loss scaling are the usual causes (a gradient that is not finite shows in the next step's loss)"
        )
