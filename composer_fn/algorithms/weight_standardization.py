"""WeightStandardization: convolutions use their weight standardized per output channel (Qiao et al., 2019).

Each output channel's filter is shifted and scaled to mean 0 and variance 1 (population variance, with
Composer's ``1e-10`` under the square root) before the convolution, on every forward: the stored weight stays
as trained and the gradient flows through the standardization. Composer registers a
``torch.nn.utils.parametrize`` hook on each convolution's weight; here the convolution is replaced by
``WSConv1d``/``WSConv2d``/``WSConv3d``, subclasses whose forward standardizes the weight it is given, so
``functional_call`` and ``torch.compile`` see an ordinary module with an ordinary ``weight`` parameter (same
names, same values).

``n_last_layers_ignore`` leaves the last convolutions alone, in the order the model calls them when
``torch.fx`` can trace it, in the order they were registered otherwise (Composer's rule).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

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
    "WSConv1d",
    "WSConv2d",
    "WSConv3d",
    "WeightStandardization",
    "apply_weight_standardization",
    "convolutions_in_order",
    "standardized_conv",
    "standardize_weight",
]

EPSILON = 1e-10
"""Added to each filter's variance before the square root (Composer's value)."""


def standardize_weight(weight: Tensor) -> Tensor:
    """Returns ``weight`` with each output channel (dim 0) shifted and scaled to mean 0 and variance 1.

    ``weight`` is a floating-point convolution weight ``[out, in, ...]`` (two or more dimensions).
    """
    if not isinstance(weight, Tensor) or weight.dim() < 2 or not weight.is_floating_point():
        shown = f"of shape {tuple(weight.shape)} and dtype {weight.dtype}" if isinstance(weight, Tensor) else repr(weight)
        raise ValueError(f"weight {shown}: expected a floating-point weight [out, in, ...] of two or more dimensions")
    dims = tuple(range(1, weight.dim()))
    variance, mean = torch.var_mean(weight, dim=dims, keepdim=True, correction=0)
    return (weight - mean) / torch.sqrt(variance + EPSILON)


class _Standardized:
    """What the standardized convolutions add to torch's: the weight they convolve with, and their forward."""

    weight: Tensor
    bias: Tensor | None
    _conv_forward: Callable[[Tensor, Tensor, Tensor | None], Tensor]

    @property
    def standardized_weight(self) -> Tensor:
        """Returns the weight the convolution uses: ``standardize_weight(self.weight)``."""
        return standardize_weight(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        """Returns the convolution of ``input`` with the standardized weight."""
        return self._conv_forward(input, standardize_weight(self.weight), self.bias)


class WSConv1d(_Standardized, nn.Conv1d):
    """A ``Conv1d`` that convolves with its standardized weight; ``weight`` is the stored, trained weight."""


class WSConv2d(_Standardized, nn.Conv2d):
    """A ``Conv2d`` that convolves with its standardized weight; ``weight`` is the stored, trained weight."""


class WSConv3d(_Standardized, nn.Conv3d):
    """A ``Conv3d`` that convolves with its standardized weight; ``weight`` is the stored, trained weight."""


_STANDARDIZED: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv1d: WSConv1d,
    nn.Conv2d: WSConv2d,
    nn.Conv3d: WSConv3d,
}
_CONVOLUTIONS = (*_STANDARDIZED, *_STANDARDIZED.values())


_CONV_SETTINGS = ("stride", "padding", "dilation", "groups", "padding_mode")


def standardized_conv(conv: nn.Conv1d | nn.Conv2d | nn.Conv3d) -> nn.Module:
    """Returns a ``WSConv*d`` with ``conv``'s settings and copies of its tensors; ``conv`` is untouched."""
    plain = WeightStandardization.layers.kind(conv) is not None
    cls = next((ws for torch_class, ws in _STANDARDIZED.items() if plain and isinstance(conv, torch_class)), None)
    if cls is None:
        raise TypeError(f"conv={type(conv).__name__} must be a torch.nn.Conv1d, Conv2d or Conv3d")
    settings = {name: getattr(conv, name) for name in _CONV_SETTINGS}
    with torch.device("meta"):
        new = cls(
            conv.in_channels, conv.out_channels, conv.kernel_size, bias=conv.bias is not None, **settings
        )
    new.weight = nn.Parameter(conv.weight.detach().clone(), requires_grad=conv.weight.requires_grad)
    if conv.bias is not None:
        new.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=conv.bias.requires_grad)
    return new


