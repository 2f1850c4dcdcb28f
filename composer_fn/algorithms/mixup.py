"""MixUp: train on convex combinations of pairs of examples and of their targets (Zhang et al., 2017).

``x_mix = (1 - mixing) * x + mixing * x[indices]`` and ``y_mix = (1 - mixing) * y + mixing * y[indices]``,
where ``indices`` is a random permutation of the batch and ``mixing = min(λ, 1 - λ)`` with λ ~ Beta(α, α),
so the original example always carries the larger weight (Composer's convention; ``mixing = 0`` leaves the
batch unchanged).

Composer draws one λ for the batch; ``per_sample=True`` draws one per example (``mixing`` of shape ``[B]``),
still in one vectorized ``lerp``.

λ is drawn on the host from the step's key with an exact Beta sampler (BATCH_START) and handed to the
traced step as a tensor (0-d, or ``[B]`` per sample); the permutation is drawn inside the traced step from the same key, so the
algorithm reproduces ``mixup_params(key, ...)`` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from composer_fn.algorithms._keys import check_key
from composer_fn.algorithms._label_mixing import LabelMixing, check_batch, check_indices, check_num_classes
from composer_fn.algorithms._targets import ensure_targets_one_hot, num_classes_of
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import no_change, register

__all__ = [
    "MixUp",
    "MixUpParams",
    "mixup_params",
    "mixup_apply",
    "mixup_targets",
    "mixup_batch",
    "draw_mixing",
    "draw_mixing_per_sample",
]


class MixUpParams(NamedTuple):
    """The random draws of one MixUp: the weight of the permuted example (0-d, or ``[B]``) and the permutation."""

    mixing: Tensor
    indices: Tensor


def draw_mixing(key: R.HostKey, alpha: float) -> float:
    """Returns ``min(λ, 1 - λ)`` with λ ~ Beta(α, α) drawn from the host key (0 when ``alpha == 0``)."""
    validate.real("alpha", alpha, minimum=0.0)
    if alpha == 0:
        return 0.0
    lam = float(R.host_rng(key).beta(alpha, alpha))
    return min(lam, 1.0 - lam)


def draw_mixing_per_sample(key: R.HostKey, alpha: float, batch_size: int) -> Tensor:
    """Returns ``min(λ, 1 - λ)`` for ``batch_size`` draws λ ~ Beta(α, α) from the host key, as float32 ``[B]``."""
    validate.real("alpha", alpha, minimum=0.0)
    if alpha == 0:
        return torch.zeros(batch_size, dtype=torch.float32)
    lam = R.host_rng(key).beta(alpha, alpha, size=batch_size)
    return torch.tensor(np.minimum(lam, 1.0 - lam), dtype=torch.float32)


def mixup_params(key: R.Key, batch_size: int, *, alpha: float = 0.2, per_sample: bool = False) -> MixUpParams:
    """Returns the MixUp draws for a batch: mixing from the host mirror of ``key``, indices from ``key``.

    ``per_sample`` draws one mixing weight per example (``[B]``) instead of one for the batch (0-d).
    """
    check_key(key)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    if per_sample:
        mixing = draw_mixing_per_sample(R.to_host(key), alpha, batch_size)
    else:
        mixing = torch.tensor(draw_mixing(R.to_host(key), alpha), dtype=torch.float32)
    return MixUpParams(mixing, R.permutation(key, batch_size))


def _weight(mixing: Tensor | float, like: Tensor) -> Tensor | float:
    if not isinstance(mixing, Tensor):
        return validate.probability("mixing", mixing, hint="the weight of the permuted example")
    if mixing.dim() == 1:
        # One weight per example, broadcast over the example's other dimensions.
        return mixing.to(like.dtype).reshape((-1,) + (1,) * (like.dim() - 1))
    return mixing.to(like.dtype)


def mixup_apply(input: Tensor, indices: Tensor, mixing: Tensor | float) -> Tensor:
    """Returns ``(1 - mixing) * input + mixing * input[indices]`` (one pass, via ``torch.lerp``).

    ``mixing`` is a number, a 0-d tensor, or one weight per example (``[B]``).
    """
    if not input.is_floating_point():
        raise TypeError(f"input of dtype {input.dtype}: MixUp needs floating-point inputs")
    if input.dim() == 0:
        raise ValueError("input of shape (): expected a batch [B, ...]")
    check_indices(indices, input.shape[0], "input")
    # index_select rather than input[indices]: the same values, a third of the time on the CPU.
    return torch.lerp(input, input.index_select(0, indices.to(input.device)), _weight(mixing, input))


def mixup_targets(target: Tensor, indices: Tensor, mixing: Tensor | float, num_classes: int) -> Tensor:
    """Returns ``(1 - mixing) * y + mixing * y[indices]`` with ``y`` the one-hot (or soft) targets."""
    check_num_classes(num_classes)
    check_indices(indices, target.shape[0] if target.dim() else 0, "target")
    probabilities = ensure_targets_one_hot(target, num_classes)
    permuted = probabilities.index_select(0, indices.to(probabilities.device))
    return torch.lerp(probabilities, permuted, _weight(mixing, probabilities))


def mixup_batch(
    input: Tensor,
    target: Tensor,
    mixing: float | Tensor | None = None,
    alpha: float = 0.2,
    indices: Tensor | None = None,
    *,
    key: R.Key | None = None,
    num_classes: int | None = None,
    per_sample: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns ``(mixed inputs, mixed targets, mixing)`` for a batch: the whole of MixUp, not half of it.

    Composer's ``mixup_batch`` returns the permuted targets and leaves mixing them to the caller; this one
    returns the finished targets. Draws not given explicitly (``mixing``, ``indices``) come from ``key``;
    ``per_sample`` draws one mixing weight per example, and an explicit ``mixing`` of shape ``[B]`` gives one.
    Class-index targets need ``num_classes``; probability targets of shape ``[B, C, ...]`` do not.
    """
    if key is not None:
        check_key(key)
    if num_classes is not None:
        check_num_classes(num_classes)
    check_batch(input, target)
    batch_size = input.shape[0]
    if (mixing is None or indices is None) and key is None:
        raise ValueError("key is required unless both mixing= and indices= are given")
    if key is not None:
        drawn = mixup_params(key, batch_size, alpha=alpha, per_sample=per_sample)
        mixing = drawn.mixing if mixing is None else mixing
        indices = drawn.indices.to(input.device) if indices is None else indices
    assert mixing is not None and indices is not None
    mixing_t = torch.as_tensor(mixing, dtype=torch.float32)
    if mixing_t.shape not in ((), (batch_size,)):
        raise ValueError(f"mixing of shape {tuple(mixing_t.shape)}: expected () or ({batch_size},), one per example")
    outside = ~((mixing_t >= 0) & (mixing_t <= 1))
    if mixing_t.dim() == 0 and bool(outside):
        raise ValueError(f"mixing={float(mixing_t)!r} must lie in [0, 1]")
    if bool(outside.any()):
        index = int(outside.nonzero()[0])
        raise ValueError(f"mixing[{index}]={float(mixing_t[index])!r} must lie in [0, 1]")
    if indices.shape != (batch_size,):
        raise ValueError(f"indices of shape {tuple(indices.shape)}: expected ({batch_size},), one per example")
    classes = num_classes_of(target, num_classes)
    mixing_t = mixing_t.to(input.device)
    return mixup_apply(input, indices, mixing_t), mixup_targets(target, indices, mixing_t, classes), mixing_t


