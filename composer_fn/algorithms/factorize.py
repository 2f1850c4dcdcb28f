"""Factorize: replace wide ``Conv2d`` and ``Linear`` layers by two thinner ones through a low-rank latent space.

A ``Linear`` with weight ``W [out, in]`` becomes ``Linear(in, r)`` then ``Linear(r, out)``; a ``k×k`` ``Conv2d``
becomes a ``k×k`` convolution to ``r`` channels then a ``1×1`` convolution (Composer's ``FactorizedLinear`` and
``FactorizedConv2d``). The two factors start from the truncated singular value decomposition of the existing
weight, split evenly (``U_r·√s`` and ``√s·V_rᵀ``): the best rank-``r`` approximation of the layer for inputs
of equal variance in every direction, and the layer itself at full rank. Composer instead re-initialises the
factors at random, which discards what the layer has learned.

A layer is replaced when ``min(in, out)`` reaches ``min_channels``/``min_features`` and the latent size ``r``
reduces the multiply-adds: ``r · (fan_in + out) < fan_in · out`` with ``fan_in = in · k_h · k_w``, i.e.
``r <= ceil(fan_in · out / (fan_in + out) - 1)`` (Composer's rule; grouped convolutions are never replaced).
``factorize_matrix`` and ``factorize_conv2d`` are Composer's data-driven solvers: starting from the same SVD
they alternate least-squares updates of the two factors to fit the outputs on given inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._surgery import Surgery, replace_modules
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


class LowRankSolution(NamedTuple):
    """A rank-``rank`` factorization ``Y ≈ (X @ Wa) @ Wb + bias`` and its normalised mean squared error.

    For matrices ``Wa`` is ``[D, rank]`` and ``Wb`` ``[rank, M]``; for convolutions ``Wa`` is the ``k×k``
    weight ``[rank, in, k_h, k_w]`` and ``Wb`` the ``1×1`` weight ``[out, rank, 1, 1]``. ``nmse`` is the mean
    squared error of the fit divided by the variance of the outputs (0: exact; 1: no better than their mean).
    """

    Wa: Tensor
    Wb: Tensor
    bias: Tensor | None
    rank: int
    nmse: float


def latent_size(latent: int | float, in_size: int, out_size: int) -> int:
    """Returns the latent width: ``latent`` itself if an int, else ``max(1, int(latent · min(in, out)))``."""
    if isinstance(latent, float):
        return max(1, int(latent * min(in_size, out_size)))
    return latent


def max_rank_with_speedup(in_size: int, out_size: int, kernel_size: tuple[int, ...] = ()) -> int:
    """Returns the largest latent width whose factorization takes fewer multiply-adds than the layer itself."""
    fan_in = in_size * math.prod(kernel_size)
    breakeven = fan_in * out_size / (fan_in + out_size)
    return int(math.ceil(breakeven - 1))


def factorizing_could_speedup(module: nn.Module, latent: int | float) -> bool:
    """Returns whether factorizing ``module`` (a ``Conv2d`` or ``Linear``) at ``latent`` saves multiply-adds.

    Anything else, grouped convolutions included, returns False: there is no supported factorization.
    """
    _check_latent("latent", latent)
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


class FactorizedLinear(nn.Module):
    """``module1(module0(x))``: a ``Linear`` factorized through ``latent_features`` features.

    ``module0`` is ``Linear(in_features, latent_features, bias=False)`` and ``module1`` is
    ``Linear(latent_features, out_features)`` with the original layer's bias (or none, as the original).
    """

    module0: nn.Linear
    module1: nn.Linear

    def __init__(self, module0: nn.Linear, module1: nn.Linear) -> None:
        super().__init__()
        if module0.bias is not None or module0.out_features != module1.in_features:
            raise ValueError(
                f"module0={module0} and module1={module1}: expected a bias-free module0 whose out_features "
                "equal module1's in_features"
            )
        self.module0 = module0
        self.module1 = module1

    @property
    def in_features(self) -> int:
        """Returns the input width (as ``nn.Linear``)."""
        return self.module0.in_features

    @property
    def out_features(self) -> int:
        """Returns the output width (as ``nn.Linear``)."""
        return self.module1.out_features

    @property
    def latent_features(self) -> int:
        """Returns the width of the latent space between the two factors."""
        return self.module0.out_features

    def forward(self, input: Tensor) -> Tensor:
        """Returns the factorized layer's output for ``input [..., in_features]``."""
        return self.module1(self.module0(input))

    @classmethod
    def from_linear(cls, module: nn.Linear, latent_features: int | float = 0.25) -> FactorizedLinear:
        """Returns the factorization of ``module`` at ``latent_features``, from its weight's truncated SVD.

        ``module`` is untouched; at full rank (``min(in, out)``) the result computes the same outputs.
        """
        if not isinstance(module, nn.Linear):
            raise TypeError(f"module={type(module).__name__} must be a torch.nn.Linear")
        rank = _checked_rank("latent_features", latent_features, module.in_features, module.out_features)
        first, second = _svd_factors(module.weight.detach().T, rank)
        with torch.device("meta"):
            module0 = nn.Linear(module.in_features, rank, bias=False)
            module1 = nn.Linear(rank, module.out_features, bias=module.bias is not None)
        module0.weight = nn.Parameter(first.T.contiguous())
        module1.weight = nn.Parameter(second.T.contiguous())
        if module.bias is not None:
            module1.bias = nn.Parameter(module.bias.detach().clone())
        return cls(module0, module1)


