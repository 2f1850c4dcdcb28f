"""ALiBi: attention with linear biases in place of position embeddings (Press et al., 2022).

Surgery (at INIT): the model's position embedding is removed (``position_embedding`` becomes None) and every
attention gets an ``AlibiBias`` in its ``position_bias`` slot, which adds ``-slope_h * |i - j|`` to the score
of query ``i`` and key ``j`` in head ``h``. The slopes are Press et al.'s: for ``n`` heads, a power of two,
the geometric sequence ``slope_h = 2 ** (-8 (h + 1) / n)``; for other head counts, the slopes of the closest
power of two below ``n``, followed by every other slope of the next power of two (their interpolation rule,
as Composer computes it). The model's ``max_seq_len`` becomes ``max_sequence_length``: nothing position-
shaped is left, so longer sequences than those trained on are accepted (ALiBi's extrapolation).

The bias is the symmetric form, for causal and bidirectional models alike. Composer builds causal models'
bias as ``slope_h * j`` instead; for the keys a causal query sees (``j <= i``) the two differ by
``slope_h * i``, a constant per query, which the softmax cancels: both give the same attention.

Batch reshape (AFTER_DATALOADER, traced, training only): each ``[B, S]`` tensor of the batch (the tokens,
their ``attention_mask`` and ``token_type_ids``, per-token labels; each token keeps its mask) becomes
``[B * S // S', S']`` with ``S' = int(S * train_sequence_length_scaling)``, so a step trains on as many tokens
in shorter rows (Composer reshapes ``(B, S)`` to ``(B / s, S * s)``). ``S'`` is a shape, chosen on the host:
``plan_key`` returns it from the coming batch's shape and the hook is specialised to it. Evaluation sees the
full rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.algorithms import _transformers as hf
from composer_fn.algorithms._sequences import set_batch_sequence_length
from composer_fn.algorithms._surgery import Surgery, replace_modules, warn_nothing_to_replace
from composer_fn.core import validate
from composer_fn.core.algorithm import Hook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp
from composer_fn.nn import has_protocol_blocks, protocol_attribute, protocol_blocks

__all__ = [
    "Alibi",
    "AlibiBias",
    "alibi_slopes",
    "apply_alibi",
    "scaled_sequence_length",
    "scale_batch_sequence_length",
]


def alibi_slopes(num_heads: int) -> list[float]:
    """Returns the ``num_heads`` ALiBi slopes of Press et al., largest first.

    For a power of two ``n``: ``2 ** (-8 (h + 1) / n)`` for ``h = 0 .. n - 1``. Otherwise the slopes of the
    largest power of two ``p < n`` followed by the first ``n - p`` of every other slope of ``2 p``.
    """
    validate.integer("num_heads", num_heads, minimum=1)
    if num_heads & (num_heads - 1) == 0:
        return [2.0 ** (-8.0 * (head + 1) / num_heads) for head in range(num_heads)]
    closest = 2 ** math.floor(math.log2(num_heads))
    return alibi_slopes(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


class AlibiBias(nn.Module):
    """The ALiBi attention bias ``-slope_h * |i - j|`` of shape ``[num_heads, S_query, S_key]``.

    The slopes are a non-persistent buffer (they follow from ``num_heads`` alone), so they move with the
    model's device and take part in no state dict.
    """

    slopes: Tensor

    def __init__(self, num_heads: int, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.register_buffer(
            "slopes",
            torch.tensor(alibi_slopes(num_heads), dtype=torch.float32, device=device),
            persistent=False,
        )

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Returns the bias for queries and keys ``[B, num_heads, S, head_dim]``, in the slopes' dtype."""
        if query.shape[-3] != self.num_heads:
            raise ValueError(
                f"query of shape {tuple(query.shape)} has {query.shape[-3]} heads; this bias was built for "
                f"num_heads={self.num_heads}"
            )
        queries = torch.arange(query.shape[-2], device=query.device)
        keys = torch.arange(key.shape[-2], device=key.device)
        distance = (keys[None, :] - queries[:, None]).abs().to(self.slopes.dtype)
        return -self.slopes[:, None, None] * distance

    def extra_repr(self) -> str:
        """Returns the hyperparameters ``repr`` shows."""
        return f"num_heads={self.num_heads}"


