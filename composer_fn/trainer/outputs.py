"""Models called with keyword arguments that return records, as Hugging Face ``transformers`` models are.

A mapping batch read with ``input_key=None`` goes to the model whole, as keyword arguments (the items its
``forward`` names, as Composer's ``HuggingFaceModel`` passes them). A model output that holds a ``loss`` (a
``transformers`` ``ModelOutput``, or any mapping or object with that field) is the loss of the default
``loss_fn``; its ``logits`` are what evaluation, metrics and per-sample losses read. Causal language models
(class names ending in ``ForCausalLM`` or ``LMHeadModel``) predict the next token: their logits at position
``t`` are compared with the labels at ``t + 1``, as their own loss does. Labels ``-100`` mark positions without
a label. Nothing here imports ``transformers``: models and outputs are recognised by what they hold.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core.state import LossFn, batch_get, batch_target, held_logits
from composer_fn.nn.sharing import shared_copy

__all__ = [
    "AUXILIARY_WEIGHTS",
    "IGNORE_INDEX",
    "auxiliary_weights",
    "causal_shift",
    "default_loss",
    "default_per_sample_loss",
    "is_causal_lm",
    "labelled_positions",
    "positions_per_sample",
    "settle_loss_function",
    "keyword_names",
    "logits_of",
    "model_inputs",
    "model_loss",
]

IGNORE_INDEX = -100
"""The label of a position that has none (padding, unmasked tokens), as cross-entropy and every collator use."""

_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def keyword_names(module: nn.Module) -> frozenset[str] | None:
    """Returns the names of the keyword arguments ``module.forward`` declares; None when it declares none by name
    (a ``forward(**kwargs)``), so that every item of a batch is passed."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = frozenset(p.name for p in parameters if p.kind in kinds)
    return names or None


def model_inputs(batch: Any, input_key: int | str | None, accepted: frozenset[str] | None) -> Any:
    """Returns what the model is called with: ``batch[input_key]``; with ``input_key=None``, a mapping batch's
    items that ``accepted`` names (all when None), as keyword arguments, with ``use_cache=False`` where the model
    takes ``use_cache`` and the batch does not say, or a tuple/list batch's item 0."""
    if input_key is not None:
        return batch_get(batch, input_key)
    if isinstance(batch, Mapping):
        given = {k: v for k, v in batch.items() if accepted is None or k in accepted}
        if accepted is not None and "use_cache" in accepted and "use_cache" not in given:
            # A forward that trains or evaluates never reuses its key-value cache; returned, the cache is an
            # output that is not a tensor (which torch.func refuses) and holds memory for nothing.
            given["use_cache"] = False
        return given
    return batch_get(batch, 0)


def model_loss(outputs: Any) -> Tensor | None:
    """Returns the loss a model computed itself (``outputs.loss`` or ``outputs['loss']``); None when it has none."""
    if isinstance(outputs, Tensor):
        return None
    if isinstance(outputs, Mapping):
        loss = outputs.get("loss")
    else:
        loss = getattr(outputs, "loss", None)
    return loss if isinstance(loss, Tensor) else None


def logits_of(outputs: Any) -> Any:
    """Returns the logits of a model output record (``outputs.logits`` or ``outputs['logits']``); ``outputs``
    itself when it holds none (a model that returns its logits as a tensor)."""
    logits = held_logits(outputs)
    return outputs if logits is None else logits


def settle_loss_function(module: nn.Module) -> nn.Module:
    """Returns ``module``, or, where it holds a Hugging Face model whose loss function is not yet resolved, a copy
    sharing its tensors in which that function is resolved, once and eagerly; ``module`` is left as it is.

    ``transformers`` picks a model's loss on first use from its class name, and logs a warning where the name
    says none (GPT-2's ``GPT2LMHeadModel``): a logging call that a compiled step cannot hold. Cached in the copy
    (``loss_function``'s own setter, the same function the model would pick), the step finds it without logging.
    """

    def unsettled(part: nn.Module) -> bool:
        return (
            "_loss_function" not in vars(part)
            and isinstance(getattr(type(part), "loss_function", None), property)
            and any(cls.__module__.startswith("transformers.") for cls in type(part).__mro__)
        )

    if not any(unsettled(part) for part in module.modules()):
        return module
    settled = shared_copy(module)
    # Resolving it logs "`loss_type=None` was set in the config but it is unrecognized" for every part whose
    # class name names no loss (GPT-2's head, the base model inside a classifier), although nothing was set:
    # the line is held back while the same function is picked.
    transformers_logger = logging.getLogger("transformers")
    level = transformers_logger.level
    transformers_logger.setLevel(logging.ERROR)
    try:
        for part in settled.modules():
            if unsettled(part):
                part.loss_function = part.loss_function
    finally:
        transformers_logger.setLevel(level)
    return settled


def is_causal_lm(module: nn.Module) -> bool:
    """Returns whether ``module`` is a causal language model whose labels are its own inputs (a ``transformers``
    ``*ForCausalLM`` or ``*LMHeadModel``): its logits at position ``t`` predict the label at ``t + 1``."""
    return type(module).__name__.endswith(_CAUSAL_SUFFIXES)


