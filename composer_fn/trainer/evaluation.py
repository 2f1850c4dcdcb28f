"""Evaluation: the held-out metrics of a state, as exact sums that add up alike over any number of processes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core.event import Event
from composer_fn.core.state import LossFn, State, batch_input, batch_target
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.microbatch import Reduce
from composer_fn.trainer.options import BatchLayout
from composer_fn.trainer.outputs import causal_shift, logits_of
from composer_fn.trainer.step import class_last

__all__ = ["evaluate", "measure", "evaluate_on", "due", "stopping"]


def evaluate(
    step: Callable[[State, Any], Tensor],
    state: State,
    batches: Iterable[Any],
    *,
    loss_fn: LossFn,
    target_key: int | str | None,
    input_key: int | str | None = 0,
    device: torch.device,
    causal: bool = False,
    on_event: Callable[[Event], None],
    reduce: Reduce | None = None,
    gather: Callable[[list[float]], list[float]] | None = None,
    per_position: bool = False,
    collective: bool = False,
) -> dict[str, float]:
    """Returns ``accuracy`` (multiclass, micro: correct over labelled positions) and ``loss`` (the batches'
    losses weighted by their sizes; with ``per_position``, a loss that averages over labelled positions, as the
    default loss does, by their labelled positions: a language model's mean over its tokens, however its rows are
    batched) of ``state``.

    ``step`` maps ``(state, batch)`` to outputs, a tensor of logits or a record holding ``logits`` (a
    ``transformers`` output; ``causal``: a causal language model's, whose logits at ``t`` predict the target at
    ``t + 1``); the loss is ``loss_fn`` of the outputs in fp32. ``batches`` are already on ``device``; an empty batch (a
    process's share of a short last batch) is skipped. ``on_event`` runs at EVAL_BATCH_START and EVAL_BATCH_END
    of every batch. Across processes, ``reduce`` sums the counts and ``gather`` concatenates the batches' weighted
    losses in rank order; the loss is their correctly rounded sum (``math.fsum``), so the metrics do not depend
    on how the batches were shared out. No sample at all is an error, not NaN metrics. A ``collective`` step (a
    sharded model's forward, which every process takes part in) runs on an empty batch too, its outputs unused.
    """
    correct = torch.zeros((), dtype=torch.int64, device=device)
    labelled = torch.zeros((), dtype=torch.int64, device=device)
    samples = torch.zeros((), dtype=torch.int64, device=device)
    losses: list[Tensor] = []
    for batch in batches:
        if int(batch_input(batch, input_key).shape[0]) == 0:
            if collective:
                step(state, batch)
            continue
        on_event(Event.EVAL_BATCH_START)
        outputs = step(state, batch)
        logits, target = causal_shift(logits_of(outputs), batch_target(batch, target_key), causal)
        predictions = logits.movedim(-1, 1) if class_last(logits, target) else logits
        with torch.no_grad():
            # -100 marks positions without a label (masked-LM targets, padding), as in cross-entropy.
            mask = target != -100
            correct += ((predictions.argmax(1) == target) & mask).sum()
            labelled += mask.sum()
            samples += target.shape[0]
            weight = mask.sum() if per_position else target.shape[0]
            losses.append(loss_fn(_in_fp32(outputs), batch).double() * weight)
        on_event(Event.EVAL_BATCH_END)
    counts = [correct, labelled, samples]
    if reduce is not None:
        counts = reduce(counts)
    weighted = torch.stack(losses).tolist() if losses else []
    if gather is not None:
        weighted = gather(weighted)
    correct_count, labelled_count, sample_count = (int(c) for c in counts)
    if sample_count == 0:
        raise ValueError("eval_dataloader yielded no batch: an evaluation needs at least one")
    return {
        "accuracy": correct_count / labelled_count if labelled_count else 0.0,
        "loss": math.fsum(weighted) / (labelled_count if per_position else sample_count),
    }


def measure(
    step: Callable[[State, Any], Tensor],
    state: State,
    batches: Iterable[Any],
    evaluator: Any,
    *,
    target_key: int | str | None,
    on_event: Callable[[Event], None],
    causal: bool = False,
    collective: bool = False,
) -> dict[str, float]:
    """Returns ``evaluator``'s torchmetrics metrics of ``state``, as ``eval/<label>/<name>``.

    Each metric is reset, updated with ``(logits, targets)`` on every non-empty batch (on the outputs' device;
    the outputs themselves where they are not a record holding ``logits``; shifted a position apart for a
    ``causal`` language model) and computed; torchmetrics sums its states across processes when a process group is up.
    A ``collective`` step runs on an empty batch too (see ``evaluate``).
    """
    metrics = dict(evaluator.metrics)
    for metric in metrics.values():
        metric.reset()
    for batch in batches:
        on_event(Event.EVAL_BATCH_START)
        target = batch_target(batch, target_key)
        if target.shape[0]:
            logits, shifted = causal_shift(logits_of(step(state, batch)), target, causal)
            for metric in metrics.values():
                metric.to(logits.device).update(logits, shifted)
        elif collective:
            step(state, batch)
        on_event(Event.EVAL_BATCH_END)
    results = {}
    for name, metric in metrics.items():
        value = metric.compute()
        if not isinstance(value, Tensor) or value.numel() != 1:
            raise ValueError(
                f"evaluator {evaluator.label!r}: metric {name!r} computes {type(value).__name__} "
                f"{tuple(value.shape) if isinstance(value, Tensor) else ''}: expected one number (a per-class metric "
                "needs average='macro' or 'micro')"
            )
        results[f"eval/{evaluator.label}/{name}"] = float(value)
    return results


def _in_fp32(outputs: Any) -> Any:
    # The outputs (a tensor or a record of them) with their floating-point tensors in fp32.
    return pytree.tree_map(lambda t: t.float() if isinstance(t, Tensor) and t.is_floating_point() else t, outputs)


def due(every: int, timestamp: Timestamp, interval: Time | None, max_steps: int) -> bool:
    """Returns whether an evaluator that runs at every ``every``-th of the run's evaluations (one each ``interval``)
    runs at ``timestamp``; every evaluator runs at the run's end (``max_steps``)."""
    if every == 1 or timestamp.batch >= max_steps or interval is None:
        return True
    # Epoch evaluations come at an epoch's end, before the timestamp moves to the next one.
    count = timestamp.batch if interval.unit is TimeUnit.BATCH else timestamp.epoch + 1
    return (count // int(interval.value)) % every == 0


def evaluate_on(
    evaluator: Evaluator,
    step: Callable[[State, Any], Any],
    state: State,
    to_device: Callable[[Any], Any],
    *,
    loss_fn: LossFn,
    layout: BatchLayout,
    device: torch.device,
    on_event: Callable[[Event], None],
    causal: bool = False,
    default_loss: bool = True,
    reduce: Reduce | None = None,
    gather: Callable[[list[float]], list[float]] | None = None,
    collective: bool = False,
) -> dict[str, float]:
    """Returns ``evaluator``'s metrics of ``state``, named ``eval/<label>/<metric>``: its own metrics (``measure``),
    else the exact accuracy and loss (``evaluate``), over its first ``subset_num_batches`` batches moved by
    ``to_device`` (``collective``: see ``evaluate``)."""
    batches = map(to_device, itertools.islice(evaluator.dataloader, evaluator.subset_num_batches))
    if evaluator.metrics is not None:
        return measure(
            step, state, batches, evaluator, target_key=layout.target_key, on_event=on_event, causal=causal,
            collective=collective,
        )  # fmt: skip
    results = evaluate(
        step,
        state,
        batches,
        loss_fn=loss_fn,
        target_key=layout.target_key,
        input_key=layout.input_key,
        device=device,
        on_event=on_event,
        causal=causal,
        reduce=reduce,
        gather=gather,
        per_position=default_loss,
        collective=collective,
    )
    return {f"eval/{evaluator.label}/{name}": value for name, value in results.items()}


def stopping(
    stoppers: Sequence[tuple[str, Callable[..., Any]]],
    state: State,
    metrics: Mapping[str, float],
    where: str,
    timestamp: Timestamp,
) -> tuple[State, str | None]:
    """Returns ``state`` with each stopping rule's entry after it read ``metrics`` at ``where`` (``'train'`` or an
    evaluator's label), and the name of the first rule that ends the run there (None: none does)."""
    stopped_by = None
    for name, rule in stoppers:
        entry, stop = rule(state.algos[name], metrics, where, timestamp)
        state = state.with_algo(name, entry)
        stopped_by = stopped_by or (name if stop else None)
    return state, stopped_by
