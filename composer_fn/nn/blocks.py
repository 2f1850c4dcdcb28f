"""The transformer block protocol: the structure model surgery relies on, and the readers that check it.

A model follows the protocol when it has these slots (``composer_fn.models.CausalLM`` and
``composer_fn.models.MaskedLM`` do); a surgery that replaces a part must keep them:

- ``model.token_embedding``: ``nn.Embedding(vocab_size, d_model)``.
- ``model.position_embedding``: ``nn.Embedding(max_seq_len, d_model)`` whose row ``t`` is added at position
  ``t``; it may be set to ``None``, and then no position is added (an attention bias such as ALiBi then
  carries the order instead).
- ``model.max_seq_len``: the longest sequence the model accepts (an int; a surgery that removes the position
  embedding may raise it).
- ``model.blocks``: an ``nn.ModuleList`` of blocks; each block computes
  ``x = x + block.attention(block.norm_attention(x))`` then
  ``x = x + block.feed_forward(block.norm_feed_forward(x))``.
- ``block.attention``: ``.num_heads`` (int), ``.causal`` (bool), ``.qkv`` (``nn.Linear(d_model, 3 * d_model)``,
  producing queries, keys and values in that order, each split into ``num_heads`` heads of
  ``d_model // num_heads`` features), ``.out`` (``nn.Linear(d_model, d_model)``) and ``.position_bias``: a
  submodule slot holding ``None`` or a module called as ``position_bias(query, key)`` with query and key of
  shape ``[B, num_heads, S, head_dim]``, returning an additive bias broadcastable to ``[B, num_heads, S, S]``
  that is added to the scaled attention scores (before the causal mask, if any, and the softmax).
- ``block.feed_forward``: ``.up`` (``nn.Linear(d_model, d_ff)``), ``.activation`` (``nn.GELU()``) and
  ``.down`` (``nn.Linear(d_ff, d_model)``), computing ``down(activation(up(x)))``. A replacement (e.g. a gated
  linear unit) is any module mapping ``[..., d_model]`` to ``[..., d_model]``.
- ``model.final_norm`` (``nn.LayerNorm``) and ``model.head`` (``nn.Linear(d_model, vocab_size)``).

``protocol_attribute`` and ``protocol_blocks`` read these slots for a surgery and raise a ``TypeError`` naming
the missing attribute when a model does not follow the protocol.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["has_protocol_blocks", "protocol_attribute", "protocol_blocks"]

_DOCUMENTED = "the transformer structure documented in composer_fn.nn.blocks"


def protocol_attribute(owner: Any, attribute: str, where: str) -> Any:
    """Returns ``owner.attribute``, or raises TypeError naming ``where.attribute`` when ``owner`` lacks it.

    ``where`` is the owner's qualified name in the model (``"model"``, ``"model.blocks.0.attention"``).
    """
    if not hasattr(owner, attribute):
        raise TypeError(
            f"{where} ({type(owner).__name__}) has no attribute {attribute!r}: this surgery needs {_DOCUMENTED} "
            "(CausalLM and MaskedLM follow it)"
        )
    return getattr(owner, attribute)


def has_protocol_blocks(model: object) -> bool:
    """Returns whether ``model`` means to follow the transformer protocol: its ``blocks`` is an ``nn.ModuleList``
    holding a block with an ``attention`` or a ``feed_forward``.

    A model whose ``blocks`` is something else (timm's ``nn.Sequential`` of its own blocks) is not one: surgeries
    of the protocol find nothing in it. One that means to follow it and breaks it gets ``protocol_blocks``'s
    TypeError naming what is missing.
    """
    blocks = getattr(model, "blocks", None) if isinstance(model, nn.Module) else None
    return isinstance(blocks, nn.ModuleList) and any(
        hasattr(block, "attention") or hasattr(block, "feed_forward") for block in blocks
    )


def protocol_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Returns ``(qualified name, block)`` for each of ``model.blocks``; TypeError if the model has none."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__}: expected a torch.nn.Module")
    blocks = protocol_attribute(model, "blocks", "model")
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"model.blocks is a {type(blocks).__name__}: {_DOCUMENTED} needs an nn.ModuleList of blocks")
    return [(f"blocks.{index}", block) for index, block in enumerate(blocks)]
