"""Copies of a module's structure that hold the module's own tensors.

Model surgery builds replacement layers from them, and the trainer settles a Hugging Face model's loss function
in one without touching the user's module; so it lives here, below both ``composer_fn.algorithms`` and
``composer_fn.trainer``.
"""

from __future__ import annotations

import copy

from torch import nn

__all__ = ["shared_copy"]


def shared_copy(module: nn.Module) -> nn.Module:
    """Returns a copy of ``module``'s structure that holds ``module``'s own parameters and buffers (not copies).

    For building replacements: a surgery moves the tensors of its input that a replacement holds onto its copy
    of the model, so a replacement made of ``shared_copy`` parts keeps every tie its layer had.
    """
    memo: dict[int, object] = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return copy.deepcopy(module, memo)
