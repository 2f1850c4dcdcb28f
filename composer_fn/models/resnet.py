"""ResNets built from a key: He et al.'s CIFAR ResNet (depth 6n + 2) and torchvision's ImageNet ResNets.

Every module is built on the meta device and its parameters are filled by ``init_parameters`` from a key, so
building a ResNet neither reads nor advances PyTorch's global random generator, and the same key gives
bitwise the same model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core.random import Key
from composer_fn.core.validate import integer, is_integer
from composer_fn.nn.init import materialise
from composer_fn.nn.residual import BasicBlock, key_or_default

__all__ = [
    "BasicBlock",
    "CIFARResNet",
    "cifar_resnet20",
    "cifar_resnet56",
    "torchvision_resnet",
    "TORCHVISION_RESNETS",
]

TORCHVISION_RESNETS: tuple[str, ...] = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
"""The torchvision architectures ``torchvision_resnet`` builds."""


class CIFARResNet(nn.Module):
    """He et al.'s ResNet for 32×32 images: depth ``6n + 2`` = a 3×3 stem, three stages of ``n`` blocks, a head.

    The stages have ``width``, ``2 * width`` and ``4 * width`` channels (16, 32, 64 in the paper); the first
    block of stages two and three halves the resolution with a stride-2 convolution and a projection shortcut
    (option B, see ``BasicBlock``). Global average pooling and a linear layer give the logits. Any input side
    works; the paper's is 32.

    Attributes: ``conv1``, ``bn1`` (the stem), ``layer1``, ``layer2``, ``layer3`` (``nn.Sequential`` of
    ``BasicBlock``), ``pool``, ``fc``. Parameters are ``init_parameters(model, key)`` (``key(0)`` when not given),
    PyTorch's default layer initialisation drawn from the key.
    """

    def __init__(
        self,
        depth: int,
        num_classes: int = 10,
        in_channels: int = 3,
        width: int = 16,
        *,
        key: Key | None = None,
    ) -> None:
        super().__init__()
        if not is_integer(depth) or depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(
                f"depth={depth!r} must be 6n + 2 for an int n >= 1 (8, 14, 20, 32, 44, 56, 110, ...)"
            )
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
            integer(name, value, minimum=1)
        parameter_key = key_or_default(key)
        blocks = (depth - 2) // 6
        self.depth = depth
        with torch.device("meta"):
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.layer1 = _stage(width, width, blocks, stride=1)
            self.layer2 = _stage(width, 2 * width, blocks, stride=2)
            self.layer3 = _stage(2 * width, 4 * width, blocks, stride=2)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4 * width, num_classes)
        materialise(self, parameter_key)

    def forward(self, images: Tensor) -> Tensor:
        """Returns class logits ``[N, num_classes]`` for images ``[N, in_channels, H, W]``."""
        x = F.relu(self.bn1(self.conv1(images)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.pool(x).flatten(1))


def _stage(in_channels: int, out_channels: int, blocks: int, stride: int) -> nn.Sequential:
    first = BasicBlock(in_channels, out_channels, stride)
    return nn.Sequential(first, *(BasicBlock(out_channels, out_channels) for _ in range(blocks - 1)))


def cifar_resnet20(num_classes: int = 10, in_channels: int = 3, *, key: Key | None = None) -> CIFARResNet:
    """Returns ResNet-20 for CIFAR (three blocks per stage, 0.27M parameters)."""
    return CIFARResNet(20, num_classes=num_classes, in_channels=in_channels, key=key)


def cifar_resnet56(num_classes: int = 10, in_channels: int = 3, *, key: Key | None = None) -> CIFARResNet:
    """Returns ResNet-56 for CIFAR (nine blocks per stage, 0.86M parameters)."""
    return CIFARResNet(56, num_classes=num_classes, in_channels=in_channels, key=key)


def _torchvision_builders() -> dict[str, Callable[..., nn.Module]]:
    from torchvision.models import resnet

    return {name: getattr(resnet, name) for name in TORCHVISION_RESNETS}


def torchvision_resnet(
    name: str, num_classes: int = 10, in_channels: int = 3, *, key: Key | None = None
) -> nn.Module:
    """Returns torchvision's ResNet ``name`` (``'resnet18'``, ``'resnet50'``, ...), untrained, built from a key.

    The model is torchvision's own ``ResNet`` with its ``BasicBlock`` or ``Bottleneck`` blocks, built with
    ``weights=None`` (nothing is downloaded) on the meta device. Its parameters are ``init_parameters(model,
    key)`` (``key(0)`` when not given): PyTorch's default layer initialisation, not torchvision's Kaiming-normal
    convolutions, which makes little difference under BatchNorm. ``in_channels`` other than 3 replaces the
    stem convolution by one with that many input channels.
    """
    builders = _torchvision_builders()
    if name not in builders:
        raise ValueError(
            f"name={name!r} is not a torchvision ResNet we build; accepted: {', '.join(builders)}"
        )
    for argument, value in (("num_classes", num_classes), ("in_channels", in_channels)):
        integer(argument, value, minimum=1)
    parameter_key = key_or_default(key)
    with torch.device("meta"):
        model = builders[name](weights=None, num_classes=num_classes)
        if in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return materialise(model, parameter_key)
