"""Microbatched steps: a batch cut into device microbatches whose gradient sums make one update.

Each microbatch runs the step's events up to its gradient with a key of its own place in the global batch;
its loss is weighted by its samples over a full microbatch's (or, for a loss that averages over positions, by
the positions it counts over a full microbatch's); the sums of gradients, loss, sample (and position) counts
and normalization statistics over every microbatch of every process (``reduce``, or ``Summing`` fed from the
last backward) divided by the global counts are the step's, which the events from AFTER_BACKWARD on see once.
``make_train_step`` builds this step when it is given a microbatch size or a sum across processes.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.state import LossFn, State, StepCtx, batch_input
from composer_fn.optim.base import in_layout_of

__all__ = [
    "Cut",
    "Reduce",
    "Summing",
    "failed_contribution",
    "halved",
    "microbatched_step",
    "norm_statistics",
    "split_batch",
]

Reduce = Callable[[Sequence[Tensor]], list[Tensor]]
"""``reduce(tensors) -> sums``: each tensor summed over every process (``distributed.all_reduce_sum``)."""


class Summing(Protocol):
    """A sum over every process begun before its tensors are known (``distributed.Summation``)."""

    def add(self, index: int, tensor: Tensor) -> None:
        """Gives the ``index``-th tensor of the sum."""
        ...

    def result(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Returns the sums of ``tensors``, giving those not given yet."""
        ...


_Sums = tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]
"""Sums over microbatches: the sample-weighted gradients (of the parameters that got one), the loss, and the
normalization statistics."""


def norm_statistics(module: nn.Module) -> tuple[str, ...]:
    """Returns the names of ``module``'s floating-point normalization buffers (BatchNorm running statistics)."""
    owners = {
        name: owner for name, owner in module.named_modules() if isinstance(owner, nn.modules.batchnorm._NormBase)
    }
    names = []
    for name, buffer in module.named_buffers():
        owner, _, _ = name.rpartition(".")
        if owner in owners and buffer.is_floating_point():
            names.append(name)
    return tuple(names)


def split_batch(batch: Any, input_key: int | str | None, size: int | None, first: int = 0) -> list[tuple[int, Any, int]]:
    """Returns ``batch`` cut along dim 0 into microbatches of ``size`` samples (the last may be smaller), each
    with its first sample's place (counted from ``first``) and its sample count; tensors whose first dim is not
    the batch's are passed whole to each."""
    total = int(batch_input(batch, input_key).shape[0])
    if size is None or size >= total:
        return [(first, batch, total)] if total else []

    def piece(start: int) -> Any:
        end = min(start + size, total)
        return pytree.tree_map(
            lambda t: t[start:end] if isinstance(t, Tensor) and t.dim() and t.shape[0] == total else t, batch
        )

    return [(first + start, piece(start), min(size, total - start)) for start in range(0, total, size)]


def _accumulate(
    sums: _Sums | None,
    grads: dict[str, Tensor],
    loss: Tensor,
    samples: int | Tensor,
    statistics: Mapping[str, Tensor],
) -> _Sums:
    # ``grads`` are those of the microbatch's loss weighted by its samples (or positions) over the full
    # microbatch's, and are the step's own (fresh from the gradient): the first microbatch's hold the running
    # sum, added in place. A parameter that got no gradient in a microbatch adds nothing; one that gets its
    # first in a later microbatch joins the sum there.
    weighted_loss = loss.detach().float() * samples
    if sums is None:
        return dict(grads), weighted_loss, dict(statistics)
    for name, g in grads.items():
        if name in sums[0]:
            sums[0][name].add_(g)
        else:
            sums[0][name] = g
    return sums[0], sums[1] + weighted_loss, {name: sums[2][name] + b for name, b in statistics.items()}


def _flat(sums: _Sums, like: Mapping[str, Tensor], count: Tensor, microbatches: Tensor, units: Tensor) -> list[Tensor]:
    # What the processes sum, in one order everywhere: every trainable parameter's gradient (zeros where this
    # process computed none) last layer first (the order the backward computes them in), the normalization
    # statistics, which parameters got a gradient here (1, else 0), the loss, the sample, microbatch and
    # position counts.
    grads, loss_sum, statistics = sums
    names = tuple(like)
    marks = torch.tensor([float(name in grads) for name in names], device=loss_sum.device)
    summed = [grads[name] if name in grads else torch.zeros_like(like[name]) for name in reversed(names)]
    return [*summed, *statistics.values(), marks, loss_sum, count, microbatches, units]


