"""BlurPool: low-pass filter before subsampling, so strided layers alias less (Zhang, 2019; Composer's ``BlurPool``).

Model surgery at INIT replaces

- every ``nn.Conv2d`` with a stride above 1 and at least ``min_channels`` input channels by a ``BlurConv2d``:
  a 3×3 binomial blur, then the convolution with its stride (``blur_first=True``); or the convolution at
  stride 1, then the blur with the stride (``blur_first=False``, about ``stride²`` times the convolution's
  cost);
- every ``nn.MaxPool2d`` by a ``BlurMaxPool2d``: the max over each window at stride 1, then the blur with the
  pool's stride.

The blur is a depthwise convolution with ``[1, 2, 1]ᵀ[1, 2, 1] / 16`` and zero padding of one pixel, so the
output shapes are the replaced layers' (a max pool with ``ceil_mode=True`` may lose its last row and
column, as in Composer). The convolution keeps its weights: only structure changes, and no random draw is
made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._autocast import compute_dtype
from composer_fn.algorithms._surgery import (
    LayerKinds,
    Surgery,
    matching_modules,
    replace_modules,
    warn_nothing_to_replace,
)
from composer_fn.core import validate
from composer_fn.core.algorithm import register

__all__ = [
    "BlurPool",
    "BlurConv2d",
    "BlurMaxPool2d",
    "apply_blurpool",
    "blur_2d",
    "blurmax_pool2d",
    "default_blur_filter",
]


def default_blur_filter() -> Tensor:
    """Returns the ``[1, 1, 3, 3]`` binomial filter ``[1, 2, 1]ᵀ[1, 2, 1] / 16``, whose entries sum to 1."""
    row = torch.tensor([1.0, 2.0, 1.0])
    return (torch.outer(row, row) / 16.0).reshape(1, 1, 3, 3)


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[-1])


def _checked_pair(argument: str, value: object, minimum: int) -> tuple[int, int]:
    """Returns ``value`` (an int, or a pair of ints, each >= ``minimum``) as a pair of Python ints."""
    if validate.is_integer(value):
        pair: tuple[object, ...] = (value, value)
    elif isinstance(value, tuple | list) and len(value) in (1, 2):
        pair = tuple(value) * (3 - len(value))
    else:
        pair = ()
    if len(pair) != 2 or not all(validate.is_integer(v) and v >= minimum for v in pair):  # type: ignore[operator]
        raise ValueError(f"{argument}={value!r} must be an int >= {minimum} or a pair of them (height, width)")
    return int(pair[0]), int(pair[1])  # type: ignore[call-overload]


def _check_images(input: object) -> Tensor:
    if not isinstance(input, Tensor) or input.dim() != 4:
        shape = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(f"input {shape}: expected a batch of images [N, C, H, W]")
    if not input.is_floating_point():
        raise TypeError(
            f"input of dtype {input.dtype}: blurring needs floating-point images (float32, float16, bfloat16 or "
            "float64); convert integer images with .float() first"
        )
    return input


def blur_2d(input: Tensor, stride: int | tuple[int, int] = 1, filter: Tensor | None = None) -> Tensor:
    """Returns ``input [N, C, H, W]`` blurred channel by channel with ``filter``, at ``stride``.

    ``filter`` is ``[kh, kw]``, ``[1, 1, kh, kw]`` (the same for every channel) or ``[C, 1, kh, kw]``, with odd
    ``kh`` and ``kw``; the default is ``default_blur_filter()``. The input is zero-padded by ``kh // 2`` and
    ``kw // 2``, so at stride 1 the output has the input's shape. Composer's ``channels`` argument is not
    needed: the channel count is read from the input. Integer images are refused (a blur of them would be
    rounded to zeros): convert them to floats first. On the CPU, a strided blur in bfloat16 or float16 (16-bit
    images, or autocast) sums the 16-bit values in fp32 and returns them rounded once to the 16-bit dtype.
    """
    _check_images(input)
    stride = _checked_pair("stride", stride, 1)
    channels = input.shape[1]
    weights = default_blur_filter() if filter is None else filter
    if weights.dim() == 2:
        weights = weights.reshape(1, 1, *weights.shape)
    if weights.dim() != 4 or weights.shape[1] != 1 or weights.shape[0] not in (1, channels):
        raise ValueError(
            f"filter of shape {tuple(weights.shape)}: expected [kh, kw], [1, 1, kh, kw] or [{channels}, 1, kh, kw]"
        )
    height, width = weights.shape[-2:]
    if height % 2 == 0 or width % 2 == 0:
        raise ValueError(f"filter of shape {tuple(weights.shape)}: its height and width must be odd")
    weights = weights.to(dtype=input.dtype, device=input.device).expand(channels, 1, height, width)
    padding = (height // 2, width // 2)
    dtype = compute_dtype(input)
    if input.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) and stride != (1, 1):
        # The CPU's strided depthwise convolution in 16-bit floats has a backward an order of magnitude slower than
        # the fp32 one (benchmarks/blurpool_cpu.py), and on some CPUs rounds its sums more than once. The same
        # 16-bit values summed in fp32 and rounded once are what it gives where it is exact.
        with torch.autocast("cpu", enabled=False):
            out = F.conv2d(
                input.to(dtype).float(), weights.to(dtype).float(), stride=stride, padding=padding, groups=channels
            )
        return out.to(dtype)
    return F.conv2d(input, weights, stride=stride, padding=padding, groups=channels)


def blurmax_pool2d(
    input: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] = 2,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    filter: Tensor | None = None,
) -> Tensor:
    """Returns the max over each ``kernel_size`` window taken at stride 1, then blurred with ``stride``.

    Composer's ``blurmax_pool2d``; ``kernel_size`` is required (Composer's default ``None`` fails in
    ``max_pool2d``). ``filter`` is as in ``blur_2d``.
    """
    _check_images(input)
    kernel = _checked_pair("kernel_size", kernel_size, 1)
    stride = _checked_pair("stride", stride, 1)
    pad = _checked_pair("padding", padding, 0)
    spread = _checked_pair("dilation", dilation, 1)
    validate.flag("ceil_mode", ceil_mode)
    _check_pool(input, kernel, pad, spread)
    maxima = F.max_pool2d(
        input, kernel_size=kernel_size, stride=1, padding=padding, dilation=dilation, ceil_mode=ceil_mode
    )
    return blur_2d(maxima, stride=stride, filter=filter)


def _check_pool(
    input: Tensor, kernel: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]
) -> None:
    for axis, size, k, pad, spread in zip(("height", "width"), input.shape[-2:], kernel, padding, dilation, strict=True):
        window = spread * (k - 1) + 1
        if 2 * pad > window:
            raise ValueError(
                f"padding={padding!r} exceeds half the pooling window along the {axis} ({window} pixels with "
                f"kernel_size={kernel!r} and dilation={dilation!r}): lower padding"
            )
        if window > size + 2 * pad:
            raise ValueError(
                f"kernel_size={kernel!r} with dilation={dilation!r} spans {window} pixels, more than the input's "
                f"{axis} of {size} (+ {2 * pad} padding): input of shape {tuple(input.shape)}"
            )


def _conv_like(conv: nn.Conv2d, stride: tuple[int, int]) -> nn.Conv2d:
    """Returns a convolution with ``conv``'s settings at ``stride``, holding copies of its tensors."""
    with torch.device("meta"):
        new = nn.Conv2d(
            conv.in_channels,
            conv.out_channels,
            _pair(conv.kernel_size),
            stride=stride,
            padding=conv.padding if isinstance(conv.padding, str) else _pair(conv.padding),
            dilation=_pair(conv.dilation),
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
        )
    new.to_empty(device=conv.weight.device)
    new.weight = nn.Parameter(conv.weight.detach().clone(), requires_grad=conv.weight.requires_grad)
    if conv.bias is not None:
        new.bias = nn.Parameter(conv.bias.detach().clone(), requires_grad=conv.bias.requires_grad)
    return new


