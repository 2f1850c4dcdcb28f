"""The base of algorithms that transform the input of the batch as it leaves the loader (CutOut, ColOut,
RandAugment, AugMix): one traced hook at AFTER_DATALOADER, drawing from the algorithm's own key."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from torch import Tensor

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, Capabilities, Hook
from composer_fn.core.event import Event
from composer_fn.core.state import State, StepCtx, batch_get, batch_set

__all__ = ["BatchTransform"]


class BatchTransform(Algorithm):
    """Transforms ``batch[input_key]`` at AFTER_DATALOADER with ``transform``; subclasses are frozen dataclasses
    with an ``input_key`` field."""

    input_key: int | str

    input_range: ClassVar[tuple[float, float] | None] = None
    """The range floating-point inputs must lie in (``(0.0, 1.0)``: pixels before normalisation), or None."""

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        """Returns ``input`` transformed, with every draw from ``key``."""
        raise NotImplementedError

    def transform_batch(self, key: R.Key, batch: Any) -> Any:
        """Returns ``batch`` with its input transformed; a transform that changes other items overrides this."""
        return batch_set(batch, self.input_key, self.transform(key, batch_get(batch, self.input_key)))

    def capabilities(self) -> Capabilities:
        return Capabilities(input_range=self.input_range)

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.AFTER_DATALOADER: self._transform}

    def _transform(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        return state, ctx.replace(batch=self.transform_batch(R.algorithm_key(ctx.key, self.name), ctx.batch))
