"""The training and evaluation steps: pure functions ``(State, batch) -> (State, metrics)`` built from a plan.

The gradient is functional (parameters in, gradients out) over ``torch.func.functional_call``. Two
mechanisms compute it, chosen by ``grad_mode``:

- ``"autograd"``: ``torch.autograd.grad`` over ``functional_call``; the cheapest eager path (within a few
  percent of a hand-written loop).
- ``"func"``: ``torch.func.grad_and_value``; traceable as one graph by ``torch.compile(fullgraph=True)``.

This module holds the reference step, which runs every traced event. For ``"autograd"`` and a plan without
traced hooks, ``make_train_step`` returns the plain step of ``composer_fn.trainer.eager_step`` instead, which
skips the empty events and computes the same state.

Module buffers (BatchNorm statistics) are cloned into the forward and come back as ``State.buffers``; the
input state is never written to.

From AFTER_BACKWARD on, hooks find the loss closure in ``ctx.gradient_fn``: ``gradient_fn(params) -> (loss,
grads)`` reruns BEFORE_FORWARD through BEFORE_BACKWARD (pure and keyed, so they transform the batch and the loss
exactly as in the first pass), the forward and the loss at ``params``, by the step's own gradient mechanism and
precision. Its state and outputs are dropped: the BatchNorm statistics it computes are discarded, so they
advance once per step, by the first pass, however many times the closure is called.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import Tensor
from torch.func import functional_call, grad_and_value

from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.engine import Plan, run_event
from composer_fn.core.event import Event
from composer_fn.core.host import on_fake_tensors
from composer_fn.core.state import ForwardFn, GradientFn, LossFn, State, Static, StepCtx, batch_get
from composer_fn.nn import forward_key_names, forward_keys
from composer_fn.optim.base import (
    GradientTransformation,
    OptState,
    apply_updates,
    in_layout_of,
    merge_state,
    restrict_state,
)
from composer_fn.optim.fused import fusable, fused_step
from composer_fn.trainer.eager_step import ModuleSlots, make_plain_step
from composer_fn.trainer.loss_scale import DynamicLossScale
from composer_fn.trainer.microbatch import Reduce, Summing, microbatched_step, norm_statistics
from composer_fn.trainer.outputs import keyword_names, model_inputs, settle_loss_function
from composer_fn.trainer.precision import Precision

__all__ = [
    "check_class_targets",
    "class_last",
    "compile_step",
    "make_train_step",
    "make_eval_step",
    "optimize",
    "unused_parameters",
    "cross_entropy_loss",
    "cross_entropy_per_sample_loss",
    "per_sample_loss",
    "precision_context",
    "StepFn",
    "GradMode",
    "Sharded",
]

StepFn = Callable[[State, Any], tuple[State, dict[str, Tensor]]]
GradMode = Literal["autograd", "func"]
GRAD_MODES: tuple[str, ...] = ("autograd", "func")


class Sharded(Protocol):
    """A module sharded over the processes (``composer_fn.trainer.sharding.ShardedModule``): its step runs the module
    itself, whose parameters are the state's (this process's shards), and torch's backward, which sums each
    gradient over the processes into this process's shard."""

    def holding(self, params: Mapping[str, Tensor]) -> contextlib.AbstractContextManager[None]:
        """Runs a block with the module's parameters holding ``params``."""
        ...

    def bind(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns the module's own parameters after writing ``params``' values into them."""
        ...

    def backward(self, objective: Tensor) -> dict[str, Tensor]:
        """Returns this process's shards of the gradients of ``objective``, summed over the processes."""
        ...

    def global_view(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns shards by parameter name as DTensors of the whole parameters."""
        ...

    def local_view(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns DTensors by parameter name as this process's shards."""
        ...

    def everywhere(self, flag: Tensor) -> Tensor:
        """Returns whether ``flag`` holds on every process."""
        ...


def class_last(outputs: Tensor, target: Tensor) -> bool:
    """Returns whether ``outputs`` hold their classes in the last dim, against class-index ``target``.

    Sequence models give ``[B, S, V]`` logits against ``[B, S]`` targets; image models give ``[B, C, ...]``.
    """
    return outputs.dim() > 2 and outputs.dim() == target.dim() + 1 and outputs.shape[:-1] == target.shape


def _classes_second(outputs: Tensor, target: Tensor) -> Tensor:
    return outputs.movedim(-1, 1) if class_last(outputs, target) else outputs


def cross_entropy_loss(target_key: int | str = 1) -> LossFn:
    """Returns ``loss_fn(outputs, batch)``: cross-entropy against ``batch[target_key]`` (indices or probabilities).

    Class-last outputs (``[B, S, V]`` against ``[B, S]`` indices) are read as such, as evaluation reads them.
    """
    validate.batch_key("target_key", target_key)

    def loss_fn(outputs: Tensor, batch: Any) -> Tensor:
        target = batch_get(batch, target_key)
        return F.cross_entropy(_classes_second(outputs, target), target)

    return loss_fn


def check_class_targets(
    outputs: Tensor, target: Tensor, target_key: int | str, where: str = "the first batch"
) -> None:
    """Raises ``ValueError`` when integer ``target`` holds a class that ``outputs`` (of one or more samples) lack.

    Classes are ``[0, C)`` with ``C`` the outputs' class dim (the last for class-last sequence outputs, else
    dim 1); -100 marks positions without a label, as in cross-entropy. Probability targets pass. ``where`` names
    the batch in the error (``"eval_dataloader's first batch"``).
    """
    if target.is_floating_point() or target.numel() == 0 or outputs.dim() < 2:
        return
    classes = outputs.shape[-1] if class_last(outputs, target[: outputs.shape[0]]) else outputs.shape[1]
    labelled = target[target != -100]
    if labelled.numel() == 0:
        return
    low, high = int(labelled.min()), int(labelled.max())
    if low < 0 or high >= classes:
        raise ValueError(
            f"{where}'s targets (batch[{target_key!r}]) hold class {high if high >= classes else low}, but "
            f"the model's outputs have {classes} classes: class-index targets must lie in [0, {classes}) (-100 "
            "marks a position without a label)"
        )


def cross_entropy_per_sample_loss(target_key: int | str = 1) -> LossFn:
    """Returns ``loss_fn(outputs, batch) -> [B]``: one cross-entropy per sample (averaged over any extra dims)."""
    validate.batch_key("target_key", target_key)

    def loss_fn(outputs: Tensor, batch: Any) -> Tensor:
        target = batch_get(batch, target_key)
        losses = F.cross_entropy(_classes_second(outputs, target), target, reduction="none")
        return losses.flatten(1).mean(1) if losses.dim() > 1 else losses

    return loss_fn


def per_sample_loss(loss_fn: LossFn) -> LossFn:
    """Returns ``fn(outputs, batch) -> [B]``: ``loss_fn`` applied to each sample alone, vectorized by ``vmap``.

    Works for any loss that averages over the batch; tensors of the batch are split along dim 0, other items
    are passed whole.
    """

    def one(outputs: Tensor, batch: Any) -> Tensor:
        return loss_fn(outputs.unsqueeze(0), pytree.tree_map(_unsqueeze, batch))

    def losses(outputs: Tensor, batch: Any) -> Tensor:
        in_dims = (0, pytree.tree_map(lambda t: 0 if isinstance(t, Tensor) else None, batch))
        result: Tensor = torch.func.vmap(one, in_dims=in_dims)(outputs, batch)
        return result

    return losses


def _unsqueeze(item: Any) -> Any:
    return item.unsqueeze(0) if isinstance(item, Tensor) else item


def precision_context(static: Static) -> contextlib.AbstractContextManager[Any]:
    """Returns the autocast context for the static spec's precision on its device (a null context for fp32)."""
    return Precision.of(static.precision, static.device).autocast()


def _forward(
    static: Static,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    slots: ModuleSlots | None,
    keywords: bool,
    sharded: bool,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    input: Tensor,
    keys: Mapping[str, Tensor] | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    # The forward writes BatchNorm statistics into the buffers it is given: hand it copies and return them.
    # Random layers read this forward's keys; the returned buffers keep the stored ones. With ``keywords``, a
    # mapping input holds the model's keyword arguments. A sharded module computes with its own parameters (the
    # caller makes them ``params``).
    keywords = keywords and isinstance(input, Mapping)
    new_buffers = {name: b.clone() for name, b in buffers.items()}
    given = {**new_buffers, **keys} if keys else new_buffers
    with autocast():
        if slots is None:
            args, kwargs = ((), dict(input)) if keywords else ((input,), None)
            outputs = functional_call(static.module, (dict(params), given), args, kwargs)
        else:
            outputs = slots(given if sharded else {**params, **given}, input, keywords)
    return outputs, new_buffers


def make_train_step(
    static: Static,
    plan: Plan,
    loss_fn: LossFn,
    tx: GradientTransformation,
    *,
    input_key: int | str | None = 0,
    grad_mode: GradMode = "autograd",
    per_sample_loss_fn: LossFn | None = None,
    donate: bool = False,
    frozen: frozenset[str] = frozenset(),
    loss_scale: DynamicLossScale | None = None,
    microbatch_size: int | None = None,
    first_sample: int = 0,
    reduce: Reduce | None = None,
    overlap: Callable[[Sequence[Tensor]], Summing] | None = None,
    guard_failures: bool = False,
    norms: bool = False,
    loss_units: Callable[[Any], Tensor] | None = None,
    units_scale: float = 1.0,
    reseed: Callable[[int], None] | None = None,
    sharded: Sharded | None = None,
) -> StepFn:
    """Returns the training step: the plan's traced events around a functional gradient and ``tx``'s update.

    The step returns the new state and ``{"loss": loss}`` (detached); with ``norms``, also the L2 norms of each
    parameter's gradient and update and over all of them (``l2_norm/grad/<name>``, ``l2_norm/update/global``). It runs, in order: AFTER_DATALOADER,
    BEFORE_TRAIN_BATCH, BEFORE_FORWARD, the forward, AFTER_FORWARD, BEFORE_LOSS, the loss, AFTER_LOSS,
    BEFORE_BACKWARD, the gradient, AFTER_BACKWARD, AFTER_TRAIN_BATCH, the update, AFTER_OPTIMIZER_STEP.
    Hooks find the model as a pure function in ``ctx.forward``, per-sample losses in
    ``ctx.per_sample_loss_fn`` (``per_sample_loss_fn``, or ``loss_fn`` vectorized per sample when not given) and,
    from AFTER_BACKWARD on, the loss closure in ``ctx.gradient_fn`` (see the module docstring).

    The model is called with ``batch[input_key]``; with ``input_key=None``, a mapping batch's items that its
    ``forward`` names, as keyword arguments (``composer_fn.trainer.outputs.model_inputs``), and a tuple batch's
    item 0. ``ctx.forward`` takes a mapping input as keyword arguments too in that case.

    Run eagerly, the update is ``tx.fused`` where the optimizer has one (torch's in-place arithmetic) on
    copies of the parameters and optimizer state; with ``donate=True`` on the state's own tensors, which the
    caller gives up (the trainer, which owns its state, does). Compiled, it is ``tx.update``.

    Parameters named in ``frozen`` (layer freezing) get no gradient computed and no update; their optimizer
    state is kept as it is. So do parameters that the step's loss does not reach, as ``torch.optim`` skips a
    parameter whose ``.grad`` is None: with ``grad_mode="autograd"`` they are found on each step (over every
    microbatch and process: a parameter that gets a gradient anywhere is updated); ``"func"`` cannot tell them
    from parameters with zero gradients, so the caller names them in ``frozen`` (``unused_parameters``).
    Hooks see gradients of the parameters that have one only.

    With precision ``'fp16-mixed'`` (or a given ``loss_scale``), the gradient is that of the scaled loss,
    unscaled before AFTER_BACKWARD (hooks and ``gradient_fn`` see true gradients); the update is skipped when a
    gradient reaching it is not finite (eagerly by a host check, as ``GradScaler.step``; compiled by a select),
    and the scale in ``state.hparams`` follows ``loss_scale.update``.

    With ``microbatch_size`` or ``reduce`` (several processes), the step is microbatched: the batch is cut into
    microbatches of ``microbatch_size`` samples (the last may be smaller; None: one), and each runs
    AFTER_DATALOADER through BEFORE_BACKWARD and its gradient, drawing from ``fold_in(step key, offset)`` where
    ``offset`` (``ctx.offset``) is its first sample's place in the global batch, counted from ``first_sample``
    (this process's first). Each microbatch's loss is weighted by its sample count over ``microbatch_size``, its
    gradient summed; ``reduce`` sums those across
    processes; the sum divided by the global sample count is the step's gradient (and loss), which the events
    from AFTER_BACKWARD on see once. With ``loss_units`` (a loss that averages over the positions
    ``loss_units(batch)`` counts, such as a language model's labelled tokens), each microbatch is weighted by
    its count over ``microbatch_size * units_scale`` instead, and the sums are divided by the global count: the
    step's loss and gradient are those of the whole global batch's mean over its positions, whatever the number
    of microbatches and processes. ``gradient_fn`` does the same over every microbatch. With ``overlap``
    (``distributed.Summation``: the same sum as ``reduce``, fed tensor by tensor), an eager step with autograd
    and no loss scaling feeds its last microbatch's gradients to the sum from the backward, so the
    communication overlaps it. The metrics then also
    hold ``samples``, the global sample count. With ``guard_failures``, a process may join the sum with a failure
    mark instead (``failed_contribution``, a process out of memory): the count is then infinite and the update
    skipped. ``reseed(offset)`` (microbatched eager steps) is called before each microbatch with its first
    sample's place in the global batch, where the trainer seeds the model's own random layers
    (``composer_fn.trainer.randomness``).

    With ``sharded`` (a module sharded over the processes, with ``reduce``), the state's parameters are this
    process's shards of the module's own: each microbatch runs the module itself and torch's backward, which sums
    its gradient over the processes into this process's shard (``Sharded.backward``); ``reduce`` sums the rest
    (counts, loss, statistics). Hooks from AFTER_BACKWARD to AFTER_TRAIN_BATCH see the parameters and gradients
    as DTensors, so that a norm over every element is the whole tensors' (``gradient_fn`` takes and gives them so
    too); a step with a non-finite gradient on any process is skipped on all. A state whose parameters are not
    the module's (swapped for an evaluation) has their values written into the module's first.
    """
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"grad_mode={grad_mode!r} must be one of {', '.join(GRAD_MODES)}")
    if sharded is None:  # a sharded module's was settled before it was sharded
        static = static.replace(module=settle_loss_function(static.module))
    # The precision is settled here, once: the traced code only enters its autocast.
    precision = Precision.of(static.precision, static.device)
    scaler = loss_scale if loss_scale is not None else precision.loss_scale()
    slots = ModuleSlots(static.module) if grad_mode == "autograd" else None
    key_names = forward_key_names(static.module)
    forward_with = functools.partial(_forward, static, precision.autocast, slots, input_key is None, sharded is not None)
    accepted = keyword_names(static.module) if input_key is None else None
    model_input = functools.partial(model_inputs, input_key=input_key, accepted=accepted)
    update = functools.partial(optimize, tx, donate=donate)
    microbatched = microbatch_size is not None or reduce is not None or sharded is not None
    if grad_mode == "autograd" and not plan.hooks and not microbatched and not norms:
        return make_plain_step(
            forward_with,
            loss_fn,
            update,
            precision=precision.autocast,
            model_input=model_input,
            frozen=frozen,
            key_names=key_names,
            scaler=scaler,
        )

    def loss_and_aux(
        params: Mapping[str, Tensor], state: State, ctx: StepCtx
    ) -> tuple[Tensor, tuple[State, StepCtx]]:
        state, ctx = run_event(Event.BEFORE_FORWARD, plan, state, ctx)
        keys = forward_keys(key_names, ctx.key) if key_names else None
        outputs, buffers = forward_with(params, state.buffers, model_input(ctx.batch), keys)
        state, ctx = state.replace(buffers=buffers), ctx.replace(outputs=outputs)
        state, ctx = run_event(Event.AFTER_FORWARD, plan, state, ctx)
        state, ctx = run_event(Event.BEFORE_LOSS, plan, state, ctx)
        with precision.autocast():
            ctx = ctx.replace(loss=ctx.loss_fn(ctx.outputs, ctx.batch))
        state, ctx = run_event(Event.AFTER_LOSS, plan, state, ctx)
        state, ctx = run_event(Event.BEFORE_BACKWARD, plan, state, ctx)
        assert ctx.loss is not None
        return ctx.loss, (state, ctx)

    def split_loss_and_aux(
        trainable: Mapping[str, Tensor], fixed: Mapping[str, Tensor], state: State, ctx: StepCtx, weight: float | Tensor
    ) -> tuple[Tensor, tuple[State, StepCtx]]:
        loss, aux = loss_and_aux({**fixed, **trainable}, state, ctx)
        # The value differentiated is the loss weighted (a microbatch's share) and scaled (loss scaling); the
        # context keeps the true one.
        objective = loss if isinstance(weight, float | int) and weight == 1.0 else loss * weight
        return (objective if scaler is None else scaler.scale(objective, state.hparams)), aux

    differentiate = grad_and_value(split_loss_and_aux, has_aux=True)
    keyed = bool(plan.hooks) or bool(key_names)
    losses_per_sample = per_sample_loss_fn if per_sample_loss_fn is not None else per_sample_loss(loss_fn)

    def forward_at(step_key: Tensor) -> ForwardFn:
        # The model as a pure function for hooks (an extra forward): random layers draw from this step's key.
        keys = forward_keys(key_names, step_key) if key_names else None

        def forward(params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], input: Any) -> tuple[Any, dict[str, Tensor]]:
            # A mapping (a batch given as keyword arguments) keeps the items the model takes, as the step's does.
            given = model_inputs(input, None, accepted) if input_key is None and isinstance(input, Mapping) else input
            with sharded.holding(params) if sharded is not None else contextlib.nullcontext():
                return forward_with(params, buffers, given, keys)

        return forward

    def differentiated(
        params: Mapping[str, Tensor],
        state: State,
        ctx: StepCtx,
        weight: float | Tensor = 1.0,
        ready: Callable[[str, Tensor], None] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor], tuple[State, StepCtx]]:
        # Frozen parameters enter as constants: autograd computes no gradient for them (nor, when every layer
        # before a point is frozen, any backward there). ``ready(name, grad)`` (autograd, no loss scaling) is
        # called as each gradient is computed, from the backward.
        if sharded is not None:
            # The module's own parameters, holding ``params``, through the forward and the backward.
            with torch.enable_grad(), sharded.holding(params):
                objective, aux = split_loss_and_aux({}, params, state, ctx, weight)
                summed = sharded.backward(objective)
            grads = {name: g for name, g in summed.items() if name not in frozen}
            if scaler is not None:
                grads = scaler.unscale(grads, state.hparams)
            loss = aux[1].loss
            assert loss is not None
            return loss, grads, aux
        trainable = {n: p for n, p in params.items() if n not in frozen}
        fixed = {n: p.detach() for n, p in params.items() if n in frozen}
        if grad_mode == "func":
            grads, (_, aux) = differentiate(trainable, fixed, state, ctx, weight)
        else:
            leaves = {name: p.detach().requires_grad_() for name, p in trainable.items()}
            # A hook may call the closure under no_grad; its gradient must not depend on where it is called from.
            with torch.enable_grad():
                objective, aux = split_loss_and_aux(leaves, fixed, state, ctx, weight)
                hooks = [leaf.register_hook(_announcer(ready, name)) for name, leaf in leaves.items()] if ready else []
                differentiated = torch.autograd.grad(objective, tuple(leaves.values()), allow_unused=True)
                for hook in hooks:
                    hook.remove()
                # A parameter the loss does not reach gets no gradient, and no update (as in torch.optim).
                grads = {name: g for name, g in zip(leaves, differentiated, strict=True) if g is not None}
        # Hooks, sums and the update pair a gradient with its parameter: give it the parameter's layout.
        grads = in_layout_of(grads, params)
        if scaler is not None:
            grads = scaler.unscale(grads, state.hparams)
        loss = aux[1].loss
        assert loss is not None
        return loss, grads, aux

    def gradients(params: Mapping[str, Tensor], state: State, ctx: StepCtx) -> tuple[Tensor, dict[str, Tensor]]:
        loss, grads, _ = differentiated(params, state, ctx)
        return loss.detach(), grads

    def gradient_fn_at(state: State, ctx: StepCtx) -> GradientFn:
        def gradient_fn(params: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            return gradients(params, state, ctx)

        return gradient_fn

    def begin(state: State, key: Tensor, batch: Any, offset: int = 0) -> tuple[State, StepCtx]:
        # The step's (or a microbatch's) context, through AFTER_DATALOADER and BEFORE_TRAIN_BATCH.
        ctx = StepCtx(
            batch=batch,
            key=key,
            loss_fn=loss_fn,
            forward=forward_at(key),
            per_sample_loss_fn=losses_per_sample,
            offset=offset,
        )
        state, ctx = run_event(Event.AFTER_DATALOADER, plan, state, ctx)
        return run_event(Event.BEFORE_TRAIN_BATCH, plan, state, ctx)

    def finish(state: State, ctx: StepCtx, finite: Tensor | None = None) -> tuple[State, dict[str, Tensor]]:
        # AFTER_BACKWARD to AFTER_OPTIMIZER_STEP, once a step, on the step's gradient in ``ctx``.
        ctx = ctx.replace(outputs=_detach(ctx.outputs))
        if sharded is not None and (plan.hooks.get(Event.AFTER_BACKWARD) or plan.hooks.get(Event.AFTER_TRAIN_BATCH)):
            state, ctx = _gradient_events(plan, state, ctx, sharded)
        else:
            state, ctx = run_event(Event.AFTER_BACKWARD, plan, state, ctx)
            state, ctx = run_event(Event.AFTER_TRAIN_BATCH, plan, state, ctx)
        assert ctx.grads is not None
        if scaler is not None:
            finite = scaler.finite(ctx.grads) if finite is None else finite & scaler.finite(ctx.grads)
            if sharded is not None:
                finite = sharded.everywhere(finite)
        before = {name: state.params[name].detach().clone() for name in ctx.grads} if norms else {}
        params, opt = update(ctx.grads, state.opt, state.params, finite)
        state = state.replace(params=params, opt=opt, step=state.step + 1)
        if scaler is not None:
            assert finite is not None
            state = state.replace(hparams=scaler.update(state.hparams, finite))
        state, ctx = run_event(Event.AFTER_OPTIMIZER_STEP, plan, state, ctx)
        assert ctx.loss is not None
        if not norms or ctx.grads is None:
            return state, {"loss": ctx.loss}
        return state, {"loss": ctx.loss, **_norms(ctx.grads, before, state.params)}

    if microbatched:
        step = microbatched_step(
            begin,
            differentiated,
            finish,
            loss_fn=loss_fn,
            input_key=input_key,
            microbatch_size=microbatch_size,
            first_sample=first_sample,
            frozen=frozen,
            statistics=norm_statistics(static.module),
            reduce=reduce,
            overlap=overlap if grad_mode == "autograd" and scaler is None else None,
            guarded=guard_failures,
            units=loss_units,
            units_scale=units_scale,
            reseed=reseed,
            grads_summed=sharded is not None,
            idle=functools.partial(_idle, sharded, forward_with, model_input) if sharded is not None else None,
        )
        return step if sharded is None else _bound(step, sharded)

    def train_step(state: State, batch: Any) -> tuple[State, dict[str, Tensor]]:
        state, ctx = begin(state, _step_key(state, keyed), batch)
        gradient_fn = gradient_fn_at(state, ctx)
        loss, grads, (state, ctx) = differentiated(state.params, state, ctx)
        ctx = ctx.replace(grads=grads, loss=loss.detach(), gradient_fn=gradient_fn)
        return finish(state, ctx)

    return train_step


def _gradient_events(plan: Plan, state: State, ctx: StepCtx, sharded: Sharded) -> tuple[State, StepCtx]:
    # AFTER_BACKWARD and AFTER_TRAIN_BATCH of a sharded step, whose hooks see the parameters and gradients as
    # DTensors (and ``gradient_fn`` takes and gives them so): a norm over every element is the whole tensors'.
    inner = ctx.gradient_fn
    assert inner is not None and ctx.grads is not None

    def gradient_fn(params: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        loss, grads = inner(sharded.local_view(params))
        return loss, sharded.global_view(grads)

    local = state.params
    state = state.replace(params=sharded.global_view(local))
    ctx = ctx.replace(grads=sharded.global_view(ctx.grads), gradient_fn=gradient_fn)
    state, ctx = run_event(Event.AFTER_BACKWARD, plan, state, ctx)
    state, ctx = run_event(Event.AFTER_TRAIN_BATCH, plan, state, ctx)
    assert ctx.grads is not None
    return state.replace(params=local), ctx.replace(grads=sharded.local_view(ctx.grads), gradient_fn=inner)


def _idle(
    sharded: Sharded, forward_with: Callable[..., tuple[Any, dict[str, Tensor]]], model_input: Callable[[Any], Any],
    params: Mapping[str, Tensor], state: State, batch: Any,
) -> dict[str, Tensor]:  # fmt: skip
    # A process whose share of the global batch is empty joins the others' forward and backward through the
    # sharded module (every process gathers each unit and reduces its gradients together) with a loss of zero: the
    # gradients it gets are the others' sums. Its forward's buffers are copies, and dropped.
    with torch.enable_grad(), sharded.holding(params):
        outputs, _ = forward_with(params, state.buffers, model_input(batch), None)
        # Empty outputs sum to zero; a loss the model computed over no sample is NaN, and is left out.
        leaves = [
            t for t in pytree.tree_leaves(outputs)
            if isinstance(t, Tensor) and t.requires_grad and bool(torch.isfinite(t.detach()).all())
        ]  # fmt: skip
        objective = torch.stack([t.sum() for t in leaves]).sum() * 0.0 if leaves else torch.zeros(())
        return sharded.backward(objective)


def _bound(step: StepFn, sharded: Sharded) -> StepFn:
    # A sharded step on a state whose parameters are the module's own (their values written there first).
    def bound_step(state: State, batch: Any) -> tuple[State, dict[str, Tensor]]:
        return step(state.replace(params=sharded.bind(state.params)), batch)

    return bound_step


def _norms(grads: Mapping[str, Tensor], before: Mapping[str, Tensor], after: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # L2 norms of each parameter's gradient and update, and over all of them (OptimizerMonitor asks for them).
    names = list(grads)
    norms = {}
    for kind, tensors in (
        ("grad", [grads[n].detach() for n in names]),
        ("update", torch._foreach_sub([after[n].detach() for n in names], [before[n] for n in names])),
    ):
        each = list(torch._foreach_norm(tensors)) if tensors else []
        norms.update({f"l2_norm/{kind}/{name}": norm for name, norm in zip(names, each, strict=True)})
        norms[f"l2_norm/{kind}/global"] = torch.linalg.vector_norm(torch.stack(each)) if each else torch.zeros(())
    return norms


def _announcer(ready: Callable[[str, Tensor], None], name: str) -> Callable[[Tensor], None]:
    def announce(grad: Tensor) -> None:
        ready(name, grad)

    return announce


def optimize(
    tx: GradientTransformation,
    grads: Mapping[str, Tensor],
    opt: OptState,
    params: Mapping[str, Tensor],
    finite: Tensor | None = None,
    *,
    donate: bool,
) -> tuple[dict[str, Tensor], OptState]:
    """Returns ``(params, opt)`` after ``tx``'s update with ``grads``: the parameters without a gradient, and their
    optimizer state, are left as they are (as ``torch.optim`` skips a ``.grad`` of None); with ``finite`` (fp16
    loss scaling), a step whose gradients are not all finite changes nothing. With ``donate``, an eager update may
    write ``params`` and ``opt``'s tensors in place (torch's fused kernels)."""
    if finite is None:
        return _update(tx, grads, opt, params, donate)
    if not torch.compiler.is_compiling():
        # Eagerly, a step with a non-finite gradient is skipped whole (a host check, as GradScaler.step).
        return _update(tx, grads, opt, params, donate) if bool(finite) else (dict(params), opt)
    # Traced, both are computed and the finite one is selected: no host synchronisation.
    new_params, new_opt = _update(tx, grads, opt, params, False)
    kept = {name: torch.where(finite, new_params[name], tensor) for name, tensor in params.items()}
    return kept, pytree.tree_map(lambda new, old: torch.where(finite, new, old), new_opt, opt)


def _update(
    tx: GradientTransformation,
    grads: Mapping[str, Tensor],
    opt: OptState,
    params: Mapping[str, Tensor],
    donate: bool,
) -> tuple[dict[str, Tensor], OptState]:
    # Parameters without a gradient (frozen, or unused by this step's loss) are left out, and so is their
    # optimizer state, as torch.optim skips a parameter whose ``.grad`` is None.
    names = tuple(params)
    partial = len(grads) != len(params)
    trainable = {n: p for n, p in params.items() if n in grads} if partial else params
    state = restrict_state(opt, names, tuple(trainable)) if partial else opt
    with torch.no_grad():
        if tx.fused is not None and fusable(params):
            if donate:
                new_params, new_state = dict(trainable), tx.fused(trainable, grads, state, 1.0)
            else:
                new_params, new_state = fused_step(tx, trainable, grads, state)
        else:
            updates, new_state = tx.update(grads, state, trainable)
            new_params = apply_updates(trainable, updates)
    if not partial:
        return new_params, new_state
    return {n: new_params.get(n, p) for n, p in params.items()}, merge_state(opt, new_state, names)


def unused_parameters(
    static: Static,
    plan: Plan,
    loss_fn: LossFn,
    state: State,
    batch: Any,
    *,
    input_key: int | str | None = 0,
    per_sample_loss_fn: LossFn | None = None,
    frozen: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """Returns the names of the parameters (not in ``frozen``) that the step's loss on ``batch`` does not reach.

    ``torch.optim`` skips a parameter whose ``.grad`` is None; a ``grad_mode="func"`` step (the compiled one)
    sees zeros there, and is given these names in ``frozen`` to skip them too. The step runs once here by
    autograd, in fp32, with the plan's hooks, and its update is discarded: nothing given changes. It runs on
    fake tensors (shapes without values, as the compiled step's trace sees them: a layer that branches on a
    concrete value takes its traced path, and nothing is computed), or on the given tensors where a fake
    run fails. Which parameters a traced graph reaches does not depend on the batch's values, so one batch (a
    microbatch's worth is enough) answers for the graph.
    """
    reached: set[str] = set()

    def record(updates: Mapping[str, Tensor], opt: OptState, params: Mapping[str, Tensor] | None = None) -> Any:
        reached.update(updates)
        return {name: torch.zeros_like(g) for name, g in updates.items()}, opt

    probe = make_train_step(
        static.replace(precision="fp32"),
        plan,
        loss_fn,
        GradientTransformation(lambda params: (), record),
        input_key=input_key,
        grad_mode="autograd",
        per_sample_loss_fn=per_sample_loss_fn,
        frozen=frozen,
    )
    try:
        on_fake_tensors(probe, state, batch)
    except Exception:  # noqa: BLE001 -- a model fake tensors cannot run is probed on its own tensors
        reached.clear()
        probe(state, batch)
    return frozenset(name for name in state.params if name not in frozen and name not in reached)


def compile_step(step: Callable[..., Any], backend: Any = "inductor") -> Callable[..., Any]:
    """Returns ``step`` compiled as one graph (``fullgraph=True``, static shapes) with a code object of its own.

    Every step that ``make_train_step`` returns shares one code object, and dynamo keeps its compiled graphs
    and its recompile limit (8) per code object: the ninth plan of a process would fail to compile. A copy
    of the code gives each step its own cache, so each plan compiles once however many plans a process runs.
    """
    if not isinstance(step, types.FunctionType):
        return torch.compile(step, backend=backend, fullgraph=True, dynamic=False)
    own = types.FunctionType(
        step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__, step.__closure__
    )
    own.__kwdefaults__ = step.__kwdefaults__
    own.__qualname__ = step.__qualname__
    own.__doc__ = step.__doc__
    return torch.compile(own, backend=backend, fullgraph=True, dynamic=False)


def _step_key(state: State, keyed: bool) -> Tensor:
    # Deriving the key is a dozen small integer ops, a measurable share of an eager step on a small model:
    # only steps whose plan runs a traced hook (the only readers of ctx.key) pay for it.
    return R.fold_in(state.key, state.step) if keyed else state.key


def _detach(outputs: Any) -> Any:
    if isinstance(outputs, Tensor):
        return outputs.detach()
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, outputs)


def make_eval_step(
    static: Static, plan: Plan, *, input_key: int | str | None = 0, predict: bool = False, sharded: Sharded | None = None
) -> Callable[[State, Any], Tensor]:
    """Returns the evaluation step ``(state, batch) -> outputs`` running EVAL_BEFORE/AFTER_FORWARD around it
    (with ``predict``, PREDICT_BEFORE/AFTER_FORWARD).

    The module's train/eval mode is the caller's (the trainer puts it in eval mode first). The model is called
    as in ``make_train_step`` (keyword arguments from a mapping batch with ``input_key=None``), with the state's
    tensors (a ``sharded`` module's own parameters holding the state's).
    """
    slots = ModuleSlots(static.module) if sharded is not None else None
    accepted = keyword_names(static.module) if input_key is None else None
    autocast = Precision.of(static.precision, static.device).autocast
    keyed = bool(plan.hooks)
    before, after = (
        (Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD)
        if predict
        else (Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD)
    )

    def eval_step(state: State, batch: Any) -> Tensor:
        ctx = StepCtx(batch=batch, key=_step_key(state, keyed), loss_fn=_no_loss)
        state, ctx = run_event(before, plan, state, ctx)
        inputs = model_inputs(ctx.batch, input_key, accepted)
        args, kwargs = ((), dict(inputs)) if input_key is None and isinstance(inputs, Mapping) else ((inputs,), None)
        with torch.no_grad(), autocast():
            if sharded is not None and slots is not None:
                with sharded.holding(state.params):
                    outputs = slots(dict(state.buffers), args[0] if args else kwargs, keywords=not args)
            else:
                outputs = functional_call(static.module, (dict(state.params), dict(state.buffers)), args, kwargs)
        state, ctx = run_event(after, plan, state, ctx.replace(outputs=outputs))
        result: Tensor = ctx.outputs
        return result

    return eval_step


def _no_loss(outputs: Any, batch: Any) -> Tensor:
    raise RuntimeError("no loss is computed during evaluation")
