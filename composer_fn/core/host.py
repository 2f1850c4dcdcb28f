"""Whether a tensor's values can be read on the host as they are, outside tracing."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["readable_on_host"]


def readable_on_host(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a plain CPU tensor outside ``torch.compile`` and ``torch.func`` transforms, needing
    no gradient: its ``.numpy()`` view (or ``.item()``) is then the tensor itself, and eager NumPy fast paths and
    host-side decisions may read it."""
    return (
        tensor.device.type == "cpu"
        and not tensor.requires_grad
        and not torch.compiler.is_compiling()
        and not torch._C._functorch.is_functorch_wrapped_tensor(tensor)
    )
