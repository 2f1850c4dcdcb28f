"""Factorize: replace wide ``Conv2d`` and ``Linear`` layers by two thinner ones through a low-rank latent space.

A ``Linear`` with weight ``W [out, in]`` becomes ``Linear(in, r)`` then ``Linear(r, out)``; a ``k×k`` ``Conv2d``
becomes a ``k×k`` convolution to ``r`` channels then a ``1×1`` convolution (Composer's ``FactorizedLinear`` and
``FactorizedConv2d``). The two factors start from the truncated singular value decomposition of the existing
weight, split evenly (``U_r·√s`` and ``√s·V_rᵀ``): the best rank-``r`` approximation of the layer for inputs
of equal variance in every direction, and the layer itself when its weight has rank ``r`` or less. Composer
instead re-initialises the factors at random, which discards what the layer has learned.

A layer is replaced when ``min(in, out)`` reaches ``min_channels``/``min_features`` and the latent size ``r``
reduces the multiply-adds: ``r · (fan_in + out) < fan_in · out`` with ``fan_in = in · k_h · k_w``, i.e.
``r <= ceil(fan_in · out / (fan_in + out) - 1)`` (Composer's rule; grouped convolutions are never replaced).
``factorize_matrix`` and ``factorize_conv2d`` are Composer's data-driven solvers: starting from the same SVD
they alternate least-squares updates of the two factors to fit the outputs on given inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch
from torch import Tensor, nn

from composer_fn.algorithms._low_rank import (
    LowRankSolution,
    check_latent,
    conv_weight_to_matrix,
    factorize_conv2d,
    factorize_matrix,
    matrix_to_conv_weight,
    svd_factors,
)
from composer_fn.algorithms._surgery import (
    LayerKinds,
    Surgery,
    check_model,
    replace_modules,
    warn_nothing_to_replace,
)
from composer_fn.core import validate
from composer_fn.core.algorithm import register

__all__ = [
    "Factorize",
    "FactorizedConv2d",
    "FactorizedLinear",
    "LowRankSolution",
    "apply_factorization",
    "factorize_conv2d",
    "factorize_matrix",
    "factorizing_could_speedup",
    "latent_size",
    "max_rank_with_speedup",
]

_T = TypeVar("_T", bound="_TwoFactors")


def latent_size(latent: int | float, in_size: int, out_size: int) -> int:
    """Returns the latent width: ``latent`` itself if an int, else ``max(1, int(latent · min(in, out)))``."""
    if not validate.is_integer(latent):
        return max(1, int(latent * min(in_size, out_size)))
    return int(latent)


def max_rank_with_speedup(in_size: int, out_size: int, kernel_size: tuple[int, ...] = ()) -> int:
    """Returns the largest latent width whose factorization takes fewer multiply-adds than the layer itself."""
    fan_in = in_size * math.prod(kernel_size)
    breakeven = fan_in * out_size / (fan_in + out_size)
    return int(math.ceil(breakeven - 1))


def factorizing_could_speedup(module: nn.Module, latent: int | float) -> bool:
    """Returns whether factorizing ``module`` (a ``Conv2d`` or ``Linear``) at ``latent`` saves multiply-adds.

    Anything else, grouped convolutions included, returns False: there is no supported factorization.
    """
    check_latent("latent", latent)
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return False
        rank = latent_size(latent, module.in_channels, module.out_channels)
        return rank <= max_rank_with_speedup(
            module.in_channels, module.out_channels, tuple(module.kernel_size)
        )
    if isinstance(module, nn.Linear):
        rank = latent_size(latent, module.in_features, module.out_features)
        return rank <= max_rank_with_speedup(module.in_features, module.out_features)
    return False


class _TwoFactors(nn.Module):
    """``module1(module0(x))``: a layer factorized into a map to the latent space and a map out of it.

    ``fits`` says whether the two modules make such a pair; ``expected`` describes a pair that does.
    """

    def __init__(self, module0: nn.Module, module1: nn.Module, fits: bool, expected: str) -> None:
        if not fits:
            raise ValueError(f"module0={module0} and module1={module1}: expected {expected}")
        super().__init__()
        self.module0 = module0
        self.module1 = module1

    def forward(self, input: Tensor) -> Tensor:
        """Returns the factorized layer's output, ``module1(module0(input))``."""
        return self.module1(self.module0(input))


def _with_weights(layer: _T, weight0: Tensor, weight1: Tensor, bias: Tensor | None) -> _T:
    """Returns ``layer`` (built on the meta device) holding the given weights and, in ``module1``, the bias."""
    layer.module0.weight = nn.Parameter(weight0)
    layer.module1.weight = nn.Parameter(weight1)
    if bias is not None:
        layer.module1.bias = nn.Parameter(bias.detach().clone())
    return layer


