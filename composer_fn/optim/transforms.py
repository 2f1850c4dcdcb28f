"""Elementary gradient transformations: scaling, schedules, weight decay, momentum and Adam moments.

Each function returns a :class:`~composer_fn.optim.base.GradientTransformation`. Updates are computed with
``torch._foreach_*`` over the list of tensors, out of place and without autograd history; counts are 0-d
tensors on the parameters' devices, and the first-step special cases are selected with ``torch.where`` on the
count, so every transform traces under ``torch.compile(fullgraph=True)``.

Momentum and Adam keep one count per parameter, as ``torch.optim`` keeps a ``step`` per parameter: ``update``
given the gradients of some parameters only (the others got none this step) advances those parameters'
counts and moments alone, so a parameter that gets a gradient on some steps only is updated as torch updates
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from composer_fn.core.host import readable_on_host
from composer_fn.core.validate import flag
from composer_fn.optim.arguments import real_number
from composer_fn.optim.base import (
    GradientTransformation,
    OptState,
    Params,
    Updates,
    chain,
    check_same_keys,
    identity,
    params_device,
    scalar_dtype,
    stacked,
    stateless,
)
from composer_fn.optim.fused import scheduled_fused

__all__ = [
    "ScheduleMultiplier",
    "ScaleByScheduleState",
    "TraceState",
    "ScaleByAdamState",
    "scale",
    "scale_by_schedule",
    "scheduled",
    "add_decayed_weights",
    "trace",
    "scale_by_adam",
]

ScheduleMultiplier = Callable[[Tensor], "Tensor | float"]
"""Maps the 0-d ``int64`` update count (0 on the first update) to a multiplier: a 0-d tensor (or a float)."""


class ScaleByScheduleState(NamedTuple):
    """The number of updates :func:`scale_by_schedule` has made, a 0-d ``int64`` tensor."""

    count: Tensor  # type: ignore[assignment]  # optax's field name; it shadows tuple.count


class TraceState(NamedTuple):
    """The state of :func:`trace`: each parameter's update count (0-d ``int64``) and momentum buffer."""

    count: dict[str, Tensor]  # type: ignore[assignment]  # optax's field name; it shadows tuple.count
    momentum_buffer: dict[str, Tensor]


class ScaleByAdamState(NamedTuple):
    """The state of :func:`scale_by_adam`: each parameter's update count (0-d ``float32``, as torch's ``step``,
    which its fused kernels read) and first (``mu``) and second (``nu``) moments."""

    count: dict[str, Tensor]  # type: ignore[assignment]  # optax's field name; it shadows tuple.count
    mu: dict[str, Tensor]
    nu: dict[str, Tensor]


def _zero_count(params: Params) -> Tensor:
    return torch.zeros((), dtype=torch.int64, device=params_device(params))


def _zero_counts(params: Params, dtype: torch.dtype) -> dict[str, Tensor]:
    return {name: torch.zeros((), dtype=dtype, device=p.device) for name, p in params.items()}


def _state_tensors(tensors: dict[str, Tensor], updates: Updates) -> list[Tensor]:
    check_same_keys("updates", updates, tensors)
    return [tensors[name] for name in updates]


def _one_minus_power(base: float, exponent: Tensor) -> Tensor:
    """Returns ``1 − base^exponent`` for ``base ∈ [0, 1)`` and ``exponent ≥ 1``, in ``exponent``'s dtype.

    Written as ``−expm1(exponent · log(base))`` with ``log(base)`` taken in double precision on the host: a
    ``float32`` ``base`` close to 1 (β₂ = 0.99999) would otherwise be off by a large relative amount in
    ``1 − base^t``.
    """
    if base == 0.0:
        return torch.ones_like(exponent)
    return -torch.expm1(exponent * math.log(base))


def scale(factor: float) -> GradientTransformation:
    """Returns a transform that multiplies every update by a constant: ``u ← factor · u``."""
    factor = real_number("factor", factor)
    if factor == 1.0:
        return identity()
    return stateless(lambda updates, _: torch._foreach_mul(updates, factor))


