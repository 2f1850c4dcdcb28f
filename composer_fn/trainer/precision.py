"""The run's precision on its device, as one record: the dtype autocast computes in, whether the loss is scaled,
and whether the device has the instructions of its 16-bit format.

``Precision.of(name, device)`` checks a precision's name (``'fp32'``, ``'bf16-mixed'`` or ``'fp16-mixed'``) and its
device. The step runs the forward and the loss inside ``autocast()`` (a null context for fp32); a run whose
precision has ``loss_scaling`` (fp16) differentiates the scaled loss with ``loss_scale()``'s rule and starts with
``loss_scale_entries()`` in ``State.hparams``; ``emulated()`` says when the device is a CPU that emulates the 16-bit
format, several times slower than fp32.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from composer_fn.core.state import PRECISIONS
from composer_fn.core.state import Precision as PrecisionName
from composer_fn.trainer.loss_scale import DynamicLossScale

__all__ = ["Precision"]

_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}

_NATIVE_ON_CPU = {"bf16-mixed": "_is_mkldnn_bf16_supported", "fp16-mixed": "_is_mkldnn_fp16_supported"}
"""The oneDNN check that a CPU has the instructions of each 16-bit format."""


@dataclass(frozen=True)
class Precision:
    """A precision on a device (see the module docstring); build it with ``Precision.of``."""

    name: PrecisionName
    device: torch.device

    @classmethod
    def of(cls, name: object, device: torch.device | str) -> Precision:
        """Returns the record of the precision ``name`` on ``device``; raises naming the argument at fault."""
        if not isinstance(name, str) or name not in PRECISIONS:
            raise ValueError(f"precision={name!r} must be one of {', '.join(PRECISIONS)}")
        if not isinstance(device, torch.device | str):
            raise TypeError(f"device={device!r}: expected a torch.device or a device name such as 'cpu' or 'cuda'")
        return _settled(name, torch.device(device))

    @property
    def dtype(self) -> torch.dtype:
        """Returns the dtype autocast computes in: ``torch.bfloat16``, ``torch.float16``, or ``torch.float32``
        for fp32 (no autocast)."""
        return _DTYPES[self.name]

    @property
    def loss_scaling(self) -> bool:
        """Returns whether the step scales the loss (fp16, whose gradients underflow where fp32's do not)."""
        return self.name == "fp16-mixed"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Returns the autocast context of the device's type in ``dtype``; a null context for fp32."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def loss_scale(self) -> DynamicLossScale | None:
        """Returns the loss-scaling rule (``torch.amp.GradScaler``'s defaults) with ``loss_scaling``, else None."""
        return DynamicLossScale() if self.loss_scaling else None

    def loss_scale_entries(self) -> dict[str, Tensor]:
        """Returns the ``State.hparams`` entries a run starts with: the initial scale and its growth tracker on the
        device with ``loss_scaling``, none without."""
        rule = self.loss_scale()
        return rule.init(self.device) if rule is not None else {}

    def emulated(self) -> str | None:
        """Returns why this precision runs several times slower than fp32 here (a CPU without the instructions of
        its 16-bit format, which autocast then emulates), or None."""
        native = _NATIVE_ON_CPU.get(self.name)
        if native is None or self.device.type != "cpu" or getattr(torch.ops.mkldnn, native)():
            return None
        return (
            f"precision={self.name!r} on this CPU, which lacks instructions for its 16-bit format, runs several "
            "times slower than 'fp32' (autocast emulates it); use precision='fp32' on this machine"
        )


@functools.cache
def _settled(name: str, device: torch.device) -> Precision:
    # The step asks for its precision at every forward: one record per name and device.
    return Precision(cast(PrecisionName, name), device)
