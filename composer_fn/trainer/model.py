"""The trained model back as an ``nn.Module``: from a trainer (``Trainer.model``) or from a checkpoint file and
the untrained architecture (``load_model``).

Both give a module with the run's surgeries (the structure the run trained) holding the weights evaluation
uses: where an algorithm swaps other weights in for evaluation (EMA's average), the module holds those, as
Composer's trainer does when it evaluates or exports. It is a new module, in eval mode, on the run's device;
the trainer's state and the model given are left as they are.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import check_surgery_conflicts, make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.passes import DEFAULT_PASSES, Pass
from composer_fn.core.state import State, Static, initial_state
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.optim.base import in_layout_of
from composer_fn.trainer.checkpoint import read_checkpoint, recorded_algorithms, unflatten_tree

__all__ = ["module_with", "evaluation_state", "load_model"]

_EVALUATION_OPENING = (Event.EVAL_BEFORE_ALL, Event.EVAL_START)
_TRACED_EVALUATION = (Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD)


def evaluation_state(
    algorithms: Sequence[Algorithm],
    static: Static,
    state: State,
    timestamp: Timestamp,
    passes: Sequence[Pass] = DEFAULT_PASSES,
) -> State:
    """Returns ``state`` as evaluation sees it: the host hooks that open an evaluation (EMA's swap) folded over
    it. Pure: the hooks return new records, so ``state`` is unchanged."""
    plan = make_plan(tuple(algorithms), passes, timestamp)
    traced = sorted({a.name for a in algorithms for e in _TRACED_EVALUATION if e in a.traced_hooks()})
    if traced:
        warnings.warn(
            f"algorithms {traced} change the outputs inside each evaluation forward; a module cannot carry that, so "
            "its outputs are the forward's without them",
            stacklevel=3,
        )
    opened = state
    for event in _EVALUATION_OPENING:
        static, opened = run_host_event(event, plan, static, opened, timestamp)
    # The weights swapped in (EMA's average) take the trained weights' strides: an average of a channels-last
    # weight with one input channel comes back in contiguous strides, which its convolution reads as NCHW.
    return opened.replace(
        params={**opened.params, **in_layout_of(_shared(opened.params, state.params), state.params)},
        buffers={**opened.buffers, **in_layout_of(_shared(opened.buffers, state.buffers), state.buffers)},
    )


def _shared(tensors: Mapping[str, Tensor], like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {name: t for name, t in tensors.items() if name in like and like[name].shape == t.shape}


def module_with(structure: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor]) -> nn.Module:
    """Returns a copy of ``structure`` (hooks and all) holding copies of ``params`` and ``buffers``, in eval mode.

    Every parameter and buffer of ``structure`` must be named in ``params`` / ``buffers`` with its shape; tensors
    keep their dtype, device and memory layout (a ChannelsLast run's weights stay channels-last). A tensor that
    ``structure`` registers under several names (tied weights: a language model's output layer and its input
    embedding) stays one tensor in the copy, holding the value given for its first name, as ``named_parameters()``
    lists it.
    """
    module = copy.deepcopy(structure)
    own_params = dict(module.named_parameters())
    own_buffers = dict(module.named_buffers())
    for kind, own, given in (("parameter", own_params, params), ("buffer", own_buffers, buffers)):
        missing = sorted(set(own) - set(given))
        if missing:
            raise ValueError(f"no trained {kind} for {missing[:5]} of the module ({len(missing)} in all)")
        for name, tensor in own.items():
            if tuple(given[name].shape) != tuple(tensor.shape):
                raise ValueError(
                    f"trained {kind} {name!r} has shape {tuple(given[name].shape)}; the module's is {tuple(tensor.shape)}"
                )
    replacements: dict[int, Tensor] = {}
    with torch.no_grad():
        for name, parameter in own_params.items():
            replacements[id(parameter)] = nn.Parameter(
                params[name].detach().clone(), requires_grad=parameter.requires_grad
            )
        for name, buffer in own_buffers.items():
            replacements[id(buffer)] = buffers[name].detach().clone()
    # Every slot holding a tensor, under each of its names, takes that tensor's one replacement.
    for owner in module.modules():
        tables: tuple[dict[str, Any], ...] = (owner._parameters, owner._buffers)
        for table in tables:
            for attribute, held in table.items():
                if held is not None and id(held) in replacements:
                    table[attribute] = replacements[id(held)]
    return module.eval()


def load_model(
    checkpoint: str | os.PathLike[str],
    model: nn.Module,
    *,
    device: str | torch.device | None = "cpu",
    evaluation_weights: bool = True,
) -> nn.Module:
    """Returns the trained module a checkpoint holds, rebuilt on ``model``, the untrained architecture.

    The surgeries the run recorded (BlurPool, SqueezeExcite, ChannelsLast, …) are replayed on a copy of
    ``model``, in their order, as the trainer did at INIT; the checkpoint's parameters and buffers then load by
    name and shape. With ``evaluation_weights`` (the default) a full checkpoint gives the weights evaluation used
    (EMA's average where the run had EMA); a weights-only checkpoint holds the training weights alone. ``model``
    is left unchanged. A checkpoint whose tensors do not fit the rebuilt structure is refused, naming the first
    tensors that differ.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected the untrained torch.nn.Module the run started from")
    target = torch.device(device) if device is not None else torch.device("cpu")
    payload = read_checkpoint(checkpoint, target, argument="checkpoint")
    algorithms = recorded_algorithms(payload["algorithms"])
    check_surgery_conflicts(algorithms, model)
    structure = copy.deepcopy(model).to(target).train()
    max_duration = payload.get("max_duration")
    timestamp = Timestamp.from_dict(payload["timestamp"])
    if max_duration is not None:
        timestamp = timestamp.with_max_duration(Time.from_timestring(max_duration))
    else:
        timestamp = timestamp.with_max_duration(Time(max(timestamp.batch, 1), TimeUnit.BATCH))
    static = Static(module=structure, device=target, seed=0)
    state = initial_state(structure, R.key(0, device=target))
    plan = make_plan(algorithms, DEFAULT_PASSES, Timestamp().with_max_duration(timestamp.max_duration))
    static, state = run_host_event(Event.INIT, plan, static, state, Timestamp().with_max_duration(timestamp.max_duration))
    _check_names("params", payload["params"], state.params, checkpoint)
    _check_names("buffers", payload["buffers"], state.buffers, checkpoint)
    state = state.replace(params=_like(payload["params"], state.params), buffers=_like(payload["buffers"], state.buffers))
    if evaluation_weights and not payload.get("weights_only", False):
        template = {a.name: a.init(static, state) for a in algorithms}
        if payload["algos_names"] != sorted(template):
            raise ValueError(
                f"checkpoint={str(checkpoint)!r} holds state for algorithms {payload['algos_names']}; its recorded "
                f"algorithms make {sorted(template)}"
            )
        state = state.replace(algos=unflatten_tree("algorithm", payload["algos"], template))
        state = evaluation_state(algorithms, static, state, timestamp)
    return module_with(static.module, state.params, state.buffers)


def _check_names(kind: str, loaded: Mapping[str, Any], expected: Mapping[str, Tensor], path: object) -> None:
    if set(loaded) != set(expected):
        extra, missing = sorted(set(loaded) - set(expected)), sorted(set(expected) - set(loaded))
        raise ValueError(
            f"checkpoint={str(path)!r} does not fit the model: {kind} only in the checkpoint {extra[:5]}, only in the "
            f"model (after the recorded surgeries) {missing[:5]}; expected the untrained architecture the run started from"
        )
    for name, tensor in expected.items():
        if tuple(loaded[name].shape) != tuple(tensor.shape):
            raise ValueError(
                f"checkpoint={str(path)!r} does not fit the model: {kind} {name!r} is {tuple(loaded[name].shape)} in "
                f"the checkpoint and {tuple(tensor.shape)} in the model"
            )


def _like(loaded: Mapping[str, Tensor], expected: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # The run's dtype and strides (a ChannelsLast run's weights are channels-last in its structure too, also
    # where one channel makes channels-last strides pass for contiguous ones).
    return {name: torch.empty_like(tensor).copy_(loaded[name]) for name, tensor in expected.items()}