def scale_by_schedule(schedule: ScheduleMultiplier, *, host_evaluable: bool = False) -> GradientTransformation:
    """Returns a transform that scales updates by a schedule of the update count: ``u ← s(t) · u``.

    ``t`` is the 0-d ``int64`` count of updates made before this one (0 on the first update) and ``s(t)`` a
    0-d tensor or a float (any :data:`~composer_fn.optim.schedules.ScheduleFn` fits). Chained after an
    optimizer whose updates carry the learning rate, this is ``torch.optim.lr_scheduler.LambdaLR`` with
    ``lr_lambda = s``. State: :class:`ScaleByScheduleState`.
    """
    if not callable(schedule):
        raise TypeError(f"schedule must be a function of the step count, got {type(schedule).__name__}")

    def init(params: Params) -> ScaleByScheduleState:
        return ScaleByScheduleState(count=_zero_count(params))

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], ScaleByScheduleState]:
        if not updates:
            return {}, ScaleByScheduleState(count=state.count + 1)
        with torch.no_grad():
            if host_evaluable and readable_on_host(state.count):
                # Eager on the CPU the count can be read for free: the schedule runs on a Python int, and a
                # multiplier of exactly 1 (a constant schedule) needs no multiplication at all.
                value = float(schedule(int(state.count)))  # type: ignore[arg-type]
                scaled = list(updates.values()) if value == 1.0 else torch._foreach_mul(list(updates.values()), value)
                return dict(zip(updates.keys(), scaled, strict=True)), ScaleByScheduleState(count=state.count + 1)
            multiplier = schedule(state.count)
            if isinstance(multiplier, Tensor):
                if multiplier.dim() != 0:
                    raise ValueError(
                        f"schedule must return a 0-d tensor or a float, got a tensor of shape {tuple(multiplier.shape)}"
                    )
                # A lookup such as table[count] is a view at a data-dependent offset, which foreach ops cannot
                # trace under torch.compile; a fresh copy on the count's device can.
                multiplier = multiplier.to(device=state.count.device, copy=True)
            scaled = torch._foreach_mul(list(updates.values()), multiplier)
            count = state.count + 1
        return dict(zip(updates.keys(), scaled, strict=True)), ScaleByScheduleState(count=count)

    return GradientTransformation(init, update)


def scheduled(optimizer: GradientTransformation, schedule: ScheduleMultiplier) -> GradientTransformation:
    """Returns ``chain(optimizer, scale_by_schedule(schedule, host_evaluable=True))``, with an in-place step.

    When ``optimizer`` has a ``fused`` step, so does the result: the learning rate times ``schedule(count)``
    (torch's ``LambdaLR`` arithmetic). The state is the chain's.
    """
    chained = chain(optimizer, scale_by_schedule(schedule, host_evaluable=True))._replace(
        learning_rate=optimizer.learning_rate
    )
    if optimizer.fused is None:
        return chained
    return chained._replace(fused=scheduled_fused(optimizer.fused, schedule))


def add_decayed_weights(weight_decay: float) -> GradientTransformation:
    """Returns a transform that adds the scaled parameters to the updates: ``u ← u + λ · p``.

    Before the learning rate this is coupled (L2) weight decay, as in ``torch.optim.SGD``/``Adam``; after
    it, decoupled weight decay. ``λ`` may be any real number (a negative ``λ`` is used where the update
    already carries the descent sign). ``update`` needs ``params``.
    """
    weight_decay = real_number("weight_decay", weight_decay)
    if weight_decay == 0.0:
        return identity()
    return stateless(
        lambda updates, params: torch._foreach_add(updates, params, alpha=weight_decay),
        reads_params="add_decayed_weights",
    )