class _ConvolutionsAsLeaves(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # Standardized convolutions must show up as calls, like the plain ones, to be counted in order; a
        # module without submodules holds no convolution, so its forward (which fx may not trace) is skipped.
        return (
            isinstance(m, _CONVOLUTIONS)
            or not any(True for _ in m.children())
            or super().is_leaf_module(m, module_qualified_name)
        )


def convolutions_in_order(module: nn.Module) -> list[str]:
    """Returns the qualified names of ``module``'s convolutions (standardized or not), in calling order.

    The order is that of a ``torch.fx`` trace, keeping the convolutions the trace calls; when ``module``
    cannot be traced, all of them in registration order.
    """
    return _ordered(module)[0]


def _ordered(module: nn.Module) -> tuple[list[str], bool]:
    registered = [name for name, m in module.named_modules() if name and isinstance(m, _CONVOLUTIONS)]
    try:
        # On a copy: tracing runs the Python of modules fx does not keep as leaves, which may write into their
        # buffers (timm's BatchNormAct2d counts its batches in training mode).
        graph = _ConvolutionsAsLeaves().trace(copy.deepcopy(module))
    except Exception:
        # Any model fx cannot trace (data-dependent control flow, unsupported ops) falls back, as Composer does.
        return registered, False
    called = [str(node.target) for node in graph.nodes if node.op == "call_module"]
    known = set(registered)
    return list(dict.fromkeys(name for name in called if name in known)), True


def _targets(module: nn.Module, n_last_layers_ignore: int) -> list[str]:
    ordered, traced = _ordered(module)
    if n_last_layers_ignore > 0 and not traced:
        warnings.warn(
            "torch.fx could not trace the model: the convolutions left plain by "
            f"n_last_layers_ignore={n_last_layers_ignore} are the last registered, which may not be the last called",
            stacklevel=3,
        )
    chosen = ordered[: max(len(ordered) - n_last_layers_ignore, 0)]
    layers = WeightStandardization.layers
    return [name for name in chosen if layers.kind(module.get_submodule(name)) is not None]


def _standardized(module: nn.Module, names: list[str]) -> nn.Module:
    replacements = {}
    for name in names:
        conv = module.get_submodule(name)
        standardized = standardized_conv(conv)  # type: ignore[arg-type]
        # The model's own tensors, which ``replace_modules`` moves onto its copy: a tied weight stays tied.
        standardized.weight = conv.weight
        standardized.bias = conv.bias
        replacements[name] = standardized
    if not any(isinstance(m, _CONVOLUTIONS) for m in module.modules()):
        warn_nothing_to_replace(
            "WeightStandardization", "torch.nn.Conv1d, Conv2d or Conv3d", module, stacklevel=4
        )
    return replace_modules(module, replacements)


def apply_weight_standardization(module: nn.Module, n_last_layers_ignore: int = 0) -> nn.Module:
    """Returns a copy of ``module`` whose convolutions standardize their weights; ``module`` is untouched.

    The last ``n_last_layers_ignore`` convolutions (in calling order) stay plain. Composer's function edits the
    module in place and returns the count; count the ``WSConv*d`` modules of the result instead.
    """
    check_model(module, "module")
    validate.integer("n_last_layers_ignore", n_last_layers_ignore, minimum=0)
    return _standardized(module, _targets(module, n_last_layers_ignore))


@register
@dataclass(frozen=True)
class WeightStandardization(Surgery):
    """Standardizes the weights of convolutions at INIT (Composer's ``WeightStandardization``).

    Args:
        n_last_layers_ignore: the convolutions left plain at the end of the model, in the order the forward calls
            them (as ``torch.fx`` traces it; else the order they were registered in).
    """

    n_last_layers_ignore: int = 0

    # After BlurPool it standardizes the convolution inside each blurred layer.
    rewrites_after: ClassVar[frozenset[str]] = frozenset({"blurpool"})
    layers: ClassVar[LayerKinds] = LayerKinds((nn.Conv1d, nn.Conv2d, nn.Conv3d))

    def __post_init__(self) -> None:
        validate.integer("n_last_layers_ignore", self.n_last_layers_ignore, minimum=0)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_targets(module, self.n_last_layers_ignore))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        # The standardized convolutions keep the existing weights: nothing is drawn, so the key is not used.
        return _standardized(module, _targets(module, self.n_last_layers_ignore))
