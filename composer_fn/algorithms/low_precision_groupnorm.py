"""LowPrecisionGroupNorm: group normalization in the autocast dtype, without the float32 round trip.

CUDA autocast runs ``group_norm`` in float32: a bf16/fp16 activation is widened, normalized and handed on in
float32. ``LPGroupNorm`` casts its input, weight and bias to the autocast dtype and normalizes with autocast
off, so the layer reads, computes and writes the low precision (Composer's ``LPGroupNorm``). Outside autocast
it is ``nn.GroupNorm``, bit for bit. Composer asks ``torch.is_autocast_enabled()``, which only sees CUDA
autocast; here the autocast state of the input's device is read, so CPU autocast counts too.

Composer's algorithm warns and does nothing unless the run's precision is fp16/bf16 mixed. The record here
always rewrites (outside autocast the new layer computes what the old one did), so checkpoints and conflict
checks see one structure whatever the precision, and a checkpoint resumes in another precision;
``apply_low_precision_groupnorm`` refuses to act only for ``"fp32"``.
Composer's ``apply_at`` (INIT, BEFORE_LOAD or AFTER_LOAD) is not kept: surgeries run at INIT, and a checkpoint
re-applies them before it loads. The default passes run it after the other surgeries at INIT
(``placement = "last"``), as Composer orders its low-precision norms, so that layers they add are converted too.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._autocast import low_precision_forward
from composer_fn.algorithms._surgery import (
    LayerKinds,
    Surgery,
    check_model,
    matching_modules,
    replaced,
)
from composer_fn.core.algorithm import ChangesNothing, register
from composer_fn.core.state import PRECISIONS
from composer_fn.nn.sharing import shared_copy

__all__ = [
    "LPGroupNorm",
    "LowPrecisionGroupNorm",
    "apply_low_precision_groupnorm",
    "low_precision_groupnorm_from",
]


class LPGroupNorm(nn.GroupNorm):
    """A ``GroupNorm`` that computes in the autocast dtype when autocast is on for its input's device."""

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input`` group-normalized in the autocast dtype (in its own dtype outside autocast)."""
        return low_precision_forward(nn.GroupNorm, self, input, F.group_norm, self.num_groups)


def low_precision_groupnorm_from(groupnorm: nn.GroupNorm) -> LPGroupNorm:
    """Returns an ``LPGroupNorm`` with ``groupnorm``'s settings and copies of its tensors; the input is untouched."""
    return _reclassed(groupnorm, copy.deepcopy(groupnorm))


def _reclassed(groupnorm: nn.GroupNorm, low: nn.Module) -> LPGroupNorm:
    if LowPrecisionGroupNorm.layers.kind(groupnorm) is None:
        raise TypeError(f"groupnorm={type(groupnorm).__name__} must be a {LowPrecisionGroupNorm.layers.describe()}")
    # A re-classed copy keeps every setting and tensor of the layer, including those only some PyTorch
    # versions have (the ``bias`` flag); the subclass changes only the forward.
    low.__class__ = LPGroupNorm
    assert isinstance(low, LPGroupNorm)
    return low


def _targets(module: nn.Module) -> list[str]:
    return list(matching_modules(module, lambda _, m: LowPrecisionGroupNorm.layers.kind(m) is not None))


def _converted(module: nn.Module) -> nn.Module:
    # The layers keep the model's own tensors, which ``replace_modules`` moves onto its copy: ties stay.
    replacements: dict[str, nn.Module] = {
        name: _reclassed(layer, shared_copy(layer))  # type: ignore[arg-type]
        for name in _targets(module)
        for layer in [module.get_submodule(name)]
    }
    return replaced(
        module,
        replacements,
        method="LowPrecisionGroupNorm",
        looks_for=LowPrecisionGroupNorm.layers.describe(),
        rewritten=LPGroupNorm,
        stacklevel=5,
    )


def apply_low_precision_groupnorm(model: nn.Module, precision: str | None = None) -> nn.Module:
    """Returns a copy of ``model`` whose ``nn.GroupNorm`` layers are ``LPGroupNorm``; ``model`` is untouched.

    ``precision`` is the precision the model will train in, when known: ``"fp32"`` has no autocast for the
    layers to follow, so the model is returned unchanged (as a copy) with a warning, as in Composer; None or
    ``"bf16-mixed"`` convert (Composer does nothing when no precision is given; the converted layer follows
    whatever autocast is active when it runs, so converting without knowing the precision is safe, and
    ``apply_low_precision_layernorm`` does the same). A model without group norms is returned as a copy with a
    warning.
    """
    check_model(model)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be None or one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        warnings.warn(
            ChangesNothing(
                "apply_low_precision_groupnorm(precision='fp32') has no effect: group norms run in the autocast "
                "dtype, and fp32 training has no autocast",
                "LowPrecisionGroupNorm",
            ),
            stacklevel=2,
        )
        return copy.deepcopy(model)
    return _converted(model)


@register
@dataclass(frozen=True)
class LowPrecisionGroupNorm(Surgery):
    """Replaces ``GroupNorm`` by ``LPGroupNorm`` at INIT (Composer's ``LowPrecisionGroupNorm``)."""

    algorithm_name = "low_precision_groupnorm"

    placement: ClassVar[Literal["any", "first", "last"]] = "last"
    layers: ClassVar[LayerKinds] = LayerKinds(
        (nn.GroupNorm,), ("timm.layers.norm.GroupNorm", "timm.layers.norm.GroupNorm1")
    )

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_targets(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        # The new layers keep the existing parameters: nothing is drawn, so the key is not used.
        return _converted(module)
