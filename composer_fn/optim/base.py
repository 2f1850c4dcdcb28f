"""The gradient-transformation contract, its combinators, and applying updates to parameters.

A :class:`GradientTransformation` is optax's pair of pure functions over ``dict[str, Tensor]`` keyed by
parameter name::

    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    params = apply_updates(params, updates)

``update`` never modifies its inputs and records no autograd history; every tensor it returns is new (or an
input passed through unchanged). Key order is preserved from ``updates``. Optimizer state is a pytree of
NamedTuples, tuples and dicts of tensors, so it crosses the ``torch.compile`` boundary and saves with
``torch.save``.

A transformation may carry two facts beside its pair: ``fused``, an in-place form of its whole step, and
``learning_rate``, its base rate. The combinators keep them where the combination computes the same thing:

- ``chain`` and ``named_chain`` keep the *last* transform's ``fused`` step, run after the ``update`` of the
  transforms before it (which only change the gradients it is given: clipping, a mask, a decay), and its
  ``learning_rate`` unless a transform before it has a rate of its own. A chain whose last transform has no
  ``fused`` step has none: a transform after an optimizer changes the update it would write in place
  (``scheduled`` is the in-place form of ``chain(optimizer, scale_by_schedule(s))``); nor does an empty chain.
- ``masked`` keeps its transform's ``fused`` step, run on the masked-in parameters, the others taking their
  passed-through update, and its ``learning_rate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = [
    "Params",
    "Updates",
    "OptState",
    "InitFn",
    "UpdateFn",
    "FusedFn",
    "GradientTransformation",
    "EmptyState",
    "MaskedState",
    "empty_state",
    "identity",
    "stateless",
    "chain",
    "named_chain",
    "masked",
    "apply_updates",
    "apply_updates_",
    "restrict_state",
    "merge_state",
    "aligned",
    "in_layout_of",
]

Params = Mapping[str, Tensor]
"""Parameters by qualified name."""

Updates = Mapping[str, Tensor]
"""Gradients or updates by parameter name; the same keys as :data:`Params`."""

OptState = Any
"""A pytree of NamedTuples, tuples and dicts whose leaves are tensors."""

InitFn = Callable[[Params], OptState]
UpdateFn = Callable[[Updates, OptState, "Params | None"], tuple[dict[str, Tensor], OptState]]
FusedFn = Callable[[Params, Updates, OptState, float], OptState]
"""``fused(params, grads, state, scale) -> state``: one whole step written into ``params`` and ``state`` in place."""


class GradientTransformation(NamedTuple):
    """A pure optimizer building block: ``init(params) -> state`` and ``update(updates, state, params)``.

    ``update`` returns ``(new_updates, new_state)``. Optimizers built from these return updates that are
    *added* to the parameters (they carry the minus sign and the learning rate).
    """

    init: InitFn
    update: UpdateFn
    fused: FusedFn | None = None
    """An optional in-place form of ``update`` then ``apply_updates`` for callers that own (donate) their
    parameters and state, with the learning rate times ``scale`` (see ``composer_fn.optim.fused``): ``params``
    becomes ``params + scale · update`` and the state what ``update`` returns. It must compute what ``update``
    computes, to rounding; the combinators keep it where that holds (see the module docstring)."""
    learning_rate: float | None = None
    """The optimizer's base learning rate, when it has one (for monitors; schedules multiply it)."""


class EmptyState(NamedTuple):
    """The state of a transform that keeps none."""


class MaskedState(NamedTuple):
    """The state of :func:`masked`: the inner transform's state over the masked-in parameters."""

    inner_state: OptState


