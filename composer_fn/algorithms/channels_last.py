"""ChannelsLast: store 4-d convolution weights in NHWC order, which GPU convolution kernels run faster on.

A host hook at INIT returns new parameters in ``torch.channels_last`` format; values are unchanged, so the
model computes the same outputs. Inputs follow the weights' format inside convolutions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composer_fn.core.algorithm import Algorithm, HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp

__all__ = ["ChannelsLast", "apply_channels_last", "channels_last_tensors"]


def channels_last_tensors(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Returns the tensors with every 4-d one in ``torch.channels_last`` format (others are kept as they are)."""
    return {
        name: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for name, t in tensors.items()
    }


def apply_channels_last(model: nn.Module) -> nn.Module:
    """Returns a copy of ``model`` whose 4-d parameters and buffers are channels-last; ``model`` is untouched."""
    converted = copy.deepcopy(model)
    return converted.to(memory_format=torch.channels_last)


@register
@dataclass(frozen=True)
class ChannelsLast(Algorithm):
    """Converts convolution weights to channels-last memory format at INIT (Composer's ``ChannelsLast``)."""

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.INIT: self._convert}

    def _convert(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        return static, state.replace(
            params=channels_last_tensors(state.params), buffers=channels_last_tensors(state.buffers)
        )
