"""Small convolutional classifiers for small images: the 8×8 digits, 28×28 Fashion-MNIST."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from composer_fn.core.random import key
from composer_fn.core.validate import choice, integer, real
from composer_fn.nn.init import materialise
from composer_fn.nn.keyed import KeyedDropout

__all__ = ["SmallCNN", "TwoConvBN"]


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


class TwoConvBN(nn.Module):
    """The "two conv + pooling + BN" network of Fashion-MNIST's benchmark table: conv5×5-BN-ReLU-maxpool2 twice
    (``width`` and ``2 * width`` channels), then a hidden linear layer of ``hidden`` units with ReLU and dropout,
    and a linear head.

    For ``image_size`` 28 the second pooling leaves 7×7 maps, so the hidden layer takes ``2 * width * 49`` inputs.
    As in torchvision's VGG, an adaptive average pooling to ``image_size // 4`` sits before the hidden layer: an
    identity at the size the network was built for, and what lets it take other sizes (progressive resizing trains
    on smaller images). The parameters start as ``init_parameters(model, key(0))``; ``dropout`` is a
    ``KeyedDropout``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        width: int = 32,
        hidden: int = 1024,
        dropout: float = 0.4,
        image_size: int = 28,
    ) -> None:
        super().__init__()
        for name, value in (
            ("in_channels", in_channels),
            ("num_classes", num_classes),
            ("width", width),
            ("hidden", hidden),
            ("image_size", image_size),
        ):
            integer(name, value, minimum=1)
        if image_size % 4:
            raise ValueError(f"image_size={image_size!r} must be a multiple of 4 (two 2x2 poolings)")
        real("dropout", dropout, minimum=0.0, maximum=1.0, open_above=True, hint="a probability")
        side = image_size // 4
        with torch.device("meta"):
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, width, kernel_size=5, padding=2, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(width, 2 * width, kernel_size=5, padding=2, bias=False),
                nn.BatchNorm2d(2 * width),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )
            self.side = side
            self.pool = nn.AdaptiveAvgPool2d(side)
            self.hidden = nn.Linear(2 * width * side * side, hidden)
            self.dropout = KeyedDropout(dropout) if dropout > 0 else nn.Identity()
            self.head = nn.Linear(hidden, num_classes)
        materialise(self, key(0))

    def forward(self, images: Tensor) -> Tensor:
        """Returns class logits ``[N, num_classes]`` for images ``[N, in_channels, H, W]``."""
        maps = self.features(images)
        if maps.shape[-2:] != (self.side, self.side):  # an identity at the size the network was built for
            maps = self.pool(maps)
        return self.head(self.dropout(torch.relu(self.hidden(maps.flatten(1)))))
