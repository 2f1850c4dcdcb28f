"""The immutable records that flow through training: ``State``, ``StepCtx``, ``Static`` and ``BatchMeta``.

``State`` and ``StepCtx`` are pytrees (``torch.utils._pytree``), so they cross the ``torch.compile`` boundary
and can be flattened for checkpoints. ``Static`` is hashable and never traced. None of them changes after
construction: ``replace`` returns a new record, and the dictionaries they hold are never written to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from composer_fn.core.records import Record, optional_entries, record, static

__all__ = [
    "initial_state", "State", "StepCtx", "Static", "BatchMeta", "batch_meta",
    "Precision", "LossFn", "ForwardFn", "GradientFn", "batch_get", "batch_input", "batch_set", "batch_target",
    "target_key_of", "held_logits", "tree_map",
]

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed"]
LossFn = Callable[[Any, Any], Tensor]
ForwardFn = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], Any], tuple[Any, dict[str, Tensor]]]
GradientFn = Callable[[Mapping[str, Tensor]], tuple[Tensor, dict[str, Tensor]]]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed", "fp16-mixed")


@record(serialized_type_name="composer_fn.State")
class State(Record):
    """Everything training carries from one step to the next, as tensors.

    Attributes:
        params: trainable parameters by qualified name.
        buffers: non-trainable module buffers (BatchNorm statistics) by qualified name; a step returns new
            ones, it never writes into these.
        opt: optimizer state, a pytree of NamedTuples.
        algos: per-algorithm state keyed by the algorithm's name.
        hparams: 0-d tensors (a changing value does not recompile the step).
        step: 0-d int64 tensor, the number of optimizer steps taken.
        key: the root random key (int64 ``[2]``); a step's key is ``fold_in(key, step)``.
    """

    params: Mapping[str, Tensor]
    buffers: Mapping[str, Tensor]
    opt: Any
    algos: Mapping[str, Any] = optional_entries()
    hparams: Mapping[str, Tensor]
    step: Tensor
    key: Tensor

    def with_algo(self, name: str, entry: Any) -> State:
        """Returns a copy whose ``algos[name]`` is ``entry``."""
        return self.replace(algos={**self.algos, name: entry})


@record(serialized_type_name="composer_fn.StepCtx")
class StepCtx(Record):
    """What one step passes between its traced events (Composer's ``state.batch/outputs/loss``, as data).

    Attributes:
        batch: the batch as the loader gave it (tuple, list or dict of tensors), as changed by the hooks so far.
        key: this step's random key; an algorithm derives its own with ``fold_in(key, name_to_int(name))``.
        loss_fn: ``loss_fn(outputs, batch) -> loss``; hooks may call it (loss interpolation).
        forward: ``forward(params, buffers, input) -> (outputs, new_buffers)``, the model as a pure function
            under the step's precision, for an algorithm that declared ``"extra_forward"`` (e.g. a scoring pass
            before the real one); the buffers given are not written to. Where the trainer gives the model mapping
            batches as keyword arguments (``input_key=None``), a mapping ``input`` is taken as those.
        per_sample_loss_fn: ``per_sample_loss_fn(outputs, batch) -> [B]`` losses, one per sample, for an
            algorithm that declared ``"per_sample_loss"``.
        gradient_fn: ``gradient_fn(params) -> (loss, grads)``, the loss closure, from AFTER_BACKWARD on, for an
            algorithm that declared ``"loss_closure"``: the detached loss of this step's batch, as the loss saw
            it, and its gradients, at other parameter values, under the step's precision; it writes nothing.
        outputs: the model's outputs, from AFTER_FORWARD on.
        loss: the scalar loss, from AFTER_LOSS on.
        per_sample_loss: per-sample losses, when an algorithm asked for them.
        grads: gradients by parameter name, from AFTER_BACKWARD on.
        scratch: per-algorithm values that live for this step only (e.g. a permutation drawn at BEFORE_FORWARD
            and used at BEFORE_LOSS), keyed by algorithm name.
        offset: the place of ``batch``'s first sample in the step's global batch (a microbatch's place).
    """

    batch: Any
    key: Tensor
    loss_fn: LossFn = static()
    forward: ForwardFn | None = static(default=None)
    per_sample_loss_fn: LossFn | None = static(default=None)
    gradient_fn: GradientFn | None = static(default=None)
    outputs: Any = None
    loss: Tensor | None = None
    per_sample_loss: Tensor | None = None
    grads: Mapping[str, Tensor] | None = None
    scratch: Mapping[str, Any] = optional_entries(default_factory=dict)
    offset: int = static(default=0)

    def with_scratch(self, name: str, value: Any, **changes: Any) -> StepCtx:
        """Returns a copy whose ``scratch[name]`` is ``value``, with any other ``changes`` to its fields."""
        return self.replace(scratch={**self.scratch, name: value}, **changes)


@dataclass(frozen=True)
class Static:
    """The hashable, never-traced part of training: structure and settings, not values.

    ``module`` is used only as structure (through ``torch.func.functional_call``); its own tensors are not
    read by the step. Model surgery returns a new ``Static`` (and new params); it never edits a module in
    place.
    """

    module: nn.Module = field(compare=False)
    precision: Precision = "fp32"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    train_inputs: Callable[[], Iterator[Any]] | None = field(default=None, compare=False)
    """For algorithms that require ``"train_data"``: a new iterator over the training inputs (the batches'
    input items, on ``device``) each call, without the run's transforms; None otherwise."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} must be one of {', '.join(PRECISIONS)}")

    def __hash__(self) -> int:
        return hash((id(self.module), self.precision, str(self.device), self.seed))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Static)
            and self.module is other.module
            and (self.precision, str(self.device), self.seed) == (other.precision, str(other.device), other.seed)
        )

    def replace(self, **changes: Any) -> Static:
        """Returns a copy with the given fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class BatchMeta:
    """What the host knows about the coming batch without reading device memory.

    ``input_shape`` is the shape of the batch's input tensor (empty when the caller does not know it);
    ``tokens`` counts the elements of an integer input, as Composer counts tokens (0 for floating inputs).
    """

    batch_size: int
    input_shape: tuple[int, ...] = ()
    tokens: int = 0


def batch_meta(batch: Any, input_key: int | str | None = 0) -> BatchMeta:
    """Returns the metadata of ``batch``: its size, its input's shape and its token count (see ``batch_input``)."""
    input = batch_input(batch, input_key)
    shape = tuple(input.shape)
    tokens = 0 if input.is_floating_point() or input.is_complex() else input.numel()
    return BatchMeta(int(shape[0]), shape, int(tokens))