def check_same_keys(argument: str, tensors: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Returns ``None`` when ``tensors`` has exactly the keys of ``expected``; raises ``ValueError`` otherwise."""
    if tensors.keys() != expected.keys():
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise ValueError(
            f"{argument} must have the same parameter names as the optimizer state/params; "
            f"missing {missing}, unexpected {extra}"
        )


def require_params(params: Params | None, transform: str) -> Params:
    """Returns ``params``; raises ``ValueError`` when a transform that reads parameters got ``None``."""
    if params is None:
        raise ValueError(
            f"params=None: {transform} reads the parameters; pass them as update(updates, state, params)"
        )
    return params


def _check_transform(argument: str, transform: object) -> GradientTransformation:
    if not isinstance(transform, GradientTransformation):
        raise TypeError(
            f"{argument} must be a GradientTransformation (an (init, update) pair), got {type(transform).__name__}"
        )
    return transform


def empty_state(params: Params) -> EmptyState:
    """Returns :class:`EmptyState`: the ``init`` of every transform that keeps no state."""
    return EmptyState()


def identity() -> GradientTransformation:
    """Returns a transform that passes updates through unchanged: ``u ← u``; its state is :class:`EmptyState`."""

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], EmptyState]:
        return dict(updates), EmptyState()

    return GradientTransformation(empty_state, update)


def stateless(
    apply: Callable[[list[Tensor], list[Tensor]], Sequence[Tensor]], *, reads_params: str | None = None
) -> GradientTransformation:
    """Returns a transform that keeps no state and maps the updates by ``apply(updates, params)``.

    ``apply`` gets the update tensors as a list and, with ``reads_params`` (the transform's name, for the error
    when ``update`` gets no ``params``), the parameters in the same order (else an empty list). It runs without
    autograd history and returns the new updates in that order. Empty updates pass through without a call.
    """

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], EmptyState]:
        if not updates:
            return {}, EmptyState()
        weights: list[Tensor] = []
        if reads_params is not None:
            params = require_params(params, reads_params)
            check_same_keys("updates", updates, params)
            weights = [params[name] for name in updates]
        with torch.no_grad():
            new_updates = apply(list(updates.values()), weights)
        return dict(zip(updates.keys(), new_updates, strict=True)), EmptyState()

    return GradientTransformation(empty_state, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Returns the composition ``t_n ∘ … ∘ t_1``: updates flow through ``transforms`` left to right.

    The state is a ``tuple`` holding each transform's state in order. Prefer :func:`named_chain` when the
    state will be read back by a person or a callback. The chain's ``fused`` step and ``learning_rate`` are its
    last transform's, kept as the module docstring says: ``chain(clip_by_global_norm(1.0), sgd(0.1))`` steps in
    place with rate 0.1; ``chain(sgd(0.1), scale(0.5))`` has neither.
    """
    for index, transform in enumerate(transforms):
        _check_transform(f"transforms[{index}]", transform)

    def init(params: Params) -> tuple[OptState, ...]:
        return tuple(transform.init(params) for transform in transforms)

    def checked(state: OptState) -> tuple[OptState, ...]:
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise ValueError(
                f"state must be the tuple of {len(transforms)} states made by this chain's init, got {type(state).__name__}"
                + (f" of length {len(state)}" if isinstance(state, tuple) else "")
            )
        return state

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], tuple[OptState, ...]]:
        new_updates: dict[str, Tensor] = dict(updates)
        new_states = []
        for transform, inner_state in zip(transforms, checked(state), strict=True):
            new_updates, new_state = transform.update(new_updates, inner_state, params)
            new_states.append(new_state)
        return new_updates, tuple(new_states)

    last = transforms[-1] if transforms else None
    if last is None or last.fused is None:
        return GradientTransformation(init, update, learning_rate=_last_rate(transforms))
    last_fused = last.fused

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> tuple[OptState, ...]:
        *leading, final = checked(state)
        new_grads: dict[str, Tensor] = dict(grads)
        new_states = []
        for transform, inner_state in zip(transforms[:-1], leading, strict=True):
            new_grads, new_state = transform.update(new_grads, inner_state, params)
            new_states.append(new_state)
        return (*new_states, last_fused(params, new_grads, final, scale))

    return GradientTransformation(init, update, fused, _last_rate(transforms))


def _last_rate(transforms: Sequence[GradientTransformation]) -> float | None:
    # The last transform's rate is the chain's when no transform before it scales the updates by a rate of its own.
    if not transforms or any(t.learning_rate is not None for t in transforms[:-1]):
        return None
    return transforms[-1].learning_rate


