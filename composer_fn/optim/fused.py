"""In-place optimizer steps for callers that own (donate) their parameters and optimizer state.

``GradientTransformation.fused(params, grads, state, scale) -> state`` performs a whole optimizer step in
place: it writes the new parameters into ``params``' tensors and the new moments into ``state``'s, and returns
the new state record (new counts; the same moment tensors). ``scale`` multiplies the learning rate, and with
it every term the learning rate multiplies (the schedule's multiplier). The arithmetic is torch's: the fused
kernels ``torch._fused_sgd_``/``_fused_adam_``/``_fused_adamw_`` where the tensors' device has them and each
parameter's gradient and state share its memory layout (the kernels pair elements in memory order), else
torch's foreach sequence. It runs eagerly only (it reads the step count on the host); compiled steps use the
functional ``update``, which inductor fuses anyway.

``fused_step`` is the pure form: it copies the parameters and the state first, so no input changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.optim.base import (
    FusedFn,
    GradientTransformation,
    OptState,
    Params,
    Updates,
    aligned,
    stacked,
)

__all__ = ["WeightDecay", "sgd_in_place", "adam_in_place", "scheduled_fused", "fused_step", "fusable"]

WeightDecay = Literal["coupled", "lr", "decoupled"]
"""Where the weight decay ``λ · p`` enters: added to the gradient (``"coupled"``, L2), to the direction before
the learning rate (``"lr"``, AdamW), or subtracted after the learning rate (``"decoupled"``, Composer's)."""

_FUSED_DEVICES = ("cpu", "cuda")
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fusable(params: Params) -> bool:
    """Returns whether an in-place step can run on ``params`` now: eager, outside any function transform."""
    return not torch.compiler.is_compiling() and not any(
        torch._C._functorch.is_functorch_wrapped_tensor(p) for p in params.values()
    )


def fused_step(
    tx: GradientTransformation, params: Params, grads: Updates, state: OptState, scale: float = 1.0
) -> tuple[dict[str, Tensor], OptState]:
    """Returns ``(new_params, new_state)`` from ``tx.fused`` run on copies: ``params`` and ``state`` are untouched."""
    if tx.fused is None:
        raise ValueError("tx.fused is None: this transformation has no in-place step; use tx.update and apply_updates")
    new_params = {name: p.clone() for name, p in params.items()}
    new_state = pytree.tree_map(lambda leaf: leaf.clone() if isinstance(leaf, Tensor) else leaf, state)
    return new_params, tx.fused(new_params, grads, new_state, scale)


_Group = tuple[list[Tensor], ...]
"""Parallel lists of tensors of one device and dtype: the parameters, their gradients, then their state."""


def _groups(*lists: list[Tensor]) -> list[tuple[bool, _Group]]:
    # Fused kernels take tensors of one device and dtype; group as torch.optim does (one group, almost always).
    first = lists[0][0] if lists[0] else None
    if first is None or all(t.device == first.device and t.dtype == first.dtype for t in lists[0]):
        groups: dict[tuple[torch.device, torch.dtype], _Group] = {}
        if first is not None:
            groups[(first.device, first.dtype)] = tuple(list(values) for values in lists)
    else:
        groups = {}
        for index, tensor in enumerate(lists[0]):
            slots = groups.setdefault((tensor.device, tensor.dtype), tuple([] for _ in lists))
            for slot, values in zip(slots, lists, strict=True):
                if values:
                    slot.append(values[index])
    return [
        (device.type in _FUSED_DEVICES and dtype in _FUSED_DTYPES and _one_layout(slots), slots)
        for (device, dtype), slots in groups.items()
    ]


def _one_layout(group: _Group) -> bool:
    # The fused kernels pair the i-th elements of a parameter, its gradient and its state in memory order, so
    # they are exact only where all of them share the parameter's strides; torch's foreach arithmetic pairs
    # elements by index, in any layout. Per-parameter counts (0-d) have no layout.
    params, *others = group
    strides = [param.stride() for param in params]
    return all(
        [tensor.stride() for tensor in tensors] == strides
        for tensors in others
        if tensors and any(tensor.dim() for tensor in tensors)
    )


def _decay_in_place(params: list[Tensor], amount: float) -> None:
    """Multiplies ``params`` by ``1 − amount``: the decoupled weight decay of Composer's optimizers."""
    if amount != 0.0 and params:
        torch._foreach_mul_(params, 1.0 - amount)


def sgd_in_place(
    learning_rate: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    *,
    decoupled: bool,
) -> FusedFn:
    """Returns the in-place step of SGD (``decoupled=False``: ``torch.optim.SGD``) or of decoupled SGDW.

    Decoupled SGDW first multiplies the weights by ``1 − scale · λ`` (Composer's ``DecoupledSGDW``). The
    state's entry ``"momentum"`` holds the momentum buffers.
    """

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> OptState:
        names, param_list, grad_list = aligned(params, grads, "grads")
        rate = learning_rate * scale
        coupled = 0.0 if decoupled else weight_decay
        if decoupled:
            _decay_in_place(param_list, scale * weight_decay)
        if momentum == 0.0:
            for native, group in _groups(param_list, grad_list, []):
                _sgd_group(group, native, rate, momentum, dampening, nesterov, coupled, False)
            return state
        trace: Any = state["momentum"]
        counts = [trace.count[n] for n in names]
        # A parameter's first step copies its gradient into its buffer (torch's ``is_first_step``). Without
        # dampening the buffers' zero start makes it m·0 + g, g exactly: every parameter goes to the kernel at
        # once, and the counts are not read on the host (no wait for the device). With dampening, parameters at
        # their first step and the others go apart, from one host read of every count.
        firsts: list[bool] = [False] * len(names) if dampening == 0.0 else stacked(counts).eq(0).tolist()
        for first in sorted(set(firsts)):
            chosen = [index for index, value in enumerate(firsts) if value == first]
            lists = [param_list, grad_list, [trace.momentum_buffer[n] for n in names]]
            part = lists if len(chosen) == len(names) else [[values[i] for i in chosen] for values in lists]
            for native, group in _groups(*part):
                _sgd_group(group, native, rate, momentum, dampening, nesterov, coupled, first)
        new_counts = dict(zip(names, torch._foreach_add(counts, 1), strict=True))
        return {**state, "momentum": type(trace)(count={**trace.count, **new_counts}, momentum_buffer=trace.momentum_buffer)}

    return fused


def _sgd_group(
    group: _Group,
    native: bool,
    rate: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    first: bool,
) -> None:
    params, grads, buffers = group
    if native:
        torch._fused_sgd_(
            params, grads, buffers,
            weight_decay=weight_decay, momentum=momentum, lr=rate, dampening=dampening,
            nesterov=nesterov, maximize=False, is_first_step=first,
        )  # fmt: skip
        return
    if weight_decay != 0.0:
        grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
    if buffers:
        if first:
            torch._foreach_copy_(buffers, grads)
        else:
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_add_(buffers, grads, alpha=1.0 - dampening)
        grads = list(torch._foreach_add(grads, buffers, alpha=momentum)) if nesterov else buffers
    torch._foreach_add_(params, grads, alpha=-rate)


def adam_in_place(
    learning_rate: float,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    *,
    decay: WeightDecay,
) -> FusedFn:
    """Returns the in-place step of Adam with ``decay`` ``'coupled'`` (Adam), ``'lr'`` (AdamW) or ``'decoupled'``.

    ``'decoupled'`` multiplies the weights by ``1 − scale · λ`` (Composer's ``DecoupledAdamW``); ``'lr'`` by
    ``1 − scale · η · λ`` (``torch.optim.AdamW``). The state's entry ``"adam"`` holds the moments.
    """

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> OptState:
        names, param_list, grad_list = aligned(params, grads, "grads")
        rate = learning_rate * scale
        moments: Any = state["adam"]
        mu = [moments.mu[n] for n in names]
        nu = [moments.nu[n] for n in names]
        # Each parameter's own step, as torch.optim's: the kernels read them from the tensors.
        steps = list(torch._foreach_add([moments.count[n] for n in names], 1.0))
        if decay == "decoupled":
            _decay_in_place(param_list, scale * weight_decay)
        for native, group in _groups(param_list, grad_list, mu, nu, steps):
            _adam_group(group, native, rate, b1, b2, eps, weight_decay, decay)
        counts = {**moments.count, **dict(zip(names, steps, strict=True))}
        return {**state, "adam": type(moments)(count=counts, mu=moments.mu, nu=moments.nu)}

    return fused


def _adam_group(
    group: _Group,
    native: bool,
    rate: float,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    decay: WeightDecay,
) -> None:
    params, grads, mu, nu, steps = group
    if native:
        kernel = torch._fused_adamw_ if decay == "lr" else torch._fused_adam_
        kernel(
            params, grads, mu, nu, [], steps,
            lr=rate, beta1=b1, beta2=b2, weight_decay=0.0 if decay == "decoupled" else weight_decay,
            eps=eps, amsgrad=False, maximize=False,
        )  # fmt: skip
        return
    if decay == "lr" and weight_decay != 0.0:
        torch._foreach_mul_(params, 1.0 - rate * weight_decay)
    if decay == "coupled" and weight_decay != 0.0:
        grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
    torch._foreach_lerp_(mu, grads, 1.0 - b1)
    torch._foreach_mul_(nu, b2)
    torch._foreach_addcmul_(nu, grads, grads, 1.0 - b2)
    # One host read gives every parameter's step (torch's foreach Adam reads them one by one).
    values: list[float] = stacked(steps).tolist()
    bias_correction1 = [1.0 - b1**step for step in values]
    bias_correction2_sqrt = [(1.0 - b2**step) ** 0.5 for step in values]
    denominators = torch._foreach_sqrt(nu)
    torch._foreach_div_(denominators, bias_correction2_sqrt)
    torch._foreach_add_(denominators, eps)
    torch._foreach_addcdiv_(params, mu, denominators, [-rate / correction for correction in bias_correction1])


def scheduled_fused(optimizer: FusedFn, schedule: Callable[..., Any]) -> FusedFn:
    """Returns the in-place step of ``chain(optimizer, scale_by_schedule(schedule))``: the rate times ``s(count)``."""

    def fused(params: Params, grads: Updates, state: OptState, scale: float) -> OptState:
        inner, scheduled = state
        multiplier = float(schedule(int(scheduled.count)))
        return (
            optimizer(params, grads, inner, scale * multiplier),
            type(scheduled)(count=scheduled.count + 1),
        )

    return fused