def initial_state(module: nn.Module, key: Tensor) -> State:
    """Returns the state before INIT: copies of ``module``'s parameters and buffers, step 0 and ``key``.

    No optimizer or algorithm state yet (the trainer fills them after INIT); the step counter lives on the
    key's device.
    """
    return State(
        params={name: p.detach().clone() for name, p in module.named_parameters()},
        buffers={name: b.detach().clone() for name, b in module.named_buffers()},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64, device=key.device),
        key=key,
    )


def batch_get(batch: Any, key: int | str) -> Any:
    """Returns the item of a tuple/list batch at an index, or of a mapping batch at a key."""
    try:
        return batch[key]
    except (IndexError, KeyError, TypeError) as error:
        raise KeyError(
            f"batch has no item {key!r}: a batch is a tuple/list indexed by position or a mapping by key, "
            f"got {type(batch).__name__}"
        ) from error


def held_logits(outputs: Any) -> Tensor | None:
    """Returns the logits a model's ``outputs`` hold: the tensor itself, or the ``logits`` of a mapping or record
    (a Hugging Face ``ModelOutput``); None when they hold none."""
    if isinstance(outputs, Tensor):
        return outputs
    logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
    return logits if isinstance(logits, Tensor) else None


def target_key_of(batch: Any, target_key: int | str) -> int | str:
    """Returns the key the targets are read at: ``target_key``, or ``'labels'`` for a mapping batch that holds
    ``'labels'`` and not ``target_key`` when that is a position (an algorithm's default 1 meeting a Hugging Face
    batch)."""
    if isinstance(batch, Mapping) and isinstance(target_key, int) and target_key not in batch and "labels" in batch:
        return "labels"
    return target_key


def batch_input(batch: Any, input_key: int | str | None) -> Any:
    """Returns the item of ``batch`` that holds its samples' inputs: ``batch[input_key]``; with ``input_key=None``
    (a mapping batch given to the model as keyword arguments), a mapping's ``'input_ids'``, else its first
    tensor, and a tuple/list's item 0."""
    if input_key is not None or not isinstance(batch, Mapping):
        return batch_get(batch, 0 if input_key is None else input_key)
    if "input_ids" in batch:
        return batch["input_ids"]
    for item in batch.values():
        if isinstance(item, Tensor):
            return item
    raise KeyError(f"batch has no tensor: a mapping batch holds its inputs as tensors, got keys {list(batch)}")


def batch_target(batch: Any, target_key: int | str | None) -> Any:
    """Returns the item of ``batch`` that holds its targets: ``batch[target_key]``; with ``target_key=None``, a
    mapping's ``'labels'`` and a tuple/list's item 1."""
    if target_key is None:
        target_key = "labels" if isinstance(batch, Mapping) else 1
    return batch_get(batch, target_key)


def batch_set(batch: Any, key: int | str, value: Any) -> Any:
    """Returns a new batch equal to ``batch`` with the item at ``key`` replaced; ``batch`` is unchanged."""
    if isinstance(batch, Mapping):
        if key not in batch:
            raise KeyError(f"batch has no key {key!r}; keys are {list(batch)}")
        return {**batch, key: value}
    if isinstance(batch, tuple | list):
        if not isinstance(key, int) or not -len(batch) <= key < len(batch):
            raise KeyError(f"batch has no position {key!r}; it holds {len(batch)} items")
        items = list(batch)
        items[key] = value
        if isinstance(batch, list):
            return type(batch)(items)
        return type(batch)(*items) if hasattr(batch, "_fields") else tuple(items)
    raise TypeError(f"batch of type {type(batch).__name__} cannot be updated: expected a tuple, list or mapping")


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Returns the pytree with ``fn`` applied to every leaf."""
    return pytree.tree_map(fn, tree)