class FactorizedLinear(_TwoFactors):
    """``module1(module0(x))``: a ``Linear`` factorized through ``latent_features`` features.

    ``module0`` is ``Linear(in_features, latent_features, bias=False)`` and ``module1`` is
    ``Linear(latent_features, out_features)`` with the original layer's bias (or none, as the original).
    ``in_features``, ``out_features`` (as ``nn.Linear``) and ``latent_features`` are the widths.
    """

    module0: nn.Linear
    module1: nn.Linear

    def __init__(self, module0: nn.Linear, module1: nn.Linear) -> None:
        fits = module0.bias is None and module0.out_features == module1.in_features
        expected = "a bias-free module0 whose out_features equal module1's in_features"
        super().__init__(module0, module1, fits, expected)
        self.in_features, self.out_features = module0.in_features, module1.out_features
        self.latent_features = module0.out_features

    @classmethod
    def from_linear(cls, module: nn.Linear, latent_features: int | float = 0.25) -> FactorizedLinear:
        """Returns the factorization of ``module`` at ``latent_features``, from its weight's truncated SVD.

        ``module`` is untouched. As in Composer, a latent width that saves no multiply-adds
        (``r · (in + out) >= in · out``) is refused with a ValueError.
        """
        if not isinstance(module, nn.Linear):
            raise TypeError(f"module={type(module).__name__} must be a torch.nn.Linear")
        rank = _checked_rank("latent_features", latent_features, module.in_features, module.out_features)
        first, second = svd_factors(module.weight.detach().T, rank)
        with torch.device("meta"):
            layer = cls(
                nn.Linear(module.in_features, rank, bias=False),
                nn.Linear(rank, module.out_features, bias=module.bias is not None),
            )
        return _with_weights(layer, first.T.contiguous(), second.T.contiguous(), module.bias)


class FactorizedConv2d(_TwoFactors):
    """``module1(module0(x))``: a ``Conv2d`` factorized through ``latent_channels`` channels.

    ``module0`` is the original ``k×k`` convolution (stride, padding, dilation, padding mode) with
    ``latent_channels`` outputs and no bias; ``module1`` is a ``1×1`` convolution to ``out_channels`` with the
    original layer's bias (or none, as the original). ``in_channels``, ``out_channels`` (as ``nn.Conv2d``) and
    ``latent_channels`` are the channel counts.
    """

    module0: nn.Conv2d
    module1: nn.Conv2d

    def __init__(self, module0: nn.Conv2d, module1: nn.Conv2d) -> None:
        fits = (
            module0.bias is None
            and module0.groups == 1
            and module0.out_channels == module1.in_channels
            and tuple(module1.kernel_size) == (1, 1)
            and tuple(module1.stride) == (1, 1)
        )
        expected = (
            "a bias-free, ungrouped module0 whose out_channels equal the in_channels of module1, a 1x1 "
            "convolution of stride 1"
        )
        super().__init__(module0, module1, fits, expected)
        self.in_channels, self.out_channels = module0.in_channels, module1.out_channels
        self.latent_channels = module0.out_channels

    @classmethod
    def from_conv2d(cls, module: nn.Conv2d, latent_channels: int | float = 0.25) -> FactorizedConv2d:
        """Returns the factorization of ``module`` at ``latent_channels``, from its weight's truncated SVD.

        ``module`` is untouched; ``latent_channels`` as a fraction is of ``min(in_channels, out_channels)``. As in
        Composer, a latent width that saves no multiply-adds (``r · (fan_in + out) >= fan_in · out`` with
        ``fan_in = in · k_h · k_w``) is refused with a ValueError.
        """
        if not isinstance(module, nn.Conv2d):
            raise TypeError(f"module={type(module).__name__} must be a torch.nn.Conv2d")
        if module.groups != 1:
            raise ValueError(f"module has groups={module.groups}: grouped convolutions cannot be factorized")
        kernel = _pair(module.kernel_size)
        rank = _checked_rank(
            "latent_channels", latent_channels, module.in_channels, module.out_channels, kernel
        )
        first, second = svd_factors(conv_weight_to_matrix(module.weight.detach()), rank)
        with torch.device("meta"):
            module0 = nn.Conv2d(
                module.in_channels,
                rank,
                kernel,
                stride=_pair(module.stride),
                padding=module.padding if isinstance(module.padding, str) else _pair(module.padding),
                dilation=_pair(module.dilation),
                bias=False,
                padding_mode=module.padding_mode,
            )
            layer = cls(module0, nn.Conv2d(rank, module.out_channels, 1, bias=module.bias is not None))
        weight0, weight1 = matrix_to_conv_weight(first, kernel), matrix_to_conv_weight(second, (1, 1))
        return _with_weights(layer, weight0, weight1, module.bias)


def _pair(values: tuple[int, ...]) -> tuple[int, int]:
    return values[0], values[1]


def _checked_rank(
    name: str, latent: int | float, in_size: int, out_size: int, kernel_size: tuple[int, ...] = ()
) -> int:
    """Returns the latent width of ``latent``; ValueError unless that width saves multiply-adds (Composer's rule)."""
    check_latent(name, latent)
    rank = latent_size(latent, in_size, out_size)
    largest = max_rank_with_speedup(in_size, out_size, kernel_size)
    if rank > largest:
        fan_in = in_size * math.prod(kernel_size)
        accepted = f"at most {largest}" if largest >= 1 else "none: this layer is too small to factorize"
        raise ValueError(
            f"{name}={latent!r} gives {rank} latent widths, which saves no multiply-adds on a layer of fan-in "
            f"{fan_in} and {out_size} outputs (r · (fan_in + out) must be below fan_in · out); accepted: "
            f"{accepted}"
        )
    return rank