def causal_shift(logits: Tensor, labels: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """Returns ``(logits, labels)`` paired position by position: for a causal model, the logits of positions
    ``0..S-2`` with the labels of ``1..S-1``; otherwise both unchanged."""
    if causal and logits.dim() == 3 and labels.dim() == 2:
        return logits[:, :-1], labels[:, 1:]
    return logits, labels


def default_loss(target_key: int | str | None) -> LossFn:
    """Returns the trainer's default ``loss_fn(outputs, batch)``: the model's own loss where its output holds
    one, else the cross-entropy of its logits against the batch's targets (``target_key``; None: a mapping's
    ``'labels'``, a tuple's item 1), class-last logits (``[B, S, V]`` against ``[B, S]``) read as such."""

    def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
        if logits.dim() > 2 and logits.dim() == target.dim() + 1 and logits.shape[:-1] == target.shape:
            logits = logits.movedim(-1, 1)
        return F.cross_entropy(logits, target)

    def loss_fn(outputs: Any, batch: Any) -> Tensor:
        own = model_loss(outputs)
        if own is not None:
            return own
        target = batch_target(batch, target_key)
        weights = auxiliary_weights(outputs)
        logits = logits_of(outputs)
        loss = cross_entropy(logits, target)
        for name, weight in weights.items():
            loss = loss + weight * cross_entropy(getattr(outputs, name), target)
        return loss

    return loss_fn


AUXILIARY_WEIGHTS: dict[str, dict[str, float]] = {
    "GoogLeNetOutputs": {"aux_logits1": 0.3, "aux_logits2": 0.3},
    "InceptionOutputs": {"aux_logits": 0.4},
}
"""The weights of the auxiliary heads' cross-entropies in the default loss, by the output record's class, as
torchvision's reference training weighs GoogLeNet's and Inception v3's."""


def auxiliary_weights(outputs: Any) -> dict[str, float]:
    """Returns the auxiliary logits ``outputs`` holds besides its logits, by field, with the weight the default
    loss gives each (``AUXILIARY_WEIGHTS``); raises ``TypeError`` for outputs the default loss cannot read: a
    plain tuple or list, or a record with auxiliary logits of unknown weight."""
    if isinstance(outputs, Tensor) or model_loss(outputs) is not None:
        return {}
    fields = getattr(outputs, "_fields", None)
    auxiliary = [f for f in fields or () if f.startswith("aux") and isinstance(getattr(outputs, f), Tensor)]
    known = AUXILIARY_WEIGHTS.get(type(outputs).__name__)
    if auxiliary and known is not None and set(auxiliary) <= set(known):
        return {name: known[name] for name in auxiliary}
    if auxiliary or (isinstance(outputs, tuple | list) and held_logits(outputs) is None):
        shown = (
            f"{type(outputs).__name__} with fields {list(fields)}"
            if fields
            else f"a {type(outputs).__name__} of {len(outputs)} items"
        )
        raise TypeError(
            f"the model returns {shown} in training, which the default loss cannot read as one prediction "
            "(a distilled or auxiliary head's outputs besides the logits); pass loss_fn=, a function (outputs, "
            "batch) -> loss that combines them, e.g. lambda outputs, batch: (F.cross_entropy(outputs[0], batch[1]) "
            "+ F.cross_entropy(outputs[1], batch[1])) / 2"
        )
    return {}


def _counted_targets(batch: Any, target_key: int | str | None, causal: bool) -> Tensor | None:
    # The integer targets the default loss averages over (a causal model's from the second position on), or
    # None when the targets are not class indices (probabilities: each sample counts once).
    target = batch_target(batch, target_key)
    if not isinstance(target, Tensor) or target.is_floating_point() or target.dim() == 0:
        return None
    return target[..., 1:] if causal and target.dim() >= 2 else target


def labelled_positions(batch: Any, target_key: int | str | None, causal: bool) -> Tensor:
    """Returns how many target positions the default loss averages over in ``batch``, as a float tensor.

    Integer targets count where they are not ``-100`` (a causal language model's from the second position on,
    as its loss shifts them); other targets count their samples. A language model's padded batch cut into
    microbatches, or spread over processes, weighs each piece by this count, so that the step's loss is the
    whole batch's mean over its labelled tokens.
    """
    target = _counted_targets(batch, target_key, causal)
    if target is None:
        given = batch_target(batch, target_key)
        if isinstance(given, Tensor):
            return torch.full((), float(given.shape[0] if given.dim() else 1), device=given.device)
        return torch.ones(())
    return (target != -100).sum().float()


def positions_per_sample(batch: Any, target_key: int | str | None, causal: bool) -> int:
    """Returns the target positions of one sample of ``batch`` (1 for one class per sample; a [B, S] language
    model batch's S, or S - 1 for a causal model), the unit ``labelled_positions`` weighs microbatches in."""
    target = _counted_targets(batch, target_key, causal)
    if target is None or target.dim() < 2:
        return 1
    return max(int(target[0].numel()), 1)


def default_per_sample_loss(target_key: int | str | None, causal: bool) -> LossFn:
    """Returns ``fn(outputs, batch) -> [B]``: each sample's cross-entropy of the logits against the targets,
    averaged over its labelled positions (``-100`` ignored; 0 for a sample without any), after the causal shift
    where ``causal``. It agrees with the model's own loss for a batch of one sample. Auxiliary heads' logits
    (GoogLeNet's, Inception's) are left out; outputs the default loss cannot read are refused as it refuses them.
    """

    def losses(outputs: Any, batch: Any) -> Tensor:
        auxiliary_weights(outputs)
        logits, target = causal_shift(logits_of(outputs), batch_target(batch, target_key), causal)
        if logits.dim() > 2 and logits.dim() == target.dim() + 1 and logits.shape[:-1] == target.shape:
            logits = logits.movedim(-1, 1)
        each = F.cross_entropy(logits.float(), target, ignore_index=IGNORE_INDEX, reduction="none")
        if each.dim() == 1:
            return each
        if target.is_floating_point():
            return each.flatten(1).mean(1)
        labelled = (target != IGNORE_INDEX).flatten(1)
        counts = labelled.sum(1).clamp(min=1)
        return each.flatten(1).sum(1) / counts

    return losses
