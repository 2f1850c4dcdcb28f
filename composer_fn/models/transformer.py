"""The transformer parts the language models share, and the structural protocol model surgery relies on.

``CausalLM`` (``composer_fn.models.lm``) and ``MaskedLM`` (``composer_fn.models.bert``) are both a
``TransformerLM``: token embedding plus a learned position embedding, ``n_layers`` pre-LayerNorm blocks
(self-attention, then a GELU feed-forward, each added back to the residual stream), a final LayerNorm and an
untied linear output head. They differ only in the attention: causal (position ``t`` sees ``0..t``) or
bidirectional (every position sees every other).

Structural protocol (what model surgery may rely on, and must keep when it replaces a part):

- ``model.token_embedding``: ``nn.Embedding(vocab_size, d_model)``.
- ``model.position_embedding``: ``nn.Embedding(max_seq_len, d_model)`` whose row ``t`` is added at position
  ``t``; it may be set to ``None``, and then no position is added (an attention bias such as ALiBi then
  carries the order instead).
- ``model.max_seq_len``: the longest sequence the model accepts (an int; a surgery that removes the position
  embedding may raise it).
- ``model.blocks``: an ``nn.ModuleList`` of ``TransformerBlock``; each block computes
  ``x = x + block.attention(block.norm_attention(x))`` then
  ``x = x + block.feed_forward(block.norm_feed_forward(x))``.
- ``block.attention`` (``SelfAttention``; ``CausalSelfAttention`` in the causal model): ``.num_heads`` (int),
  ``.causal`` (bool), ``.qkv`` (``nn.Linear(d_model, 3 * d_model)``, producing queries, keys and values in
  that order, each split into ``num_heads`` heads of ``d_model // num_heads`` features), ``.out``
  (``nn.Linear(d_model, d_model)``) and ``.position_bias``: a submodule slot holding ``None`` or a module
  called as ``position_bias(query, key)`` with query and key of shape ``[B, num_heads, S, head_dim]``,
  returning an additive bias broadcastable to ``[B, num_heads, S, S]`` that is added to the scaled attention
  scores (before the causal mask, if any, and the softmax).
- ``block.feed_forward`` (``FeedForward``): ``.up`` (``nn.Linear(d_model, d_ff)``), ``.activation``
  (``nn.GELU()``) and ``.down`` (``nn.Linear(d_ff, d_model)``), computing ``down(activation(up(x)))``. A
  replacement (e.g. a gated linear unit) is any module mapping ``[..., d_model]`` to ``[..., d_model]``.
- ``model.final_norm`` (``nn.LayerNorm``) and ``model.head`` (``nn.Linear(d_model, vocab_size)``).

``protocol_attribute`` and ``protocol_blocks`` read these slots for a surgery and raise a ``TypeError`` naming
the missing attribute when a model does not follow the protocol.

There is no dropout: a module called through ``functional_call`` receives no random key unless it registers
one (``composer_fn.models.keyed``), and these models draw nothing at random in their forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core.random import key
from composer_fn.models._build import materialise

__all__ = [
    "SelfAttention",
    "CausalSelfAttention",
    "FeedForward",
    "TransformerBlock",
    "TransformerLM",
    "protocol_attribute",
    "protocol_blocks",
]


class SelfAttention(nn.Module):
    """Multi-head self-attention, causal (each position sees itself and the ones before) or bidirectional."""

    position_bias: nn.Module | None

    def __init__(self, d_model: int, num_heads: int, *, causal: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        # A registered (empty) submodule slot, so that surgery can fill it like any other submodule.
        self.register_module("position_bias", None)

    def forward(self, x: Tensor) -> Tensor:
        """Returns the attention output ``[B, S, d_model]`` for hidden states ``[B, S, d_model]``."""
        batch, length, width = x.shape
        # [B, S, 3, H, Dh] -> three [B, H, S, Dh]: the layout scaled_dot_product_attention expects.
        query, key_, value = (
            self.qkv(x).view(batch, length, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        )
        if self.position_bias is None:
            attended = F.scaled_dot_product_attention(query, key_, value, is_causal=self.causal)
        else:
            bias = self.position_bias(query, key_).to(query.dtype)
            if self.causal:
                # A float mask is added to the scores; the causal part becomes -inf above the diagonal.
                future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
                bias = bias.masked_fill(future, float("-inf"))
            attended = F.scaled_dot_product_attention(query, key_, value, attn_mask=bias)
        return self.out(attended.transpose(1, 2).reshape(batch, length, width))


class CausalSelfAttention(SelfAttention):
    """Multi-head self-attention in which each position attends to itself and the positions before it."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, causal=True)


