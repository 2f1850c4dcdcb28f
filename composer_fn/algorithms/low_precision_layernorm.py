"""Low-precision LayerNorm: under autocast, layer norms run in the autocast dtype instead of float32.

Under CUDA autocast ``layer_norm`` runs in float32 (it is on autocast's float32 list): bfloat16 activations
are cast up, normalised, and the float32 result flows on. Under CPU autocast it runs in its input's dtype,
which in a pre-LayerNorm transformer is the float32 residual stream. ``LPLayerNorm`` (Composer's layer) casts
its input, weight and bias to the autocast dtype and normalises with autocast turned off, so the layer reads
and writes the low precision, saving the casts and half of the memory traffic. Outside autocast it is
``nn.LayerNorm``'s own forward, bit for bit.

Surgery at INIT replaces every ``nn.LayerNorm`` (and subclass keeping its forward, and timm's ``LayerNorm``; an
``LPLayerNorm`` is kept, which makes the rewrite idempotent) by an ``LPLayerNorm`` with the same shape, epsilon
and affine tensors, and timm's channels-first ``LayerNorm2d`` by an ``LPLayerNorm2d`` (see ``LowPrecisionLayerNorm.layers``).
RMS norms (``nn.RMSNorm``, and Llama's, Mistral's and Qwen2's, which compute in float32 whatever their input)
become ``LPRMSNorm``: in the autocast dtype under autocast, and outside it exactly the layer it replaced. The default
passes run it after every other algorithm of an event (``placement = "last"``), so that layer norms other
surgeries add are converted too. It draws nothing at random.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._autocast import low_precision_forward, normalized_in_autocast_dtype
from composer_fn.algorithms._no_op import warn_changes_nothing_here
from composer_fn.algorithms._surgery import (
    LayerKinds,
    Surgery,
    matching_modules,
    replace_modules,
    warn_nothing_to_replace,
)
from composer_fn.core.algorithm import ChangesNothing, register
from composer_fn.core.state import PRECISIONS, BatchMeta, State, Static
from composer_fn.core.time import Timestamp

__all__ = ["LowPrecisionLayerNorm", "LPLayerNorm", "LPLayerNorm2d", "LPRMSNorm", "apply_low_precision_layernorm"]

class LPLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed in the autocast dtype under autocast, and exactly as ``nn.LayerNorm`` outside it."""

    def forward(self, input: Tensor) -> Tensor:
        """Returns the normalised ``input``: in the autocast dtype under autocast, else ``nn.LayerNorm``'s result."""
        return low_precision_forward(nn.LayerNorm, self, input, F.layer_norm, self.normalized_shape)


class LPLayerNorm2d(LPLayerNorm):
    """timm's ``LayerNorm2d`` as an ``LPLayerNorm``: the channels of ``[N, C, H, W]`` normalised, channels first."""

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input`` normalised over its channels (dim 1), in the autocast dtype under autocast."""
        return super().forward(input.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _rms_norm(input: Tensor, shape: Any, weight: Tensor | None, bias: None, eps: float | None) -> Tensor:
    return F.rms_norm(input, shape, weight, eps)


class LPRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` computed in the autocast dtype under autocast; outside it, what the replaced layer computed.

    ``float32_statistics``: outside autocast, normalise in float32 and scale the result cast back to the input's
    dtype (``weight * (x * rsqrt(mean(x ** 2) + eps)).to(dtype)``, Hugging Face's Llama-style RMS norm), instead
    of ``nn.RMSNorm``'s forward.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        float32_statistics: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)
        self.float32_statistics = float32_statistics

    def forward(self, input: Tensor) -> Tensor:
        """Returns the normalised ``input``: in the autocast dtype under autocast, else the replaced layer's result."""
        if torch.is_autocast_enabled(input.device.type):
            return normalized_in_autocast_dtype(_rms_norm, input, self.normalized_shape, self.weight, None, self.eps)  # type: ignore[arg-type]
        if not self.float32_statistics:
            return super().forward(input)
        dtype = input.dtype
        x = input.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # type: ignore[operator]
        return self.weight * x.to(dtype)

    def extra_repr(self) -> str:
        """Returns the hyperparameters ``repr`` shows."""
        return f"{super().extra_repr()}, float32_statistics={self.float32_statistics}"


def _low_precision_rms(layer: Any) -> LPRMSNorm:
    weight = layer.weight
    torch_layer = isinstance(layer, nn.RMSNorm)
    converted = LPRMSNorm(
        tuple(layer.normalized_shape) if torch_layer else tuple(weight.shape),
        eps=layer.eps if torch_layer else float(layer.variance_epsilon),
        elementwise_affine=weight is not None,
        float32_statistics=not torch_layer,
        device=None if weight is None else weight.device,
        dtype=None if weight is None else weight.dtype,
    )
    # The layer's own weight, which ``replace_modules`` moves onto its copy: a weight tied elsewhere stays tied.
    converted.weight = weight
    return converted


def _low_precision(layer: Any) -> nn.Module:
    if LowPrecisionLayerNorm.rms_layers.kind(layer) is not None:
        return _low_precision_rms(layer)
    return _low_precision_layer_norm(layer)


