"""What the NLP surgeries rewrite in Hugging Face ``transformers`` models: BERT, GPT-2 and Llama.

Nothing here imports ``transformers`` until a model of its own is met (its classes are recognised by name).

- **ALiBi** (``ALIBI_LAYOUTS``): the absolute positions are removed where the model adds them (BERT's
  ``embeddings.position_embeddings`` and GPT-2's ``wpe`` become ``ZeroPositions``; Llama's rotary embedding
  becomes ``NoRotation``, which rotates by zero), and each attention module gains an ``alibi`` child (an
  ``AlibiBias``). The model's ``config._attn_implementation`` becomes ``composer_fn_alibi_sdpa`` or
  ``composer_fn_alibi_eager``: the attention functions registered under those names add the module's bias to
  the scores, merged with the model's causal and padding mask, then run the implementation the model had
  (``sdpa``, or the model's own ``eager_attention_forward``). Flash and flex attention take no additive bias,
  so a model configured for them is refused.
- **Gated linear units**: BERT's ``BertIntermediate`` becomes a ``GatedIntermediate`` and GPT-2's ``GPT2MLP`` a
  ``GatedMLP``. The gate and the input projection are new layers; the block's output projection (and, in
  BERT, its dropout and LayerNorm) stays as it was. Llama's ``LlamaMLP`` is gated already.
- **Low-precision norms**: Llama's ``LlamaRMSNorm`` becomes an ``LPRMSNorm`` (see ``low_precision_layernorm``).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "ALIBI_LAYOUTS",
    "AlibiLayout",
    "GatedIntermediate",
    "GatedMLP",
    "NoRotation",
    "ZeroPositions",
    "alibi_attention_name",
    "is_transformers_model",
    "model_type",
]


def is_transformers_model(model: object) -> bool:
    """Returns whether ``model`` is a module of ``transformers`` (or of a class derived from one) with a config."""
    return (
        isinstance(model, nn.Module)
        and hasattr(model, "config")
        and any(cls.__module__.startswith("transformers.") for cls in type(model).__mro__)
    )


def model_type(model: nn.Module) -> str:
    """Returns ``model.config.model_type`` (``"bert"``, ``"gpt2"``, ``"llama"``, ...)."""
    return str(getattr(model.config, "model_type", type(model).__name__))


def class_named(module: object, names: tuple[str, ...]) -> bool:
    """Returns whether ``module``'s class, or a base of it, is one of ``names`` (``module.qualname``)."""
    return any(f"{cls.__module__}.{cls.__qualname__}" in names for cls in type(module).__mro__)


@dataclass(frozen=True)
class AlibiLayout:
    """Where a model family keeps its positions and its attention.

    ``positions``: the class whose child ``position_attribute`` adds absolute positions (replaced by
    ``ZeroPositions``), or the rotary-embedding class (replaced by ``NoRotation``) when ``position_attribute``
    is None. ``attention``: the attention classes whose scores get the bias. ``length_buffers``: the
    ``positions`` module's index buffers that cap the sequence length, lengthened to ``max_sequence_length``.
    """

    positions: str
    position_attribute: str | None
    attention: tuple[str, ...]
    length_buffers: tuple[str, ...] = ()


ALIBI_LAYOUTS: dict[str, AlibiLayout] = {
    "bert": AlibiLayout(
        "transformers.models.bert.modeling_bert.BertEmbeddings",
        "position_embeddings",
        ("transformers.models.bert.modeling_bert.BertSelfAttention",),
        ("position_ids", "token_type_ids"),
    ),
    "gpt2": AlibiLayout(
        "transformers.models.gpt2.modeling_gpt2.GPT2Model",
        "wpe",
        ("transformers.models.gpt2.modeling_gpt2.GPT2Attention",),
    ),
    "llama": AlibiLayout(
        "transformers.models.llama.modeling_llama.LlamaRotaryEmbedding",
        None,
        ("transformers.models.llama.modeling_llama.LlamaAttention",),
    ),
}
"""The Hugging Face model families ALiBi rewrites, by ``config.model_type``."""

