"""Random layers under a functional step: each forward receives a fresh key in a buffer named ``forward_key``.

A module that draws random numbers in its forward (stochastic depth, dropout variants) registers a
``forward_key`` buffer with ``register_forward_key``. The training step replaces every such buffer, for one
forward, by ``fold_in(step_key, name_to_int(qualified_name))``: each layer draws its own bits, the draws
change every step, and the same state and batch give the same draws (a SAM second pass included). The
stored buffer keeps its initial value; outside a training step (evaluation, a plain call) the layer sees
that value, and layers whose draws matter only in training mode ignore it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.validate import probability

__all__ = ["FORWARD_KEY", "KeyedDropout", "register_forward_key", "forward_key_names", "forward_keys"]

FORWARD_KEY = "forward_key"
"""The buffer name the training step fills with a per-step, per-layer key."""


def register_forward_key(module: nn.Module) -> None:
    """Registers ``module.forward_key``, a non-persistent key buffer the training step fills each forward."""
    module.register_buffer(FORWARD_KEY, R.key(0), persistent=False)


def forward_key_names(module: nn.Module) -> tuple[str, ...]:
    """Returns the qualified names of ``module``'s ``forward_key`` buffers."""
    return tuple(name for name, _ in module.named_buffers() if name.rpartition(".")[2] == FORWARD_KEY)


def forward_keys(names: tuple[str, ...], step_key: Tensor) -> dict[str, Tensor]:
    """Returns the key each named ``forward_key`` buffer holds for one forward under ``step_key``."""
    if not (isinstance(step_key, Tensor) and step_key.dtype == torch.int64 and step_key.shape[-1:] == (2,)):
        raise TypeError(f"step_key={step_key!r} must be a key, an int64 tensor [..., 2] such as composer_fn.random.key(0)")
    return {name: R.fold_in(step_key, R.name_to_int(name)) for name in names}


class KeyedDropout(nn.Dropout):
    """``nn.Dropout`` whose mask comes from its ``forward_key`` buffer instead of the global generator.

    In training, each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``; the keep mask
    is ``uniform(forward_key, input.shape) >= p``. The training step fills ``forward_key`` with a fresh key
    each step (see the module docstring); a plain call sees the stored key, so repeated calls draw the same
    mask. In evaluation it is the identity.
    """

    forward_key: Tensor

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(probability("p", p))
        register_forward_key(self)

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input`` with elements zeroed with probability ``p`` and the rest scaled (training only)."""
        if not self.training or self.p == 0.0:
            return input
        if self.p == 1.0:
            return torch.zeros_like(input)
        keep = R.uniform(self.forward_key, tuple(input.shape)) >= self.p
        return input * keep.to(input.dtype) * (1.0 / (1.0 - self.p))