class FeedForward(nn.Module):
    """The position-wise feed-forward layer ``down(activation(up(x)))``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU()
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Returns ``down(activation(up(x)))``, of the shape of ``x``."""
        return self.down(self.activation(self.up(x)))


class TransformerBlock(nn.Module):
    """A pre-LayerNorm block: attention then feed-forward, each on a residual branch."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, causal: bool = True) -> None:
        super().__init__()
        self.norm_attention = nn.LayerNorm(d_model)
        self.attention = (
            CausalSelfAttention(d_model, num_heads)
            if causal
            else SelfAttention(d_model, num_heads, causal=False)
        )
        self.norm_feed_forward = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        """Returns the hidden states ``[B, S, d_model]`` after the block."""
        x = x + self.attention(self.norm_attention(x))
        return x + self.feed_forward(self.norm_feed_forward(x))


class TransformerLM(nn.Module):
    """A transformer language model following the module's protocol; ``causal`` picks the attention.

    The parameters start as ``init_parameters(model, key(0))``, without touching the global random state;
    draw other values with ``init_parameters(model, key(seed))``.
    """

    position_embedding: nn.Embedding | None

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int | None,
        max_seq_len: int,
        causal: bool,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("n_layers", n_layers),
            ("max_seq_len", max_seq_len),
        ):
            _check_positive(name, value)
        if d_ff is not None:
            _check_positive("d_ff", d_ff)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        width = 4 * d_model if d_ff is None else d_ff
        with torch.device("meta"):
            self.token_embedding = nn.Embedding(vocab_size, d_model)
            self.position_embedding = nn.Embedding(max_seq_len, d_model)
            self.blocks = nn.ModuleList(
                TransformerBlock(d_model, n_heads, width, causal=causal) for _ in range(n_layers)
            )
            self.final_norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size)
        materialise(self, key(0))

    def forward(self, input_ids: Tensor) -> Tensor:
        """Returns logits ``[B, S, vocab_size]`` for token ids ``int64 [B, S]`` with ``S <= max_seq_len``."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids of shape {tuple(input_ids.shape)}: expected [batch, sequence]")
        length = input_ids.shape[1]
        if length > self.max_seq_len:
            raise ValueError(
                f"input_ids of length {length} exceed max_seq_len={self.max_seq_len}; build the model with a "
                "larger max_seq_len or shorten the sequences"
            )
        x = self.token_embedding(input_ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding.weight[:length]
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.head(self.final_norm(x))
        return logits


def protocol_attribute(owner: Any, attribute: str, where: str) -> Any:
    """Returns ``owner.attribute``, or raises TypeError naming ``where.attribute`` when ``owner`` lacks it.

    ``where`` is the owner's qualified name in the model (``"model"``, ``"model.blocks.0.attention"``).
    """
    if not hasattr(owner, attribute):
        raise TypeError(
            f"{where} ({type(owner).__name__}) has no attribute {attribute!r}: this surgery needs the transformer "
            "structure documented in composer_fn.models.transformer (CausalLM and MaskedLM follow it)"
        )
    return getattr(owner, attribute)


def protocol_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Returns ``(qualified name, block)`` for each of ``model.blocks``; TypeError if the model has none."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model={type(model).__name__}: expected a torch.nn.Module")
    blocks = protocol_attribute(model, "blocks", "model")
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(
            f"model.blocks is a {type(blocks).__name__}: the transformer structure documented in "
            "composer_fn.models.transformer needs an nn.ModuleList of blocks"
        )
    return [(f"blocks.{index}", block) for index, block in enumerate(blocks)]


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")
