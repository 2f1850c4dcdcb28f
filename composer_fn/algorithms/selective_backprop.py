"""Selective backprop: score the batch with an extra forward and train on its harder part (Jiang et al., 2019).

During ``[start, end)`` of the run, except every ``interrupt``-th batch, the batch is scored with a forward
pass (inputs optionally downscaled by ``scale_factor``) and per-sample losses; then ``int(keep * N)`` samples are
drawn without replacement, the sample of loss rank ``r`` (0 = lowest) with probability proportional to
``((r + 0.5) / N) ** (1 / keep - 1)``, as in Composer. The draw uses the Gumbel-top-k trick on the step's key, so
it is keyed, exact (the same distribution as sampling one by one without replacement) and compiles to a
static shape.

The scoring pass runs under the step's precision and does not update BatchNorm statistics (its buffers are
discarded; Composer's scoring pass, in train mode, updates them).

At the run's first batch and at each pruned one, the model's forward runs on fake tensors at the kept batch size
(and the scoring size): a model that cannot take them is refused before the step, naming the shape.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.algorithms._keys import check_key
from composer_fn.algorithms._label_mixing import check_batch
from composer_fn.algorithms._shapes import shape_failure
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import Algorithm, Hook, HostHook, no_change, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx, batch_get, batch_input
from composer_fn.core.time import Timestamp, TimeUnit

__all__ = [
    "SelectiveBackprop",
    "should_selective_backprop",
    "selection_weights",
    "select_indices",
    "select_using_loss",
]

_INTERPOLATION = {3: "linear", 4: "bilinear", 5: "trilinear"}


def should_selective_backprop(
    current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9, interrupt: int = 2
) -> bool:
    """Returns whether the batch ``batch_idx`` of the epoch, at ``current_duration`` of the run, is pruned.

    True inside ``[start, end)`` except on every ``interrupt``-th batch (``interrupt = 0``: every batch).
    """
    validate.real("current_duration", current_duration, minimum=0.0, maximum=1.0, hint="a fraction of the run")
    validate.integer("batch_idx", batch_idx, minimum=0)
    _check_interval(start, end)
    validate.integer("interrupt", interrupt, minimum=0)
    in_interval = start <= current_duration < end
    return in_interval and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)


def selection_weights(batch_size: int, keep: float) -> Tensor:
    """Returns the sampling probability of each loss rank (0 = lowest loss), in float64, summing to 1."""
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    keep = validate.real("keep", keep, minimum=0.0, maximum=1.0, open_below=True)
    ranks = (torch.arange(batch_size, dtype=torch.float64) + 0.5) / batch_size
    weights = ranks ** (1.0 / keep - 1.0)
    return weights / weights.sum()


def select_indices(key: R.Key, losses: Tensor, keep: float) -> Tensor:
    """Returns the indices of the ``int(keep * N)`` samples drawn by loss rank (see the module docstring)."""
    check_key(key)
    validate.real("keep", keep, minimum=0.0, maximum=1.0, open_below=True)
    if losses.dim() != 1 or losses.shape[0] == 0:
        raise ValueError(f"losses of shape {tuple(losses.shape)}: expected one loss per sample, [N] with N >= 1")
    count = losses.shape[0]
    chosen = max(int(keep * count), 1)
    by_loss = torch.argsort(losses.float(), stable=True)
    # Gumbel-top-k: the top k of log(p) + Gumbel noise is a draw of k items without replacement with weights p.
    uniform = R.uniform(key, (count,), dtype=torch.float64, low=math.ulp(0.0), high=1.0).to(losses.device)
    scores = selection_weights(count, keep).to(losses.device).log() - torch.log(-torch.log(uniform))
    ranks = torch.topk(scores, chosen).indices
    return by_loss[ranks]


def _check_interval(start: object, end: object) -> None:
    validate.real("start", start, minimum=0.0, maximum=1.0, hint="a fraction of the run")
    validate.real("end", end, minimum=0.0, maximum=1.0, hint="a fraction of the run")
    if start > end:  # type: ignore[operator]
        raise ValueError(f"start={start!r}, end={end!r}: expected 0 <= start <= end <= 1")


def _take(batch: Any, indices: Tensor, size: int) -> Any:
    return pytree.tree_map(
        lambda t: t.index_select(0, indices) if isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] == size else t,
        batch,
    )


def _downscale(input: Tensor, scale_factor: float) -> Tensor:
    if scale_factor == 1:
        return input
    if input.dim() not in _INTERPOLATION:
        raise ValueError(f"input of shape {tuple(input.shape)}: scale_factor != 1 needs a 3-, 4- or 5-d input")
    return F.interpolate(input, scale_factor=scale_factor, mode=_INTERPOLATION[input.dim()])


def _takes_reduction(loss_fun: Callable[..., Tensor]) -> bool:
    try:
        parameters = inspect.signature(loss_fun).parameters.values()
    except (TypeError, ValueError):
        # No signature to read (some builtins): the call itself will say.
        return True
    return any(
        (p.name == "reduction" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in parameters
    )


def select_using_loss(
    input: Tensor,
    target: Tensor,
    model: Callable[[Tensor], Tensor],
    loss_fun: Callable[..., Tensor],
    keep: float = 0.5,
    scale_factor: float = 1,
    *,
    key: R.Key,
) -> tuple[Tensor, Tensor]:
    """Returns the pruned ``(input, target)``: ``int(keep * N)`` samples drawn by loss rank (Composer's function).

    ``loss_fun(outputs, target, reduction="none")`` must return per-sample losses (a ``loss_fun`` without a
    ``reduction`` keyword raises TypeError before the model runs); ``model`` is called once, without
    gradients, on the input downscaled by ``scale_factor`` (in (0, 1]).
    """
    check_key(key)
    validate.real("keep", keep, minimum=0.0, maximum=1.0, open_below=True)
    validate.real("scale_factor", scale_factor, minimum=0.0, maximum=1.0, open_below=True)
    check_batch(input, target)
    if not callable(model):
        raise TypeError(f"model={model!r} must be callable, model(input) -> outputs")
    if not callable(loss_fun) or not _takes_reduction(loss_fun):
        raise TypeError(
            f"loss_fun={loss_fun!r} must take a reduction keyword, as loss_fun(outputs, target, reduction='none') "
            "returning per-sample losses (torch.nn.functional.cross_entropy does)"
        )
    with torch.no_grad():
        losses = loss_fun(model(_downscale(input, scale_factor)), target, reduction="none")
        if losses.dim() > 1:
            losses = losses.flatten(1).mean(1)
        if losses.shape != (input.shape[0],):
            raise ValueError(
                f"loss_fun={loss_fun!r} returned losses of shape {tuple(losses.shape)} with reduction='none': "
                f"expected one loss per sample, ({input.shape[0]},)"
            )
        finite = torch.isfinite(losses)
        if not bool(finite.all()):
            sample = int((~finite).nonzero()[0])
            raise ValueError(
                f"loss_fun={loss_fun!r} gave a non-finite loss ({float(losses[sample])}) for sample {sample}: "
                "selection by loss rank needs finite losses"
            )
        indices = select_indices(key, losses, keep)
    return input.index_select(0, indices), target.index_select(0, indices)


@register
@dataclass(frozen=True)
class SelectiveBackprop(Algorithm):
    """Trains on the harder part of some batches, scored by an extra forward (Composer's ``SelectiveBackprop``).

    Args:
        start: the fraction of the run at which pruning begins.
        end: the fraction of the run at which pruning stops.
        keep: the fraction of each pruned batch that is kept, in (0, 1].
        scale_factor: the input is downscaled by this for the scoring pass only, in (0, 1].
        interrupt: every ``interrupt``-th batch of the interval is not pruned (0: every batch is).
        input_key: where the input sits in the batch; None (the default): what the model is given, a mapping
            batch's items as keyword arguments (a language model's ``input_ids`` and ``attention_mask``) or a
            tuple's item 0. Composer's default is 0.
        target_key: where the target sits in the batch.
    """

    placement = "first"
    requires = frozenset({"extra_forward", "per_sample_loss"})
    checks_at = frozenset({Event.BATCH_START})

    start: float = 0.5
    end: float = 0.9
    keep: float = 0.5
    scale_factor: float = 1.0
    interrupt: int = 2
    input_key: int | str | None = None
    target_key: int | str = 1

    def __post_init__(self) -> None:
        validate.real("keep", self.keep, minimum=0.0, maximum=1.0, open_below=True)
        _check_interval(self.start, self.end)
        validate.real("scale_factor", self.scale_factor, minimum=0.0, maximum=1.0, open_below=True)
        validate.integer("interrupt", self.interrupt, minimum=0)
        if self.input_key is not None:
            validate.batch_key("input_key", self.input_key)
        validate.batch_key("target_key", self.target_key)

    def changes_nothing(self) -> str | None:
        if self.keep == 1:
            why = "every sample of a batch is kept, so no batch is pruned"
            instead = "keep < 1 (Composer's default is 0.5)"
            return no_change("SelectiveBackprop", "keep=1", why, instead)
        if self.start == self.end:
            return (
                f"SelectiveBackprop(start={self.start!r}, end={self.end!r}) changes nothing: the interval "
                "[start, end) in which batches are pruned is empty; use start < end"
            )
        return None

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        pruned = self.keep < 1 and should_selective_backprop(
            timestamp.elapsed, timestamp.batch_in_epoch, self.start, self.end, self.interrupt
        )
        # The shape check runs at the first batch of the run, ahead of the interval (where the run reaches it), and at
        # every pruned batch.
        return pruned or (event is Event.BATCH_START and timestamp.batch == 0 and self.keep < 1 and self._reached(timestamp))

    def _reached(self, timestamp: Timestamp) -> bool:
        # Whether some batch of the run falls in [start, end), its elapsed fraction counted as Timestamp.elapsed does.
        total = timestamp.max_duration
        if total is None or total.unit is not TimeUnit.BATCH:
            return self.start < self.end
        steps = int(total.value)
        first = math.ceil(self.start * steps)
        if first >= 1 and (first - 1) / steps >= self.start:  # the product rounded up past an exact fraction
            first -= 1
        return first < steps and first / steps < self.end

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.BATCH_START: self._check_shapes}

    def _check_shapes(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        # The kept samples (and the downscaled scoring input) tried before the step that prunes, on fake tensors: a
        # model that cannot take them (BatchNorm over a single sample, a kernel larger than a downscaled map) is
        # refused, naming the shape, instead of failing inside its own code. Integer inputs (token ids) are left
        # to the step: a language model takes any batch size.
        if meta is None or meta.tokens or len(meta.input_shape) < 2:
            return static, state
        full = meta.input_shape
        kept = max(int(self.keep * full[0]), 1)
        shapes = [full, (kept, *full[1:])]
        # The scoring size where the downscaled item is the model's input (the metadata describes that one).
        if self.scale_factor != 1 and len(full) in _INTERPOLATION and self.input_key in (None, 0):
            shapes.append((full[0], full[1], *(math.floor(dim * self.scale_factor) for dim in full[2:])))
        failure = shape_failure(static.module, state.params, state.buffers, shapes)
        if failure is None:
            return static, state
        shape, _, error = failure
        model = type(static.module).__name__
        if shape == shapes[1]:
            raise ValueError(
                f"SelectiveBackprop(keep={self.keep}) trains on {kept} of the batch's {full[0]} samples, but {model} "
                f"fails on a batch of {kept} ({error}); use a larger keep or larger batches, or leave "
                "SelectiveBackprop out for this model"
            )
        raise ValueError(
            f"SelectiveBackprop(scale_factor={self.scale_factor}) scores the batch at "
            f"{'x'.join(map(str, shape[2:]))}, but {model} fails on that input ({error}); use a larger scale_factor "
            "(1 scores at full size), or leave SelectiveBackprop out for this model"
        )

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {Event.AFTER_DATALOADER: self._prune}

    def _prune(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        assert ctx.forward is not None and ctx.per_sample_loss_fn is not None
        if self.input_key is None and isinstance(ctx.batch, Mapping):
            # The model's keyword arguments, as the step gives them (a language model's ids and attention mask).
            if self.scale_factor != 1:
                raise ValueError(
                    f"SelectiveBackprop(scale_factor={self.scale_factor!r}) downscales an image input, but the batch is a "
                    f"mapping of {', '.join(map(str, ctx.batch))} given to the model as keyword arguments; use "
                    "scale_factor=1, or input_key naming the images"
                )
            size = batch_input(ctx.batch, None).shape[0]
            given: Any = ctx.batch
        else:
            input = batch_get(ctx.batch, 0 if self.input_key is None else self.input_key)
            size = input.shape[0]
            given = _downscale(input, self.scale_factor)
        with torch.no_grad():
            outputs, _ = ctx.forward(state.params, state.buffers, given)
            losses = ctx.per_sample_loss_fn(outputs, ctx.batch).detach()
            indices = select_indices(R.algorithm_key(ctx.key, self.name), losses, self.keep)
        # Every per-sample tensor of the batch is pruned alike; other items pass through unchanged.
        return state, ctx.replace(batch=_take(ctx.batch, indices, size), per_sample_loss=losses)