def named_chain(*transforms: tuple[str, GradientTransformation]) -> GradientTransformation:
    """Returns the composition of ``transforms`` left to right, with its state as a ``dict`` keyed by name.

    ``named_chain(("momentum", trace(0.9)), ("learning_rate", scale(-0.1)))`` has the state
    ``{"momentum": TraceState(...), "learning_rate": EmptyState()}``, so a piece of state is found by what it
    is, not by its position. Its ``fused`` step and ``learning_rate`` are kept as :func:`chain`'s.
    """
    names: list[str] = []
    for index, entry in enumerate(transforms):
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            raise TypeError(
                f"transforms[{index}] must be a (name, GradientTransformation) pair, got {entry!r}"
            )
        _check_transform(f"transforms[{index}][1]", entry[1])
        if entry[0] in names:
            raise ValueError(f"transforms[{index}] repeats the name {entry[0]!r}; names must be unique")
        names.append(entry[0])

    def init(params: Params) -> dict[str, OptState]:
        return {name: transform.init(params) for name, transform in transforms}

    def checked(state: OptState) -> Mapping[str, OptState]:
        if not isinstance(state, Mapping) or set(state.keys()) != set(names):
            got = list(state.keys()) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(
                f"state must be the dict made by this named_chain's init with keys {names}, got {got}"
            )
        return state

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], dict[str, OptState]]:
        state = checked(state)
        new_updates: dict[str, Tensor] = dict(updates)
        new_states: dict[str, OptState] = {}
        for name, transform in transforms:
            new_updates, new_states[name] = transform.update(new_updates, state[name], params)
        return new_updates, new_states

    rate = _last_rate([transform for _, transform in transforms])
    last_name, last = transforms[-1] if transforms else ("", None)
    if last is None or last.fused is None:
        return GradientTransformation(init, update, learning_rate=rate)
    last_fused = last.fused

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> dict[str, OptState]:
        state = checked(state)
        new_grads: dict[str, Tensor] = dict(grads)
        new_states: dict[str, OptState] = {}
        for name, transform in transforms[:-1]:
            new_grads, new_states[name] = transform.update(new_grads, state[name], params)
        new_states[last_name] = last_fused(params, new_grads, state[last_name], scale)
        return new_states

    return GradientTransformation(init, update, fused, rate)