def trace(momentum: float, dampening: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """Returns heavy-ball momentum with ``torch.optim.SGD``'s semantics.

    With ``m`` = ``momentum``, ``d`` = ``dampening`` and gradient ``g_t``::

        b_1 = g_1                              (the first buffer is the gradient itself)
        b_t = m · b_{t−1} + (1 − d) · g_t      (t > 1)
        u_t = g_t + m · b_t  if nesterov  else  b_t

    ``t`` counts the parameter's own updates (a parameter that gets no gradient on a step is left out of it).
    State: :class:`TraceState` with buffers shaped and typed like the parameters.
    """
    momentum = real_number("momentum", momentum, minimum=0.0)
    dampening = real_number("dampening", dampening)
    flag("nesterov", nesterov)
    if nesterov and (momentum == 0.0 or dampening != 0.0):
        raise ValueError(
            f"nesterov=True requires momentum > 0 and dampening == 0, got momentum={momentum}, dampening={dampening}"
        )

    def init(params: Params) -> TraceState:
        with torch.no_grad():
            buffers = {name: torch.zeros_like(p) for name, p in params.items()}
        return TraceState(count=_zero_counts(params, torch.int64), momentum_buffer=buffers)

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], TraceState]:
        if not updates:
            return {}, TraceState(count={}, momentum_buffer={})
        grads = list(updates.values())
        buffers = _state_tensors(state.momentum_buffer, updates)
        counts = _state_tensors(state.count, updates)
        with torch.no_grad():
            if dampening == 0.0:
                # The buffers start at zero, so m·0 + g is g exactly on the first step: no switch needed.
                new_buffers = torch._foreach_add(grads, buffers, alpha=momentum)
            else:
                # With dampening a parameter's first step differs, so its coefficients switch on its count:
                # 0·b + 1·g is g exactly, and one foreach expression serves every step with no branch on a tensor.
                first = stacked(counts) == 0
                dtype = scalar_dtype(grads)
                buffer_weight = torch.where(
                    first, torch.zeros_like(first, dtype=dtype), torch.full_like(first, momentum, dtype=dtype)
                )
                grad_weight = torch.where(
                    first,
                    torch.ones_like(first, dtype=dtype),
                    torch.full_like(first, 1.0 - dampening, dtype=dtype),
                )
                new_buffers = torch._foreach_mul(buffers, list(buffer_weight.unbind()))
                torch._foreach_add_(new_buffers, torch._foreach_mul(grads, list(grad_weight.unbind())))
            directions = torch._foreach_add(grads, new_buffers, alpha=momentum) if nesterov else new_buffers
            new_counts = torch._foreach_add(counts, 1)
        names = list(updates.keys())
        return dict(zip(names, directions, strict=True)), TraceState(
            count=dict(zip(names, new_counts, strict=True)), momentum_buffer=dict(zip(names, new_buffers, strict=True))
        )

    return GradientTransformation(init, update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Returns Adam's bias-corrected direction, as in ``torch.optim.Adam``.

    With gradient ``g_t`` and ``t`` counting from 1::

        μ_t = β₁ · μ_{t−1} + (1 − β₁) · g_t
        ν_t = β₂ · ν_{t−1} + (1 − β₂) · g_t²
        u_t = (μ_t / (1 − β₁ᵗ)) / (√ν_t / √(1 − β₂ᵗ) + ε)

    ``t`` counts the parameter's own updates, as torch's per-parameter ``step``. State: :class:`ScaleByAdamState`
    with moments shaped and typed like the parameters.
    """
    b1 = real_number("b1", b1, minimum=0.0, maximum=1.0, open_above=True)
    b2 = real_number("b2", b2, minimum=0.0, maximum=1.0, open_above=True)
    eps = real_number("eps", eps, minimum=0.0)

    def init(params: Params) -> ScaleByAdamState:
        with torch.no_grad():
            mu = {name: torch.zeros_like(p) for name, p in params.items()}
            nu = {name: torch.zeros_like(p) for name, p in params.items()}
        return ScaleByAdamState(count=_zero_counts(params, torch.float32), mu=mu, nu=nu)

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], ScaleByAdamState]:
        if not updates:
            return {}, ScaleByAdamState(count={}, mu={}, nu={})
        grads = list(updates.values())
        mu = _state_tensors(state.mu, updates)
        nu = _state_tensors(state.nu, updates)
        counts = _state_tensors(state.count, updates)
        with torch.no_grad():
            new_counts = list(torch._foreach_add(counts, 1.0))
            new_mu = torch._foreach_lerp(mu, grads, 1.0 - b1)
            new_nu = torch._foreach_mul(nu, b2)
            torch._foreach_addcmul_(new_nu, grads, grads, value=1.0 - b2)
            # Each parameter's bias corrections from its own count, computed over all counts at once.
            steps = stacked(new_counts).to(scalar_dtype(grads))
            bias_correction1 = list(_one_minus_power(b1, steps).unbind())
            bias_correction2_sqrt = list(torch.sqrt(_one_minus_power(b2, steps)).unbind())
            denominators = torch._foreach_sqrt(new_nu)
            torch._foreach_div_(denominators, bias_correction2_sqrt)
            torch._foreach_add_(denominators, eps)
            directions = torch._foreach_div(new_mu, denominators)
            torch._foreach_div_(directions, bias_correction1)
        names = list(updates.keys())
        new_state = ScaleByAdamState(
            count=dict(zip(names, new_counts, strict=True)),
            mu=dict(zip(names, new_mu, strict=True)),
            nu=dict(zip(names, new_nu, strict=True)),
        )
        return dict(zip(names, directions, strict=True)), new_state

    return GradientTransformation(init, update)
