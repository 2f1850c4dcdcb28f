"""The checks a run makes of its set-up before the first step: the first training batch (its keys, its input
range, its classes against the model's outputs) and each evaluator's first batch against its metrics.

Each is a function of the run's set-up (``SetUp``), its state and the batch; it returns or raises, naming the
argument or the batch at fault. None of them changes the run: forwards use the evaluation step without hooks in
eval mode, and metrics are measured on clones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import make_plan
from composer_fn.core.state import (
    LossFn,
    State,
    Static,
    batch_get,
    batch_input,
    batch_set,
    batch_target,
    target_key_of,
)
from composer_fn.core.time import Timestamp
from composer_fn.trainer import distributed
from composer_fn.trainer.checks import first_line, input_expectation
from composer_fn.trainer.evaluation import evaluate
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.outputs import causal_shift, keyword_names, logits_of, positions_per_sample
from composer_fn.trainer.sharding import is_sharded, sharded_module
from composer_fn.trainer.step import check_class_targets, make_eval_step

__all__ = [
    "SetUp",
    "check_input_range",
    "check_targets",
    "check_keywords",
    "check_algorithm_keys",
    "check_batch_kind",
    "check_train_keys",
    "units_scale",
    "check_evaluators",
    "outputs_of",
    "item",
    "described",
    "first_sample",
]


@dataclass(frozen=True)
class SetUp:
    """The run's set-up as its checks read it: the model's structure and the run's settings (``static``), where
    batches hold the model's input and the targets, the loss, whether it is the default one, whether the model is
    a causal language model, and the shape and dtype of the input it trained on (None before the first batch)."""

    static: Static
    input_key: int | str | None
    target_key: int | str | None
    loss_fn: LossFn
    default_loss: bool
    causal: bool
    trained_input: tuple[tuple[int, ...], torch.dtype] | None = None

    def target_name(self, batch: Any) -> int | str:
        """Returns where ``batch`` holds its targets (``target_key``, or the default item for this kind of batch)."""
        if self.target_key is not None:
            return self.target_key
        return "labels" if isinstance(batch, Mapping) else 1


    def keywords(self, batch: Any) -> bool:
        """Returns whether the model takes ``batch`` as keyword arguments."""
        return self.input_key is None and isinstance(batch, Mapping)


def check_input_range(ranges: Sequence[tuple[str, tuple[float, float]]], batch: Any, input_key: int | str | None) -> None:
    """Raises ValueError when the floating-point input of ``batch`` (at ``input_key``) leaves a range an algorithm
    takes (``ranges``: its name and range, from ``Capabilities.input_range``)."""
    # Once, on the first batch: an augmentation written for pixels in [0, 1] would silently mangle
    # standardised inputs (a traced step cannot read values to check them).
    input = batch_input(batch, input_key)
    if not ranges or not isinstance(input, Tensor) or not input.is_floating_point() or not input.numel():
        return
    low, high = float(input.min()), float(input.max())
    for name, (lowest, highest) in ranges:
        if low < lowest or high > highest:
            raise ValueError(
                f"{name} takes floating-point inputs in [{lowest}, {highest}], but the first batch's "
                f"inputs span [{low:.4g}, {high:.4g}]: give it pixels before normalisation (or uint8 images) "
                "and normalise after it, e.g. in the model"
            )


def check_targets(
    setup: SetUp, state: State, timestamp: Timestamp, batch: Any, where: str = "train_dataloader's first batch"
) -> None:
    """Raises ValueError when, with the default loss, ``batch`` holds a class the model has no output for (a
    sequence-to-sequence model's labels included), naming the batch (``where``) and its item."""
    # Once, on the first batch, with the default loss: a class index the model has no output for fails deep
    # inside cross-entropy (on a GPU, as a device-side assertion). One sample's evaluation forward, by the
    # evaluation step without hooks and uncompiled, gives the class count. Where the model computes its own
    # loss, the targets it checks are the labels it is given.
    if not setup.default_loss:
        return
    accepted = keyword_names(setup.static.module)
    # The model computes its own loss from the labels it is given: the labels are checked against its logits.
    own_loss = setup.keywords(batch) and "labels" in batch and (accepted is None or "labels" in accepted)
    unlabelled = None
    if setup.keywords(batch):
        # As the step calls it: with the labels (a sequence-to-sequence model builds its decoder's inputs from
        # them); where that fails (a label the model's own loss cannot take), without them, for the check below.
        first = pytree.tree_map(first_sample, dict(batch))
        unlabelled = {k: v for k, v in first.items() if k != "labels"}
    else:
        key = setup.input_key if setup.input_key is not None else 0
        item(batch, setup.target_key, "target_key", where)
        first = batch_set(batch, key, pytree.tree_map(first_sample, batch_get(batch, key)))
    step = make_eval_step(
        setup.static, make_plan((), timestamp=timestamp), input_key=setup.input_key, sharded=sharded_module(setup.static.module)
    )
    module = setup.static.module
    training = module.training
    try:
        module.eval()
        try:
            outputs = outputs_of(setup, step, state, first, where)
        except ValueError:
            if unlabelled is None or not own_loss:
                raise
            outputs = outputs_of(setup, step, state, unlabelled, where)
    finally:
        module.train(training)
    if own_loss:
        target, key = batch["labels"], "labels"
    else:
        target = item(batch, setup.target_key, "target_key", where, outputs)
        key = setup.target_name(batch)
    logits = logits_of(outputs)
    if isinstance(target, Tensor) and not target.is_floating_point() and isinstance(logits, Tensor):
        logits, target = causal_shift(logits, target, setup.causal)
        check_class_targets(logits, target, key, where)


def check_keywords(setup: SetUp, batch: Any, where: str) -> None:
    """Raises ValueError when a mapping batch given as keyword arguments gives the model's forward no input (labels
    alone are none), naming ``where`` the batch comes from."""
    if not setup.keywords(batch):
        return
    accepted = keyword_names(setup.static.module)
    if accepted is None or (accepted & set(batch)) - {"labels"}:
        return
    some = next((k for k in batch if isinstance(batch[k], Tensor)), None)
    raise ValueError(
        f"input_key=None: {where} is a mapping with keys {list(batch)}, given to the model as "
        f"keyword arguments, but {type(setup.static.module).__name__}.forward takes no input among them (it takes "
        f"{sorted(accepted)}): rename the batch's keys, or pass input_key"
        + (f"={some!r}" if some is not None else "")
        + " to call the model with one item"
    )


def outputs_of(setup: SetUp, step: Callable[[State, Any], Any], state: State, batch: Any, where: str) -> Any:
    """Returns the model's outputs by ``step`` on ``batch``, taken to check the run's set-up; a model that cannot
    take it is refused naming ``where`` the batch comes from, its shape and what the model takes."""
    try:
        return step(state, batch)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        if distributed.is_out_of_memory(error):
            raise
        inputs = batch_input(batch, setup.input_key)
        shape = f"inputs of {described(inputs)}"
        expected = input_expectation(setup.static.module, setup.trained_input)
        raise ValueError(
            f"the model fails on {where} ({shape}): {first_line(error)}" + (f"; {expected}" if expected else "")
        ) from error


def check_evaluators(
    setup: SetUp,
    state: State,
    timestamp: Timestamp,
    evaluators: Sequence[Evaluator],
    eval_dataloader: Any,
    to_device: Callable[[Any], Any],
) -> None:
    """Raises where an evaluator's first batch (moved by ``to_device``) cannot be measured: see below.

    ``eval_dataloader`` is the Trainer's argument, so that errors name it when it was a plain loader."""
    # Once, before the first step or evaluation: each evaluator's first batch goes through the model (eval
    # mode, no gradient, the evaluation step without hooks) and through clones of its metrics, or through the
    # default accuracy and loss, so that outputs a metric cannot take or labels the model has no class for are
    # refused before training, not at its first evaluation. Nothing of the run changes: the metrics measured
    # are clones, and torch's random state is put back after the loader's first batch is drawn.
    if not evaluators:
        return
    step = make_eval_step(
        setup.static, make_plan((), timestamp=timestamp), input_key=setup.input_key, sharded=sharded_module(setup.static.module)
    )
    module = setup.static.module
    training = module.training
    try:
        module.eval()
        for evaluator in evaluators:
            argument = "eval_dataloader" if evaluator.dataloader is eval_dataloader else f"Evaluator({evaluator.label!r})"
            _check_evaluator(setup, state, evaluator, step, argument, to_device)
    finally:
        module.train(training)


def _check_evaluator(
    setup: SetUp,
    state: State,
    evaluator: Evaluator,
    step: Callable[[State, Any], Any],
    argument: str,
    to_device: Callable[[Any], Any],
) -> None:
    with torch.random.fork_rng(devices=[]):
        raw = next(iter(evaluator.dataloader), None)
    if raw is None:
        raise ValueError(f"{argument} yields no batch: an evaluation needs at least one")
    check_batch_kind(raw, argument)
    batch = to_device(raw)
    where = f"{argument}'s first batch"
    check_keywords(setup, batch, where)
    inputs = item(batch, setup.input_key, "input_key", where)
    target = item(batch, setup.target_key, "target_key", where)
    if not isinstance(target, Tensor):
        raise TypeError(f"{where} has targets (batch[{setup.target_key!r}]) of type {type(target).__name__}: expected a tensor")
    if isinstance(inputs, Tensor) and inputs.dim() and not inputs.shape[0]:
        if is_sharded(setup.static.module):
            step(state, batch)  # a sharded model's forward is every process's
        return  # a process's empty share of a short batch
    outputs = outputs_of(setup, step, state, batch, where)
    logits, shifted = causal_shift(logits_of(outputs), target, setup.causal)
    measured = f"the model's outputs of {described(logits)} against targets of {described(shifted)}"
    if evaluator.metrics is None:
        if setup.default_loss and isinstance(logits, Tensor):
            check_class_targets(logits, shifted, setup.target_name(batch), where)
        try:
            evaluate(
                lambda state, batch: outputs,
                state,
                [batch],
                loss_fn=setup.loss_fn,
                target_key=setup.target_key,
                input_key=setup.input_key,
                device=setup.static.device,
                on_event=lambda event: None,
                causal=setup.causal,
            )
        except (RuntimeError, ValueError, TypeError, IndexError, AttributeError) as error:
            raise ValueError(
                f"{argument}: the default evaluation (classification accuracy and loss_fn) fails on {measured}: "
                f"{first_line(error)}; pass an Evaluator with metrics that fit the model's outputs (e.g. "
                "torchmetrics.MeanSquaredError() for a regression)"
            ) from error
        return
    for name, metric in evaluator.metrics.items():
        probe = metric.clone()
        if hasattr(probe, "sync_on_compute"):
            probe.sync_on_compute = False  # the probe is this process's alone
        try:
            probe.to(logits.device).update(logits, shifted)
            value = probe.compute()
        except Exception as error:  # noqa: BLE001 -- torchmetrics refuses unfit inputs with any kind of error
            raise ValueError(
                f"Evaluator({evaluator.label!r}): metrics[{name!r}] ({type(metric).__name__}) cannot measure "
                f"{measured}: {first_line(error)}"
            ) from error
        if not isinstance(value, Tensor) or value.numel() != 1:
            raise ValueError(
                f"Evaluator({evaluator.label!r}): metrics[{name!r}] ({type(metric).__name__}) computes "
                f"{described(value)}: expected one number (a per-class metric needs average='macro' or 'micro')"
            )


def item(batch: Any, key: int | str | None, argument: str, where: str, outputs: Any = None) -> Any:
    """Returns the batch's item at ``key`` (None: the default item, see ``batch_input`` and ``batch_target``); a key
    the batch lacks is refused naming ``argument``, the one it came from. ``outputs``: the model's, said to hold no
    loss of its own."""
    try:
        return (batch_input if argument == "input_key" else batch_target)(batch, key)
    except KeyError:
        held = f"keys {list(batch)}" if isinstance(batch, Mapping) else f"{len(batch)} items" if isinstance(batch, tuple | list) else type(batch).__name__
        item = key if key is not None else ("labels" if isinstance(batch, Mapping) else 0 if argument == "input_key" else 1)
        hint = (
            f"; the model's output ({type(outputs).__name__}) holds no loss of its own, so the default loss reads the "
            "targets there (a Hugging Face model computes its loss when the batch holds 'labels')"
            if outputs is not None and not isinstance(outputs, Tensor)
            else ""
        )
        raise ValueError(f"{argument}={key!r}: {where} has no item {item!r} (it holds {held}){hint}") from None


def check_batch_kind(batch: Any, argument: str) -> None:
    """Raises TypeError when ``batch``, from the loader ``argument``, is not a tuple, list or mapping."""
    if not isinstance(batch, tuple | list | Mapping):
        raise TypeError(
            f"{argument} yields {type(batch).__name__} batches; expected tuples or lists (inputs, targets) or "
            "mappings, read at input_key and target_key"
        )


def check_train_keys(setup: SetUp, algorithms: Sequence[Algorithm], batch: Any) -> None:
    """Raises ValueError when the first training batch lacks what the model, the run or an algorithm reads in it (see
    ``check_keywords``, ``item``, ``check_algorithm_keys``)."""
    where = "train_dataloader's first batch"
    check_keywords(setup, batch, where)
    item(batch, setup.input_key, "input_key", where)
    check_algorithm_keys(algorithms, batch)


def units_scale(setup: SetUp, batch: Any, broadcast: Callable[[float], float]) -> float:
    """Returns the scale of a loss counted in units (tokens, positions) that weighs a sample as ``batch`` does: the power
    of two nearest its positions per sample, so that runs whose first batches differ (a resumed run) weigh alike,
    exactly; every process takes rank 0's (``broadcast``)."""
    per_sample = positions_per_sample(batch, setup.target_key, setup.causal)
    return float(broadcast(2.0 ** round(math.log2(per_sample))))


def check_algorithm_keys(algorithms: Sequence[Algorithm], batch: Any) -> None:
    """Raises ValueError when an algorithm's ``input_key`` or ``target_key`` is not in ``batch`` (it would fail inside
    the traced step), naming the algorithm, its argument and what the batch holds."""
    for algorithm in algorithms:
        for argument in ("input_key", "target_key"):
            key = getattr(algorithm, argument, None)
            if key is None:
                continue
            read = target_key_of(batch, key) if argument == "target_key" else key
            present = read in batch if isinstance(batch, Mapping) else isinstance(read, int) and -len(batch) <= read < len(batch)
            if present:
                continue
            held = f"a mapping of {', '.join(map(repr, batch))}" if isinstance(batch, Mapping) else f"{len(batch)} items"
            what = "the inputs it changes" if argument == "input_key" else "the targets"
            tokens = isinstance(batch, Mapping) and "input_ids" in batch
            hint = (
                f"; {type(algorithm).__name__} changes images or features, not token sequences: leave it out of a run on "
                "a language model's batches"
                if tokens and argument == "input_key"
                else f"; name the item that holds {what}"
            )
            raise ValueError(
                f"{type(algorithm).__name__}({argument}={key!r}) reads {what} at {key!r}, but train_dataloader's first "
                f"batch holds {held}{hint}"
            )


def first_sample(item: Any) -> Any:
    """Returns the first sample of a batched tensor (``item[:1]``); anything else as it is."""
    return item[:1] if isinstance(item, Tensor) and item.dim() else item


def described(value: object) -> str:
    """Returns ``value`` described for an error: a tensor's shape and dtype, else its type."""
    if isinstance(value, Tensor):
        return f"shape {tuple(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    return f"type {type(value).__name__}"
