"""A multilayer perceptron classifier."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from composer_fn.core.random import key
from composer_fn.core.validate import integer, is_integer, real
from composer_fn.nn.init import materialise
from composer_fn.nn.keyed import KeyedDropout

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
        integer("in_features", in_features, minimum=1)
        integer("num_classes", num_classes, minimum=1)
        widths = tuple(hidden) if isinstance(hidden, Sequence) and not isinstance(hidden, str) else (0,)
        if not all(is_integer(width) and width >= 1 for width in widths):
            raise ValueError(f"hidden={hidden!r} must be a sequence of ints >= 1, e.g. (64,)")
        real("dropout", dropout, minimum=0.0, maximum=1.0, open_above=True, hint="a probability")
        layers: list[nn.Module] = [nn.Flatten()]
        with torch.device("meta"):
            for fan_in, fan_out in zip((in_features, *widths), widths, strict=False):
                layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
                if dropout > 0:
                    layers.append(KeyedDropout(dropout))
            layers.append(nn.Linear(widths[-1] if widths else in_features, num_classes))
        super().__init__(*layers)
        materialise(self, key(0))

