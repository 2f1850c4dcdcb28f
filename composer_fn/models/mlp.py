"""A multilayer perceptron classifier."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from composer_fn.core.random import key
from composer_fn.models._build import materialise
from composer_fn.models.keyed import KeyedDropout

__all__ = ["MLP"]


class MLP(nn.Sequential):
    """A classifier that flattens its input, then applies Linear/ReLU layers and a Linear head.

    ``hidden`` lists the widths of the hidden layers; an empty sequence gives a linear classifier. With
    ``dropout > 0`` a ``KeyedDropout(dropout)`` follows each hidden ReLU (by default there is none). The
    parameters start as ``init_parameters(model, key(0))``, without touching the global random state; draw
    other values with ``init_parameters(model, key(seed))``.
    """

    def __init__(
        self, in_features: int, num_classes: int, hidden: Sequence[int] = (64,), dropout: float = 0.0
    ) -> None:
        _check_positive("in_features", in_features)
        _check_positive("num_classes", num_classes)
        widths = tuple(hidden)
        for width in widths:
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise ValueError(f"hidden={hidden!r} must be a sequence of ints >= 1, e.g. (64,)")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout!r} must be a probability in [0, 1)")
        layers: list[nn.Module] = [nn.Flatten()]
        with torch.device("meta"):
            for fan_in, fan_out in zip((in_features, *widths), widths, strict=False):
                layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
                if dropout > 0:
                    layers.append(KeyedDropout(dropout))
            layers.append(nn.Linear(widths[-1] if widths else in_features, num_classes))
        super().__init__(*layers)
        materialise(self, key(0))


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")
