"""Dynamic loss scaling for fp16 training, as pure functions over two 0-d tensors of ``State.hparams``.

fp16 gradients underflow where fp32 ones do not, so the step differentiates ``loss * scale``, divides the
gradients by the scale and, when any of them is not finite, skips the update and halves the scale; after
``growth_interval`` finite steps in a row it doubles the scale. The rule, the defaults and the arithmetic
(the reciprocal taken in float64, then rounded to float32, and the update of ``torch._amp_update_scale_``) are
``torch.amp.GradScaler``'s, so a run's scale values and skipped steps equal a hand loop's with a
``GradScaler``.

The scale and its growth tracker live in ``State.hparams`` under ``LOSS_SCALE`` and ``GROWTH_TRACKER``: they are
checkpointed with the run, and a changing scale never recompiles the step. ``update`` is branch-free (a select),
so a compiled step skips an overflowing update without a host synchronisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from composer_fn.core import validate

__all__ = ["DynamicLossScale", "LOSS_SCALE", "GROWTH_TRACKER"]

LOSS_SCALE = "loss_scale"
GROWTH_TRACKER = "loss_scale_growth_tracker"


@dataclass(frozen=True)
class DynamicLossScale:
    """The loss-scaling rule; its defaults are ``torch.amp.GradScaler``'s.

    Args:
        init_scale: the first scale.
        growth_factor: the factor applied after ``growth_interval`` finite steps in a row (> 1).
        backoff_factor: the factor applied after a step with a non-finite gradient (in (0, 1)).
        growth_interval: the number of finite steps in a row before the scale grows.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        validate.real("init_scale", self.init_scale, minimum=0.0, open_below=True)
        validate.real("growth_factor", self.growth_factor, minimum=1.0, open_below=True)
        validate.real("backoff_factor", self.backoff_factor, minimum=0.0, maximum=1.0, open_below=True, open_above=True)
        validate.integer("growth_interval", self.growth_interval, minimum=1)

    def init(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Returns the hparams entries of a run's start: the initial scale (float32) and a zero tracker (int32)."""
        return {
            LOSS_SCALE: torch.full((), self.init_scale, dtype=torch.float32, device=device),
            GROWTH_TRACKER: torch.zeros((), dtype=torch.int32, device=device),
        }

    @staticmethod
    def scale(loss: Tensor, hparams: Mapping[str, Tensor]) -> Tensor:
        """Returns ``loss`` times the current scale, the value to differentiate."""
        scale = hparams.get(LOSS_SCALE)
        if scale is None:
            raise KeyError(
                f"state.hparams has no {LOSS_SCALE!r}: a step with loss scaling (precision 'fp16-mixed') needs "
                "state.replace(hparams={**state.hparams, **DynamicLossScale().init(device)}) first (the Trainer does it)"
            )
        return loss * scale

    @staticmethod
    def unscale(grads: Mapping[str, Tensor], hparams: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns ``grads`` divided by the scale (times its float32 reciprocal, as ``GradScaler.unscale_``)."""
        inverse = hparams[LOSS_SCALE].double().reciprocal().float()
        names = tuple(grads)
        unscaled = torch._foreach_mul([grads[name] for name in names], inverse)
        return dict(zip(names, unscaled, strict=True))

    @staticmethod
    def finite(grads: Mapping[str, Tensor]) -> Tensor:
        """Returns a 0-d bool tensor: whether every gradient is finite."""
        values = list(grads.values())
        if not values:
            return torch.ones((), dtype=torch.bool)
        return torch.stack([torch.isfinite(g).all() for g in values]).all()

    def update(self, hparams: Mapping[str, Tensor], finite: Tensor) -> dict[str, Tensor]:
        """Returns ``hparams`` with the scale and tracker after a step whose gradients were ``finite`` or not."""
        scale, tracker = hparams[LOSS_SCALE], hparams[GROWTH_TRACKER]
        successful = tracker + 1
        grow = finite & (successful >= self.growth_interval)
        grown = scale * self.growth_factor
        # torch._amp_update_scale_: a grown scale that overflows float32 is not taken.
        grown = torch.where(torch.isfinite(grown), grown, scale)
        new_scale = torch.where(finite, torch.where(grow, grown, scale), scale * self.backoff_factor)
        new_tracker = torch.where(finite & ~grow, successful, torch.zeros_like(tracker))
        return {**hparams, LOSS_SCALE: new_scale, GROWTH_TRACKER: new_tracker}