def _combine(
    sums: _Sums,
    like: Mapping[str, Tensor],
    samples: int,
    microbatches: int,
    unit: float,
    reduce: Reduce | None,
    failed: bool = False,
    summing: Summing | None = None,
    units: Tensor | None = None,
    grads_summed: bool = False,
) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor], Tensor]:
    # The global sums divided by the global counts: gradients by samples (``units``: positions) over ``unit``
    # (a full microbatch's, the weights' denominator) and the loss by samples (positions) (an infinite count
    # marks a process that failed its microbatches), statistics by microbatches. The sums are the step's own:
    # divided in place. ``like`` holds the trainable parameters; those that got a gradient on no microbatch of
    # any process get none (and no update). With ``grads_summed`` (a sharded module's backward summed them over
    # the processes) only the rest is summed.
    grads, loss_sum, statistics = sums
    device = loss_sum.device
    count = torch.full((), float("inf") if failed else float(samples), device=device)
    # Its own tensor even when it counts samples: a sum across processes may work on each tensor in place.
    positions = count.clone() if units is None or failed else units.float()
    parts = torch.full((), float(microbatches), device=device)
    if summing is None and reduce is None:
        total, divisor, loss = count, positions, loss_sum
        summed, used, mean_statistics = grads, [name for name in like if name in grads], list(statistics.values())
    elif grads_summed:
        assert reduce is not None
        flat = reduce([*statistics.values(), loss_sum, count, parts, positions])
        total, parts, divisor, loss = flat[-3], flat[-2], flat[-1], flat[-4]
        summed, used, mean_statistics = grads, [name for name in like if name in grads], flat[: len(statistics)]
    else:
        flat = _flat(sums, like, count, parts, positions)
        flat = summing.result(flat) if summing is not None else reduce(flat)  # type: ignore[misc]
        total, parts, divisor, loss = flat[-3], flat[-2], flat[-1], flat[-4]
        names = tuple(like)
        summed = dict(zip(reversed(names), flat, strict=False))
        mean_statistics = flat[len(names) : len(names) + len(statistics)]
        # Where every parameter got a gradient on this process, each got one in all: nothing to read back.
        local = all(name in grads for name in names)
        marks = [1.0] * len(names) if local else flat[len(names) + len(statistics)].tolist()
        used = [name for name, mark in zip(names, marks, strict=True) if mark > 0]
    share = divisor / unit if unit != 1 else divisor
    # A sum across processes comes back contiguous: each gradient returns to its parameter's layout.
    mean = in_layout_of({name: summed[name].div_(share) for name in used}, like)
    averaged = {name: b / parts for name, b in zip(statistics, mean_statistics, strict=True)}
    return mean, loss / divisor, averaged, total


@dataclass(frozen=True)
class Cut:
    """How this process cuts its batches: its place among ``processes``, a process's batch (``rank_batch``: the
    loader's ``batch_size``, else its first batch's size; None before it is known) and the microbatch size
    (``microbatch``; ``auto``: halved each time a step runs out of memory)."""

    rank: int
    processes: int
    rank_batch: int | None
    microbatch: int | None
    auto: bool

    @property
    def process_batch(self) -> int:
        """Returns a process's batch (1 while unknown)."""
        return max(self.rank_batch or 1, 1)

    @property
    def first_sample(self) -> int:
        """Returns the place of this process's first sample in the global batch (ranks before it hold a process's
        batch each)."""
        return self.rank * self.process_batch

    @property
    def microbatch_size(self) -> int | None:
        """Returns the size a step cuts its batch into, or None for a step that does not cut it: several processes,
        or microbatches asked for, cut it (into one microbatch when no size was given)."""
        if self.microbatch is None and self.processes == 1 and not self.auto:
            return None
        return self.microbatch or self.process_batch

    def halved(self, step: int, device: torch.device) -> Cut:
        """Returns the cut to retry ``step`` with after it ran out of memory (see ``halved``)."""
        return dataclasses.replace(self, microbatch=halved(self.microbatch or self.rank_batch or 1, step, device))


