"""Checks of a run's set-up that the trainer makes before its first step, each naming the argument at fault.

The device must exist on this machine; a loss function must take ``(outputs, batch)``; checkpoint metadata must
be plain values a ``weights_only`` read can hold; the metric names a run logs (with the range of each, where it
is known) are what stoppers are checked against; and inputs given to ``predict`` are compared with what the model
trained on, or with its first layer.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.callbacks.base import Callback
from composer_fn.core import validate

__all__ = [
    "available_device",
    "check_algorithms_read",
    "check_loss_signature",
    "check_predict_input",
    "first_line",
    "input_expectation",
    "logged_metrics",
    "plain_metadata",
]

UNBOUNDED = (-math.inf, math.inf)
"""The range of a metric whose values are not known to be bounded."""

_ACCELERATORS = ("cuda", "xpu", "mps")


def first_line(error: BaseException) -> str:
    """Returns the first line of ``error``'s message (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _device_count(kind: str) -> int:
    if kind == "cpu":
        return 1
    if kind == "mps":
        backend = getattr(torch.backends, "mps", None)
        return int(bool(backend is not None and backend.is_available()))
    module = getattr(torch, kind, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        return 0
    count = getattr(module, "device_count", None)
    return int(count()) if callable(count) else 1


def _available() -> list[str]:
    names = ["cpu"]
    for kind in _ACCELERATORS:
        count = _device_count(kind)
        names += [kind] if kind == "mps" and count else [f"{kind}:{index}" for index in range(count)]
    return names


def available_device(device: object) -> torch.device:
    """Returns ``device`` as a ``torch.device`` if this machine has it; raises ValueError naming ``device``, the
    value and the devices that are available otherwise (``'cuda'`` without a GPU, ``'cuda:3'`` with fewer)."""
    try:
        parsed = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={device!r} is not a device ('cpu', 'cuda', 'cuda:1', ...): {first_line(error)}"
        ) from None
    count = _device_count(parsed.type)
    if count and (parsed.index is None or parsed.type == "cpu" or parsed.index < count):
        return parsed
    reason = (
        f"this machine has {count} {parsed.type} device{'s' if count != 1 else ''}, so index {parsed.index} is out of range"
        if count
        else f"no {parsed.type} device is available on this machine"
    )
    raise ValueError(f"device={device!r}: {reason}; available: {', '.join(map(repr, _available()))}")


def check_loss_signature(argument: str, function: object) -> None:
    """Raises TypeError if ``function`` cannot be called with two positional arguments ``(outputs, batch)``.

    A callable whose signature cannot be read (some builtins and extension functions) passes.
    """
    if function is None:
        return
    if not callable(function):
        raise TypeError(f"{argument}={function!r}: expected a function (outputs, batch) -> loss")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
    except TypeError as error:
        name = getattr(function, "__name__", type(function).__name__)
        raise TypeError(
            f"{argument}={name}{signature} cannot be called as {argument}(outputs, batch) ({error}): expected a "
            "function of two positional arguments, the model's outputs and the batch"
        ) from None


