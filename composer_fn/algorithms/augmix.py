"""AugMix: mix several random augmentation chains of an image, then mix the result with the image.

Per image (Hendrycks et al., 2020, as Composer's ``augmix_image``): ``width`` chains, each of ``depth`` ops
drawn uniformly from the augmentation set at random strengths (``depth <= 0``: a random 1 to 3 ops per chain),
are applied to copies of the image; the chains are combined with weights ``w ~ Dirichlet(alpha, ..., alpha)``
and the combination is blended with the original by ``m ~ Beta(alpha, alpha)``:
``mixed = (1 - m) * image + m * sum_k w_k * chain_k``.

All draws are made on the device from the key, in plain tensor code (so the algorithm's traced hook can make
them): the Gamma variates behind the Dirichlet and Beta weights come from Marsaglia and Tsang's method with a
fixed number of proposals (``_GAMMA_PROPOSALS``: all are rejected with probability below 1e-15, and then the
proposals' centre ``d`` is used), in float64 and in log space so that a small ``alpha`` cannot underflow.
``augmix_apply`` runs the ``width`` chains of the whole batch as one batch of ``width * B`` images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from composer_fn.algorithms import _augment as ops
from composer_fn.algorithms._batch_transform import BatchTransform
from composer_fn.algorithms._keys import check_key
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register

__all__ = [
    "AugMix",
    "AugMixParams",
    "AugmentAndMixTransform",
    "augmix_params",
    "augmix_apply",
    "augmix_batch",
    "augmix_image",
]

_GAMMA_PROPOSALS = 12
"""Marsaglia-Tsang acceptance is at least 0.95 per proposal: 0.05**12 < 1e-15."""

_RANDOM_DEPTH = 3
"""With ``depth <= 0`` each chain has 1 to this many ops (Composer's ``np.random.randint(1, 4)``)."""


class AugMixParams(NamedTuple):
    """The draws of one AugMix over a batch.

    Attributes:
        op: ``[B, width, steps]`` op ids into ``PRIMITIVES``; ``IDENTITY`` (-1) past a chain's depth.
        magnitude: ``[B, width, steps]`` unsigned op arguments (see ``RandAugmentParams``).
        sign: ``[B, width, steps]`` +1 or -1.
        chain_weights: ``[B, width]`` float32 Dirichlet weights of the chains (each row sums to 1).
        mixing: ``[B]`` float32 Beta weight of the chains' combination against the original image.
    """

    op: Tensor
    magnitude: Tensor
    sign: Tensor
    chain_weights: Tensor
    mixing: Tensor


def _log_gamma_variates(key: R.Key, alpha: float, shape: tuple[int, ...]) -> Tensor:
    """Returns ``log(G)`` for ``G ~ Gamma(alpha, 1)`` of ``shape``, float64 (Marsaglia & Tsang, 2000)."""
    # For alpha < 1: G(alpha) = G(alpha + 1) * U ** (1 / alpha), added in log space.
    boosted = alpha + 1.0 if alpha < 1.0 else alpha
    d = boosted - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    proposals = shape + (_GAMMA_PROPOSALS,)
    z = R.normal(R.fold_in(key, 0), proposals, dtype=torch.float64)
    # 1 - U lies in (0, 1]: its log is finite.
    log_u = torch.log1p(-R.uniform(R.fold_in(key, 1), proposals, dtype=torch.float64))
    cube_root = 1.0 + c * z
    v = cube_root * cube_root * cube_root
    positive = v > 0.0
    log_v = torch.log(torch.where(positive, v, 1.0))
    accepted = positive & (log_u < 0.5 * z * z + d - d * v + d * log_v)
    first = accepted.to(torch.uint8).argmax(dim=-1, keepdim=True)
    log_gamma = math.log(d) + log_v.gather(-1, first).squeeze(-1)
    log_gamma = torch.where(accepted.any(dim=-1), log_gamma, math.log(d))
    if alpha < 1.0:
        log_gamma = log_gamma + torch.log1p(-R.uniform(R.fold_in(key, 2), shape, dtype=torch.float64)) / alpha
    return log_gamma


def augmix_params(
    key: R.Key,
    batch_size: int,
    *,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: str = "all",
) -> AugMixParams:
    """Returns the chains' ops and strengths and the mixing weights for ``batch_size`` images, from ``key``."""
    check_key(key)
    _check(severity, depth, width, alpha, augmentation_set)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    steps = depth if depth > 0 else _RANDOM_DEPTH
    shape = (batch_size, width, steps)
    choice = R.randint(R.fold_in(key, 0), 0, len(ops.augmentation_sets[augmentation_set]), shape)
    op, magnitude, sign = ops.draw_ops(
        R.uniform(R.fold_in(key, 1), shape + (4,)), choice, severity, augmentation_set
    )
    if depth <= 0:
        chain_depth = R.randint(R.fold_in(key, 2), 1, _RANDOM_DEPTH + 1, (batch_size, width, 1))
        step = torch.arange(steps, device=op.device)
        op = torch.where(step < chain_depth, op, ops.IDENTITY)
    chain_weights = torch.softmax(_log_gamma_variates(R.fold_in(key, 3), alpha, (batch_size, width)), dim=-1)
    pair = _log_gamma_variates(R.fold_in(key, 4), alpha, (batch_size, 2))
    mixing = torch.sigmoid(pair[:, 0] - pair[:, 1])  # G1 / (G1 + G2) ~ Beta(alpha, alpha)
    return AugMixParams(op, magnitude, sign, chain_weights.to(torch.float32), mixing.to(torch.float32))


def augmix_apply(images: Tensor, params: AugMixParams) -> Tensor:
    """Returns ``(1 - m) * images + m * sum_k w_k * chain_k(images)`` per image (deterministic).

    ``images`` is ``[B, C, H, W]`` (``C`` 1 or 3), ``uint8`` (the result is rounded back to ``uint8``) or
    floating in ``[0, 1]`` (mixed in float32, cast back). The input is never written to.
    """
    ops.check_images(images)
    batch, channels, height, width_px = images.shape
    if params.op.dim() != 3 or params.op.shape[0] != batch:
        raise ValueError(f"params.op of shape {tuple(params.op.shape)}: expected [{batch}, width, steps]")
    for name in ("magnitude", "sign"):
        if getattr(params, name).shape != params.op.shape:
            raise ValueError(
                f"params.{name} of shape {tuple(getattr(params, name).shape)}: expected like params.op"
            )
    width, steps = params.op.shape[1:]
    if params.chain_weights.shape != (batch, width) or params.mixing.shape != (batch,):
        raise ValueError(
            f"params.chain_weights {tuple(params.chain_weights.shape)} and params.mixing "
            f"{tuple(params.mixing.shape)}: expected ({batch}, {width}) and ({batch},)"
        )
    # Chain k of image b is image k * B + b of one batch: every step runs once over all chains.
    chains = images.repeat(width, 1, 1, 1)
    op = params.op.to(images.device).transpose(0, 1).reshape(width * batch, steps)
    magnitude = params.magnitude.transpose(0, 1).reshape(width * batch, steps)
    sign = params.sign.transpose(0, 1).reshape(width * batch, steps)
    value = ops.op_arguments(op, magnitude, sign, images)
    for step in range(steps):
        chains = ops.apply_op(chains, op[:, step], value[:, step])
    chains = chains.view(width, batch, channels, height, width_px)
    weights = params.chain_weights.to(images.device, torch.float32).t().reshape(width, batch, 1, 1, 1)
    # Accumulated in place into one float32 buffer created here: the chains are never converted whole.
    combination = torch.zeros(images.shape, dtype=torch.float32, device=images.device)
    for chain in range(width):
        combination.addcmul_(chains[chain], weights[chain])
    # lerp(combination, image, 1 - m) is (1 - m) * image + m * combination, and exactly the image when m = 0.
    keep = 1.0 - params.mixing.to(images.device, torch.float32).view(batch, 1, 1, 1)
    mixed = combination.lerp_(images.to(torch.float32), keep)
    if images.dtype == torch.uint8:
        return ops.to_levels(mixed.round_().clamp_(0.0, 255.0))
    return mixed.to(images.dtype)


def augmix_batch(
    input: Tensor,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: str = "all",
    *,
    key: R.Key,
) -> Tensor:
    """Returns AugMix of a ``[B, C, H, W]`` batch, every image with its own draws from ``key``.

    ``input`` is ``uint8``, or floating (``float64`` included, mixed in ``float32``) in ``[0, 1]``: run eagerly,
    a floating batch outside that range raises ValueError. The result has the input's dtype.
    """
    check_key(key)
    _check(severity, depth, width, alpha, augmentation_set)
    return ops.augment_batch(
        input, lambda images: _augmix(images, severity, depth, width, alpha, augmentation_set, key), "AugMix"
    )


def _augmix(
    images: Tensor, severity: float, depth: int, width: int, alpha: float, augmentation_set: str, key: R.Key
) -> Tensor:
    ops.check_images(images, "input")
    params = augmix_params(
        key,
        images.shape[0],
        severity=severity,
        depth=depth,
        width=width,
        alpha=alpha,
        augmentation_set=augmentation_set,
    )
    return augmix_apply(images, params)


def augmix_image(
    img: Any,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: str = "all",
    *,
    key: R.Key,
) -> Any:
    """Returns AugMix of one ``[C, H, W]`` image, a ``[B, C, H, W]`` batch or a PIL image, drawn from ``key``.

    The result is of the kind given: a PIL image (mode ``L`` or ``RGB``) for a PIL image, else a tensor of
    the input's shape and dtype (see ``augmix_batch`` for the dtypes and range).
    """
    check_key(key)
    return ops.on_image_or_batch(
        img, lambda images: augmix_batch(images, severity, depth, width, alpha, augmentation_set, key=key)
    )


def _check(severity: float, depth: int, width: int, alpha: float, augmentation_set: str) -> None:
    ops.check_severity(severity, augmentation_set)
    validate.integer("depth", depth, hint="<= 0 for a random 1 to 3 ops per chain")
    validate.integer("width", width, minimum=1)
    validate.real("alpha", alpha, minimum=0.0, open_below=True)


class AugmentAndMixTransform(ops.KeyedTransform):
    """AugMix of one image per call, for data-loader workers (Composer's ``AugmentAndMixTransform``).

    Args:
        severity: strength of the ops, in [0, 10].
        depth: ops per chain; ``<= 0`` draws 1 to 3 per chain.
        width: number of chains.
        alpha: concentration of the Dirichlet chain weights and of the Beta mixing weight.
        augmentation_set: ``"all"``, ``"safe"`` or ``"original"``.
        seed: the root of the draws; ``__call__`` says how each call's key derives from it.
    """

    def __init__(
        self,
        severity: float = 3,
        depth: int = -1,
        width: int = 3,
        alpha: float = 1.0,
        augmentation_set: str = "all",
        seed: int = 0,
    ) -> None:
        _check(severity, depth, width, alpha, augmentation_set)
        super().__init__(seed)
        self.severity, self.depth, self.width, self.alpha = severity, depth, width, alpha
        self.augmentation_set = augmentation_set

    def _augment(self, batch: Tensor, key: R.Key) -> Tensor:
        return augmix_batch(
            batch, self.severity, self.depth, self.width, self.alpha, self.augmentation_set, key=key
        )

    def __repr__(self) -> str:
        return (
            f"AugmentAndMixTransform(severity={self.severity!r}, depth={self.depth!r}, width={self.width!r}, "
            f"alpha={self.alpha!r}, augmentation_set={self.augmentation_set!r})"
        )


@register
@dataclass(frozen=True)
class AugMix(BatchTransform):
    """Augments the input batch with AugMix on the device (Composer's ``AugMix``).

    Args:
        severity: strength of the ops, in [0, 10].
        depth: ops per chain; ``<= 0`` draws 1 to 3 per chain and image.
        width: number of augmentation chains mixed per image.
        alpha: concentration of the Dirichlet chain weights and of the Beta mixing weight (> 0).
        augmentation_set: ``"all"``, ``"safe"`` or ``"original"``.
        input_key: where the images sit in the batch: ``uint8``, or floats in ``[0, 1]`` (normalize after).
    """

    algorithm_name = "augmix"
    input_range = (0.0, 1.0)

    severity: float = 3
    depth: int = -1
    width: int = 3
    alpha: float = 1.0
    augmentation_set: str = "all"
    input_key: int | str = 0

    def __post_init__(self) -> None:
        _check(self.severity, self.depth, self.width, self.alpha, self.augmentation_set)
        validate.batch_key("input_key", self.input_key)

    def transform(self, key: R.Key, input: Tensor) -> Tensor:
        # The values of a traced batch cannot be read; the Trainer checks the first batch's range instead.
        return _augmix(input, self.severity, self.depth, self.width, self.alpha, self.augmentation_set, key)
