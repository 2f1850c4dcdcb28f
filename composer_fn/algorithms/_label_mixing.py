"""The base of MixUp and CutMix: each example is mixed with a partner from a permutation of the batch, and its
target (or its loss) with the partner's, by the weight the mixing gave.

A record draws its Beta variates on the host at BATCH_START from the step's key and hands them to the traced
step in ``State.algos[name]`` (0-d, or one per example of the global batch, which a microbatch reads from its
place ``StepCtx.offset`` on, and which BATCH_END empties). At BEFORE_FORWARD the traced step pairs the examples
from the batch's (or microbatch's) key, mixes the inputs and keeps the pairing in ``StepCtx.scratch[name]``; at
BEFORE_LOSS it mixes the targets, or at BEFORE_BACKWARD it interpolates the loss with the loss of the partners'
targets.

Class index -100 (``IGNORE_INDEX``) marks an example or position without a target: its one-hot row is zeros,
so a mixed row holds only the partner's share, and the mixed targets are scaled so that the mean over every
position (what cross-entropy with probabilities takes) is the mean over the mass they hold, as
``F.cross_entropy``'s ``ignore_index`` averages over the labelled positions; with ``interpolate_loss`` the loss
skips it as ``F.cross_entropy`` does. The number of classes is read from the model's logits (the ``logits`` of a mapping
output such as a Hugging Face ``ModelOutput``). A model whose output holds its own loss computed that loss inside
its forward from the unmixed labels, which mixing cannot reach; for such a model the step's loss is the
cross-entropy of its logits ``[B, C]`` against the mixed targets (or, with ``interpolate_loss``, the partner's
loss is the cross-entropy against the partners' labels).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.algorithms._targets import IGNORE_INDEX, class_dimension, model_logits
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Capabilities, Hook, HostHook
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx, batch_get, batch_set, target_key_of
from composer_fn.core.time import Timestamp

__all__ = ["LabelMixing", "Pairing", "check_batch", "check_indices", "check_num_classes"]


def check_num_classes(num_classes: object) -> int:
    """Returns ``num_classes`` as an int if it is a class count (an int >= 1); raises ValueError otherwise."""
    return validate.integer("num_classes", num_classes, minimum=1, hint="the number of classes of the targets")


def check_batch(input: Tensor, target: Tensor) -> None:
    """Raises unless ``input`` and ``target`` are tensors holding the same, non-zero number of examples (dim 0).

    Only shapes are read, so the check costs nothing inside a traced step.
    """
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} of type {type(value).__name__}: expected a tensor")
    if input.dim() == 0 or input.shape[0] == 0:
        raise ValueError(f"input of shape {tuple(input.shape)} holds no examples: expected a batch [B, ...] with B >= 1")
    if target.dim() == 0 or target.shape[0] != input.shape[0]:
        raise ValueError(
            f"target of shape {tuple(target.shape)} does not fit input of shape {tuple(input.shape)}: expected one "
            f"target per example, {input.shape[0]} along dim 0"
        )


def check_indices(indices: Tensor, batch_size: int, of: str) -> None:
    """Raises unless ``indices`` is an integer tensor of shape ``[batch_size]``, one partner per example of ``of``."""
    if not isinstance(indices, Tensor) or indices.dtype not in (torch.int64, torch.int32):
        shown = f"of dtype {indices.dtype}" if isinstance(indices, Tensor) else f"of type {type(indices).__name__}"
        raise TypeError(f"indices {shown}: expected an int64 tensor, a permutation of the batch")
    if tuple(indices.shape) != (batch_size,):
        raise ValueError(
            f"indices of shape {tuple(indices.shape)}: expected ({batch_size},), one partner per example of {of}"
        )


class Pairing(Protocol):
    """The traced draws of one mixing: at least the permutation that gives each example its partner."""

    @property
    def indices(self) -> Tensor:
        """Returns the permutation: example ``b``'s partner is example ``indices[b]``."""
        ...


_P = TypeVar("_P", bound=Pairing)


