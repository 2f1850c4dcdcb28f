"""Building the zoo's modules without PyTorch's global random generator."""

from __future__ import annotations

import torch
from torch import nn

from composer_fn.core import random as R
from composer_fn.core.random import Key
from composer_fn.models.init import init_parameters
from composer_fn.models.keyed import FORWARD_KEY


def materialise(module: nn.Module, parameter_key: Key) -> nn.Module:
    """Returns ``module``, built on the meta device, moved to the CPU with ``init_parameters(module, key)``.

    PyTorch layers draw their initial weights from the global generator as they are built. Built on the meta
    device they draw nothing, and the values are filled in here from the key instead. Normalisation
    statistics are reset and random layers' ``forward_key`` buffers set to ``key(0)``; any other buffer would hold
    uninitialised memory, so it is refused.
    """
    module.to_empty(device="cpu")
    for owner_name, owner in module.named_modules():
        buffers = [name for name, _ in owner.named_buffers(recurse=False) if name != FORWARD_KEY]
        if FORWARD_KEY in owner._buffers:
            # A random layer's key buffer: the training step fills it each forward; its stored value is key(0).
            owner._buffers[FORWARD_KEY] = R.key(0)
        if isinstance(owner, nn.modules.batchnorm._NormBase):
            owner.reset_running_stats()
        elif buffers:
            raise TypeError(
                f"module {owner_name!r} ({type(owner).__name__}) has buffers {buffers} to initialise"
            )
    values = init_parameters(module, parameter_key)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            parameter.copy_(values[name])
    return module
