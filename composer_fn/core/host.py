"""Whether code runs eagerly, and whether a tensor's values can be read on the host as they are; running code on
fake tensors.

Eager-only fast paths (byte kernels, slicing by values read on the host, checks on tensor values) ask these
questions; traced code takes the plain tensor form, which the compiler fuses. ``on_fake_tensors`` runs code
on tensors that hold shapes and no values, as the compiler's trace sees them, at no compute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["eager", "readable_on_host", "on_fake_tensors"]

_T = TypeVar("_T")


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


def on_fake_tensors(function: Callable[..., _T], *tensors: Any) -> _T:
    """Returns ``function(*tensors)`` run on fake copies of the tensors in ``tensors`` (pytrees): shapes, dtypes and
    devices without values, so nothing is computed and no tensor given changes; tensors made inside are fake too.

    A layer that branches on a concrete value takes its traced path (``torch.compiler.is_compiling`` is False,
    but the tensors are fake). Exceptions propagate, without torch's own log line for a failing operation.
    """
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    disabled, logger.disabled = logger.disabled, True
    try:
        with mode:
            fake = pytree.tree_map(lambda t: mode.from_tensor(t) if isinstance(t, Tensor) else t, tensors)
            return function(*fake)
    finally:
        logger.disabled = disabled