class BlurConv2d(nn.Module):
    """A strided convolution with a blur: ``conv(blur(x))`` or, with ``blur_first=False``, ``blur(conv₁(x))``.

    Built from ``conv`` (its settings and copies of its weights; ``conv`` itself is not kept). With
    ``blur_first`` the blur runs at stride 1 on the ``in_channels`` and the convolution keeps its stride;
    otherwise the convolution runs at stride 1 and the blur subsamples its ``out_channels`` with the
    convolution's stride. Attributes: ``conv``, the buffer ``blur_filter`` ``[channels, 1, 3, 3]`` (Composer's
    names), ``blur_first``, ``blur_stride``.
    """

    blur_filter: Tensor

    def __init__(self, conv: nn.Conv2d, blur_first: bool = True) -> None:
        super().__init__()
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv of type {type(conv).__name__}: expected a torch.nn.Conv2d")
        self.blur_first = blur_first
        stride = _pair(conv.stride)
        self.blur_stride = (1, 1) if blur_first else stride
        self.conv = _conv_like(conv, stride if blur_first else (1, 1))
        channels = conv.in_channels if blur_first else conv.out_channels
        self.register_buffer(
            "blur_filter", default_blur_filter().to(conv.weight.device).repeat(channels, 1, 1, 1)
        )
        self.train(conv.training)

    def forward(self, input: Tensor) -> Tensor:
        """Returns the blurred convolution of ``input`` (the replaced convolution's output shape)."""
        if self.blur_first:
            return self.conv(blur_2d(input, stride=self.blur_stride, filter=self.blur_filter))
        return blur_2d(self.conv(input), stride=self.blur_stride, filter=self.blur_filter)