class FactorizedConv2d(nn.Module):
    """``module1(module0(x))``: a ``Conv2d`` factorized through ``latent_channels`` channels.

    ``module0`` is the original ``k×k`` convolution (stride, padding, dilation, padding mode) with
    ``latent_channels`` outputs and no bias; ``module1`` is a ``1×1`` convolution to ``out_channels`` with the
    original layer's bias (or none, as the original).
    """

    module0: nn.Conv2d
    module1: nn.Conv2d

    def __init__(self, module0: nn.Conv2d, module1: nn.Conv2d) -> None:
        super().__init__()
        if (
            module0.bias is not None
            or module0.groups != 1
            or module0.out_channels != module1.in_channels
            or tuple(module1.kernel_size) != (1, 1)
            or tuple(module1.stride) != (1, 1)
        ):
            raise ValueError(
                f"module0={module0} and module1={module1}: expected a bias-free, ungrouped module0 whose "
                "out_channels equal the in_channels of module1, a 1x1 convolution of stride 1"
            )
        self.module0 = module0
        self.module1 = module1

    @property
    def in_channels(self) -> int:
        """Returns the input channel count (as ``nn.Conv2d``)."""
        return self.module0.in_channels

    @property
    def out_channels(self) -> int:
        """Returns the output channel count (as ``nn.Conv2d``)."""
        return self.module1.out_channels

    @property
    def latent_channels(self) -> int:
        """Returns the channel count between the two convolutions."""
        return self.module0.out_channels

    def forward(self, input: Tensor) -> Tensor:
        """Returns the factorized convolution's output for ``input [N, in_channels, H, W]``."""
        return self.module1(self.module0(input))

    @classmethod
    def from_conv2d(cls, module: nn.Conv2d, latent_channels: int | float = 0.25) -> FactorizedConv2d:
        """Returns the factorization of ``module`` at ``latent_channels``, from its weight's truncated SVD.

        ``module`` is untouched. At full rank (``min(in · k_h · k_w, out)``) the result computes the same
        outputs; ``latent_channels`` as a fraction is of ``min(in_channels, out_channels)``, as in Composer.
        """
        if not isinstance(module, nn.Conv2d):
            raise TypeError(f"module={type(module).__name__} must be a torch.nn.Conv2d")
        if module.groups != 1:
            raise ValueError(f"module has groups={module.groups}: grouped convolutions cannot be factorized")
        kernel = _pair(module.kernel_size)
        fan_in = module.in_channels * math.prod(kernel)
        rank = latent_size(latent_channels, module.in_channels, module.out_channels)
        _checked_rank("latent_channels", latent_channels, fan_in, module.out_channels, rank=rank)
        first, second = _svd_factors(_conv_weight_to_matrix(module.weight.detach()), rank)
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
            module1 = nn.Conv2d(rank, module.out_channels, 1, bias=module.bias is not None)
        module0.weight = nn.Parameter(_matrix_to_conv_weight(first, kernel))
        module1.weight = nn.Parameter(_matrix_to_conv_weight(second, (1, 1)))
        if module.bias is not None:
            module1.bias = nn.Parameter(module.bias.detach().clone())
        return cls(module0, module1)


def _pair(values: tuple[int, ...]) -> tuple[int, int]:
    return values[0], values[1]


def _check_latent(name: str, latent: Any) -> None:
    if isinstance(latent, bool) or not (
        (isinstance(latent, int) and latent >= 1) or (isinstance(latent, float) and 0.0 < latent < 1.0)
    ):
        raise ValueError(
            f"{name}={latent!r} must be an int >= 1 or a float in (0, 1) (a fraction of the width)"
        )


def _checked_rank(
    name: str, latent: int | float, in_size: int, out_size: int, rank: int | None = None
) -> int:
    _check_latent(name, latent)
    rank = latent_size(latent, in_size, out_size) if rank is None else rank
    if rank > min(in_size, out_size):
        raise ValueError(f"{name}={latent!r} gives rank {rank}, above the full rank {min(in_size, out_size)}")
    return rank


