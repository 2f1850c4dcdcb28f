"""SqueezeExcite: channel attention after convolutions (Hu et al., 2018; Composer's ``SqueezeExcite``).

Model surgery at INIT replaces every ``nn.Conv2d`` with ``min(in_channels, out_channels) >= min_channels`` by
a ``SqueezeExciteConv2d``: the convolution, then a ``SqueezeExcite2d`` block that rescales each of its ``C``
output channels by ``sigmoid(W₂ relu(W₁ mean_hw(y)))``, with ``W₁`` of shape ``[L, C]`` and ``W₂`` of shape
``[C, L]``. As in Composer, both linear layers have no bias, so each replaced convolution adds ``2·C·L``
parameters. ``L`` is ``latent_channels``, or ``int(latent_channels · C)`` when ``latent_channels < 1``.

The new layers draw their initial values (PyTorch's default ``Linear`` initialisation) from the surgery's
key, a different key for each replaced convolution; the convolution keeps its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from composer_fn.algorithms._surgery import LayerKinds, Surgery, matching_modules, replaced
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register
from composer_fn.nn import init_parameters
from composer_fn.nn.sharing import shared_copy

__all__ = [
    "SqueezeExcite",
    "SqueezeExcite2d",
    "SqueezeExciteConv2d",
    "apply_squeeze_excite",
    "latent_width",
]

_LATENT_FORMS = "a width (>= 1) or a fraction of the convolution's output channels (< 1)"


def latent_width(num_features: int, latent_channels: float) -> int:
    """Returns the hidden width ``L`` of the block after ``num_features`` channels (Composer's rule).

    ``latent_channels >= 1`` is the width itself (truncated to an int); below 1 it is a fraction of
    ``num_features``, truncated. A width below 1 is refused.
    """
    validate.real("latent_channels", latent_channels, minimum=0.0, open_below=True, hint=_LATENT_FORMS)
    width = int(latent_channels if latent_channels >= 1 else latent_channels * num_features)
    if width < 1:
        raise ValueError(
            f"latent_channels={latent_channels!r} of num_features={num_features} gives a hidden width of {width}; "
            "expected at least 1 (raise latent_channels, or min_channels to skip narrow layers)"
        )
    return width


class SqueezeExcite2d(nn.Module):
    """``x · sigmoid(W₂ relu(W₁ mean_hw(x)))``, channel by channel: the squeeze-and-excitation block.

    ``pool_and_mlp`` is Composer's ``Sequential(AdaptiveAvgPool2d(1), Flatten(), Linear(C, L, bias=False),
    ReLU(), Linear(L, C, bias=False), Sigmoid())`` (the same parameter names). Its weights are
    ``init_parameters(block, key)`` (``key(0)`` when not given), built without PyTorch's global generator.
    """

    def __init__(
        self, num_features: int, latent_channels: float = 0.125, *, key: Tensor | None = None
    ) -> None:
        super().__init__()
        validate.integer("num_features", num_features, minimum=1)
        self.latent_channels = latent_width(num_features, latent_channels)
        with torch.device("meta"):
            self.pool_and_mlp = nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(num_features, self.latent_channels, bias=False),
                nn.ReLU(),
                nn.Linear(self.latent_channels, num_features, bias=False),
                nn.Sigmoid(),
            )
        self.to_empty(device="cpu")
        values = init_parameters(self, R.key(0) if key is None else key)
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                parameter.copy_(values[name])

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input [N, C, H, W]`` with each channel scaled by its attention coefficient in (0, 1)."""
        coefficients = self.pool_and_mlp(input)
        return input * coefficients.reshape(input.shape[0], input.shape[1], 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """A convolution followed by a ``SqueezeExcite2d`` over its output channels: ``se(conv(x))``.

    ``conv`` is kept as given (pass a copy to keep your own); ``se`` draws its weights from ``key``.
    """

    def __init__(self, conv: nn.Conv2d, latent_channels: float = 0.125, *, key: Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv of type {type(conv).__name__}: expected a torch.nn.Conv2d")
        self.conv = conv
        se = SqueezeExcite2d(conv.out_channels, latent_channels, key=key)
        self.se = se.to(device=conv.weight.device, dtype=conv.weight.dtype)
        self.train(conv.training)

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``se(conv(input))``."""
        return self.se(self.conv(input))


def _check(latent_channels: float, min_channels: int) -> None:
    validate.real("latent_channels", latent_channels, minimum=0.0, open_below=True, hint=_LATENT_FORMS)
    validate.integer("min_channels", min_channels, minimum=0)


def _squeeze_excite_targets(model: nn.Module, min_channels: int) -> tuple[str, ...]:
    # A convolution inside a SqueezeExciteConv2d already has its block: idempotence.
    wrapped = [name for name, m in model.named_modules() if isinstance(m, SqueezeExciteConv2d)]

    def is_target(name: str, module: nn.Module) -> bool:
        return (
            isinstance(module, nn.Conv2d)
            and SqueezeExcite.layers.kind(module) is not None
            and min(module.in_channels, module.out_channels) >= min_channels
            and not any(name.startswith(prefix + ".") for prefix in wrapped)
        )

    return tuple(matching_modules(model, is_target))


def apply_squeeze_excite(
    model: nn.Module, latent_channels: float = 64, min_channels: int = 128, *, key: Tensor
) -> nn.Module:
    """Returns a copy of ``model`` with a squeeze-excite block after each wide convolution; ``model`` is untouched.

    Composer's ``apply_squeeze_excite`` without ``optimizers``. A ``nn.Conv2d`` with ``min(in_channels,
    out_channels) >= min_channels`` becomes ``SqueezeExciteConv2d(conv, latent_channels)``; the block after the
    convolution named ``name`` draws its weights from ``fold_in(key, name_to_int(name))``. Applying it twice
    gives the model of one application.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    _check(latent_channels, min_channels)
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (2,):
        raise ValueError(f"key={key!r} must be one key: an int64 tensor of shape [2], e.g. key(0)")
    replacements = {}
    for name in _squeeze_excite_targets(model, min_channels):
        # The model's own convolution, which ``replace_modules`` moves onto its copy: its ties stay.
        conv = shared_copy(model.get_submodule(name))
        assert isinstance(conv, nn.Conv2d)
        layer_key = R.fold_in(key.cpu(), R.name_to_int(name))
        replacements[name] = SqueezeExciteConv2d(conv, latent_channels, key=layer_key)
    looks_for = f"torch.nn.Conv2d with at least {min_channels} input and output channels"
    return replaced(model, replacements, method="SqueezeExcite", looks_for=looks_for, rewritten=SqueezeExciteConv2d)


@register
@dataclass(frozen=True)
class SqueezeExcite(Surgery):
    """Adds squeeze-excite blocks after wide convolutions at INIT (Composer's ``SqueezeExcite``).

    Args:
        latent_channels: the blocks' hidden width, or a fraction of each convolution's output channels when
            below 1.
        min_channels: a convolution gets a block when ``min(in_channels, out_channels) >= min_channels``.

    With ``BlurPool`` in the same run it runs second, whichever order they are given in, and a blurred strided
    convolution gets its block on the convolution inside the ``BlurConv2d``: ``se(conv(blur(x)))``, the model
    Composer builds in either order (with ``blur_first=True``). After ``WeightStandardization`` it wraps the
    standardized convolution.
    """

    latent_channels: float = 64
    min_channels: int = 128

    rewrites_after: ClassVar[frozenset[str]] = frozenset({"blurpool", "weight_standardization"})
    layers: ClassVar[LayerKinds] = LayerKinds((nn.Conv2d,), subclasses="any")

    def __post_init__(self) -> None:
        _check(self.latent_channels, self.min_channels)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_squeeze_excite_targets(module, self.min_channels))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return apply_squeeze_excite(
            module, latent_channels=self.latent_channels, min_channels=self.min_channels, key=key
        )