GLU_LAYERS: dict[str, tuple[str, ...]] = {
    "transformers.models.bert.modeling_bert.BertIntermediate": ("dense", "intermediate_act_fn"),
    "transformers.models.gpt2.modeling_gpt2.GPT2MLP": ("c_fc", "act"),
}
"""The feed-forward classes GatedLinearUnits rewrites: the input projection's and the activation's attribute."""

GATED_ALREADY: tuple[str, ...] = ("transformers.models.llama.modeling_llama.LlamaMLP",)
"""Feed-forward classes that are gated linear units already (Llama's SwiGLU)."""


class ZeroPositions(nn.Module):
    """Stands in for a position embedding ALiBi removed: adds nothing, whatever the positions.

    Returns zeros of shape ``[1, ..., 1, dim]``, which broadcast against the token embeddings they are added to,
    in the dtype of the model (its ``zero`` buffer follows ``.to(dtype)``); it holds no parameter.
    """

    zero: Tensor

    def __init__(
        self, dim: int, *, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("zero", torch.zeros(dim, dtype=dtype, device=device), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        """Returns zeros of shape ``[1] * position_ids.dim() + [dim]``."""
        return self.zero.view(*([1] * position_ids.dim()), self.dim)

    def extra_repr(self) -> str:
        """Returns the width ``repr`` shows."""
        return f"dim={self.dim}"


class NoRotation(nn.Module):
    """Stands in for a rotary embedding ALiBi removed: the rotation by angle zero (cosine 1, sine 0).

    ``forward(x, position_ids)`` returns ``(cos, sin)`` of shape ``[batch, sequence, dim]`` in ``x``'s dtype, as
    the rotary embedding did, so queries and keys come out of the rotation unchanged.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Returns ones and zeros of shape ``[*position_ids.shape, dim]`` in ``x``'s dtype and device."""
        shape = (*position_ids.shape, self.dim)
        return x.new_ones(shape), x.new_zeros(shape)

    def extra_repr(self) -> str:
        """Returns the width ``repr`` shows."""
        return f"dim={self.dim}"


class GatedIntermediate(nn.Module):
    """BERT's intermediate layer as a gated linear unit: ``activation(gate(x)) * up(x)``, ``d_model -> d_ff``."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, activation: nn.Module) -> None:
        super().__init__()
        self.gate = gate
        self.up = up
        self.activation = activation

    def forward(self, hidden_states: Tensor) -> Tensor:
        """Returns ``activation(gate(hidden_states)) * up(hidden_states)``."""
        return self.activation(self.gate(hidden_states)) * self.up(hidden_states)


class GatedMLP(GatedIntermediate):
    """GPT-2's MLP as a gated linear unit: ``dropout(c_proj(activation(gate(x)) * up(x)))``.

    ``c_proj`` and ``dropout`` are the MLP's own layers.
    """

    def __init__(
        self, gate: nn.Linear, up: nn.Linear, activation: nn.Module, c_proj: nn.Module, dropout: nn.Module
    ) -> None:
        super().__init__(gate, up, activation)
        self.c_proj = c_proj
        self.dropout = dropout

    def forward(self, hidden_states: Tensor) -> Tensor:
        """Returns ``dropout(c_proj(activation(gate(x)) * up(x)))``."""
        return self.dropout(self.c_proj(super().forward(hidden_states)))


# ---- ALiBi's attention functions ----

_ALIBI_PREFIX = "composer_fn_alibi_"


def alibi_attention_name(implementation: str | None) -> str:
    """Returns the attention implementation ALiBi registers for the model's ``implementation`` (registering it).

    Raises ValueError for an implementation that takes no additive bias (flash, flex attention).
    """
    if implementation is None:
        implementation = "eager"
    if implementation.startswith(_ALIBI_PREFIX):
        return implementation
    if implementation not in ("sdpa", "eager"):
        raise ValueError(
            f"the model's config._attn_implementation={implementation!r}: ALiBi adds a bias to the attention scores, "
            "which only 'sdpa' and 'eager' take; build the model with attn_implementation='sdpa' or 'eager'"
        )
    _register()
    return _ALIBI_PREFIX + implementation


def check_attention_interface(module: nn.Module) -> None:
    """Raises ValueError unless ``module``'s forward calls transformers' attention interface, through which ALiBi
    adds its bias (older releases of some models compute attention in a forward of their own, which would leave
    the model without position information and without the bias)."""
    forward = getattr(type(module), "forward", None)
    # Under its decorators (transformers wraps some forwards to rename deprecated arguments).
    names = getattr(getattr(inspect.unwrap(forward), "__code__", None), "co_names", ()) if forward else ()
    if "ALL_ATTENTION_FUNCTIONS" not in names:
        import transformers  # noqa: PLC0415

        raise ValueError(
            f"{type(module).__name__}.forward of transformers {transformers.__version__} computes attention itself, "
            "not through transformers' attention interface, so ALiBi cannot give it a bias; use a transformers "
            "release whose model calls ALL_ATTENTION_FUNCTIONS (BERT does from 4.54, GPT-2 and Llama from 4.53)"
        )


def _register() -> None:
    from transformers import AttentionInterface  # noqa: PLC0415 (only for models of transformers)

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface  # noqa: PLC0415
    except ImportError as error:  # pragma: no cover - older transformers
        raise ImportError(
            "ALiBi on a Hugging Face model needs transformers' AttentionMaskInterface (transformers>=4.53)"
        ) from error
    for base in ("sdpa", "eager"):
        name = _ALIBI_PREFIX + base
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, _ATTENTION_FUNCTIONS[base])
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])


def _eager_function(module: nn.Module) -> Callable[..., Any]:
    # The model's own eager attention, from the module its attention class is defined in.
    for cls in type(module).__mro__:
        function = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if function is not None:
            return function  # type: ignore[no-any-return]
    raise TypeError(
        f"{type(module).__name__}'s module defines no eager_attention_forward to add ALiBi's bias to"
    )


def _with_bias(
    module: Any, query: Tensor, key: Tensor, attention_mask: Tensor | None, is_causal: bool
) -> Tensor:
    # The module's ALiBi bias [1, heads, q, k] merged with the model's mask: masked scores get the dtype's minimum.
    bias = module.alibi(query, key).to(query.dtype)[None]
    minimum = torch.finfo(query.dtype).min
    if attention_mask is None:
        if not is_causal:
            return bias
        queries = torch.arange(query.shape[-2], device=query.device)
        keys = torch.arange(key.shape[-2], device=query.device)
        return torch.where(queries[:, None] >= keys[None, :], bias, minimum)
    attention_mask = attention_mask[..., : key.shape[-2]]
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, bias, minimum)
    return (attention_mask.to(query.dtype) + bias).clamp_min(minimum)


def _sdpa_with_alibi(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Any]:
    from transformers import AttentionInterface  # noqa: PLC0415

    sdpa: Any = AttentionInterface._global_mapping["sdpa"]
    if not isinstance(module._modules.get("alibi"), nn.Module):
        return sdpa(module, query, key, value, attention_mask, is_causal=is_causal, **kwargs)
    # sdpa's own rule for when it masks causally without a mask.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[-2] > 1 and attention_mask is None
    mask = _with_bias(module, query, key, attention_mask, causal)
    return sdpa(module, query, key, value, mask, is_causal=False, **kwargs)


def _eager_with_alibi(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Any]:
    eager = _eager_function(module)
    if isinstance(module._modules.get("alibi"), nn.Module):
        # The eager functions mask only with the mask they are given, which for causal models holds causality.
        attention_mask = _with_bias(module, query, key, attention_mask, False)
    return eager(module, query, key, value, attention_mask, **kwargs)


_ATTENTION_FUNCTIONS: dict[str, Callable[..., Any]] = {"sdpa": _sdpa_with_alibi, "eager": _eager_with_alibi}