class BlurMaxPool2d(nn.Module):
    """``MaxPool2d`` followed by a blur: the max of each window at stride 1, then the blur with the stride.

    Takes ``MaxPool2d``'s arguments (``stride`` defaults to ``kernel_size``); the buffer ``filt2d`` holds the
    ``[1, 1, 3, 3]`` filter (Composer's name).
    """

    filt2d: Tensor

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        _checked_pair("kernel_size", kernel_size, 1)
        if stride is not None:
            _checked_pair("stride", stride, 1)
        _checked_pair("padding", padding, 0)
        _checked_pair("dilation", dilation, 1)
        validate.flag("ceil_mode", ceil_mode)
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode
        self.register_buffer("filt2d", default_blur_filter())

    def extra_repr(self) -> str:
        """Returns the hyperparameters ``repr`` shows."""
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )

    def forward(self, input: Tensor) -> Tensor:
        """Returns the blurred max pool of ``input``."""
        return blurmax_pool2d(
            input,
            kernel_size=self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            ceil_mode=self.ceil_mode,
            filter=self.filt2d,
        )


def _check(replace_convs: bool, replace_maxpools: bool, blur_first: bool, min_channels: int) -> None:
    validate.flag("replace_convs", replace_convs)
    validate.flag("replace_maxpools", replace_maxpools)
    validate.flag("blur_first", blur_first)
    validate.integer("min_channels", min_channels, minimum=0)


def _blurpool_targets(
    model: nn.Module, replace_convs: bool, replace_maxpools: bool, min_channels: int
) -> tuple[str, ...]:
    # Layers already inside a blurred layer (its own convolution) are never blurred again: idempotence.
    blurred = [name for name, m in model.named_modules() if isinstance(m, BlurConv2d | BlurMaxPool2d)]

    def is_target(name: str, module: nn.Module) -> bool:
        if any(name.startswith(prefix + ".") for prefix in blurred):
            return False
        kind = BlurPool.layers.kind(module)
        if replace_maxpools and kind is not None and isinstance(module, nn.MaxPool2d):
            return not module.return_indices
        if replace_convs and kind is not None and isinstance(module, nn.Conv2d):
            return max(_pair(module.stride)) > 1 and module.in_channels >= min_channels
        return False

    return tuple(matching_modules(model, is_target))