def _alibi_targets(model: nn.Module) -> frozenset[str]:
    if hf.is_transformers_model(model):
        return _transformers_targets(model)
    if isinstance(model, nn.Module) and not has_protocol_blocks(model):
        return frozenset()
    blocks = protocol_blocks(model)
    protocol_attribute(model, "max_seq_len", "model")
    names = set()
    if protocol_attribute(model, "position_embedding", "model") is not None:
        names.add("position_embedding")
    for name, block in blocks:
        attention = protocol_attribute(block, "attention", f"model.{name}")
        protocol_attribute(attention, "num_heads", f"model.{name}.attention")
        bias = protocol_attribute(attention, "position_bias", f"model.{name}.attention")
        if bias is not None and not isinstance(bias, AlibiBias):
            raise ValueError(
                f"model.{name}.attention.position_bias already holds a {type(bias).__name__}; ALiBi would replace "
                "it. Apply one position bias per model"
            )
        if bias is None:
            names.add(f"{name}.attention.position_bias")
    return frozenset(names)


def _layout(model: nn.Module) -> hf.AlibiLayout:
    kind = hf.model_type(model)
    if kind not in hf.ALIBI_LAYOUTS:
        raise ValueError(
            f"ALiBi rewrites the Hugging Face models of type {', '.join(sorted(hf.ALIBI_LAYOUTS))}; "
            f"{type(model).__name__} has config.model_type={kind!r}, whose positions and attention it does not know"
        )
    layout = hf.ALIBI_LAYOUTS[kind]
    implementation = getattr(model.config, "_attn_implementation", None)
    if kind == "gpt2" and getattr(model.config, "reorder_and_upcast_attn", False) and implementation == "eager":
        raise ValueError(
            "GPT-2 with config.reorder_and_upcast_attn=True computes its eager attention in a path of its own, which "
            "takes no bias; ALiBi needs reorder_and_upcast_attn=False or attn_implementation='sdpa'"
        )
    hf.alibi_attention_name(implementation)  # refuses attention that takes no bias
    return layout


def _transformers_targets(model: nn.Module) -> frozenset[str]:
    # The position layers to remove and, for each attention module without a bias, the "alibi" slot it gains.
    layout = _layout(model)
    names = set()
    for name, module in model.named_modules():
        if hf.class_named(module, (layout.positions,)):
            if layout.position_attribute is None:
                names.add(name)
            elif isinstance(module._modules.get(layout.position_attribute), nn.Embedding):
                names.add(f"{name}.{layout.position_attribute}".lstrip("."))
        elif hf.class_named(module, layout.attention) and "alibi" not in module._modules:
            hf.check_attention_interface(module)
            names.add(f"{name}.alibi")
    return frozenset(names)


def _has_alibi(model: nn.Module) -> bool:
    return any(isinstance(m, AlibiBias) for m in model.modules())


