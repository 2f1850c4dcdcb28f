"""The check that a functional call was given a key tensor, not a seed."""

from __future__ import annotations

import torch
from torch import Tensor

from composer_fn.core import random as R
from composer_fn.core import validate

__all__ = ["check_key"]


def check_key(key: object, argument: str = "key") -> R.Key:
    """Returns ``key`` if it is a key tensor (``int64 [..., 2]``); raises TypeError saying how to make one.

    Only the type, dtype and shape are read, so the check costs nothing inside a traced step.
    """
    if isinstance(key, Tensor) and key.dtype == torch.int64 and key.dim() >= 1 and key.shape[-1] == 2:
        return key
    if validate.is_integer(key):
        raise TypeError(
            f"{argument}={key!r} is a seed, not a key: pass {argument}=composer_fn.random.key({key!r})"
        )
    shown = (
        f"a tensor of dtype {key.dtype} and shape {tuple(key.shape)}"
        if isinstance(key, Tensor)
        else repr(key)
    )
    raise TypeError(
        f"{argument}={shown} must be a key, an int64 tensor [..., 2] such as composer_fn.random.key(seed)"
    )
