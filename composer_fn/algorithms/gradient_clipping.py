"""Gradient clipping: bound the gradients by their global norm, their values, or their norms relative to the weights.

Runs at AFTER_TRAIN_BATCH (traced): after every microbatch's backward and before the optimizer update, it
replaces ``StepCtx.grads`` by the clipped gradients, as Composer's ``GradientClipping`` clips ``.grad``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from torch import Tensor

from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, register
from composer_fn.core.event import Event
from composer_fn.core.state import State, StepCtx
from composer_fn.optim.base import EmptyState, GradientTransformation
from composer_fn.optim.clipping import adaptive_clip, clip_by_global_norm, clip_by_value
from composer_fn.optim.transforms import real_number

__all__ = ["CLIPPING_TYPES", "GradientClipping", "apply_gradient_clipping"]

CLIPPING_TYPES: tuple[str, ...] = ("adaptive", "norm", "value")
"""The accepted ``clipping_type`` values, as in Composer."""


def _check_clipping_threshold(clipping_threshold: object) -> float:
    number = real_number("clipping_threshold", clipping_threshold)
    if not number > 0.0:
        raise ValueError(f"clipping_threshold={clipping_threshold!r} must be > 0 (a finite positive number)")
    return number


def _transform(clipping_type: str, clipping_threshold: float) -> GradientTransformation:
    if clipping_type == "norm":
        return clip_by_global_norm(clipping_threshold)
    if clipping_type == "value":
        return clip_by_value(clipping_threshold)
    return adaptive_clip(clipping_threshold)


def apply_gradient_clipping(
    grads: Mapping[str, Tensor],
    clipping_type: str,
    clipping_threshold: float,
    params: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Returns the clipped gradients, new tensors by parameter name; ``grads`` and ``params`` are left untouched.

    ``clipping_type``:

    - ``"norm"``: ``g ← g · min(1, λ / (‖g‖ + 1e-6))`` with ``‖g‖`` the joint L2 norm of all gradients
      (``torch.nn.utils.clip_grad_norm_``);
    - ``"value"``: every element clamped into ``[−λ, λ]`` (``torch.nn.utils.clip_grad_value_``);
    - ``"adaptive"``: AGC, each output unit's gradient scaled down to at most ``λ · max(‖w‖ᵤ, 1e-3)`` of
      unit-wise norm (see :func:`composer_fn.optim.adaptive_clip`); needs ``params``.

    ``λ`` is ``clipping_threshold``. Composer's ``apply_gradient_clipping`` takes the model and writes into
    ``.grad``; this one takes and returns the gradients.
    """
    clipping_type = validate.choice("clipping_type", clipping_type, CLIPPING_TYPES)
    clipping_threshold = _check_clipping_threshold(clipping_threshold)
    if clipping_type == "adaptive" and params is None:
        raise ValueError(
            "params=None: clipping_type='adaptive' scales each gradient by its parameter's norm; "
            "pass params (the parameters by name)"
        )
    clipped, _ = _transform(clipping_type, clipping_threshold).update(grads, EmptyState(), params)
    return clipped


@register
@dataclass(frozen=True)
class GradientClipping(Algorithm):
    """Clips the gradients before the optimizer update (Composer's ``GradientClipping``).

    Args:
        clipping_type: ``"norm"`` (the joint L2 norm of all gradients), ``"value"`` (each element) or
            ``"adaptive"`` (AGC: each output unit's gradient norm relative to its weights' norm).
        clipping_threshold: the largest norm, the largest absolute value, or the largest gradient-to-weight
            norm ratio; a finite number > 0.
    """

    clipping_type: str = "norm"
    clipping_threshold: float = 0.1

    def __post_init__(self) -> None:
        validate.choice("clipping_type", self.clipping_type, CLIPPING_TYPES)
        _check_clipping_threshold(self.clipping_threshold)

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.AFTER_TRAIN_BATCH: self._clip}

    def _clip(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        if ctx.grads is None:
            raise ValueError(
                "ctx.grads=None at AFTER_TRAIN_BATCH: gradient clipping needs the step's gradients"
            )
        clipped = apply_gradient_clipping(
            ctx.grads, self.clipping_type, self.clipping_threshold, state.params
        )
        return state, ctx.replace(grads=clipped)
