"""Whether a model takes the input shapes a method will give it, asked before the first step.

Methods that change the input's shape (smaller images, fewer samples) can meet a model that accepts one size
only, as it declares (``fixed_input_size``), or that fails at the new shape inside its own code, at a size it
declares nowhere. ``shape_failure`` runs the model's forward at each shape, on fake tensors (shapes without
values: nothing is computed) where they serve, so a method can refuse up front, naming the shape and the
model's error.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from composer_fn.core import validate
from composer_fn.core.host import on_fake_tensors

__all__ = ["shape_failure", "fixed_input_size", "check_resizable"]

_ANSWERED: weakref.WeakKeyDictionary[nn.Module, set[tuple[tuple[int, ...], ...]]] = (
    weakref.WeakKeyDictionary()
)
"""The questions ``shape_failure`` answered None for each module (the shapes), so a run that asks at every batch
runs the forwards once: the answer depends on the module's structure and the shapes alone."""


def shape_failure(
    module: nn.Module,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    shapes: Sequence[Sequence[int]],
) -> tuple[tuple[int, ...], tuple[int, ...] | None, str] | None:
    """Returns ``(shape, the last passing shape before it or None, error)`` for the first of ``shapes`` at which
    ``module`` with ``params`` and ``buffers`` fails on an input of that shape; None when every shape passes, or
    when the first (the shape the run's own step uses) fails too: the model fails for another cause, which its own
    step reports.

    The forward runs in the module's mode (training: auxiliary heads included), without gradients, on fake
    tensors where those run the first shape (else on real ones, on the parameters' device), with torch's
    generator put back after; buffers are copies, so BatchNorm statistics do not move.
    """
    asked = tuple(tuple(int(dim) for dim in shape) for shape in shapes)
    if not asked or asked in _ANSWERED.get(module, set()):
        return None
    template = next((t for t in params.values() if t.is_floating_point()), None)
    dtype = template.dtype if template is not None else torch.float32
    device = template.device if template is not None else torch.device("cpu")

    def forward(shape: tuple[int, ...], tensors: tuple[dict[str, Tensor], dict[str, Tensor]]) -> None:
        functional_call(module, tensors, (torch.zeros(shape, dtype=dtype, device=device),))

    def run(shape: tuple[int, ...], fake: bool) -> None:
        tensors = ({**params}, {name: b.clone() for name, b in buffers.items()})
        if fake:
            on_fake_tensors(forward, shape, tensors)
        else:
            forward(shape, tensors)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        fake = True
        try:
            run(asked[0], fake)
        except Exception:  # noqa: BLE001 -- a model fake tensors cannot run is run on real ones
            fake = False
            try:
                run(asked[0], fake)
            except Exception:  # noqa: BLE001 -- failing at the step's own shape, the model fails for another cause
                _ANSWERED.setdefault(module, set()).add(asked)
                return None
        passed = asked[0]
        for shape in asked[1:]:
            try:
                run(shape, fake)
            except Exception as error:  # noqa: BLE001 -- the model's own error, reported with the shape
                return (
                    shape,
                    passed if passed != asked[0] else None,
                    (str(error).strip().splitlines() or [type(error).__name__])[0],
                )
            passed = shape
    _ANSWERED.setdefault(module, set()).add(asked)
    return None


_FIXED_SIZE_PATCH_EMBEDDINGS = frozenset({"ViTPatchEmbeddings", "DeiTPatchEmbeddings"})


def _pair(size: object) -> tuple[int, int] | None:
    if validate.is_integer(size):
        return int(size), int(size)  # type: ignore[call-overload]
    if isinstance(size, tuple | list) and len(size) == 2 and all(validate.is_integer(v) for v in size):
        return int(size[0]), int(size[1])
    return None


def _declared_size(module: torch.nn.Module) -> tuple[int, int] | None:
    kind, origin = type(module).__name__, type(module).__module__
    if origin.startswith("torchvision.") and kind == "VisionTransformer":
        return _pair(getattr(module, "image_size", None))
    if getattr(module, "strict_img_size", False) is True:
        return _pair(getattr(module, "img_size", None))
    if origin.startswith("transformers.") and kind in _FIXED_SIZE_PATCH_EMBEDDINGS:
        return _pair(getattr(module, "image_size", None))
    return None


def fixed_input_size(model: torch.nn.Module) -> tuple[str, tuple[int, int]] | None:
    """Returns ``(module name, (height, width))`` of the first module that accepts only one input size, or None.

    The size is the one these modules declare: torchvision's ``VisionTransformer.image_size``, a timm
    ``PatchEmbed`` whose ``strict_img_size`` holds (its ``img_size``), and the ``image_size`` of Hugging Face's
    ViT and DeiT patch embeddings. The name is ``""`` for ``model`` itself.
    """
    for name, module in model.named_modules():
        size = _declared_size(module)
        if size is not None:
            return name, size
    return None


def check_resizable(model: torch.nn.Module, does: str, method: str) -> None:
    """Raises ValueError when ``model`` accepts one input size only (``fixed_input_size``): ``does`` says how the
    method ``method`` changes the images' size."""
    fixed = fixed_input_size(model)
    if fixed is None:
        return
    name, (height, width) = fixed
    module = model.get_submodule(name)
    where = f"submodule {name!r} ({type(module).__name__})" if name else type(module).__name__
    raise ValueError(
        f"{does}, but the model's {where} accepts only {height}x{width} inputs (its position embeddings have one "
        f"entry per patch of that size). Leave {method} out for this model, or build it to accept other sizes "
        "(timm: dynamic_img_size=True)"
    )
