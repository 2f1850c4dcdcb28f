"""A small causal transformer language model, and its next-token cross-entropy loss.

``CausalLM`` maps token ids ``int64 [B, S]`` to logits ``[B, S, vocab_size]``; the logits at position ``t``
depend on tokens ``0..t`` only. It is a GPT-style decoder: token embedding plus a learned position embedding,
``n_layers`` pre-LayerNorm blocks (causal self-attention, then a GELU feed-forward, each added back to the
residual stream), a final LayerNorm and a linear output head.

The output head is *untied* from the token embedding. The parameters follow PyTorch's default initialisation
(see ``init_parameters``), which draws embeddings from N(0, 1); a head tied to such an embedding would start
with logits of standard deviation about ``sqrt(d_model)``, while an untied ``Linear`` head starts near 0.6.

There is no dropout: a module called through ``functional_call`` receives no random key, and dropout would
have to draw from PyTorch's global generator, which nothing in this project reads.

Structural protocol (what model surgery may rely on, and must keep when it replaces a part):

- ``model.token_embedding``: ``nn.Embedding(vocab_size, d_model)``.
- ``model.position_embedding``: ``nn.Embedding(max_seq_len, d_model)`` whose row ``t`` is added at position
  ``t``; it may be set to ``None``, and then no position is added (an attention bias such as ALiBi then
  carries the order instead).
- ``model.blocks``: an ``nn.ModuleList`` of ``TransformerBlock``; each block computes
  ``x = x + block.attention(block.norm_attention(x))`` then
  ``x = x + block.feed_forward(block.norm_feed_forward(x))``.
- ``block.attention`` (``CausalSelfAttention``): ``.num_heads`` (int), ``.qkv``
  (``nn.Linear(d_model, 3 * d_model)``, producing queries, keys and values in that order, each split into
  ``num_heads`` heads of ``d_model // num_heads`` features), ``.out`` (``nn.Linear(d_model, d_model)``) and
  ``.position_bias``: ``None`` or a module called as ``position_bias(query, key)`` with query and key of shape
  ``[B, num_heads, S, head_dim]``, returning an additive bias broadcastable to ``[B, num_heads, S, S]`` that is
  added to the scaled attention scores (before the causal mask and the softmax).
- ``block.feed_forward`` (``FeedForward``): ``.up`` (``nn.Linear(d_model, d_ff)``), ``.activation``
  (``nn.GELU()``) and ``.down`` (``nn.Linear(d_ff, d_model)``), computing ``down(activation(up(x)))``. A
  replacement (e.g. a gated linear unit) is any module mapping ``[..., d_model]`` to ``[..., d_model]``.
- ``model.final_norm`` (``nn.LayerNorm``) and ``model.head`` (``nn.Linear(d_model, vocab_size)``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core.random import key
from composer_fn.core.state import LossFn, batch_get
from composer_fn.models._build import materialise

__all__ = ["CausalLM", "TransformerBlock", "CausalSelfAttention", "FeedForward", "causal_lm_loss"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position attends to itself and the positions before it."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.position_bias: nn.Module | None = None

    def forward(self, x: Tensor) -> Tensor:
        """Returns the attention output ``[B, S, d_model]`` for hidden states ``[B, S, d_model]``."""
        batch, length, width = x.shape
        # [B, S, 3, H, Dh] -> three [B, H, S, Dh]: the layout scaled_dot_product_attention expects.
        query, key_, value = (
            self.qkv(x).view(batch, length, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        )
        if self.position_bias is None:
            attended = F.scaled_dot_product_attention(query, key_, value, is_causal=True)
        else:
            # A float mask is added to the scores; the causal part becomes -inf above the diagonal.
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            bias = self.position_bias(query, key_).to(query.dtype).masked_fill(future, float("-inf"))
            attended = F.scaled_dot_product_attention(query, key_, value, attn_mask=bias)
        return self.out(attended.transpose(1, 2).reshape(batch, length, width))


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
    """A pre-LayerNorm decoder block: attention then feed-forward, each on a residual branch."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.norm_attention = nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, num_heads)
        self.norm_feed_forward = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        """Returns the hidden states ``[B, S, d_model]`` after the block."""
        x = x + self.attention(self.norm_attention(x))
        return x + self.feed_forward(self.norm_feed_forward(x))


class CausalLM(nn.Module):
    """A GPT-style causal language model; see the module docstring for its structure.

    Args:
        vocab_size: the number of token ids (ids lie in ``[0, vocab_size)``).
        d_model: the width of the residual stream; a multiple of ``n_heads``.
        n_heads: attention heads per block.
        n_layers: the number of blocks.
        d_ff: the feed-forward width; ``4 * d_model`` when None.
        max_seq_len: the longest sequence the position embedding covers.

    The parameters start as ``init_parameters(model, key(0))``, without touching the global random state;
    draw other values with ``init_parameters(model, key(seed))``.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        d_ff: int | None = None,
        max_seq_len: int = 256,
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
            self.position_embedding: nn.Embedding | None = nn.Embedding(max_seq_len, d_model)
            self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, width) for _ in range(n_layers))
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


def causal_lm_loss(target_key: int | str = 1) -> LossFn:
    """Returns ``loss_fn(outputs, batch)``: the mean cross-entropy of logits ``[B, S, V]`` against ``batch[target_key]``.

    The labels ``int64 [B, S]`` hold, at each position, the id of the token that follows; every position of
    every row counts once.
    """

    def loss_fn(outputs: Tensor, batch: Any) -> Tensor:
        labels = batch_get(batch, target_key)
        return F.cross_entropy(outputs.flatten(0, -2), labels.flatten())

    return loss_fn


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")