def plain_metadata(value: object, where: str = "save_metadata") -> Any:
    """Returns ``value`` made of plain values only (NumPy numbers become Python numbers); raises TypeError naming
    the entry (``save_metadata['model']``) that a checkpoint read with ``weights_only`` could not hold."""
    if value is None or isinstance(value, str | bool):
        return value
    if validate.is_bool(value):
        return bool(value)
    if validate.is_integer(value):
        return int(value)
    if validate.is_real(value):
        return float(value)
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not (isinstance(key, str) or validate.is_integer(key)):
                raise TypeError(f"{where} has the key {key!r}: expected strings (or ints) as keys")
            plain[key if isinstance(key, str) else int(key)] = plain_metadata(item, f"{where}[{key!r}]")
        return plain
    if isinstance(value, list | tuple):
        items = [plain_metadata(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"{where}={value!r} of type {type(value).__name__}: expected plain values (strings, numbers, booleans, None, "
        "lists and dicts of them), which a checkpoint read with weights_only can hold"
    )


def _metric_bounds(metric: Any) -> tuple[float, float]:
    # torchmetrics records the range a metric's values lie in for its plots (accuracy: [0, 1]; MSE: [0, inf)).
    low, high = getattr(metric, "plot_lower_bound", None), getattr(metric, "plot_upper_bound", None)
    return (
        float(low) if validate.is_real(low) else -math.inf,
        float(high) if validate.is_real(high) else math.inf,
    )


def check_algorithms_read(
    algorithms: Sequence[Any],
    evaluators: Sequence[Any],
    callbacks: Sequence[Any],
    default_loss: bool,
    max_steps: int,
    steps_per_epoch: int,
) -> None:
    """Runs each algorithm's checks of what it reads in the run (``Capabilities.checks_logged`` against the metrics
    logged where it watches, see ``logged_metrics``; ``checks_length`` against the run's length), which raise or
    warn."""
    logging = [c for c in callbacks if type(c).log_metrics is not Callback.log_metrics]
    logged = logged_metrics(evaluators, logging, default_loss)
    for algorithm in algorithms:
        capabilities = algorithm.capabilities()
        if capabilities.checks_logged is not None and capabilities.watches in logged:
            capabilities.checks_logged(logged[capabilities.watches])
        if capabilities.checks_length is not None:
            capabilities.checks_length(max_steps, steps_per_epoch)


def logged_metrics(
    evaluators: Sequence[Any], logging_callbacks: Sequence[Any], default_loss: bool
) -> dict[str, dict[str, tuple[float, float]]]:
    """Returns, for ``'train'`` (each log step's record) and for each evaluator's label (after its evaluations),
    the names of the metrics the run logs there, each with the range its values can take.

    A name may be an ``fnmatch`` pattern (``'throughput/*'``, or ``'*'`` for a callback that does not say what it
    logs, see ``Callback.logs``). ``default_loss``: the loss is the default cross-entropy (never negative).
    """
    loss = (0.0, math.inf) if default_loss else UNBOUNDED
    train: dict[str, tuple[float, float]] = {
        "loss": loss,
        "lr_multiplier": UNBOUNDED,
        "samples_per_second": (0.0, math.inf),
    }
    for callback in logging_callbacks:
        for pattern in getattr(callback, "logs", None) or ("*",):
            train.setdefault(pattern, UNBOUNDED)
    measured: dict[str, tuple[float, float]] = {}
    for evaluator in evaluators:
        prefix = f"eval/{evaluator.label}/"
        if evaluator.metrics is None:
            measured.update({f"{prefix}accuracy": (0.0, 1.0), f"{prefix}loss": loss})
        else:
            measured.update({f"{prefix}{name}": _metric_bounds(m) for name, m in evaluator.metrics.items()})
    return {"train": train, **{evaluator.label: measured for evaluator in evaluators}}


def _first_layer(module: nn.Module) -> tuple[nn.Module | None, bool]:
    # The first layer with parameters in registration order, and whether a Flatten comes before it.
    flattened = False
    for layer in module.modules():
        if isinstance(layer, nn.Flatten):
            flattened = True
        if next(layer.children(), None) is None and next(layer.parameters(recurse=False), None) is not None:
            return layer, flattened
    return None, flattened


def input_expectation(module: nn.Module, trained: tuple[tuple[int, ...], torch.dtype] | None) -> str:
    """Returns what ``module`` takes as input, in words: the shape of the batches it trained on (``trained``:
    the first training batch's input shape and dtype), else what its first layer takes; empty if unknown."""
    if trained is not None:
        shape, dtype = trained
        return f"the model trained on inputs of shape ({', '.join(['B', *map(str, shape[1:])])}) and dtype {dtype}"
    layer, flattened = _first_layer(module)
    if isinstance(layer, nn.modules.conv._ConvNd):
        dims = len(layer.kernel_size)
        return (
            f"the model's first layer, {type(layer).__name__}, takes {layer.in_channels} channels: inputs of shape "
            f"(B, {layer.in_channels}{', ...' * dims})"
        )
    if isinstance(layer, nn.Linear):
        where = "features once flattened" if flattened else "features in the last dim"
        return f"the model's first layer, Linear, takes {layer.in_features} {where}"
    if isinstance(layer, nn.Embedding):
        return f"the model's first layer, Embedding, takes integer token ids in [0, {layer.num_embeddings})"
    return ""


def check_predict_input(
    inputs: object,
    index: int,
    input_key: int | str | None,
    trained: tuple[tuple[int, ...], torch.dtype] | None,
    module: nn.Module,
) -> None:
    """Raises TypeError/ValueError when ``inputs`` (batch ``index`` of ``predict``'s ``dataloader``) cannot be
    what the model takes: not a tensor, or a rank, channel count or feature count other than the training
    batches' (``trained``)."""
    where = f"dataloader's batch {index}"
    if not isinstance(inputs, Tensor):
        raise TypeError(
            f"predict: {where} has inputs (batch[{input_key!r}]) of type {type(inputs).__name__}: expected a tensor "
            "of a batch of samples"
        )
    if trained is None:
        return
    shape, dtype = trained
    given = tuple(inputs.shape)
    mismatch = ""
    if len(given) != len(shape):
        mismatch = f"{len(given)} dims instead of {len(shape)}"
    elif dtype.is_floating_point and len(shape) == 2 and given[1] != shape[1]:
        mismatch = f"{given[1]} features instead of {shape[1]}"
    elif dtype.is_floating_point and len(shape) > 2 and given[1] != shape[1]:
        mismatch = f"{given[1]} channels instead of {shape[1]}"
    if mismatch:
        raise ValueError(
            f"predict: {where} has inputs of shape {given} ({mismatch}); {input_expectation(module, trained)}"
            + (" (one sample: inputs.unsqueeze(0))" if len(given) + 1 == len(shape) else "")
        )

