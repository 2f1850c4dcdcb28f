"""The residual block of He et al.'s CIFAR ResNet, shared by the model zoo and by algorithms that rewrite it.

Stochastic depth recognises it (as it recognises torchvision's ``BasicBlock``) and wraps its residual branch,
so it lives here, below both ``composer_fn.models`` and ``composer_fn.algorithms``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.random import Key
from composer_fn.core.validate import integer
from composer_fn.nn.init import materialise, require_key

__all__ = ["BasicBlock", "key_or_default"]


def key_or_default(key: Key | None) -> Key:
    """Returns ``key``, checked, or ``key(0)`` when it is None."""
    return R.key(0) if key is None else require_key(key)


def _building_on_meta() -> bool:
    # Inside ``with torch.device("meta")`` an owner builds the whole tree and materialises it once.
    return torch.get_default_device().type == "meta"


class BasicBlock(nn.Module):
    """The CIFAR ResNet's residual block: ``relu(residual(x) + shortcut(x))``.

    Structure, which model surgery relies on (the names are torchvision's ``BasicBlock``'s):

    - ``conv1`` (3×3, ``stride``), ``bn1``, ``conv2`` (3×3), ``bn2``: the residual branch
      ``residual(x) = bn2(conv2(relu(bn1(conv1(x)))))``, which ends in ``bn2``;
    - ``shortcut``: ``nn.Identity()`` when the shape is kept, otherwise a 1×1 convolution with ``stride`` and a
      BatchNorm (He et al.'s option B: a projection, where option A pads with zeros).

    Built alone, the block's parameters are ``init_parameters(block, key)`` (``key(0)`` when not given); built
    inside ``with torch.device("meta")`` it stays there for its owner to materialise.
    """

    def __init__(
        self, in_channels: int, out_channels: int, stride: int = 1, *, key: Key | None = None
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("stride", stride)):
            integer(name, value, minimum=1)
        owned = not _building_on_meta()
        parameter_key = key_or_default(key)
        with torch.device("meta"):
            self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(out_channels)
            self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(out_channels)
            self.shortcut: nn.Module = nn.Identity()
            if stride != 1 or in_channels != out_channels:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(out_channels),
                )
        if owned:
            materialise(self, parameter_key)

    def residual(self, x: Tensor) -> Tensor:
        """Returns the residual branch's output ``bn2(conv2(relu(bn1(conv1(x)))))``."""
        return self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))

    def forward(self, x: Tensor) -> Tensor:
        """Returns ``relu(residual(x) + shortcut(x))``."""
        return F.relu(self.residual(x) + self.shortcut(x))
