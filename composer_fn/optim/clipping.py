"""Gradient clipping transforms: by global norm, by value, and adaptive (unit-wise, relative to the weights).

Each function returns a stateless :class:`~composer_fn.optim.base.GradientTransformation`. The clipping
coefficients are computed on the device and applied unconditionally (a coefficient of exactly 1 leaves a
gradient unchanged), so no value is read on the host and every transform traces under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from composer_fn.optim.arguments import real_number
from composer_fn.optim.base import GradientTransformation, stateless

__all__ = ["clip_by_global_norm", "clip_by_value", "adaptive_clip", "unitwise_norm"]


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Returns a transform that rescales all updates together so their joint L2 norm is at most ``max_norm``.

    With ``‖u‖`` the L2 norm of every update concatenated::

        u ← u · min(1, max_norm / (‖u‖ + 1e-6))

    exactly as ``torch.nn.utils.clip_grad_norm_`` (whose ``1e-6`` keeps a zero gradient finite).
    """
    max_norm = real_number("max_norm", max_norm, minimum=0.0, open_below=True)

    def clip(updates: list[Tensor], params: list[Tensor]) -> Sequence[Tensor]:
        norms = torch._foreach_norm(updates)
        total_norm = torch.linalg.vector_norm(torch.stack([n.to(updates[0].device) for n in norms]))
        coefficient = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        return torch._foreach_mul(updates, coefficient)

    return stateless(clip)


def clip_by_value(max_value: float) -> GradientTransformation:
    """Returns a transform that clamps every update element into ``[-max_value, max_value]``.

    ``u ← min(max(u, −max_value), max_value)``, as ``torch.nn.utils.clip_grad_value_``.
    """
    max_value = real_number("max_value", max_value, minimum=0.0, open_below=True)

    def clip(updates: list[Tensor], params: list[Tensor]) -> Sequence[Tensor]:
        clipped = torch._foreach_clamp_min(updates, -max_value)
        torch._foreach_clamp_max_(clipped, max_value)
        return clipped

    return stateless(clip)


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
    clipping_threshold = real_number("clipping_threshold", clipping_threshold, minimum=0.0, open_below=True)
    eps = real_number("eps", eps, minimum=0.0)

    def clip(updates: list[Tensor], params: list[Tensor]) -> Sequence[Tensor]:
        update_norms = [unitwise_norm(u) for u in updates]
        max_norms: list[Tensor] | tuple[Tensor, ...] = [unitwise_norm(p) for p in params]
        # Out of place: a norm over a sharded tensor is a partial sum, which in-place arithmetic cannot change.
        if eps > 0.0:
            max_norms = torch._foreach_clamp_min(max_norms, eps)
        max_norms = torch._foreach_mul(max_norms, clipping_threshold)
        # Selecting with where (not min(1, m / n)) keeps 0/0 out of the result when a unit's weights and
        # update are both zero, and leaves a unit whose update norm is NaN unscaled, as Composer's
        # nan_to_num does.
        coefficients = [
            torch.where(n > m, m / n, torch.ones_like(n)).to(u.dtype)
            for u, n, m in zip(updates, update_norms, max_norms, strict=True)
        ]
        return torch._foreach_mul(updates, coefficients)

    return stateless(clip, reads_params="adaptive_clip")
