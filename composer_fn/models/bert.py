"""A small BERT-style masked language model, BERT's keyed token masking, and the masked-token loss.

``MaskedLM`` maps token ids ``int64 [B, S]`` to logits ``[B, S, vocab_size]``; every position sees every
other (bidirectional attention). Its structure is the protocol of ``composer_fn.nn.blocks``, the one
``CausalLM`` follows, so the same surgeries (ALiBi, gated linear units, low-precision LayerNorm) apply to
both. Two choices differ from the original BERT and are deliberate:

- *pre*-LayerNorm blocks (``x + attention(norm(x))``) with a final LayerNorm, as in ``CausalLM``, rather than
  BERT's post-LayerNorm (``norm(x + attention(x))``): the protocol is one for both models, and pre-LN trains
  without a learning-rate warm-up at this scale;
- the output head is a plain ``Linear(d_model, vocab_size)``, untied from the token embedding, without BERT's
  extra dense + GELU + LayerNorm transform before it, and there is no segment (token-type) embedding or
  pooler: the model is for masked-token pre-training on single rows.

``mask_tokens`` applies BERT's masking rule with a key: each position is selected with probability
``mlm_probability``; a selected position becomes ``mask_token_id`` with probability 0.8, a token drawn
uniformly from ``[0, vocab_size)`` with probability 0.1, and stays as it is with probability 0.1. Labels hold
the original token at selected positions and -100 (no loss) elsewhere; ``masked_lm_loss`` averages the
cross-entropy over the selected positions only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.state import LossFn, batch_get
from composer_fn.core.validate import integer, is_integer, is_real, probability
from composer_fn.models.transformer import TransformerLM
from composer_fn.nn.init import require_key

__all__ = ["MaskedLM", "mask_tokens", "masked_lm_loss", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""The label of positions that carry no loss (PyTorch's and Hugging Face's convention)."""

# BERT's split of the selected positions: 80% become the mask token, 10% a random token, 10% stay.
_MASKED_SHARE = 0.8
_RANDOM_SHARE = 0.1


class MaskedLM(TransformerLM):
    """A BERT-style masked language model with bidirectional attention; see the module docstring.

    Its arguments (``vocab_size``, ``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len``, ``d_ff``) are
    ``TransformerLM``'s; ``vocab_size`` counts the mask token. The parameters start as ``init_parameters(model,
    key(0))``, without touching the global random state; draw other values with ``init_parameters(model,
    key(seed))``.
    """

    causal = False


def mask_tokens(
    tokens: Tensor,
    *,
    key: R.Key,
    mask_token_id: int,
    vocab_size: int,
    mlm_probability: float = 0.15,
) -> tuple[Tensor, Tensor]:
    """Returns ``(inputs, labels)``: ``tokens`` masked by BERT's 80/10/10 rule under ``key``; ``tokens`` is untouched.

    Each position is selected independently with probability ``mlm_probability``. A selected position's input
    becomes ``mask_token_id`` (probability 0.8), a token uniform over ``[0, vocab_size)`` (0.1), or keeps its
    token (0.1); its label is the original token. Unselected positions keep their token and have label
    ``IGNORE_INDEX`` (-100). Inputs and labels are ``int64`` of the shape of ``tokens``. The draws are plain
    tensor ops on the key: the same key gives the same masking, eagerly or compiled, on any device.
    """
    if (
        not isinstance(tokens, Tensor)
        or tokens.is_floating_point()
        or tokens.is_complex()
        or tokens.dtype == torch.bool
    ):
        raise TypeError(
            f"tokens of dtype {getattr(tokens, 'dtype', type(tokens).__name__)}: expected an integer tensor"
        )
    key = require_key(key)
    integer("mask_token_id", mask_token_id, minimum=0)
    if not is_integer(vocab_size) or not 1 <= vocab_size <= 2**24:
        raise ValueError(f"vocab_size={vocab_size!r} must be an int in [1, 2**24]")
    if not is_real(mlm_probability):
        raise TypeError(f"mlm_probability={mlm_probability!r} must be a float in [0, 1]")
    probability("mlm_probability", mlm_probability)
    tokens = tokens.long()
    shape = tuple(tokens.shape)
    key = key.to(tokens.device)
    selected = R.uniform(R.fold_in(key, 0), shape) < mlm_probability
    share = R.uniform(R.fold_in(key, 1), shape)
    random_tokens = R.randint(R.fold_in(key, 2), 0, vocab_size, shape)
    masked = selected & (share < _MASKED_SHARE)
    randomised = selected & (share >= _MASKED_SHARE) & (share < _MASKED_SHARE + _RANDOM_SHARE)
    inputs = torch.where(masked, mask_token_id, torch.where(randomised, random_tokens, tokens))
    labels = torch.where(selected, tokens, IGNORE_INDEX)
    return inputs, labels


def masked_lm_loss(target_key: int | str = 1) -> LossFn:
    """Returns ``loss_fn(outputs, batch)``: the mean cross-entropy over the positions whose label is not -100.

    ``outputs`` are logits ``[B, S, V]`` and ``batch[target_key]`` the labels ``int64 [B, S]`` that
    ``mask_tokens`` returns. Positions labelled ``IGNORE_INDEX`` add nothing; a batch with no labelled
    position has loss 0 (not the NaN of a mean over nothing), so a step on it changes nothing.
    """
    validate.batch_key("target_key", target_key)

    def loss_fn(outputs: Tensor, batch: Any) -> Tensor:
        labels = batch_get(batch, target_key).flatten()
        losses = F.cross_entropy(outputs.flatten(0, -2), labels, ignore_index=IGNORE_INDEX, reduction="none")
        counted = (labels != IGNORE_INDEX).sum()
        return losses.sum() / counted.clamp(min=1)

    return loss_fn
