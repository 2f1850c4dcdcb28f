"""Whether code runs eagerly, and whether a tensor's values can be read on the host as they are.

Eager-only fast paths (byte kernels, slicing by values read on the host, checks on tensor values) ask these
questions; traced code takes the plain tensor form, which the compiler fuses.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["eager", "readable_on_host"]


def eager() -> bool:
    """Whether the calling code runs eagerly rather than under ``torch.compile``'s tracing."""
    return not torch.compiler.is_compiling()


def readable_on_host(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a plain CPU tensor outside ``torch.compile`` and ``torch.func`` transforms, needing
    no gradient: its ``.numpy()`` view (or ``.item()``) is then the tensor itself, and eager NumPy fast paths and
    host-side decisions may read it."""
    return (
        tensor.device.type == "cpu"
        and not tensor.requires_grad
        and eager()
        and not torch._C._functorch.is_functorch_wrapped_tensor(tensor)
    )
