"""LayerFreezing: progressively freeze the earliest layers (Composer's ``LayerFreezing``, after FreezeOut).

The layers are the modules that hold parameters and have no submodules, in definition order (Composer's
depth-first flattening; the last layer is never frozen). After ``freeze_start`` of the run, each epoch end
freezes the first ``int(p · (L − 1))`` of the ``L`` layers, ``p = freeze_level · (elapsed − freeze_start) /
(1 − freeze_start)``.

Freezing is a mask on the gradient transformation, not an edit of the model or the optimizer: the step
computes no gradient for a frozen parameter (autograd skips it) and applies no update to it, and its
optimizer state is kept as it is. The frozen depth is a function of the timestamp (the last epoch end's
elapsed fraction), so each frozen set compiles one step and a run resumed from a checkpoint freezes exactly
what the uninterrupted run froze (Composer cannot resume it, its issue #1002).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from torch import nn

from composer_fn.algorithms._no_op import warn_changes_nothing_here
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Capabilities, no_change, register
from composer_fn.core.time import Timestamp

__all__ = ["LayerFreezing", "freeze_layers", "freeze_schedule", "freezable_layers"]


def freeze_schedule(current_duration: float, freeze_start: float = 0.5, freeze_level: float = 1.0) -> float:
    """Returns the fraction of layers frozen at ``current_duration``: 0 until ``freeze_start``, then linear to ``freeze_level``.

    ``current_duration`` is the fraction of the run done, in [0, 1]; ``freeze_start`` lies in [0, 1) and
    ``freeze_level`` in [0, 1].
    """
    validate.real("current_duration", current_duration, minimum=0.0, maximum=1.0, hint="the fraction of the run done")
    _check(freeze_start, freeze_level)
    if current_duration <= freeze_start:
        return 0.0
    return freeze_level * (current_duration - freeze_start) / (1.0 - freeze_start)


def freezable_layers(model: nn.Module) -> list[str]:
    """Returns the qualified names of the layers that can freeze: modules with parameters and no submodules.

    Depth first, in definition order; a module with submodules is searched and its own parameters are not
    counted, as in Composer.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    layers: list[str] = []

    def visit(name: str, module: nn.Module) -> None:
        children = list(module.named_children())
        if not children and any(True for _ in module.parameters(recurse=False)):
            layers.append(name)
            return
        for child_name, child in children:
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", model)
    return layers


def freeze_layers(
    model: nn.Module, current_duration: float, freeze_start: float = 0.5, freeze_level: float = 1.0
) -> tuple[frozenset[str], int, float]:
    """Returns ``(frozen parameter names, layers frozen, fraction)`` for ``model`` at ``current_duration``.

    Composer's ``freeze_layers`` without its side effects: nothing is changed; hand the names to the step
    (``make_train_step(frozen=...)``) to freeze them.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    fraction = freeze_schedule(current_duration, freeze_start, freeze_level)
    depth = int(fraction * len(freezable_layers(model)[:-1]))
    return _frozen_names(model, fraction), depth, fraction


@register
@dataclass(frozen=True)
class LayerFreezing(Algorithm):
    """Freezes the earliest layers progressively from ``freeze_start`` on (Composer's ``LayerFreezing``).

    Args:
        freeze_start: the fraction of the run before freezing begins, in [0, 1).
        freeze_level: the fraction of the layers frozen at the end of the run, in [0, 1].
    """

    freeze_start: float = 0.5
    freeze_level: float = 1.0

    def __post_init__(self) -> None:
        _check(self.freeze_start, self.freeze_level)

    def changes_nothing(self) -> str | None:
        why, instead = "no layer is ever frozen", "freeze_level > 0 (Composer's default is 1.0)"
        return no_change("LayerFreezing", "freeze_level=0", why, instead) if self.freeze_level == 0 else None

    def _fraction(self, timestamp: Timestamp) -> float:
        # Composer freezes at EPOCH_END: the schedule reads the elapsed fraction of the last finished epoch.
        if timestamp.epoch == 0 and timestamp.batch_in_epoch == timestamp.batch:
            return 0.0
        epoch_end = dataclasses.replace(timestamp, batch=timestamp.batch - timestamp.batch_in_epoch, batch_in_epoch=0)
        return freeze_schedule(epoch_end.elapsed, self.freeze_start, self.freeze_level)

    def capabilities(self) -> Capabilities:
        return Capabilities(freezes=self.frozen_parameters, checks_length=self.check_length)

    def check_length(self, max_steps: int, steps_per_epoch: int) -> None:
        """Warns (``ChangesNothing``) when no epoch of a run of ``max_steps`` steps ends past ``freeze_start``
        before the run ends."""
        reason = self.changes_nothing_in(max_steps, steps_per_epoch)
        if reason is not None:
            warn_changes_nothing_here("LayerFreezing", reason)

    def changes_nothing_in(self, max_steps: int, steps_per_epoch: int) -> str | None:
        ends = range(steps_per_epoch, max_steps, max(steps_per_epoch, 1))
        if any(freeze_schedule(end / max_steps, self.freeze_start, self.freeze_level) > 0 for end in ends):
            return None
        epochs = -(-max_steps // max(steps_per_epoch, 1))
        return (
            f"LayerFreezing(freeze_start={self.freeze_start!r}) in a run of {epochs} epoch(s) freezes no layer: it "
            f"freezes at the end of an epoch past {self.freeze_start!r} of the run, and no epoch but the last ends "
            "there, so it changes nothing; start earlier or train more epochs"
        )

    def frozen_parameters(self, module: Any, timestamp: Timestamp) -> frozenset[str]:
        """Returns the parameters of ``module`` frozen in the step starting at ``timestamp``."""
        fraction = self._fraction(timestamp)
        if fraction <= 0.0 or not isinstance(module, nn.Module):
            return frozenset()
        return _frozen_names(module, fraction)


def _check(freeze_start: object, freeze_level: object) -> None:
    hint = "freezing needs time to happen"
    validate.real("freeze_start", freeze_start, minimum=0.0, maximum=1.0, open_above=True, hint=hint)
    validate.real("freeze_level", freeze_level, minimum=0.0, maximum=1.0, hint="the fraction of layers frozen at the end")


@functools.lru_cache(maxsize=64)
def _frozen_names(module: nn.Module, fraction: float) -> frozenset[str]:
    # The trainer asks before every step; the answer changes only at epoch ends.
    layers = freezable_layers(module)
    depth = int(fraction * len(layers[:-1]))
    return frozenset(
        f"{layer}.{parameter}" if layer else parameter
        for layer in layers[:depth]
        for parameter, _ in module.get_submodule(layer).named_parameters(recurse=False)
    )
