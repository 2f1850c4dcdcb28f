"""The transformer language models' parts: ``TransformerLM``, its blocks, their attention and feed-forward.

``CausalLM`` (``composer_fn.models.lm``) and ``MaskedLM`` (``composer_fn.models.bert``) are both a
``TransformerLM``: token embedding plus a learned position embedding, ``n_layers`` pre-LayerNorm blocks
(self-attention, then a GELU feed-forward, each added back to the residual stream), a final LayerNorm and an
untied linear output head. They differ only in the attention, which each sets with ``causal``: causal
(position ``t`` sees ``0..t``) or bidirectional (every position sees every other).

Their structure is the transformer block protocol of ``composer_fn.nn.blocks``, which model surgery relies
on: ``model.blocks`` holds ``TransformerBlock``s, whose ``attention`` is a ``SelfAttention``
(``CausalSelfAttention`` in the causal model) and whose ``feed_forward`` is a ``FeedForward``.

There is no dropout: a module called through ``functional_call`` receives no random key unless it registers
one (``composer_fn.nn.keyed``), and these models draw nothing at random in their forward.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.core.random import key
from composer_fn.core.validate import integer
from composer_fn.nn.init import materialise

__all__ = [
    "SelfAttention",
    "CausalSelfAttention",
    "FeedForward",
    "TransformerBlock",
    "TransformerLM",
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


def _check_token_ids(input_ids: Tensor, vocab_size: int) -> None:
    # Where reading the ids costs no device synchronisation (eager, on the CPU): an id outside the vocabulary
    # would fail inside the embedding with torch's "index out of range in self".
    if input_ids.device.type != "cpu" or input_ids.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"input_ids hold token {high if high >= vocab_size else low}, outside the model's vocabulary of "
            f"{vocab_size}: expected ids in [0, {vocab_size})"
        )


class TransformerLM(nn.Module):
    """A transformer language model following ``composer_fn.nn.blocks``; a subclass picks the attention (``causal``).

    Args:
        vocab_size: the number of token ids (ids lie in ``[0, vocab_size)``).
        d_model: the width of the residual stream; a multiple of ``n_heads``.
        n_heads: attention heads per block.
        n_layers: the number of blocks.
        max_seq_len: the longest sequence the position embedding covers.
        d_ff: the feed-forward width; ``4 * d_model`` when None.

    The parameters start as ``init_parameters(model, key(0))``, without touching the global random state;
    draw other values with ``init_parameters(model, key(seed))``.
    """

    causal: ClassVar[bool]
    position_embedding: nn.Embedding | None

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        max_seq_len: int = 256,
        d_ff: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("n_layers", n_layers),
            ("max_seq_len", max_seq_len),
        ):
            integer(name, value, minimum=1)
        if d_ff is not None:
            integer("d_ff", d_ff, minimum=1)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        width = 4 * d_model if d_ff is None else d_ff
        with torch.device("meta"):
            self.token_embedding = nn.Embedding(vocab_size, d_model)
            self.position_embedding = nn.Embedding(max_seq_len, d_model)
            self.blocks = nn.ModuleList(
                TransformerBlock(d_model, n_heads, width, causal=self.causal) for _ in range(n_layers)
            )
            self.final_norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size)
        materialise(self, key(0))

    def forward(self, input_ids: Tensor) -> Tensor:
        """Returns logits ``[B, S, vocab_size]`` for token ids ``int64 [B, S]`` with ``S <= max_seq_len``."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids of shape {tuple(input_ids.shape)}: expected [batch, sequence]")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids of dtype {input_ids.dtype}: expected integer token ids (int64)")
        _check_token_ids(input_ids, self.token_embedding.num_embeddings)
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
