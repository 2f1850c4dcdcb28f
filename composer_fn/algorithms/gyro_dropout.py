"""GyroDropout: dropout that trains a fixed bank of pre-selected subnetworks (Lee et al., MLSys 2022).

Ordinary dropout samples a new mask for every sample of every step. ``GyroDropoutLayer`` keeps a bank of
``sigma`` masks over its features (the last dimension: ``[B, F]`` for a classifier head, ``[B, S, D]`` for the
activations of a sequence model, where a mask drops features of every token, never whole tokens, as
``nn.Dropout`` on those activations would drop elements), each feature kept with probability ``1 - p``. At any time ``tau``
masks of the bank are active, drawn with replacement (Composer's ``np.random.choice(sigma, tau)``); the batch
is split in ``tau`` consecutive groups of samples, group ``j`` uses active mask ``j`` (sample ``i`` of ``B``
uses mask ``i · tau // B``, which is Composer's ``repeat_interleave`` when ``tau`` divides ``B`` and also
covers the batches it cannot), and kept features are scaled by ``1 / (1 - p)``. A new set of ``tau`` masks
is drawn every ``selection_period`` training forwards, with Composer's period
``max(1, iterations // sigma) · tau`` for a run of ``iterations`` steps (Composer's ``int(iters_per_epoch ·
max_epoch / sigma) · tau``, which is 0, a division by zero, for runs shorter than ``sigma`` steps). In
evaluation the layer is the identity.

Randomness and state, as tensors:

- ``mask_key`` (a buffer, drawn from the surgery key and the layer's name): mask ``m`` of the bank is
  ``uniform(fold_in(bank key, m), features) >= p`` and the masks active in selection round ``r`` are
  ``randint(fold_in(selection key, r), 0, sigma, tau)``. Nothing of the bank is stored: it is recomputed from
  the key (``tau · features`` draws a forward), so its size need not be known before the first batch.
- ``training_step`` (a buffer): the number of training forwards so far, advanced in place by each training
  forward like BatchNorm's ``num_batches_tracked``; the step's forward returns it with the other buffers.
  Round ``r = training_step // selection_period``.

Both are checkpointed, so a resumed run continues the same schedule (Composer's is not resumable), and a
plain training loop advances the schedule as the trainer does. The layer does not read the per-step
``forward_key``: its draws must stay fixed for a whole selection round, so they are a pure function of its
own key and step count.

Dropouts of attention probabilities are left as they are: the attention modules of Hugging Face and timm
keep one (``attn_dropout``, ``attn_drop``, a ``...SelfAttention``'s ``dropout``) and, on their fused path,
pass its ``p`` to ``scaled_dot_product_attention`` instead of calling it, so a replacement would change the
attention's dropout probability to GyroDropout's ``p``; the bank of masks is over features, which attention
probabilities are not.

The record runs at INIT like every surgery (Composer's runs at FIT_START): the trainer's INIT timestamp holds
the run's length in batches, which gives the period; ``rewrite`` alone, with no run length, uses ``tau``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composer_fn.algorithms._surgery import (
    Surgery,
    check_model,
    matching_modules,
    replace_modules,
    warn_nothing_to_replace,
)
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register
from composer_fn.core.time import Timestamp, TimeUnit

__all__ = [
    "GyroDropout",
    "GyroDropoutLayer",
    "apply_gyro_dropout",
    "gyro_dropout_masks",
    "selection_period",
]

_MAX_BANK = 2**24


def selection_period(iterations: int | None, sigma: int, tau: int) -> int:
    """Returns the number of training steps between two selections of active masks.

    ``max(1, iterations // sigma) · tau`` for a run of ``iterations`` steps; ``tau`` when the length is unknown.
    """
    if iterations is None:
        return tau
    return max(1, iterations // sigma) * tau


def _bank_and_selection_keys(mask_key: Tensor) -> tuple[Tensor, Tensor]:
    return R.fold_in(mask_key, R.name_to_int("bank")), R.fold_in(mask_key, R.name_to_int("selection"))


def gyro_dropout_masks(
    mask_key: Tensor, step: Tensor | int, features: int, p: float, sigma: int, tau: int, period: int
) -> Tensor:
    """Returns the ``tau`` active keep-masks ``bool [tau, features]`` at training step ``step``.

    Round ``step // period`` selects ``tau`` of the ``sigma`` masks of the bank that ``mask_key`` defines
    (see the module docstring); each mask keeps a feature with probability ``1 - p``.
    """
    if not isinstance(step, Tensor):
        step = validate.integer("step", step, minimum=0, hint="the training step")
    features = validate.integer("features", features, minimum=1, hint="the width of a mask")
    _check(p, sigma, tau)
    period = validate.integer("period", period, minimum=1, hint="training steps between selections")
    sigma, tau = int(sigma), int(tau)
    bank_key, selection_key = _bank_and_selection_keys(mask_key)
    round_ = step // period
    selected = R.randint(R.fold_in(selection_key, round_), 0, sigma, (tau,))
    return R.uniform(R.fold_in(bank_key, selected), (features,)) >= p


def _check(p: object, sigma: object, tau: object) -> None:
    validate.real("p", p, minimum=0.0, maximum=1.0, open_above=True, hint="a dropout probability")
    for name, value in (("sigma", sigma), ("tau", tau)):
        if not validate.is_integer(value) or not 1 <= value <= _MAX_BANK:
            raise ValueError(f"{name}={value!r} must be an int in [1, 2**24]")


class GyroDropoutLayer(nn.Module):
    """Dropout over ``tau`` active masks of a keyed bank of ``sigma`` (see the module docstring)."""

    mask_key: Tensor
    training_step: Tensor

    def __init__(
        self,
        p: float = 0.5,
        sigma: int = 256,
        tau: int = 16,
        period: int = 16,
        mask_key: Tensor | None = None,
    ) -> None:
        _check(p, sigma, tau)
        validate.integer("period", period, minimum=1, hint="training steps between selections")
        super().__init__()
        self.p = float(p)
        self.sigma = int(sigma)
        self.tau = int(tau)
        self.period = int(period)
        initial = R.key(0) if mask_key is None else mask_key.detach().clone()
        if initial.shape != (2,) or initial.dtype != torch.int64:
            raise ValueError(
                f"mask_key of shape {tuple(initial.shape)} and {initial.dtype}: expected one key, int64 [2]"
            )
        self.register_buffer("mask_key", initial)
        self.register_buffer("training_step", torch.zeros((), dtype=torch.int64, device=initial.device))

    def extra_repr(self) -> str:
        """Returns the hyperparameters ``repr`` shows."""
        return f"p={self.p}, sigma={self.sigma}, tau={self.tau}, period={self.period}"

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input [B, ..., features]`` with each sample's group mask applied (training), else ``input``."""
        if not self.training:
            return input
        if input.dim() < 2:
            raise ValueError(f"input of shape {tuple(input.shape)}: expected [batch, ..., features]")
        masks = gyro_dropout_masks(
            self.mask_key, self.training_step, input.shape[-1], self.p, self.sigma, self.tau, self.period
        )
        self.training_step.add_(1)
        batch = input.shape[0]
        group = torch.arange(batch, device=input.device) * self.tau // batch
        mask = masks.to(device=input.device, dtype=input.dtype)[group]
        mask = mask.reshape(mask.shape[:1] + (1,) * (input.dim() - 2) + mask.shape[1:])
        return input * mask * (1.0 / (1.0 - self.p))


_ATTENTION_DROPOUT_NAMES = frozenset({"attn_dropout", "attn_drop", "attention_dropout"})


def _attention_dropouts(module: nn.Module) -> set[str]:
    """Returns the names of the dropouts of attention probabilities (see the module docstring)."""
    found = set()
    for owner_name, owner in module.named_modules():
        for child_name, child in owner.named_children():
            is_attention = child_name in _ATTENTION_DROPOUT_NAMES or (
                child_name == "dropout" and type(owner).__name__.endswith("SelfAttention")
            )
            if is_attention and isinstance(child, nn.Dropout):
                found.add(f"{owner_name}.{child_name}" if owner_name else child_name)
    return found


def _targets(module: nn.Module) -> list[str]:
    attention = _attention_dropouts(module)
    return [
        name
        for name in matching_modules(module, lambda _, m: isinstance(m, nn.Dropout))
        if name not in attention
    ]


def _with_gyro_dropout(
    module: nn.Module, key: Tensor, p: float, sigma: int, tau: int, period: int
) -> nn.Module:
    replacements: dict[str, nn.Module] = {
        name: GyroDropoutLayer(p, sigma, tau, period, R.fold_in(key, R.name_to_int(name)))
        for name in _targets(module)
    }
    if not replacements and not any(isinstance(m, GyroDropoutLayer) for m in module.modules()):
        warn_nothing_to_replace("GyroDropout", "torch.nn.Dropout", module, stacklevel=4)
    return replace_modules(module, replacements)


def apply_gyro_dropout(
    model: nn.Module,
    iters_per_epoch: int,
    max_epoch: int,
    p: float = 0.5,
    sigma: int = 256,
    tau: int = 16,
    *,
    key: Tensor,
) -> nn.Module:
    """Returns a copy of ``model`` whose ``nn.Dropout`` layers are ``GyroDropoutLayer``; ``model`` is untouched.

    The run is ``iters_per_epoch · max_epoch`` training steps, which sets the selection period; each layer's
    mask bank is keyed by ``fold_in(key, name_to_int(name))``. ``nn.Dropout`` subclasses are replaced too;
    dropouts of attention probabilities are kept (see the module docstring).
    """
    check_model(model)
    _check(p, sigma, tau)
    validate.integer("iters_per_epoch", iters_per_epoch, minimum=1)
    validate.integer("max_epoch", max_epoch, minimum=1)
    period = selection_period(iters_per_epoch * max_epoch, sigma, tau)
    return _with_gyro_dropout(model, key, p, sigma, tau, period)


@register
@dataclass(frozen=True)
class GyroDropout(Surgery):
    """Replaces ``nn.Dropout`` by ``GyroDropoutLayer`` at INIT (Composer's ``GyroDropout``).

    Args:
        p: the probability of dropping a feature, in each mask of the bank.
        sigma: the masks in the bank (the subnetworks trained).
        tau: the masks active at once, each serving a group of the batch's samples.
    """

    p: float = 0.5
    sigma: int = 256
    tau: int = 16

    def __post_init__(self) -> None:
        _check(self.p, self.sigma, self.tau)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_targets(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return _with_gyro_dropout(
            module, key, self.p, self.sigma, self.tau, selection_period(None, self.sigma, self.tau)
        )

    def rewrite_at(self, module: nn.Module, key: Tensor, timestamp: Timestamp) -> nn.Module:
        # The selection period follows the run's length, which the INIT timestamp knows and ``rewrite`` does not.
        duration = timestamp.max_duration
        iterations = int(duration.value) if duration is not None and duration.unit is TimeUnit.BATCH else None
        period = selection_period(iterations, self.sigma, self.tau)
        return _with_gyro_dropout(module, key, self.p, self.sigma, self.tau, period)