def _apply_alibi_transformers(model: Any, max_sequence_length: int, selected: frozenset[str] | None = None) -> Any:
    layout = _layout(model)
    targets = _transformers_targets(model) if selected is None else selected
    if not targets and not _has_alibi(model):
        warn_nothing_to_replace("Alibi", f"attention of {', '.join(layout.attention)}", model, stacklevel=4)
    replacements: dict[str, nn.Module] = {}
    for name in targets - {t for t in targets if t.endswith(".alibi")}:
        old: Any = model.get_submodule(name)
        if isinstance(old, nn.Embedding):
            replacements[name] = hf.ZeroPositions(
                old.embedding_dim, dtype=old.weight.dtype, device=old.weight.device
            )
        else:
            replacements[name] = hf.NoRotation(2 * int(old.inv_freq.numel()))
    for name in targets:
        owner = model.get_submodule(name.rpartition(".")[0]) if name.endswith(".alibi") else None
        cap = getattr(owner, "bias", None) if owner is not None else None
        if isinstance(cap, Tensor) and cap.dtype == torch.bool and cap.dim() == 4 and cap.shape[-1] < max_sequence_length:
            # Older GPT-2 releases mask causally with a buffer of the model's positions, in the eager path too.
            raise ValueError(
                f"max_sequence_length={max_sequence_length}: {type(owner).__name__} of this transformers release masks "
                f"causally with a buffer of {cap.shape[-1]} positions, so it cannot read longer rows; use "
                f"max_sequence_length <= {cap.shape[-1]}, or a transformers release without that buffer (5.x)"
            )
    rewritten = replace_modules(model, replacements)
    heads = int(model.config.num_attention_heads)
    for name in sorted(t for t in targets if t.endswith(".alibi")):
        attention: nn.Module = rewritten.get_submodule(name.rpartition(".")[0])
        device = next(attention.parameters(), torch.empty(0)).device
        attention.add_module("alibi", AlibiBias(heads, device=device))
    # The index buffers that cap the length grow to max_sequence_length, so that longer sequences are accepted.
    for module in rewritten.modules():
        if hf.class_named(module, (layout.positions,)):
            for buffer_name in layout.length_buffers:
                buffer = module._buffers.get(buffer_name)
                if buffer is not None and buffer.shape[-1] < max_sequence_length:
                    persistent = buffer_name not in module._non_persistent_buffers_set
                    longer = (
                        torch.arange(max_sequence_length, device=buffer.device)
                        if buffer_name == "position_ids"
                        else torch.zeros(max_sequence_length, dtype=buffer.dtype, device=buffer.device)
                    )
                    module.register_buffer(buffer_name, longer.expand(1, -1), persistent=persistent)
    configs: dict[int, Any] = {id(m.config): m.config for m in rewritten.modules() if hasattr(m, "config")}
    for config in configs.values():
        config._attn_implementation = hf.alibi_attention_name(config._attn_implementation)
        if hasattr(config, "max_position_embeddings"):
            config.max_position_embeddings = max(config.max_position_embeddings, max_sequence_length)
    return rewritten


def apply_alibi(model: nn.Module, max_sequence_length: int) -> nn.Module:
    """Returns a copy of ``model`` with ALiBi attention biases and no position embedding; ``model`` is untouched.

    ``model`` follows the transformer protocol (``composer_fn.nn.blocks``), or is a Hugging Face BERT, GPT-2 or
    Llama (``ALIBI_LAYOUTS`` in ``composer_fn.algorithms._transformers``: their position embeddings, or rotary
    embedding, removed, and their ``sdpa`` or ``eager`` attention given the bias; other model types are refused).
    A model without ``blocks`` comes back as an unchanged copy with a warning, as from every surgery that finds
    nothing to replace; blocks that break the protocol raise a TypeError naming the missing attribute. The copy
    accepts sequences up to ``max_sequence_length`` (its ``max_seq_len``, or ``config.max_position_embeddings``).
    Applying it to a model that already has ALiBi only sets that length. No parameter is drawn, so no key is
    needed. Composer's ``apply_alibi`` leaves batches alone too: the shorter training
    rows are ``scale_batch_sequence_length`` (the ``Alibi`` algorithm does both).
    """
    max_sequence_length = validate.integer("max_sequence_length", max_sequence_length, minimum=1)
    if hf.is_transformers_model(model):
        return _apply_alibi_transformers(model, max_sequence_length)
    if isinstance(model, nn.Module) and not has_protocol_blocks(model):
        warn_nothing_to_replace(
            "Alibi", "transformer blocks (model.blocks, see composer_fn.nn.blocks)", model
        )
        return replace_modules(model, {})
    targets = _alibi_targets(model)
    replacements: dict[str, nn.Module] = {}
    for name, block in protocol_blocks(model):
        if f"{name}.attention.position_bias" in targets:
            attention = protocol_attribute(block, "attention", f"model.{name}")
            device = next(attention.parameters(), torch.empty(0)).device
            replacements[f"{name}.attention.position_bias"] = AlibiBias(attention.num_heads, device=device)
    rewritten = replace_modules(model, replacements)
    if "position_embedding" in targets:
        # Under every name it is registered by, so that none of its weights stays behind.
        embedding = rewritten.get_submodule("position_embedding")
        for owner in list(rewritten.modules()):
            for attribute, child in list(owner._modules.items()):
                if child is embedding:
                    owner.register_module(attribute, None)
    # A plain (non-tensor) attribute: nn.Module would store it the same way.
    object.__setattr__(rewritten, "max_seq_len", max_sequence_length)
    return rewritten