def _svd_factors(matrix: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Returns ``(A [D, rank], B [rank, M])`` with ``A @ B`` the best rank-``rank`` approximation of ``matrix``."""
    # Float64 keeps a full-rank factorization within rounding of the original in float32.
    u, s, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    root = s[:rank].sqrt()
    # Equal scaling of both factors keeps their magnitudes alike, which gradient descent prefers.
    first = u[:, :rank] * root
    second = root[:, None] * vh[:rank]
    return first.to(matrix.dtype), second.to(matrix.dtype)


def _conv_weight_to_matrix(weight: Tensor) -> Tensor:
    return weight.reshape(weight.shape[0], -1).T


def _matrix_to_conv_weight(matrix: Tensor, kernel: tuple[int, ...]) -> Tensor:
    weight = matrix.T
    return weight.reshape(weight.shape[0], -1, *kernel).contiguous()


def _lstsq(a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.lstsq(a, b).solution


def factorize_matrix(
    X: Tensor,
    Y: Tensor,
    Wa: Tensor,
    Wb: Tensor | None = None,
    bias: Tensor | None = None,
    rank: int | float = 0.25,
    n_iters: int = 3,
) -> LowRankSolution:
    """Returns the rank-``rank`` factorization ``(Wa', Wb', bias')`` that fits ``Y`` from ``X`` in least squares.

    ``X [N, D]`` are inputs, ``Y [N, M]`` the layer's outputs on them; the layer is ``Wa [D, M]`` (or an
    earlier factorization ``Wa [D, d] @ Wb [d, M]``) plus ``bias [M]``. The factors start from the truncated SVD
    of ``Wa (@ Wb)`` and then alternate ``n_iters`` least-squares updates of ``Wb'`` and ``Wa'`` (Composer's
    solver); ``bias'`` absorbs the mean residual. ``rank`` is an int, or a float in (0, 1): a fraction of ``D``
    (capped at the current rank). At full rank the solution reproduces ``Y``.
    """
    if X.dim() != 2 or Y.dim() != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"X {tuple(X.shape)} and Y {tuple(Y.shape)} must be matrices with the same number of rows"
        )
    if isinstance(n_iters, bool) or not isinstance(n_iters, int) or n_iters < 0:
        raise ValueError(f"n_iters={n_iters!r} must be an int >= 0")
    weight = Wa.detach() if Wb is None else Wa.detach() @ Wb.detach()
    if weight.shape != (X.shape[1], Y.shape[1]):
        raise ValueError(
            f"Wa {tuple(Wa.shape)}{'' if Wb is None else f' @ Wb {tuple(Wb.shape)}'} must map X's "
            f"{X.shape[1]} columns to Y's {Y.shape[1]}"
        )
    _check_latent("rank", rank)
    current = Wa.shape[1] if Wb is not None else min(weight.shape)
    k = min(int(rank * X.shape[1]), current) if isinstance(rank, float) else rank
    k = max(k, 1)
    if k > min(current, *weight.shape):
        raise ValueError(f"rank={rank!r} gives {k}, above the current rank {min(current, *weight.shape)}")
    dtype = X.dtype
    x, y = X.detach().to(torch.float64), Y.detach().to(torch.float64)
    target = y - bias.detach().to(torch.float64) if bias is not None else y
    first, second = _svd_factors(weight.to(torch.float64), k)
    # Least squares of the outputs on the inputs, solved once: the targets of every Wa update.
    coefficients = _lstsq(x, target)
    for _ in range(n_iters):
        second = _lstsq(x @ first, target)
        first = _lstsq(second.T, coefficients.T).T
    fitted = (x @ first) @ second
    new_bias = (target - fitted).mean(dim=0)
    if bias is not None:
        new_bias = new_bias + bias.detach().to(torch.float64)
    residual = y - (fitted + new_bias)
    error, variance = float((residual * residual).mean()), float(y.var()) if y.numel() > 1 else 0.0
    nmse = error / variance if variance > 0 else error
    return LowRankSolution(first.to(dtype), second.to(dtype), new_bias.to(dtype), k, nmse)


def factorize_conv2d(
    X: Tensor,
    Wa: Tensor,
    Wb: Tensor | None = None,
    rank: int | float = 0.25,
    biasA: Tensor | None = None,
    biasB: Tensor | None = None,
    n_iters: int = 3,
    **conv2d_kwargs: Any,
) -> LowRankSolution:
    """Returns the ``k×k`` then ``1×1`` factorization of a convolution fitted on inputs ``X [N, in, H, W]``.

    The convolution is ``Wa [out, in, k_h, k_w]`` plus ``biasA [out]``, or an earlier factorization ``Wa [d,
    in, k_h, k_w]`` (+ ``biasA [d]``) followed by ``Wb [out, d, 1, 1]`` (+ ``biasB [out]``). Every ``k×k``
    input patch is a row of the least-squares problem of ``factorize_matrix``. ``conv2d_kwargs`` are the
    convolution's ``padding``, ``dilation``, ``padding_mode`` and ``groups`` (1 only); its ``stride`` is
    accepted and ignored, as in Composer: every position supplies a row. ``rank`` as a fraction is of
    ``in · k_h · k_w``. The solution holds ``Wa [rank, in, k_h, k_w]``, ``Wb [out, rank, 1, 1]`` and the bias.
    """
    unknown = set(conv2d_kwargs) - {"padding", "dilation", "padding_mode", "groups", "stride"}
    if unknown:
        raise TypeError(f"factorize_conv2d got unknown convolution arguments {sorted(unknown)}")
    if conv2d_kwargs.get("groups", 1) != 1:
        raise ValueError(f"groups={conv2d_kwargs['groups']!r}: grouped convolutions cannot be factorized")
    if biasB is not None and Wb is None:
        raise ValueError("biasB was given without Wb: a second bias needs a second convolution")
    if X.dim() != 4 or Wa.dim() != 4 or X.shape[1] != Wa.shape[1]:
        raise ValueError(
            f"X {tuple(X.shape)} and Wa {tuple(Wa.shape)} must be [N, in, H, W] and [out, in, k_h, k_w]"
        )
    kernel = tuple(Wa.shape[2:])
    patches = _patches(
        X.detach(), kernel, **{k: v for k, v in conv2d_kwargs.items() if k not in ("groups", "stride")}
    )
    first = _conv_weight_to_matrix(Wa.detach())
    outputs = patches @ first
    if biasA is not None:
        outputs = outputs + biasA.detach()
    second = None
    if Wb is not None:
        second = _conv_weight_to_matrix(Wb.detach())
        outputs = outputs @ second
        if biasB is not None:
            outputs = outputs + biasB.detach()
    # The constant the layer adds to every output: it is taken out before the fit, so a full-rank
    # factorization reproduces the outputs exactly.
    bias = None
    if biasA is not None:
        bias = biasA.detach() if second is None else biasA.detach() @ second
    if biasB is not None:
        bias = biasB.detach() if bias is None else bias + biasB.detach()
    solution = factorize_matrix(patches, outputs, first, second, bias, rank, n_iters)
    return solution._replace(
        Wa=_matrix_to_conv_weight(solution.Wa, kernel), Wb=_matrix_to_conv_weight(solution.Wb, (1, 1))
    )


def _patches(
    images: Tensor,
    kernel: tuple[int, ...],
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    padding_mode: str = "zeros",
) -> Tensor:
    """Returns every ``k×k`` input patch (at stride 1) as a row ``[N · positions, in · k_h · k_w]``."""
    if isinstance(padding, str):
        raise ValueError(f"padding={padding!r}: give the padding in pixels (an int or a pair)")
    pad = (padding, padding) if isinstance(padding, int) else tuple(padding)
    if padding_mode != "zeros" and any(pad):
        images = F.pad(images, (pad[1], pad[1], pad[0], pad[0]), mode=padding_mode)
        pad = (0, 0)
    unfolded = F.unfold(images, kernel_size=kernel, dilation=dilation, padding=pad)
    return unfolded.transpose(1, 2).reshape(-1, unfolded.shape[1])


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be a bool")


def _check_minimum(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")


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
        if factorize_convs and type(child) is nn.Conv2d:
            wide = min(child.in_channels, child.out_channels) >= min_channels
            if wide and factorizing_could_speedup(child, latent_channels):
                found[name] = child
        elif factorize_linears and type(child) is nn.Linear:
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
    hparams = Factorize(
        factorize_convs, factorize_linears, min_channels, latent_channels, min_features, latent_features
    )
    return _factorized(model, hparams.layers_to_factorize(model), latent_channels, latent_features)


@register
@dataclass(frozen=True)
class Factorize(Surgery):
    """Factorizes wide ``Conv2d`` and ``Linear`` layers at INIT (Composer's ``Factorize``; class defaults)."""

    factorize_convs: bool = True
    factorize_linears: bool = True
    min_channels: int = 256
    latent_channels: int | float = 0.25
    min_features: int = 256
    latent_features: int | float = 128

    def __post_init__(self) -> None:
        _check_flag("factorize_convs", self.factorize_convs)
        _check_flag("factorize_linears", self.factorize_linears)
        _check_minimum("min_channels", self.min_channels)
        _check_minimum("min_features", self.min_features)
        _check_latent("latent_channels", self.latent_channels)
        _check_latent("latent_features", self.latent_features)

    @classmethod
    def for_checks(cls) -> Factorize:
        """Returns widths low enough to factorize the contract suite's width-8 SmallCNN (head included)."""
        return cls(min_channels=8, min_features=4, latent_features=0.25)

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