def _blurred(model: nn.Module, name: str, blur_first: bool) -> nn.Module:
    module = model.get_submodule(name)
    if isinstance(module, nn.Conv2d):
        blurred = BlurConv2d(module, blur_first=blur_first)
        # The model's own tensors, which ``replace_modules`` moves onto its copy: a weight tied elsewhere stays tied.
        blurred.conv.weight = module.weight
        blurred.conv.bias = module.bias
        return blurred
    assert isinstance(module, nn.MaxPool2d)
    pool = BlurMaxPool2d(module.kernel_size, module.stride, module.padding, module.dilation, module.ceil_mode)
    pool.train(module.training)
    # A max pool holds no tensor: its filter goes where its parent's tensors are (the CPU when it has none).
    parent = model.get_submodule(name.rpartition(".")[0])
    tensors = [*parent.parameters(), *parent.buffers()]
    return pool.to(tensors[0].device) if tensors else pool


def _looks_for(replace_convs: bool, replace_maxpools: bool, min_channels: int) -> str:
    kinds = [f"strided torch.nn.Conv2d with at least {min_channels} input channels"] if replace_convs else []
    return (
        " or ".join([*kinds, *(["torch.nn.MaxPool2d"] if replace_maxpools else [])])
        or "layer (both kinds off)"
    )


def apply_blurpool(
    model: nn.Module,
    replace_convs: bool = True,
    replace_maxpools: bool = True,
    blur_first: bool = True,
    min_channels: int = 16,
) -> nn.Module:
    """Returns a copy of ``model`` with strided convolutions and max pools blurred; ``model`` is untouched.

    Composer's ``apply_blurpool`` without ``optimizers`` (nothing is edited in place). Convolutions are
    replaced when ``replace_convs``, their stride exceeds 1 and they have at least ``min_channels`` input
    channels; ``nn.MaxPool2d`` layers when ``replace_maxpools``. Applying it twice gives the model of one
    application.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    _check(replace_convs, replace_maxpools, blur_first, min_channels)
    names = _blurpool_targets(model, replace_convs, replace_maxpools, min_channels)
    if not names and not any(isinstance(m, BlurConv2d | BlurMaxPool2d) for m in model.modules()):
        warn_nothing_to_replace("BlurPool", _looks_for(replace_convs, replace_maxpools, min_channels), model)
    return replace_modules(model, {name: _blurred(model, name, blur_first) for name in names})


@register
@dataclass(frozen=True)
class BlurPool(Surgery):
    """Blurs strided convolutions and max pools at INIT (Composer's ``BlurPool``; see the module docstring).

    Args:
        replace_convs: replace strided ``nn.Conv2d`` layers by ``BlurConv2d``.
        replace_maxpools: replace ``nn.MaxPool2d`` layers by ``BlurMaxPool2d``.
        blur_first: blur before the convolution (cheap) rather than after it at stride 1.
        min_channels: a convolution needs at least this many input channels to be replaced.
    """

    algorithm_name = "blurpool"
    layers: ClassVar[LayerKinds] = LayerKinds((nn.Conv2d, nn.MaxPool2d))

    replace_convs: bool = True
    replace_maxpools: bool = True
    blur_first: bool = True
    min_channels: int = 16

    def __post_init__(self) -> None:
        _check(self.replace_convs, self.replace_maxpools, self.blur_first, self.min_channels)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(
            _blurpool_targets(module, self.replace_convs, self.replace_maxpools, self.min_channels)
        )

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return apply_blurpool(
            module, self.replace_convs, self.replace_maxpools, self.blur_first, self.min_channels
        )
