"""ChannelsLast: store 4-d convolution weights in NHWC order, which GPU convolution kernels run faster on.

A host hook at INIT returns new parameters in ``torch.channels_last`` format; values are unchanged, so the
model computes the same outputs. Inputs follow the weights' format inside convolutions. The format is the
tensor's strides, as ``Module.to(memory_format=torch.channels_last)`` sets them: a weight with one input channel
(a grayscale model's first convolution) is both contiguous and channels-last by ``is_contiguous``, and only its
strides tell its convolution which kernels to run.

One exception, on the CPU only: oneDNN's AVX2 kernel for the weight gradient of a 1×1 convolution with a
stride, no padding and fewer than 8 input channels (one group) writes past its workspace in channels-last
format, giving wrong gradients or a corrupted heap (``benchmarks/channels_last_sweep.py`` finds exactly these
layers). Where the CPU's convolutions take oneDNN's AVX2 kernels, such layers keep a contiguous weight and
make their input contiguous (a forward pre-hook), so they run the correct NCHW kernel; a warning names them.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.algorithms._surgery import check_model, warn_nothing_to_replace
from composer_fn.core.algorithm import Algorithm, HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp
from composer_fn.nn.sharing import shared_copy
from composer_fn.optim.base import contiguous_strides

__all__ = [
    "ChannelsLast",
    "apply_channels_last",
    "channels_last_tensors",
    "channels_last_fault",
    "onednn_avx2_kernels",
    "ONEDNN_FAULT",
]

ONEDNN_FAULT = (
    "oneDNN's AVX2 kernel for the weight gradient of a 1×1 convolution with a stride, no padding and fewer than "
    "8 input channels writes past its workspace in channels-last format, giving wrong gradients or a corrupted "
    "heap (upstream oneDNN issue: '1x1 convolution backward_weights writes past the rtus workspace (nhwc, IC < "
    "ic_block)')"
)
"""The upstream fault that ChannelsLast steps around on the CPU."""

_BELOW_AVX2 = ("SSE41", "AVX")
"""``ONEDNN_MAX_CPU_ISA`` values that keep oneDNN below its AVX2 kernels."""


def onednn_avx2_kernels() -> bool:
    """Returns whether this process's CPU convolutions run oneDNN's AVX2 kernels.

    They do on a CPU whose best vector ISA is AVX2 (ATen's ``torch.backends.cpu.get_cpu_capability()``), unless
    ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``) caps oneDNN below AVX2, and on an AVX-512 CPU whose oneDNN
    is capped at an AVX2 ISA (``AVX2``, ``AVX2_VNNI``, ``AVX2_VNNI_2``).
    """
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    machine = torch.backends.cpu.get_cpu_capability()
    if machine == "AVX2":
        return cap not in _BELOW_AVX2
    return machine == "AVX512" and cap.startswith("AVX2")


def channels_last_fault(module: nn.Module) -> bool:
    """Returns whether ``module`` is a convolution whose weight gradient oneDNN's AVX2 kernels get wrong in
    channels-last format: a ``Conv2d`` of one group with a 1×1 kernel, a stride, no padding and fewer than 8
    input channels (see ``ONEDNN_FAULT``)."""
    return (
        isinstance(module, nn.Conv2d)
        and module.groups == 1
        and module.in_channels < 8
        and module.kernel_size == (1, 1)
        and module.stride != (1, 1)
        and module.padding in ((0, 0), "valid")
    )


def _faulty_layers(module: nn.Module, device: torch.device) -> tuple[str, ...]:
    # The layers to keep contiguous: on the CPU with oneDNN's AVX2 kernels only.
    if device.type != "cpu" or not onednn_avx2_kernels():
        return ()
    return tuple(name for name, child in module.named_modules() if channels_last_fault(child))


def _strides(shape: Sequence[int], memory_format: torch.memory_format) -> tuple[int, ...]:
    # The strides torch gives a new tensor of this shape in this format.
    if memory_format == torch.channels_last:
        _, c, h, w = shape
        return (h * w * c, 1, w * c, c)
    return contiguous_strides(shape)


def _in_format(tensor: Tensor, memory_format: torch.memory_format) -> Tensor:
    # ``tensor`` itself where its strides are the format's, else a copy with them. ``contiguous(memory_format=)``
    # keeps a tensor that ``is_contiguous`` in both formats (one channel, or 1×1 maps) with the strides it has.
    if tensor.stride() == _strides(tensor.shape, memory_format):
        return tensor
    return tensor.clone(memory_format=memory_format)


def _contiguous_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # A contiguous input and weight make the convolution take oneDNN's NCHW kernel, which is correct.
    return (_in_format(args[0], torch.contiguous_format), *args[1:])


def _guard(module: nn.Module, layers: Collection[str]) -> None:
    # Registers the contiguous-input hook on each layer (once, however many times the module is converted).
    for name in layers:
        layer = module.get_submodule(name)
        if _contiguous_input not in layer._forward_pre_hooks.values():
            layer.register_forward_pre_hook(_contiguous_input)


def _warn_if_nothing(module: nn.Module, tensors: Iterable[Tensor]) -> None:
    if not any(t.dim() == 4 for t in tensors):
        warn_nothing_to_replace("ChannelsLast", "4-d parameter or buffer (a 2-d convolution's weight)", module, stacklevel=4)


def _warn(layers: Collection[str]) -> None:
    warnings.warn(
        f"ChannelsLast keeps {len(layers)} layer(s) in contiguous format on this CPU ({', '.join(layers)}): "
        f"{ONEDNN_FAULT}. Every other layer is channels-last.",
        stacklevel=3,
    )


def channels_last_tensors(tensors: Mapping[str, Tensor], keep: Collection[str] = ()) -> dict[str, Tensor]:
    """Returns the tensors with every 4-d one in ``torch.channels_last`` format, but those named in ``keep``
    (others are kept as they are). ``keep`` may only name tensors of ``tensors``.

    The format is the strides ``Module.to(memory_format=torch.channels_last)`` gives, also for a tensor with
    one channel (a grayscale model's first convolution weight), which ``contiguous(memory_format=)`` leaves in
    contiguous strides; a tensor already in them is returned itself."""
    if isinstance(keep, str):
        raise TypeError(f"keep={keep!r} must be a collection of names, not one name: keep=({keep!r},)")
    unknown = sorted(set(keep) - set(tensors))
    if unknown:
        raise ValueError(f"keep names {unknown[:5]}, which tensors does not hold")
    return {
        name: _in_format(t, torch.channels_last) if t.dim() == 4 and name not in keep else t
        for name, t in tensors.items()
    }


def apply_channels_last(model: nn.Module) -> nn.Module:
    """Returns a copy of ``model`` whose 4-d parameters and buffers are channels-last; ``model`` is untouched.

    On a CPU that runs oneDNN's AVX2 kernels, the layers ``channels_last_fault`` names stay contiguous and
    make their input contiguous, with a warning naming them.
    """
    check_model(model)
    _warn_if_nothing(model, [*model.parameters(), *model.buffers()])
    converted = copy.deepcopy(model).to(memory_format=torch.channels_last)
    device = next((p.device for p in converted.parameters()), torch.device("cpu"))
    layers = _faulty_layers(converted, device)
    if layers:
        _guard(converted, layers)
        with torch.no_grad():
            for name in layers:
                layer = converted.get_submodule(name)
                assert isinstance(layer, nn.Conv2d)
                layer.weight.data = _in_format(layer.weight.data, torch.contiguous_format)
        _warn(layers)
    return converted


@register
@dataclass(frozen=True)
class ChannelsLast(Algorithm):
    """Converts convolution weights to channels-last memory format at INIT (Composer's ``ChannelsLast``).

    On the CPU, the layers oneDNN's AVX2 kernels get wrong in that format stay contiguous (see the module
    docstring), with a warning naming them.
    """

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.INIT: self._convert}

    def _convert(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        _warn_if_nothing(static.module, [*state.params.values(), *state.buffers.values()])
        layers = _faulty_layers(static.module, static.device)
        if layers:
            module = shared_copy(static.module)
            _guard(module, layers)
            static = static.replace(module=module)
            _warn(layers)
        kept = {f"{name}.weight" for name in layers}
        return static, state.replace(
            params=channels_last_tensors(state.params, kept), buffers=channels_last_tensors(state.buffers)
        )