def halved(size: int, step: int, device: torch.device) -> int:
    """Returns the microbatch size to retry ``step`` with after it ran out of memory with ``size`` (half of it, rounded
    up), the memory the failed attempt held freed; a step that fails one sample at a time is refused."""
    if size <= 1:
        raise RuntimeError(
            f"out of device memory at step {step} with device_train_microbatch_size=1 (on some process): the model "
            "does not fit one sample at a time; use a smaller model or precision"
        )
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return math.ceil(size / 2)


def failed_contribution(state: State, frozen: frozenset[str], statistics: Sequence[str], reduce: Reduce) -> None:
    """Joins the other processes' sum of this step with nothing but a failure mark (for a process whose
    microbatches ran out of memory): every process then reads an infinite count and skips the update."""
    like = _trainable(state.params, frozen)
    _combine(_nothing(state.params, state.buffers, statistics), like, 0, 0, 1, reduce, failed=True, units=torch.zeros(()))


def microbatched_step(
    begin: Callable[[State, Tensor, Any, int], tuple[State, StepCtx]],
    differentiated: Callable[..., tuple[Tensor, dict[str, Tensor], tuple[State, StepCtx]]],
    finish: Callable[..., tuple[State, dict[str, Tensor]]],
    *,
    loss_fn: LossFn,
    input_key: int | str | None,
    microbatch_size: int | None,
    first_sample: int,
    frozen: frozenset[str],
    statistics: tuple[str, ...],
    reduce: Reduce | None,
    overlap: Callable[[Sequence[Tensor]], Summing] | None,
    guarded: bool,
    units: Callable[[Any], Tensor] | None = None,
    units_scale: float = 1.0,
    reseed: Callable[[int], None] | None = None,
    grads_summed: bool = False,
    idle: Callable[[Mapping[str, Tensor], State, Any], dict[str, Tensor]] | None = None,
) -> Callable[[State, Any], tuple[State, dict[str, Tensor]]]:
    """Returns the step of the module docstring from the plain step's pieces: ``begin`` (AFTER_DATALOADER and
    BEFORE_TRAIN_BATCH), ``differentiated`` (the events up to the gradient, and the gradient) and ``finish``
    (the events from AFTER_BACKWARD on and the update). ``reseed(offset)``, where given, is called before each
    microbatch with its place in the global batch (the model's own draws, ``composer_fn.trainer.randomness``).
    With ``grads_summed``, the gradients ``differentiated`` gives are summed over the processes already (a sharded
    module's), and ``reduce`` sums the rest; a process without a sample then joins the others' backward by
    ``idle(params, state, batch)``, which returns those sums."""
    # Each microbatch's loss is weighted by its samples over a full microbatch's (1 but for a short last one):
    # the summed gradients keep the scale of one microbatch's (what fp16 loss scaling expects). A loss over
    # positions weighs by its positions over a full microbatch's, ``units_scale`` positions per sample.
    unit = (microbatch_size or 1) * (units_scale if units is not None else 1)

    def gradient_sums(params: Mapping[str, Tensor], entries: Sequence[tuple[State, StepCtx, Any]], idling: Any) -> _Sums:
        sums = None
        for state, ctx, count in entries:
            loss, grads, _ = differentiated(params, state, ctx, count / unit)
            sums = _accumulate(sums, grads, loss, count, {})
        if sums is None:
            sums = _nothing(params, {}, ())
            if idle is not None:
                sums = (idle(params, *idling), *sums[1:])
        return sums

    def step(state: State, batch: Any) -> tuple[State, dict[str, Tensor]]:
        step_key = R.fold_in(state.key, state.step)
        # Every microbatch's normalization statistics start from the step's; the step keeps their average,
        # which the processes' sum makes the same on every process.
        start = state.buffers
        entries: list[tuple[State, StepCtx, Any]] = []
        sums: _Sums | None = None
        positions: Tensor | None = None
        # The context of the events from AFTER_BACKWARD on: the last microbatch's, else (no sample) the step's.
        ctx = StepCtx(batch=batch, key=step_key, loss_fn=loss_fn)
        samples = 0
        parts = split_batch(batch, input_key, microbatch_size, first_sample)
        summing = None
        for number, (offset, part, size) in enumerate(parts):
            if reseed is not None:
                reseed(offset)
            state, ctx = begin(state.replace(buffers=start), R.fold_in(step_key, offset), part, offset)
            # What the loss averages over, counted on the batch the loss will see (after the batch's hooks).
            count: Any = size if units is None else units(ctx.batch).detach().float()
            if units is not None:
                positions = count if positions is None else positions + count
            entries.append((state, ctx, count))
            fed: set[str] = set()
            ready = None
            if overlap is not None and number == len(parts) - 1 and not torch.compiler.is_compiling():
                # The last microbatch's backward feeds the processes' sum gradient by gradient.
                summing, ready = _feeding(overlap, state, sums, frozen, statistics, fed)
            loss, grads, (state, ctx) = differentiated(state.params, state, ctx, count / unit, ready)
            if sums is not None:
                grads = {name: g for name, g in grads.items() if name not in fed}
            sums = _accumulate(sums, grads, loss, count, {name: state.buffers[name] for name in statistics})
            samples += size
        if sums is None:
            sums = _nothing(state.params, state.buffers, statistics)
            if idle is not None:
                sums = (idle(state.params, state, batch), *sums[1:])
        if units is not None and positions is None:
            positions = torch.zeros((), device=sums[1].device)
        trainable = _trainable(state.params, frozen)
        grads, loss, averaged, total = _combine(
            sums, trainable, samples, len(entries), unit, reduce, summing=summing, units=positions,
            grads_summed=grads_summed,
        )
        state = state.replace(buffers={**state.buffers, **averaged})
        captured = tuple(entries)
        idling = (state, batch)

        counted = positions

        def gradient_fn(params: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            mean, mean_loss, _, _ = _combine(
                gradient_sums(params, captured, idling), _trainable(params, frozen), samples, len(captured), unit, reduce,
                units=counted, grads_summed=grads_summed,
            )
            return mean_loss, mean

        ctx = ctx.replace(grads=grads, loss=loss, gradient_fn=gradient_fn)
        state, metrics = finish(state, ctx, torch.isfinite(total) if guarded else None)
        return state, {**metrics, "samples": total}

    return step


def _feeding(
    overlap: Callable[[Sequence[Tensor]], Summing],
    state: State,
    sums: _Sums | None,
    frozen: frozenset[str],
    statistics: Sequence[str],
    fed: set[str],
) -> tuple[Summing, Callable[[str, Tensor], None]]:
    # A sum laid out as ``_combine`` lays its tensors out, and the gradient hook that adds each gradient to the
    # earlier microbatches' (in place) and gives the total to the sum, recording its name in ``fed``.
    trainable = _trainable(state.params, frozen)
    scalar = torch.zeros((), device=next(iter(state.params.values())).device)
    like = (trainable, scalar.float(), {name: state.buffers[name] for name in statistics})
    summing = overlap(_flat(like, trainable, scalar, scalar, scalar))
    place = {name: index for index, name in enumerate(reversed(trainable))}

    def ready(name: str, grad: Tensor) -> None:
        if sums is not None and name in sums[0]:
            grad = sums[0][name].add_(grad)
        elif sums is not None:
            # Its first gradient of the step: the running sum starts here.
            sums[0][name] = grad
        summing.add(place[name], grad)
        fed.add(name)

    return summing, ready


def _trainable(params: Mapping[str, Tensor], frozen: frozenset[str]) -> dict[str, Tensor]:
    return {name: p for name, p in params.items() if name not in frozen}


def _nothing(params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], statistics: Sequence[str]) -> _Sums:
    # The sums of a process whose share of the global batch is empty (the epoch's short last batch): no
    # gradient, zero loss and statistics.
    loss = torch.zeros((), dtype=torch.float32, device=next(iter(params.values())).device)
    return {}, loss, {n: torch.zeros_like(buffers[n]) for n in statistics}
