"""Composer's strength sampling: the severity to op-argument mapping of each op, the draws, and the arguments
in the images' units."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from composer_fn.algorithms._augment.primitives import (
    ORIGINAL,
    PRIMITIVES,
    SOLARIZE,
    TRANSLATE_X,
    TRANSLATE_Y,
    augmentation_sets,
)
from composer_fn.core import validate


def check_severity(severity: float, augmentation_set: str) -> None:
    """Raises ValueError unless ``0 <= severity <= 10`` and ``augmentation_set`` names a set."""
    validate.real("severity", severity, minimum=0.0, maximum=10.0)
    validate.choice("augmentation_set", augmentation_set, tuple(augmentation_sets))


# Composer's severity -> magnitude mapping, per op: (scale, floored, offset, factor, kind). For kind 0 the argument
# is ``offset + factor * g(level * scale)``, with ``g`` the floor when ``floored`` (Composer's int_parameter) and
# the identity otherwise (float_parameter); kind 1 is the colour ops' symmetric factor, kind 2 brightness's.
_MAPPING: Mapping[str, tuple[float, float, float, float, float]] = MappingProxyType(
    {
        "autocontrast": (0.0, 0.0, 0.0, 1.0, 0.0),
        "equalize": (0.0, 0.0, 0.0, 1.0, 0.0),
        "posterize": (0.4, 1.0, 4.0, -1.0, 0.0),  # 4 - int_parameter(level, 4)
        "rotate": (3.0, 1.0, 0.0, 1.0, 0.0),  # int_parameter(level, 30) degrees
        "solarize": (25.6, 1.0, 256.0, -1.0, 0.0),  # 256 - int_parameter(level, 256)
        "shear_x": (0.03, 0.0, 0.0, 1.0, 0.0),  # float_parameter(level, 0.3)
        "shear_y": (0.03, 0.0, 0.0, 1.0, 0.0),
        # int_parameter(level, side / 3): kept as a fraction of the side, floored to pixels at apply time.
        "translate_x": (1.0 / 30.0, 0.0, 0.0, 1.0, 0.0),
        "translate_y": (1.0 / 30.0, 0.0, 0.0, 1.0, 0.0),
        "color": (0.0, 0.0, 0.0, 0.0, 1.0),
        "contrast": (0.0, 0.0, 0.0, 0.0, 1.0),
        "brightness": (0.0, 0.0, 0.0, 0.0, 2.0),  # the symmetric factor, times 0.75 above 1
        "sharpness": (0.0, 0.0, 0.0, 0.0, 1.0),
        # float_parameter(level, 1.8) + 0.1
        **{name: (0.18, 0.0, 0.1, 1.0, 0.0) for name in ORIGINAL},
    }
)

_SIGNED = frozenset({"rotate", "shear_x", "shear_y", "translate_x", "translate_y"})

SetTable = tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]
"""A set's rows of coefficients (one per member, see ``draw``) and its members' op ids."""


def _set_table(augmentation_set: str) -> SetTable:
    """Returns the set's rows of ``_MAPPING`` plus its signed flag and ±1, and its members' op ids."""
    names = augmentation_sets[augmentation_set]
    rows = tuple((*_MAPPING[name], float(name in _SIGNED), -1.0, 1.0) for name in names)
    return rows, tuple(PRIMITIVES.index(name.removesuffix("_original")) for name in names)


SET_TABLES: Mapping[str, SetTable] = MappingProxyType({name: _set_table(name) for name in augmentation_sets})
"""Each augmentation set's ``SetTable`` by name."""


def draw(uniforms: Any, coefficients: Any, severity: float, xp: Any) -> tuple[Any, Any]:
    """Returns the magnitude and sign from ``uniforms`` and each draw's row of ``SET_TABLES`` (float32 arrays of
    ``xp``, torch or NumPy: Python scalars take the arrays' dtype in both, so both give the same bits)."""
    level = 0.1 + (severity - 0.1) * uniforms[..., 0]
    symmetric = xp.where(
        uniforms[..., 2] > 0.5,
        1.0 + (severity - 1.0) * uniforms[..., 3],
        (1.0 - 0.09 * severity) + (0.09 * severity) * uniforms[..., 3],
    )
    scale, floored, offset, factor, kind, signed, minus, plus = (coefficients[..., i] for i in range(8))
    scaled = level * scale
    linear = offset + factor * xp.where(floored > 0.5, xp.floor(scaled), scaled)
    colour = xp.where((kind > 1.5) & (symmetric > 1.0), symmetric * 0.75, symmetric)
    magnitude = xp.where(kind > 0.5, colour, linear)
    sign = xp.where((signed > 0.5) & (uniforms[..., 1] > 0.5), minus, plus)
    return magnitude, sign


def draw_ops(
    uniforms: Tensor, choice: Tensor, severity: float, augmentation_set: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns ``(op, magnitude, sign)`` for ops chosen uniformly from the set, as Composer samples them.

    ``choice`` holds indices into the set; ``uniforms`` (shape ``choice.shape + (4,)``, in ``[0, 1)``) give the
    level ``U(0.1, severity)``, the sign (negative when above 0.5, for the ops Composer flips) and the colour
    ops' symmetric factor: ``U(1, severity)`` or ``U(1 - 0.09 severity, 1)``, each with probability 1/2.
    """
    rows, op_ids = SET_TABLES[augmentation_set]
    table = torch.tensor(rows, dtype=torch.float32, device=choice.device)
    magnitude, sign = draw(uniforms, table[choice], severity, torch)
    return torch.tensor(op_ids, device=choice.device)[choice], magnitude, sign


def op_arguments(op: Tensor, magnitude: Tensor, sign: Tensor, images: Tensor) -> Tensor:
    """Returns the signed op arguments in the images' units: translations in pixels, thresholds in levels."""
    height, width = images.shape[-2:]
    signed = magnitude.to(images.device, torch.float32) * sign.to(images.device, torch.float32)
    op = op.to(images.device)
    value = torch.where(op == TRANSLATE_X, torch.trunc(signed * width), signed)
    value = torch.where(op == TRANSLATE_Y, torch.trunc(signed * height), value)
    if images.dtype != torch.uint8:
        value = torch.where(op == SOLARIZE, value * (1.0 / 255.0), value)
    return value