def masked(
    transform: GradientTransformation, mask: Callable[[Params], Mapping[str, bool]] | Mapping[str, bool]
) -> GradientTransformation:
    """Returns a transform that applies ``transform`` to the parameters where ``mask`` is true only.

    ``u_k ← transform(u)_k`` where ``mask[k]``, and ``u_k ← u_k`` elsewhere. The inner transform sees (and
    keeps state for) the masked-in parameters only. ``mask`` is a mapping from every parameter name to a
    Python ``bool``, or a function building one: it is called on ``params`` in ``init`` and on ``updates``
    in ``update``. Its values must be Python booleans so the selection is fixed at trace time. With a ``fused``
    step in ``transform``, the masked transform has one: ``transform``'s on the masked-in parameters, and
    ``p ← p + scale · u`` on the others; its ``learning_rate`` is ``transform``'s.
    """
    _check_transform("transform", transform)
    if not (callable(mask) or isinstance(mask, Mapping)):
        raise TypeError(
            f"mask must be a Mapping[str, bool] or a function of the params, got {type(mask).__name__}"
        )

    def resolve(tree: Mapping[str, Tensor]) -> Mapping[str, bool]:
        resolved = mask(tree) if callable(mask) else mask
        check_same_keys("mask", resolved, tree)
        for name, value in resolved.items():
            if not isinstance(value, bool):
                raise TypeError(f"mask[{name!r}] must be a Python bool, got {type(value).__name__}")
        return resolved

    def init(params: Params) -> MaskedState:
        chosen = resolve(params)
        return MaskedState(transform.init({k: p for k, p in params.items() if chosen[k]}))

    def update(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[dict[str, Tensor], MaskedState]:
        chosen = resolve(updates)
        inner_updates = {k: u for k, u in updates.items() if chosen[k]}
        inner_params = None if params is None else {k: params[k] for k in inner_updates}
        new_inner, inner_state = transform.update(inner_updates, state.inner_state, inner_params)
        return {k: new_inner[k] if chosen[k] else u for k, u in updates.items()}, MaskedState(inner_state)

    if transform.fused is None:
        return GradientTransformation(init, update, learning_rate=transform.learning_rate)
    inner_fused = transform.fused

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> MaskedState:
        chosen = resolve(grads)
        inner_grads = {k: g for k, g in grads.items() if chosen[k]}
        inner_params = {k: params[k] for k in inner_grads}
        if inner_grads:
            inner_state = inner_fused(inner_params, inner_grads, state.inner_state, scale)
        else:
            # Nothing for the in-place step to write: the state moves on as ``update`` moves it.
            inner_state = transform.update({}, state.inner_state, {})[1]
        passed = [k for k in grads if not chosen[k]]
        if passed:
            with torch.no_grad():
                torch._foreach_add_([params[k] for k in passed], [grads[k] for k in passed], alpha=scale)
        return MaskedState(inner_state)

    return GradientTransformation(init, update, fused, transform.learning_rate)


def _per_parameter(node: Any, names: frozenset[str]) -> bool:
    return isinstance(node, Mapping) and len(node) > 0 and frozenset(node) == names


def restrict_state(state: OptState, names: Sequence[str], keep: Sequence[str]) -> OptState:
    """Returns ``state`` with every per-parameter mapping (keyed by exactly ``names``) cut down to ``keep``.

    Counts and other leaves are kept as they are, so a transform can update a subset of the parameters (the
    trainable ones under layer freezing); :func:`merge_state` puts the result back.
    """
    everything, kept = frozenset(names), tuple(keep)

    def cut(node: Any) -> Any:
        if _per_parameter(node, everything):
            return {name: node[name] for name in kept}
        if isinstance(node, Mapping):
            return {key: cut(value) for key, value in node.items()}
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return type(node)(*(cut(value) for value in node))
        if isinstance(node, tuple | list):
            return type(node)(cut(value) for value in node)
        return node

    return cut(state)


def merge_state(full: OptState, part: OptState, names: Sequence[str]) -> OptState:
    """Returns ``full`` with the entries ``part`` holds (a :func:`restrict_state` of it, updated) taken from ``part``."""
    everything = frozenset(names)

    def merge(whole: Any, piece: Any) -> Any:
        if _per_parameter(whole, everything):
            return {name: piece.get(name, value) for name, value in whole.items()}
        if isinstance(whole, Mapping):
            return {key: merge(value, piece[key]) for key, value in whole.items()}
        if isinstance(whole, tuple) and hasattr(whole, "_fields"):
            return type(whole)(*(merge(a, b) for a, b in zip(whole, piece, strict=True)))
        if isinstance(whole, tuple | list):
            return type(whole)(merge(a, b) for a, b in zip(whole, piece, strict=True))
        return piece

    return merge(full, part)


def aligned(
    params: Params, updates: Updates, argument: str = "updates"
) -> tuple[list[str], list[Tensor], list[Tensor]]:
    """Returns the parameter names and the parameters and ``updates`` as lists, in ``params``' key order.

    Raises ``ValueError``, naming ``argument``, unless ``updates`` has exactly the keys of ``params``.
    """
    check_same_keys(argument, updates, params)
    names = list(params.keys())
    return names, [params[k] for k in names], [updates[k] for k in names]


def in_layout_of(tensors: Mapping[str, Tensor], like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Returns ``tensors`` with each laid out in memory as ``like``'s tensor of the same name (its strides).

    The backward may hand a gradient back in another layout than its parameter's (channels-last strides for
    a contiguous weight after a permute, as in ConvNeXt's ``LayerNorm2d``); kernels that pair elements by
    memory order (torch's fused optimizer steps) need both in one. A tensor already in its layout is returned
    as it is; another is copied into a new tensor of that layout, with the same values. When every tensor is
    in its layout, a ``dict`` given is returned itself (unchanged).
    """
    laid_out: dict[str, Tensor] | None = None
    for name, tensor in tensors.items():
        template = like[name]
        if tensor.stride() != template.stride():
            laid_out = laid_out if laid_out is not None else dict(tensors)
            laid_out[name] = torch.empty_like(template, dtype=tensor.dtype).copy_(tensor)
    if laid_out is not None:
        return laid_out
    return tensors if isinstance(tensors, dict) else dict(tensors)


def apply_updates(params: Params, updates: Updates) -> dict[str, Tensor]:
    """Returns the new parameters ``p ← p + u``, as new tensors in ``params``' key order, dtypes and strides.

    Inputs are left untouched and the result carries no autograd history. Use :func:`apply_updates_` to
    write into ``params`` instead.
    """
    names, param_list, update_list = aligned(params, updates)
    if not names:
        return {}
    with torch.no_grad():
        try:
            new = torch._foreach_add(param_list, update_list)
        except (RuntimeError, TypeError) as error:
            raise _misfit(names, param_list, update_list) or error from error
        # An update may be wider than its parameter (fp32 updates for bf16 weights): the parameter keeps its dtype.
        return {name: _like_parameter(n, p) for name, n, p in zip(names, new, param_list, strict=True)}


def _like_parameter(new: Tensor, parameter: Tensor) -> Tensor:
    # ``new`` in the parameter's dtype and strides. A sum takes its operands' strides where they say one order;
    # where a dimension of size 1 lets other strides address the same elements (a channels-last weight of one
    # input channel, or of a 1×1 kernel), it takes contiguous strides in eager runs and not in traced ones, and
    # the strides decide which kernels a convolution runs. Those parameters get a copy in their own strides.
    if 1 in parameter.shape and parameter.stride() != contiguous_strides(parameter.shape):
        return torch.empty_like(parameter).copy_(new)
    return new if new.dtype == parameter.dtype else new.to(parameter.dtype)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Returns the strides torch gives a new contiguous tensor of ``shape`` (a size of 0 counts as 1)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def apply_updates_(params: Params, updates: Updates) -> None:
    """Returns ``None`` after adding ``updates`` into ``params`` in place: ``p ← p + u``.

    For callers that own (donate) their parameters, such as a trainer keeping ``nn.Parameter`` storage. The
    updates must have the parameters' dtypes or be castable to them in place.
    """
    names, param_list, update_list = aligned(params, updates)
    if not names:
        return
    with torch.no_grad():
        try:
            torch._foreach_add_(param_list, update_list)
        except (RuntimeError, TypeError) as error:
            raise _misfit(names, param_list, update_list) or error from error


def _misfit(names: list[str], params: list[Tensor], updates: list[Any]) -> ValueError | None:
    """Returns the error naming the first update that does not fit its parameter, or None if every one fits."""
    for name, param, update in zip(names, params, updates, strict=True):
        if not isinstance(update, Tensor):
            return ValueError(f"updates[{name!r}] of type {type(update).__name__}: expected a tensor")
        if update.shape != param.shape:
            return ValueError(
                f"updates[{name!r}] of shape {tuple(update.shape)} does not fit params[{name!r}] of shape "
                f"{tuple(param.shape)}"
            )
    return None


def scalar_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    """Returns the dtype for 0-d coefficient tensors: ``float32`` at least, wider if any tensor is wider.

    Coefficients such as ``1 - β^t`` are computed once per step; keeping them in ``float32`` for ``bfloat16``
    parameters matches torch's own "opmath" precision, and ``float64`` parameters keep full precision.
    """
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def stacked(scalars: Sequence[Tensor]) -> Tensor:
    """Returns 0-d tensors (per-parameter step counts) as one vector on the first one's device, so that a
    coefficient per parameter is one expression, and reading them all is one host read."""
    device = scalars[0].device
    return torch.stack([scalar.to(device) for scalar in scalars])


def params_device(params: Params) -> torch.device:
    """Returns the device of the first parameter, or the CPU when there are none."""
    for tensor in params.values():
        return tensor.device
    return torch.device("cpu")