def _low_precision_layer_norm(layer: nn.LayerNorm) -> LPLayerNorm:
    reference = layer.weight
    channels_first = LowPrecisionLayerNorm.layers.kind(layer) == "timm.layers.norm.LayerNorm2d"
    # LayerNorm's own initialisation is ones and zeros: building it draws nothing at random.
    converted = (LPLayerNorm2d if channels_first else LPLayerNorm)(
        layer.normalized_shape,
        eps=layer.eps,
        elementwise_affine=layer.elementwise_affine,
        bias=layer.bias is not None,
        device=None if reference is None else reference.device,
        dtype=None if reference is None else reference.dtype,
    )
    with torch.no_grad():
        if layer.weight is not None:
            converted.weight.copy_(layer.weight)
        if layer.bias is not None:
            converted.bias.copy_(layer.bias)
    # The layer's own tensors, which ``replace_modules`` moves onto its copy: a weight tied elsewhere stays tied.
    converted.weight = layer.weight
    converted.bias = layer.bias
    return converted


def _layer_norms(model: nn.Module) -> dict[str, nn.Module]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__}: expected a torch.nn.Module")
    names = matching_modules(
        model, lambda _, module: LowPrecisionLayerNorm.layers.kind(module) is not None or LowPrecisionLayerNorm.rms_layers.kind(module) is not None
    )
    return {name: model.get_submodule(name) for name in names}  # type: ignore[misc]


def _converted(model: nn.Module, layers: dict[str, nn.Module]) -> nn.Module:
    if not layers and not any(isinstance(m, LPLayerNorm | LPRMSNorm) for m in model.modules()):
        looks_for = f"{LowPrecisionLayerNorm.layers.describe()} or {LowPrecisionLayerNorm.rms_layers.describe()}"
        warn_nothing_to_replace("LowPrecisionLayerNorm", looks_for, model, stacklevel=4)
    return replace_modules(model, {name: _low_precision(layer) for name, layer in layers.items()})


def apply_low_precision_layernorm(model: nn.Module, precision: str | None = None) -> nn.Module:
    """Returns a copy of ``model`` whose ``nn.LayerNorm`` layers are ``LPLayerNorm``; ``model`` is untouched.

    ``precision`` is the precision the model will train in, when known: ``"fp32"`` has no autocast for the
    layers to follow, so the model is returned unchanged (as a copy) with a warning, as in Composer; None or
    ``"bf16-mixed"`` convert. Composer converts only for a mixed precision and does nothing when none is
    given; here the converted layer follows whatever autocast is active when it runs, so converting without
    knowing the precision is safe. A model without layer norms is returned as a copy with a warning.
    """
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be None or one of {', '.join(PRECISIONS)}")
    layers = _layer_norms(model)
    if precision == "fp32":
        warnings.warn(
            ChangesNothing(
                "apply_low_precision_layernorm(precision='fp32') has no effect: layer norms run in the autocast "
                "dtype, and fp32 training has no autocast",
                "LowPrecisionLayerNorm",
            ),
            stacklevel=2,
        )
        return replace_modules(model, {})
    return _converted(model, layers)


@register
@dataclass(frozen=True)
class LowPrecisionLayerNorm(Surgery):
    """Runs every ``nn.LayerNorm`` in the autocast dtype (Composer's ``LowPrecisionLayerNorm``).

    The record converts the layers whatever the run's precision: outside autocast (``"fp32"``, evaluation
    without autocast) ``LPLayerNorm`` computes exactly what ``nn.LayerNorm`` does, and a structure that does not
    depend on the precision lets a checkpoint resume in another precision. Composer's ``apply_at`` is not
    offered: surgery runs at INIT, and checkpoints re-apply it before loading (Composer's AFTER_LOAD use).
    """

    algorithm_name = "low_precision_layernorm"
    placement: ClassVar[Literal["any", "first", "last"]] = "last"
    layers: ClassVar[LayerKinds] = LayerKinds(
        (nn.LayerNorm,), ("timm.layers.norm.LayerNorm", "timm.layers.norm.LayerNorm2d")
    )
    """``nn.LayerNorm`` and timm's ``LayerNorm`` and ``LayerNorm2d`` (channels first)."""
    rms_layers: ClassVar[LayerKinds] = LayerKinds(
        (nn.RMSNorm,),
        (
            "transformers.models.llama.modeling_llama.LlamaRMSNorm",
            "transformers.models.mistral.modeling_mistral.MistralRMSNorm",
            "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
        ),
    )
    """The RMS norms it converts too: ``nn.RMSNorm`` and those of Hugging Face's Llama, Mistral and Qwen2 (which
    normalise in float32 and scale the result cast back to the input's dtype)."""

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_layer_norms(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return _converted(module, _layer_norms(module))

    def _operate(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        if static.precision == "fp32" and _layer_norms(static.module):
            warn_changes_nothing_here(
                "LowPrecisionLayerNorm",
                "LowPrecisionLayerNorm changes nothing in a run of precision='fp32': its layer norms run in the "
                "autocast dtype, and an fp32 run has no autocast (the layers are converted all the same, so a "
                "checkpoint resumes in another precision); use precision='bf16-mixed' or leave it out",
            )
        return super()._operate(static, state, timestamp, meta)