def scaled_sequence_length(
    batch_size: int, sequence_length: int, train_sequence_length_scaling: float
) -> int:
    """Returns ``int(sequence_length * train_sequence_length_scaling)``, the training row length of ALiBi.

    Raises ValueError unless the length is at least 1 and divides the batch's ``batch_size * sequence_length``
    tokens, so that the reshape keeps every token.
    """
    scaling = train_sequence_length_scaling
    validate.real("train_sequence_length_scaling", scaling, minimum=0.0, maximum=1.0, open_below=True)
    batch_size = validate.integer("batch_size", batch_size, minimum=1)
    sequence_length = validate.integer("sequence_length", sequence_length, minimum=1)
    length = int(sequence_length * train_sequence_length_scaling)
    tokens = batch_size * sequence_length
    if length < 1 or tokens % length:
        raise ValueError(
            f"train_sequence_length_scaling={train_sequence_length_scaling!r} on a [{batch_size}, {sequence_length}] "
            f"batch gives rows of {length} tokens, which must be at least 1 and divide its {tokens} tokens; "
            "choose a scaling whose product with the sequence length is a divisor of the token count"
        )
    return length


def scale_batch_sequence_length(batch: Any, train_sequence_length_scaling: float) -> Any:
    """Returns ``batch`` with every ``[B, S]`` sequence reshaped to ``[B * S // S', S']``; ``batch`` is untouched.

    ``S' = scaled_sequence_length(B, S, train_sequence_length_scaling)``, with ``[B, S]`` the shape of the
    tokens (``"input_ids"`` in a mapping that holds them, else the first item). ``batch`` is a mapping, tuple
    or list of tensors of that shape (tokens, ``attention_mask``, ``token_type_ids``, per-token labels); token
    ``k`` of the flattened batch stays token ``k`` in every tensor, so each label and mask value stays with its
    token. A re-cut row mixes examples, so a batch that holds one value per example (a ``[B]`` classification
    label) raises ValueError unless the scaling leaves the rows as they are.
    """
    batch_size, sequence_length = _batch_shape(batch)
    length = scaled_sequence_length(batch_size, sequence_length, train_sequence_length_scaling)
    return _reshaped(batch, length)


def _reshaped(batch: Any, length: int) -> Any:
    items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
    batch_size, sequence_length = _batch_shape(batch)
    if length < sequence_length:
        for name, item in items:
            if isinstance(item, Tensor) and item.dim() == 1 and item.shape[0] == batch_size:
                raise ValueError(
                    f"batch item {name!r} of shape {tuple(item.shape)} holds one value per example (a "
                    f"classification label): ALiBi's training rows of {length} tokens re-cut the [{batch_size}, "
                    f"{sequence_length}] batch across examples, so no row can keep it. Use "
                    "Alibi(train_sequence_length_scaling=1.0) for a model that classifies whole sequences"
                )
    return set_batch_sequence_length(batch, length, truncate=False)