@register
@dataclass(frozen=True)
class MixUp(LabelMixing[MixUpParams]):
    """Mixes pairs of examples and their targets (Composer's ``MixUp``).

    Args:
        alpha: the Beta(α, α) concentration; 0 disables mixing.
        interpolate_loss: instead of mixing the targets, replace the loss by
            ``(1 - mixing) * loss(y) + mixing * loss(y[indices])`` (equal for cross-entropy).
        per_sample: draw one mixing weight per example; by default one serves the whole batch, as in
            Composer. Needs mixed targets: per-example weights cannot interpolate a batch-mean loss.
        input_key: where the input sits in the batch.
        target_key: where the target sits in the batch.
    """

    algorithm_name = "mixup"

    alpha: float = 0.2
    interpolate_loss: bool = False
    per_sample: bool = False
    input_key: int | str = 0
    target_key: int | str = 1

    def changes_nothing(self) -> str | None:
        why = "a Beta(0, 0) draw gives every batch a mixing weight of 0, so the inputs and targets stay as they are"
        instead = "alpha > 0 (Composer's default is 0.2)"
        return no_change("MixUp", "alpha=0", why, instead) if self.alpha == 0 else None

    def draw(self, key: R.HostKey, batch_size: int | None) -> Tensor:
        if batch_size is None:
            return torch.tensor(draw_mixing(key, self.alpha), dtype=torch.float32)
        return draw_mixing_per_sample(key, self.alpha, batch_size)

    def mix_inputs(self, key: R.Key, input: Tensor, draws: Tensor) -> tuple[Tensor, MixUpParams]:
        indices = R.permutation(key, input.shape[0])
        return mixup_apply(input, indices.to(input.device), draws), MixUpParams(draws, indices)

    def mix_targets(self, target: Tensor, input: Tensor, pairing: MixUpParams, num_classes: int) -> Tensor:
        return mixup_targets(target, pairing.indices, pairing.mixing, num_classes)

    def mix_losses(self, loss: Tensor, partner_loss: Tensor, pairing: MixUpParams) -> Tensor:
        return torch.lerp(loss, partner_loss, pairing.mixing.to(loss.dtype))
