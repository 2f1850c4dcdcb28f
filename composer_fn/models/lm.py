"""A small causal transformer language model, and its next-token cross-entropy loss.

``CausalLM`` maps token ids ``int64 [B, S]`` to logits ``[B, S, vocab_size]``; the logits at position ``t``
depend on tokens ``0..t`` only. It is a GPT-style decoder: token embedding plus a learned position embedding,
``n_layers`` pre-LayerNorm blocks (causal self-attention, then a GELU feed-forward, each added back to the
residual stream), a final LayerNorm and a linear output head. Its structure follows the protocol documented
in ``composer_fn.nn.blocks`` (shared with ``MaskedLM``), which is what model surgery relies on:
``model.position_embedding``, ``model.blocks``, ``block.attention`` (``.qkv``, ``.out``, ``.num_heads``,
``.position_bias``) and ``block.feed_forward``.

The output head is *untied* from the token embedding. The parameters follow PyTorch's default initialisation
(see ``init_parameters``), which draws embeddings from N(0, 1); a head tied to such an embedding would start
with logits of standard deviation about ``sqrt(d_model)``, while an untied ``Linear`` head starts near 0.6.

There is no dropout: a module called through ``functional_call`` receives no random key, and dropout would
have to draw from PyTorch's global generator, which nothing in this project reads.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from composer_fn.core import validate
from composer_fn.core.state import LossFn, batch_get
from composer_fn.models.transformer import CausalSelfAttention, FeedForward, TransformerBlock, TransformerLM

__all__ = ["CausalLM", "TransformerBlock", "CausalSelfAttention", "FeedForward", "causal_lm_loss"]


class CausalLM(TransformerLM):
    """A GPT-style causal language model; see the module docstring for its structure.

    Its arguments (``vocab_size``, ``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len``, ``d_ff``) are
    ``TransformerLM``'s. The parameters start as ``init_parameters(model, key(0))``, without touching the global
    random state; draw other values with ``init_parameters(model, key(seed))``.
    """

    causal = True


def causal_lm_loss(target_key: int | str = 1) -> LossFn:
    """Returns ``loss_fn(outputs, batch)``: the mean cross-entropy of logits ``[B, S, V]`` against ``batch[target_key]``.

    The labels ``int64 [B, S]`` hold, at each position, the id of the token that follows; every position of
    every row counts once. Probability targets ``[B, S, V]`` (smoothed or mixed labels) are taken as well.
    """
    validate.batch_key("target_key", target_key)

    def loss_fn(outputs: Tensor, batch: Any) -> Tensor:
        labels = batch_get(batch, target_key)
        targets = labels.flatten(0, -2) if labels.is_floating_point() else labels.flatten()
        return F.cross_entropy(outputs.flatten(0, -2), targets)

    return loss_fn
