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

from composer_fn.core import random as R
from composer_fn.core.random import Key
from composer_fn.models._build import materialise

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


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")


def _key_or_default(key: Key | None) -> Key:
    if key is None:
        return R.key(0)
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (2,):
        raise ValueError(f"key={key!r} must be one key: an int64 tensor of shape [2], e.g. key(0)")
    return key


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
            _check_positive_int(name, value)
        owned = not _building_on_meta()
        parameter_key = _key_or_default(key)
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
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(
                f"depth={depth!r} must be 6n + 2 for an int n >= 1 (8, 14, 20, 32, 44, 56, 110, ...)"
            )
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
            _check_positive_int(name, value)
        parameter_key = _key_or_default(key)
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
        _check_positive_int(argument, value)
    parameter_key = _key_or_default(key)
    with torch.device("meta"):
        model = builders[name](weights=None, num_classes=num_classes)
        if in_channels != 3:
            model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return materialise(model, parameter_key)