def _factorization_targets(
    module: nn.Module,
    factorize_convs: bool,
    factorize_linears: bool,
    min_channels: int,
    latent_channels: int | float,
    min_features: int,
    latent_features: int | float,
) -> dict[str, nn.Module]:
    """Returns the layers to factorize by qualified name (never one inside an earlier factorization)."""
    factorized = [
        name for name, m in module.named_modules() if isinstance(m, FactorizedConv2d | FactorizedLinear)
    ]
    found: dict[str, nn.Module] = {}
    for name, child in module.named_modules():
        if not name or any(name.startswith(prefix + ".") for prefix in factorized):
            continue
        kind = Factorize.layers.kind(child)
        if factorize_convs and kind is not None and isinstance(child, nn.Conv2d):
            wide = min(child.in_channels, child.out_channels) >= min_channels
            if wide and factorizing_could_speedup(child, latent_channels):
                found[name] = child
        elif factorize_linears and kind is not None and isinstance(child, nn.Linear):
            wide = min(child.in_features, child.out_features) >= min_features
            if wide and factorizing_could_speedup(child, latent_features):
                found[name] = child
    return found


def _factorized(
    module: nn.Module,
    targets: dict[str, nn.Module],
    latent_channels: int | float,
    latent_features: int | float,
) -> nn.Module:
    replacements: dict[str, nn.Module] = {}
    for name, layer in targets.items():
        if isinstance(layer, nn.Conv2d):
            replacements[name] = FactorizedConv2d.from_conv2d(layer, latent_channels)
        else:
            assert isinstance(layer, nn.Linear)
            replacements[name] = FactorizedLinear.from_linear(layer, latent_features)
    if not replacements and not any(
        isinstance(m, FactorizedConv2d | FactorizedLinear) for m in module.modules()
    ):
        warn_nothing_to_replace(
            "Factorize", "torch.nn.Conv2d or torch.nn.Linear wide enough to factorize", module, stacklevel=4
        )
    return replace_modules(module, replacements)


def apply_factorization(
    model: nn.Module,
    factorize_convs: bool = True,
    factorize_linears: bool = True,
    min_channels: int = 512,
    latent_channels: int | float = 0.25,
    min_features: int = 512,
    latent_features: int | float = 0.25,
) -> nn.Module:
    """Returns a copy of ``model`` whose wide ``Conv2d``/``Linear`` layers are factorized; ``model`` is untouched.

    A layer is factorized when ``min(in, out) >= min_channels`` (convolutions) or ``>= min_features``
    (linear layers) and the latent width saves multiply-adds (see the module docstring). The factors start
    from the layer's truncated SVD, so no key is needed. The defaults are those of Composer's function.
    """
    check_model(model)
    hparams = Factorize(
        factorize_convs, factorize_linears, min_channels, latent_channels, min_features, latent_features
    )
    return _factorized(model, hparams.layers_to_factorize(model), latent_channels, latent_features)


@register
@dataclass(frozen=True)
class Factorize(Surgery):
    """Factorizes wide ``Conv2d`` and ``Linear`` layers at INIT (Composer's ``Factorize``; class defaults).

    Args:
        factorize_convs: whether to factorize ``Conv2d`` layers.
        factorize_linears: whether to factorize ``Linear`` layers.
        min_channels: a convolution is factorized only with at least this many input and output channels.
        latent_channels: a convolution's latent channels: a count, or a fraction of its smaller channel count.
        min_features: a linear layer is factorized only with at least this many input and output features.
        latent_features: a linear layer's latent features: a count, or a fraction of its smaller feature count.

    A layer is factorized only when its latent width saves multiply-adds.
    """

    layers: ClassVar[LayerKinds] = LayerKinds((nn.Conv2d, nn.Linear), subclasses="none")

    factorize_convs: bool = True
    factorize_linears: bool = True
    min_channels: int = 256
    latent_channels: int | float = 0.25
    min_features: int = 256
    latent_features: int | float = 128

    def __post_init__(self) -> None:
        validate.flag("factorize_convs", self.factorize_convs)
        validate.flag("factorize_linears", self.factorize_linears)
        validate.integer("min_channels", self.min_channels, minimum=1)
        validate.integer("min_features", self.min_features, minimum=1)
        check_latent("latent_channels", self.latent_channels)
        check_latent("latent_features", self.latent_features)

    def layers_to_factorize(self, module: nn.Module) -> dict[str, nn.Module]:
        """Returns the layers of ``module`` this record factorizes, by qualified name."""
        return _factorization_targets(
            module,
            self.factorize_convs,
            self.factorize_linears,
            self.min_channels,
            self.latent_channels,
            self.min_features,
            self.latent_features,
        )

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(self.layers_to_factorize(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        # The factors come from each layer's SVD: nothing is drawn, so the key is not used.
        return _factorized(
            module, self.layers_to_factorize(module), self.latent_channels, self.latent_features
        )
