"""Optimizers as chains of gradient transformations, numerically equal to their torch and Composer twins.

Every optimizer returns a :class:`~composer_fn.optim.base.GradientTransformation` whose updates are *added*
to the parameters (they include the minus sign and the learning rate), and whose ``fused`` field performs the
same step in place, with torch's arithmetic, for callers that donate their tensors (the eager trainer). Its state is a ``dict`` keyed by what
each piece is (``"momentum"``, ``"adam"``, …), and its structure depends only on which features are on, so
a schedule is composed by chaining ``scale_by_schedule`` after it::

    tx = chain(sgd(0.1, momentum=0.9), scale_by_schedule(cosine))   # == SGD + LambdaLR(cosine)
"""

from __future__ import annotations

from collections.abc import Sequence

from composer_fn.optim.base import GradientTransformation, identity, named_chain
from composer_fn.optim.fused import adam_in_place, sgd_in_place
from composer_fn.optim.transforms import (
    add_decayed_weights,
    at_least_zero,
    beta,
    scale,
    scale_by_adam,
    trace,
)

__all__ = ["sgd", "sgdw", "adam", "adamw", "decoupled_adamw"]


def _momentum(momentum: float, dampening: float, nesterov: bool) -> GradientTransformation:
    momentum_transform = trace(momentum, dampening, nesterov)
    # Without momentum torch keeps no buffers; neither do we (a zero-momentum trace would hold a copy of
    # every parameter).
    return momentum_transform if momentum > 0.0 else identity()


def _betas(betas: Sequence[float]) -> tuple[float, float]:
    if not (isinstance(betas, Sequence) and len(betas) == 2):
        raise TypeError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    return beta("betas[0]", betas[0]), beta("betas[1]", betas[1])


def sgd(
    learning_rate: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> GradientTransformation:
    """Returns stochastic gradient descent, equal to ``torch.optim.SGD`` (coupled weight decay).

    With learning rate ``η``, weight decay ``λ`` and momentum ``m`` (buffers as in
    :func:`~composer_fn.optim.transforms.trace`)::

        g ← g + λ · p
        d = trace_m(g)      (d = g when m = 0)
        u = −η · d

    State: ``{"weight_decay": EmptyState, "momentum": TraceState | EmptyState, "learning_rate": EmptyState}``.
    """
    learning_rate = at_least_zero("learning_rate", learning_rate)
    weight_decay = at_least_zero("weight_decay", weight_decay)
    chained = named_chain(
        ("weight_decay", add_decayed_weights(weight_decay)),
        ("momentum", _momentum(momentum, dampening, nesterov)),
        ("learning_rate", scale(-learning_rate)),
    )
    fused = sgd_in_place(
        learning_rate, momentum, dampening, nesterov, weight_decay, decoupled=False, momentum_key="momentum"
    )
    return chained._replace(fused=fused)


def sgdw(
    learning_rate: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
) -> GradientTransformation:
    """Returns SGD with decoupled weight decay, equal to Composer's ``DecoupledSGDW`` at a constant rate.

    Momentum as in :func:`sgd`, then the decay is *not* multiplied by the learning rate::

        d = trace_m(g)
        u = −η · d − λ · p        i.e.  p ← p · (1 − λ) − η · d

    Chained with ``scale_by_schedule(s)`` the whole update is scaled, so the decay becomes ``s(t) · λ``:
    Composer's ``lr / initial_lr`` factor. State: ``{"momentum", "learning_rate", "weight_decay"}``.
    """
    learning_rate = at_least_zero("learning_rate", learning_rate)
    weight_decay = at_least_zero("weight_decay", weight_decay)
    chained = named_chain(
        ("momentum", _momentum(momentum, dampening, nesterov)),
        ("learning_rate", scale(-learning_rate)),
        # The update already carries the descent sign, so the decay enters negated.
        ("weight_decay", add_decayed_weights(-weight_decay)),
    )
    fused = sgd_in_place(
        learning_rate, momentum, dampening, nesterov, weight_decay, decoupled=True, momentum_key="momentum"
    )
    return chained._replace(fused=fused)


def adam(
    learning_rate: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> GradientTransformation:
    """Returns Adam with coupled (L2) weight decay, equal to ``torch.optim.Adam``.

    ::

        g ← g + λ · p
        u = −η · adam_{β₁,β₂,ε}(g)

    with Adam's bias-corrected direction from :func:`~composer_fn.optim.transforms.scale_by_adam`.
    State: ``{"weight_decay": EmptyState, "adam": ScaleByAdamState, "learning_rate": EmptyState}``.
    """
    learning_rate = at_least_zero("learning_rate", learning_rate)
    weight_decay = at_least_zero("weight_decay", weight_decay)
    b1, b2 = _betas(betas)
    eps = at_least_zero("eps", eps)
    chained = named_chain(
        ("weight_decay", add_decayed_weights(weight_decay)),
        ("adam", scale_by_adam(b1, b2, eps)),
        ("learning_rate", scale(-learning_rate)),
    )
    return chained._replace(fused=adam_in_place(learning_rate, b1, b2, eps, weight_decay, decay="coupled"))


def adamw(
    learning_rate: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> GradientTransformation:
    """Returns AdamW, equal to ``torch.optim.AdamW`` (decay multiplied by the learning rate).

    ::

        u = −η · (adam_{β₁,β₂,ε}(g) + λ · p)      i.e.  p ← p · (1 − η · λ) − η · adam(g)

    State: ``{"adam": ScaleByAdamState, "weight_decay": EmptyState, "learning_rate": EmptyState}``.
    """
    learning_rate = at_least_zero("learning_rate", learning_rate)
    weight_decay = at_least_zero("weight_decay", weight_decay)
    b1, b2 = _betas(betas)
    eps = at_least_zero("eps", eps)
    chained = named_chain(
        ("adam", scale_by_adam(b1, b2, eps)),
        ("weight_decay", add_decayed_weights(weight_decay)),
        ("learning_rate", scale(-learning_rate)),
    )
    return chained._replace(fused=adam_in_place(learning_rate, b1, b2, eps, weight_decay, decay="lr"))


def decoupled_adamw(
    learning_rate: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 1e-5,
) -> GradientTransformation:
    """Returns Adam with fully decoupled weight decay, equal to Composer's ``DecoupledAdamW`` at a constant rate.

    The decay is *not* multiplied by the learning rate::

        u = −η · adam_{β₁,β₂,ε}(g) − λ · p        i.e.  p ← p · (1 − λ) − η · adam(g)

    Chained with ``scale_by_schedule(s)`` the decay becomes ``s(t) · λ``, Composer's ``lr / initial_lr``
    factor. Defaults are Composer's (``betas=(0.9, 0.95)``, ``weight_decay=1e-5``). State:
    ``{"adam": ScaleByAdamState, "learning_rate": EmptyState, "weight_decay": EmptyState}``.
    """
    learning_rate = at_least_zero("learning_rate", learning_rate)
    weight_decay = at_least_zero("weight_decay", weight_decay)
    b1, b2 = _betas(betas)
    eps = at_least_zero("eps", eps)
    chained = named_chain(
        ("adam", scale_by_adam(b1, b2, eps)),
        ("learning_rate", scale(-learning_rate)),
        # The update already carries the descent sign, so the decay enters negated.
        ("weight_decay", add_decayed_weights(-weight_decay)),
    )
    return chained._replace(fused=adam_in_place(learning_rate, b1, b2, eps, weight_decay, decay="decoupled"))