def _batch_shape(batch: Any) -> tuple[int, int]:
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), Tensor):
        items: Any = [batch["input_ids"]]
    else:
        items = list(batch.values()) if isinstance(batch, Mapping) else batch
    if (
        not isinstance(items, tuple | list)
        or not items
        or not isinstance(items[0], Tensor)
        or items[0].dim() != 2
    ):
        first = items[0] if isinstance(items, tuple | list) and items else None
        found = (
            f"its first item is a tensor of shape {tuple(first.shape)}"
            if isinstance(first, Tensor)
            else f"its first item is {type(first).__name__}"
            if isinstance(items, tuple | list) and items
            else "it holds no item"
            if isinstance(items, tuple | list)
            else "it is not a mapping, tuple or list"
        )
        raise ValueError(
            f"batch of type {type(batch).__name__}: {found}; expected a mapping, tuple or list whose first item is "
            "a [batch, sequence] tensor of token ids (ALiBi shortens the rows of a language model's batch)"
        )
    batch_size, sequence_length = items[0].shape
    return int(batch_size), int(sequence_length)


@register
@dataclass(frozen=True)
class Alibi(Surgery):
    """ALiBi surgery at INIT and shorter training rows at AFTER_DATALOADER (Composer's ``Alibi``).

    Args:
        max_sequence_length: the longest sequence the rewritten model accepts. Composer requires it; the
            default here is 8192 so that the record can be built without arguments.
        train_sequence_length_scaling: the training rows' length as a fraction of the batch's (1 keeps it).
    """

    max_sequence_length: int = 8192
    train_sequence_length_scaling: float = 0.25

    def __post_init__(self) -> None:
        validate.integer("max_sequence_length", self.max_sequence_length, minimum=1)
        scaling = self.train_sequence_length_scaling
        validate.real("train_sequence_length_scaling", scaling, minimum=0.0, maximum=1.0, open_below=True)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return _alibi_targets(module)

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return apply_alibi(module, self.max_sequence_length)

    def _restricted_rewrite(self, module: nn.Module, key: Tensor, timestamp: Timestamp) -> nn.Module:
        if hf.is_transformers_model(module):
            return _apply_alibi_transformers(module, self.max_sequence_length, self.surgery_targets(module))
        return super()._restricted_rewrite(module, key, timestamp)

    def _operate(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        # The shorter rows only make sense for a model with ALiBi: a model it cannot rewrite is refused.
        if not self.surgery_targets(static.module) and not _has_alibi(static.module):
            raise ValueError(
                f"Alibi found no attention to give a bias to in {type(static.module).__name__} (it rewrites models "
                "following composer_fn.nn.blocks and Hugging Face models of type "
                f"{', '.join(sorted(hf.ALIBI_LAYOUTS))}); without it, its shorter training rows would only change the "
                "batches. Remove Alibi from this run, or widen its target_modules"
            )
        return super()._operate(static, state, timestamp, meta)

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        if meta is None or len(meta.input_shape) != 2:
            return None
        batch_size, sequence_length = meta.input_shape
        return scaled_sequence_length(batch_size, sequence_length, self.train_sequence_length_scaling)

    def traced_hooks(self, plan_key: Hashable = None) -> Mapping[Event, Hook]:
        if plan_key is not None and not validate.is_integer(plan_key):
            raise TypeError(f"plan_key={plan_key!r}: expected the training row length (an int) or None")
        return {Event.AFTER_DATALOADER: functools.partial(self._reshape, plan_key)}

    def _reshape(self, length: int | None, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        # Without a plan key (a caller that did not describe the batch) the length follows the traced shape.
        if length is None:
            return state, ctx.replace(
                batch=scale_batch_sequence_length(ctx.batch, self.train_sequence_length_scaling)
            )
        return state, ctx.replace(batch=_reshaped(ctx.batch, length))