class LabelMixing(Algorithm, Generic[_P]):
    """Base record of the label-mixing algorithms (see the module docstring); subclasses are frozen dataclasses
    with the fields below and say how to draw, pair and mix."""

    alpha: float
    interpolate_loss: bool
    per_sample: bool
    input_key: int | str
    target_key: int | str

    def __post_init__(self) -> None:
        validate.real("alpha", self.alpha, minimum=0.0, hint="the Beta(α, α) concentration")
        validate.flag("interpolate_loss", self.interpolate_loss)
        validate.flag("per_sample", self.per_sample)
        validate.batch_key("input_key", self.input_key)
        validate.batch_key("target_key", self.target_key)
        if self.per_sample and self.interpolate_loss:
            raise ValueError(
                "per_sample=True with interpolate_loss=True: a per-example weight cannot interpolate the "
                "batch-mean loss; use interpolate_loss=False (mixed targets) or per_sample=False"
            )

    def draw(self, key: R.HostKey, batch_size: int | None) -> Tensor:
        """Returns the host draws of a batch from ``key``: float32, 0-d, or ``[batch_size]`` per example."""
        raise NotImplementedError

    def mix_inputs(self, key: R.Key, input: Tensor, draws: Tensor) -> tuple[Tensor, _P]:
        """Returns the mixed inputs and the pairing drawn from ``key``, given the host ``draws``."""
        raise NotImplementedError

    def mix_targets(self, target: Tensor, input: Tensor, pairing: _P, num_classes: int) -> Tensor:
        """Returns the targets mixed as the (mixed) ``input`` was."""
        raise NotImplementedError

    def mix_losses(self, loss: Tensor, partner_loss: Tensor, pairing: _P) -> Tensor:
        """Returns the loss interpolated with ``partner_loss``, the loss against the partners' targets."""
        raise NotImplementedError

    def capabilities(self) -> Capabilities:
        return Capabilities(interpolates_loss=self.interpolate_loss)

    def init(self, static: Static, state: State) -> Tensor:
        # Per-example draws live in the state only from BATCH_START to the step; at rest the entry is empty, so
        # a checkpoint has the same shape whatever the batch size.
        shape = (0,) if self.per_sample else ()
        return torch.zeros(shape, dtype=torch.float32, device=state.step.device)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        if self.per_sample:
            return {Event.BATCH_START: self._draw, Event.BATCH_END: self._empty}
        return {Event.BATCH_START: self._draw}

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        late = Event.BEFORE_BACKWARD if self.interpolate_loss else Event.BEFORE_LOSS
        return {
            Event.BEFORE_FORWARD: self._mix_inputs,
            late: self._mix_loss if self.interpolate_loss else self._mix_targets,
        }

    def _draw(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        if self.per_sample and meta is None:
            raise ValueError(
                f"{type(self).__name__}(per_sample=True) needs the batch size at BATCH_START (BatchMeta)"
            )
        step_key = R.host_fold_in(R.host_key(static.seed), timestamp.batch)
        size = meta.batch_size if self.per_sample and meta is not None else None
        drawn = self.draw(R.host_algorithm_key(step_key, self.name), size)
        return static, state.with_algo(self.name, drawn.to(state.step.device, non_blocking=True))

    def _empty(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        return static, state.with_algo(self.name, state.algos[self.name].new_zeros(0))

    def _mix_inputs(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        input = batch_get(ctx.batch, self.input_key)
        draws = state.algos[self.name]
        if self.per_sample:
            draws = draws[ctx.offset : ctx.offset + input.shape[0]]
        mixed, pairing = self.mix_inputs(R.algorithm_key(ctx.key, self.name), input, draws)
        return state, ctx.with_scratch(self.name, pairing, batch=batch_set(ctx.batch, self.input_key, mixed))

    def _mix_targets(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        target = batch_get(ctx.batch, target_key_of(ctx.batch, self.target_key))
        input = batch_get(ctx.batch, self.input_key)
        logits = model_logits(ctx.outputs)
        if target.shape == logits.shape and not target.is_floating_point():
            # A target of the logits' shape holds probabilities (an integer one-hot target), as in Composer.
            target = target.to(torch.float32)
        mixed = self.mix_targets(target, input, ctx.scratch[self.name], logits.shape[1])
        if not target.is_floating_point():
            mixed = _over_labelled_mass(mixed, target, class_dimension(logits, target))
        ctx = ctx.replace(batch=batch_set(ctx.batch, target_key_of(ctx.batch, self.target_key), mixed))
        if _holds_own_loss(ctx.outputs):
            ctx = ctx.replace(loss_fn=functools.partial(_logits_cross_entropy, target_key_of(ctx.batch, self.target_key)))
        return state, ctx

    def _mix_loss(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        pairing: _P = ctx.scratch[self.name]
        target = batch_get(ctx.batch, target_key_of(ctx.batch, self.target_key))
        partners = batch_set(ctx.batch, target_key_of(ctx.batch, self.target_key), target[pairing.indices])
        assert ctx.loss is not None
        loss_fn = ctx.loss_fn
        if _holds_own_loss(ctx.outputs):
            loss_fn = functools.partial(_logits_cross_entropy, target_key_of(ctx.batch, self.target_key))
        return state, ctx.replace(loss=self.mix_losses(ctx.loss, loss_fn(ctx.outputs, partners), pairing))


def _over_labelled_mass(mixed: Tensor, target: Tensor, dim: int) -> Tensor:
    # Ignored positions (-100) carry no probability mass, or only their partner's share: scaled so that the
    # mean over every position, which cross-entropy with probabilities takes, is the mean over the mass there
    # is, as cross-entropy's ignore_index averages over the labelled positions only. Without an ignored label
    # the factor is exactly 1.
    mass = mixed.sum(dim)
    scale = torch.where(
        (target == IGNORE_INDEX).any(), mass.numel() / mass.sum().clamp(min=1e-12), torch.ones((), device=mass.device)
    )
    return mixed * scale


def _holds_own_loss(outputs: Any) -> bool:
    if isinstance(outputs, Tensor):
        return False
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    return isinstance(loss, Tensor)


def _logits_cross_entropy(target_key: int | str, outputs: Any, batch: Any) -> Tensor:
    """Returns the cross-entropy of the outputs' logits against ``batch[target_key]`` (indices or probabilities)."""
    return F.cross_entropy(model_logits(outputs), batch_get(batch, target_key))
