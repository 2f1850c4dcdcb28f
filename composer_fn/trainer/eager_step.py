"""The eager-only step machinery: ``ModuleSlots`` and the training step of a plan without traced hooks.

``ModuleSlots`` is the eager path's replacement for ``torch.func.functional_call``. ``make_plain_step`` builds
the training step that ``make_train_step`` (``composer_fn.trainer.step``) returns for ``grad_mode="autograd"``
and a plan with no traced hook: the reference step without its event folds, which would all be empty, and
the records passed between them. It is given the reference step's forward, precision and update, so both
steps compute the same state bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.state import LossFn, State
from composer_fn.nn import forward_keys
from composer_fn.optim.base import OptState, in_layout_of
from composer_fn.trainer.loss_scale import DynamicLossScale

__all__ = ["ModuleSlots", "make_plain_step", "KeyedForward", "Update"]

KeyedForward = Callable[
    [Mapping[str, Tensor], Mapping[str, Tensor], Any, Mapping[str, Tensor] | None], tuple[Any, dict[str, Tensor]]
]
"""``forward(params, buffers, input, keys) -> (outputs, new buffers)``; ``keys`` fill the random layers' buffers."""

Update = Callable[..., tuple[dict[str, Tensor], OptState]]
"""``update(grads, opt, params, finite=None) -> (new params, new opt)``: the optimizer step, skipped where the
0-d bool ``finite`` is False."""


class ModuleSlots:
    """Where each parameter and buffer of a module lives, found once, to call the module on given tensors.

    ``torch.func.functional_call`` walks the module tree and checks tied names on every call, which costs tens
    of microseconds per step on a small model. The eager step instead writes the given tensors into the
    owning modules' tables, calls the module and puts the originals back. Tied tensors (one tensor under
    several names) are filled from their first name, as ``named_parameters()`` lists it.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        slots: dict[str, list[tuple[dict[str, Any], str]]] = {}
        first_name: dict[int, str] = {}
        for kind, members in (("_parameters", module.named_parameters), ("_buffers", module.named_buffers)):
            for name, tensor in members(remove_duplicate=False):
                owner_path, _, attribute = name.rpartition(".")
                owner = module.get_submodule(owner_path)
                canonical = first_name.setdefault(id(tensor), name)
                slots.setdefault(canonical, []).append((getattr(owner, kind), attribute))
        self.slots = {name: tuple(tables) for name, tables in slots.items()}

    def __call__(self, tensors: Mapping[str, Tensor], input: Any, keywords: bool = False) -> Any:
        """Returns ``module(input)`` computed with ``tensors`` in place of the module's own (``module(**input)``
        with ``keywords``)."""
        saved = []
        try:
            for name, tensor in tensors.items():
                for table, attribute in self.slots[name]:
                    saved.append((table, attribute, table[attribute]))
                    table[attribute] = tensor
            return self.module(**input) if keywords else self.module(input)
        finally:
            for table, attribute, original in reversed(saved):
                table[attribute] = original


def make_plain_step(
    forward: KeyedForward,
    loss_fn: LossFn,
    update: Update,
    *,
    precision: Callable[[], contextlib.AbstractContextManager[Any]],
    model_input: Callable[[Any], Any],
    frozen: frozenset[str],
    key_names: tuple[str, ...],
    scaler: DynamicLossScale | None = None,
) -> Callable[[State, Any], tuple[State, dict[str, Tensor]]]:
    """Returns the eager training step ``(state, batch) -> (state, {"loss": loss})`` of a plan without hooks.

    The step runs ``forward`` on ``model_input(batch)``, ``loss_fn`` under ``precision()``, the gradient
    of the parameters not in ``frozen`` by ``torch.autograd.grad``, and ``update``. The random layers named in
    ``key_names`` draw from ``fold_in(state.key, state.step)``, as in the reference step. With ``scaler`` (fp16),
    it differentiates the scaled loss, unscales the gradients, skips the update when one is not finite and
    updates the scale in ``state.hparams``. Gradients reach ``update`` in their parameters' memory layout.
    """

    def plain_step(state: State, batch: Any) -> tuple[State, dict[str, Tensor]]:
        leaves = {name: p.detach() if name in frozen else p.detach().requires_grad_() for name, p in state.params.items()}
        keys = forward_keys(key_names, R.fold_in(state.key, state.step)) if key_names else None
        outputs, buffers = forward(leaves, state.buffers, model_input(batch), keys)
        with precision():
            loss = loss_fn(outputs, batch)
        trainable = [name for name in leaves if name not in frozen]
        objective = loss if scaler is None else scaler.scale(loss, state.hparams)
        # A parameter the loss does not reach this step (an unused layer, a skipped block) gets no gradient and
        # no update, as in torch.optim.
        differentiated = torch.autograd.grad(objective, [leaves[n] for n in trainable], allow_unused=True)
        given = {name: g for name, g in zip(trainable, differentiated, strict=True) if g is not None}
        grads = in_layout_of(given, state.params)
        if scaler is None:
            params, opt = update(grads, state.opt, state.params)
            return state.replace(params=params, buffers=buffers, opt=opt, step=state.step + 1), {"loss": loss.detach()}
        grads = scaler.unscale(grads, state.hparams)
        finite = scaler.finite(grads)
        params, opt = update(grads, state.opt, state.params, finite)
        hparams = scaler.update(state.hparams, finite)
        state = state.replace(params=params, buffers=buffers, opt=opt, hparams=hparams, step=state.step + 1)
        return state, {"loss": loss.detach()}

    return plain_step
