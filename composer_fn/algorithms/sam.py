"""Sharpness-aware minimization: step with the gradient taken at the worst nearby point (Foret et al., 2021).

On a SAM step the gradient ``g`` of the batch moves the parameters to ``w + e`` with
``e = rho * g / (||g||_2 + epsilon)`` (``||g||_2`` the global norm over every gradient), the gradient of the same
batch is taken there, and the optimizer applies that second gradient to the unperturbed ``w``. This is Composer's
``SAMOptimizer`` (``first_step``: ``e_w = p.grad * rho / (grad_norm + epsilon)``; ``second_step``: restore ``w``,
step the base optimizer), written as a pure function of the loss closure instead of an optimizer that moves
the weights and back.

As in Composer, a SAM step reports the first pass's loss, and only every ``interval``-th step is a SAM step:
step ``n`` (0-based) is one when ``(n + 1) % interval == 0``. Composer counts steps on the optimizer object,
which restarts at zero when a run resumes; here the count is the run's batch counter, so a resumed run makes
the same choice as the uninterrupted one.

Differences from Composer: the second pass reuses this step's random draws (a MixUp lambda, a CutOut box) and
does not update BatchNorm statistics (its buffers are discarded, so they advance once per step), where
Composer's second closure draws again and updates them a second time.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, register
from composer_fn.core.event import Event
from composer_fn.core.state import GradientFn, State, StepCtx
from composer_fn.core.time import Timestamp

__all__ = ["SAM", "sam_gradients", "sam_perturbation", "is_sam_step"]


def _check(rho: float, epsilon: float) -> None:
    validate.real("rho", rho, minimum=0.0, hint="the radius of the neighbourhood")
    hint = "it keeps a zero gradient from dividing by zero"
    validate.real("epsilon", epsilon, minimum=0.0, open_below=True, hint=hint)


def _check_gradients(grads: object) -> None:
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads of type {type(grads).__name__}: expected a mapping of parameter names to gradients")
    if not grads:
        raise ValueError("grads={}: expected at least one gradient (a mapping of parameter names to gradients)")
    for name, grad in grads.items():
        if not isinstance(grad, Tensor) or not (grad.is_floating_point() or grad.is_complex()):
            shown = f"of dtype {grad.dtype}" if isinstance(grad, Tensor) else f"of type {type(grad).__name__}"
            raise TypeError(f"grads[{name!r}] {shown}: expected a floating-point tensor")


def sam_perturbation(grads: Mapping[str, Tensor], rho: float = 0.05, epsilon: float = 1e-12) -> dict[str, Tensor]:
    """Returns ``e = rho * g / (||g||_2 + epsilon)`` by parameter name, ``||g||_2`` the norm over all gradients.

    ``grads`` must hold at least one floating-point tensor.
    """
    _check(rho, epsilon)
    _check_gradients(grads)
    names = tuple(grads)
    with torch.no_grad():
        tensors = [grads[name].detach() for name in names]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)).float())
        scale = rho / (norm + epsilon)
        return dict(zip(names, torch._foreach_mul(tensors, scale), strict=True))


def sam_gradients(
    params: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    gradient_fn: GradientFn,
    rho: float = 0.05,
    epsilon: float = 1e-12,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Returns ``(loss, grads)`` of ``gradient_fn`` at ``params + e``, ``e = rho * g / (||g||_2 + epsilon)``.

    ``grads`` is the gradient ``g`` at ``params``; ``gradient_fn(params) -> (loss, grads)`` recomputes the loss
    of the same batch and its gradients (the step's ``ctx.gradient_fn``). Parameters without a gradient are
    not moved; every gradient must belong to a parameter of its shape. Nothing given is written to.
    """
    if not callable(gradient_fn):
        raise TypeError(f"gradient_fn={gradient_fn!r} must be callable, gradient_fn(params) -> (loss, grads)")
    _check_gradients(grads)
    unknown = sorted(set(grads) - set(params))
    if unknown:
        raise ValueError(f"grads holds {unknown}, which params does not: every gradient must belong to a parameter")
    for name, grad in grads.items():
        if grad.shape != params[name].shape:
            raise ValueError(
                f"grads[{name!r}] of shape {tuple(grad.shape)} does not fit params[{name!r}] of shape "
                f"{tuple(params[name].shape)}"
            )
    perturbation = sam_perturbation(grads, rho, epsilon)
    moved = [name for name in params if name in perturbation]
    with torch.no_grad():
        shifted = torch._foreach_add([params[name].detach() for name in moved], [perturbation[n] for n in moved])
    return gradient_fn({**params, **dict(zip(moved, shifted, strict=True))})


def is_sam_step(batch: int, interval: int = 1) -> bool:
    """Returns whether the step after ``batch`` completed batches is a SAM step (every ``interval``-th one)."""
    return (batch + 1) % interval == 0


@register
@dataclass(frozen=True)
class SAM(Algorithm):
    """Replaces the gradient by the sharpness-aware one on every ``interval``-th step (Composer's ``SAM``).

    Args:
        rho: the radius of the neighbourhood in which the loss is maximised (``>= 0``).
        epsilon: added to the gradient norm before dividing (``> 0``).
        interval: every ``interval``-th step is a SAM step (two forward and backward passes); the others are
            plain steps.
    """

    placement = "first"
    requires = frozenset({"loss_closure"})
    algorithm_name = "sam"

    rho: float = 0.05
    epsilon: float = 1.0e-12
    interval: int = 1

    def __post_init__(self) -> None:
        _check(self.rho, self.epsilon)
        validate.integer("interval", self.interval, minimum=1)

    def changes_nothing(self) -> str | None:
        if self.rho == 0:
            return (
                "SAM(rho=0) changes nothing but the cost: the second gradient is taken at the same weights, so it "
                "equals the first; use rho > 0 (Composer's default is 0.05) or leave SAM out"
            )
        return None

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        return is_sam_step(timestamp.batch, self.interval)

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.AFTER_BACKWARD: self._sharpness_aware_gradients}

    def _sharpness_aware_gradients(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        assert ctx.gradient_fn is not None and ctx.grads is not None
        _, grads = sam_gradients(state.params, ctx.grads, ctx.gradient_fn, self.rho, self.epsilon)
        return state, ctx.replace(grads=grads)
