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

from composer_fn.optim.arguments import real_number
from composer_fn.optim.base import GradientTransformation, identity, named_chain
from composer_fn.optim.fused import WeightDecay, adam_in_place, sgd_in_place
from composer_fn.optim.transforms import add_decayed_weights, scale, scale_by_adam, trace

__all__ = ["sgd", "sgdw", "adam", "adamw", "decoupled_adamw"]


def _momentum(momentum: float, dampening: float, nesterov: bool) -> GradientTransformation:
    momentum_transform = trace(momentum, dampening, nesterov)
    # Without momentum torch keeps no buffers; neither do we (a zero-momentum trace would hold a copy of
    # every parameter).
    return momentum_transform if momentum > 0.0 else identity()


def _rate_and_decay(learning_rate: float, weight_decay: float) -> tuple[float, float]:
    return (
        real_number("learning_rate", learning_rate, minimum=0.0),
        real_number("weight_decay", weight_decay, minimum=0.0),
    )


def _descent(
    direction: tuple[str, GradientTransformation],
    learning_rate: float,
    weight_decay: float,
    decay: WeightDecay,
) -> GradientTransformation:
    rate = ("learning_rate", scale(-learning_rate))
    if decay == "coupled":
        chained = named_chain(("weight_decay", add_decayed_weights(weight_decay)), direction, rate)
    elif decay == "lr":
        chained = named_chain(direction, ("weight_decay", add_decayed_weights(weight_decay)), rate)
    else:
        # The update already carries the descent sign, so the decay enters negated.
        chained = named_chain(direction, rate, ("weight_decay", add_decayed_weights(-weight_decay)))
    return chained._replace(learning_rate=learning_rate)


def _sgd(
    learning_rate: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    decay: WeightDecay,
) -> GradientTransformation:
    learning_rate, weight_decay = _rate_and_decay(learning_rate, weight_decay)
    chained = _descent(
        ("momentum", _momentum(momentum, dampening, nesterov)), learning_rate, weight_decay, decay
    )
    fused = sgd_in_place(learning_rate, momentum, dampening, nesterov, weight_decay, decoupled=decay == "decoupled")
    return chained._replace(fused=fused)


def _adam(
    learning_rate: float, betas: Sequence[float], eps: float, weight_decay: float, decay: WeightDecay
) -> GradientTransformation:
    learning_rate, weight_decay = _rate_and_decay(learning_rate, weight_decay)
    given = betas
    if getattr(betas, "ndim", None) == 1 and hasattr(betas, "tolist"):  # a NumPy array or a tensor of two
        betas = betas.tolist()
    if not (isinstance(betas, Sequence) and not isinstance(betas, str) and len(betas) == 2):
        raise TypeError(f"betas must be a pair (beta1, beta2), got {given!r}")
    b1, b2 = (
        real_number(f"betas[{index}]", beta, minimum=0.0, maximum=1.0, open_above=True)
        for index, beta in enumerate(betas)
    )
    eps = real_number("eps", eps, minimum=0.0)
    chained = _descent(("adam", scale_by_adam(b1, b2, eps)), learning_rate, weight_decay, decay)
    return chained._replace(fused=adam_in_place(learning_rate, b1, b2, eps, weight_decay, decay=decay))


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
    return _sgd(learning_rate, momentum, dampening, nesterov, weight_decay, "coupled")


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
    return _sgd(learning_rate, momentum, dampening, nesterov, weight_decay, "decoupled")


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
    return _adam(learning_rate, betas, eps, weight_decay, "coupled")


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
    return _adam(learning_rate, betas, eps, weight_decay, "lr")


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
    return _adam(learning_rate, betas, eps, weight_decay, "decoupled")
