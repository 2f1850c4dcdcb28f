"""Gradient clipping transforms: by global norm, by value, and adaptive (unit-wise, relative to the weights).

Each function returns a stateless :class:`~composer_fn.optim.base.GradientTransformation`. The clipping
coefficients are computed on the device and applied unconditionally (a coefficient of exactly 1 leaves a
gradient unchanged), so no value is read on the host and every transform traces under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from composer_fn.optim.base import (
    EmptyState,
    GradientTransformation,
    OptState,
    Params,
    Updates,
    check_same_keys,
    empty_state,
    require_params,
)
from composer_fn.optim.transforms import at_least_zero, real_number

__all__ = ["clip_by_global_norm", "clip_by_value", "adaptive_clip", "unitwise_norm"]


def _positive(argument: str, value: object) -> float:
    number = real_number(argument, value)
    if not number > 0.0:
        raise ValueError(f"{argument} must be > 0, got {number}")
    return number


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Returns a transform that rescales all updates together so their joint L2 norm is at most ``max_norm``.

    With ``‖u‖`` the L2 norm of every update concatenated::

        u ← u · min(1, max_norm / (‖u‖ + 1e-6))

    exactly as ``torch.nn.utils.clip_grad_norm_`` (whose ``1e-6`` keeps a zero gradient finite).
    """
    max_norm = _positive("max_norm", max_norm)

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], EmptyState]:
        if not updates:
            return {}, EmptyState()
        tensors = list(updates.values())
        with torch.no_grad():
            norms = torch._foreach_norm(tensors)
            total_norm = torch.linalg.vector_norm(torch.stack([n.to(tensors[0].device) for n in norms]))
            coefficient = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
            clipped = torch._foreach_mul(tensors, coefficient)
        return dict(zip(updates.keys(), clipped, strict=True)), EmptyState()

    return GradientTransformation(empty_state, update)


def clip_by_value(max_value: float) -> GradientTransformation:
    """Returns a transform that clamps every update element into ``[-max_value, max_value]``.

    ``u ← min(max(u, −max_value), max_value)``, as ``torch.nn.utils.clip_grad_value_``.
    """
    max_value = _positive("max_value", max_value)

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], EmptyState]:
        if not updates:
            return {}, EmptyState()
        with torch.no_grad():
            clipped = torch._foreach_clamp_min(list(updates.values()), -max_value)
            torch._foreach_clamp_max_(clipped, max_value)
        return dict(zip(updates.keys(), clipped, strict=True)), EmptyState()

    return GradientTransformation(empty_state, update)


def unitwise_norm(tensor: Tensor) -> Tensor:
    """Returns the L2 norm of each unit of ``tensor``: one per output row/filter, or one for the whole tensor.

    A tensor with two or more dimensions has one unit per index of its first dimension (a linear layer's
    output row, a convolution's filter), normed over the remaining dimensions and kept broadcastable
    (``[out, 1, …]``); a scalar or a vector (a bias) is one unit, normed whole (``[]``).
    """
    if tensor.dim() <= 1:
        return torch.linalg.vector_norm(tensor)
    return torch.linalg.vector_norm(tensor, dim=tuple(range(1, tensor.dim())), keepdim=True)


def adaptive_clip(clipping_threshold: float, eps: float = 1e-3) -> GradientTransformation:
    """Returns adaptive gradient clipping (AGC, Brock et al., 2021): caps each unit's update relative to its weights.

    With ``‖·‖ᵤ`` the :func:`unitwise_norm` and ``λ`` = ``clipping_threshold``, for each unit of each
    parameter ``w`` and its update ``u``::

        m = λ · max(‖w‖ᵤ, eps)
        u ← u · (m / ‖u‖ᵤ  if ‖u‖ᵤ > m  else 1)

    ``eps`` keeps units whose weights are (near) zero, such as zero-initialised biases, trainable; with
    ``eps = 0`` this is Composer's ``_apply_agc``, where such a unit's update is zeroed. ``update`` needs
    ``params``.
    """
    clipping_threshold = _positive("clipping_threshold", clipping_threshold)
    eps = at_least_zero("eps", eps)

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], EmptyState]:
        if not updates:
            return {}, EmptyState()
        params = require_params(params, "adaptive_clip")
        check_same_keys("updates", updates, params)
        tensors = list(updates.values())
        with torch.no_grad():
            update_norms = [unitwise_norm(u) for u in tensors]
            max_norms = [unitwise_norm(params[name]) for name in updates]
            if eps > 0.0:
                torch._foreach_clamp_min_(max_norms, eps)
            torch._foreach_mul_(max_norms, clipping_threshold)
            # Selecting with where (not min(1, m / n)) keeps 0/0 out of the result when a unit's weights and
            # update are both zero, and leaves a unit whose update norm is NaN unscaled, as Composer's
            # nan_to_num does.
            coefficients = [
                torch.where(n > m, m / n, torch.ones_like(n)).to(u.dtype)
                for u, n, m in zip(tensors, update_norms, max_norms, strict=True)
            ]
            clipped = torch._foreach_mul(tensors, coefficients)
        return dict(zip(updates.keys(), clipped, strict=True)), EmptyState()

    return GradientTransformation(empty_state, update)
