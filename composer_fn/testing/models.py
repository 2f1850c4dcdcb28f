"""Tiny versions of the models users bring, with random weights (nothing is downloaded), and batches for them.

Language models (``transformers``): ``tiny_gpt2``, ``tiny_bert_mlm``, ``tiny_bert_classifier`` and
``tiny_llama``, built from configs of a few layers; ``token_batches`` makes right-padded batches as a collator
does (``attention_mask`` 0 and labels ``-100`` at the pads). Vision models (``torchvision``, ``timm``):
``vision_model`` builds one by name at a small width where the family allows it. Each builder seeds PyTorch's
generator from ``seed`` first, so the same call gives the same weights; it imports its library on use.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "LANGUAGE_MODELS",
    "VISION_MODELS",
    "language_model",
    "tiny_bert_classifier",
    "tiny_bert_mlm",
    "tiny_gpt2",
    "tiny_llama",
    "token_batches",
    "vision_model",
]

VOCAB = 64
"""The vocabulary of every tiny language model; token 0 is the pad."""


def _seeded(build: Callable[..., Any]) -> Callable[..., Any]:
    # Runs ``build`` with the global generator forked and seeded from its ``seed`` argument, then restored.
    signature = inspect.signature(build)

    @functools.wraps(build)
    def seeded(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(bound.arguments["seed"])
            return build(*args, **kwargs)

    return seeded


def _transformers() -> Any:
    import transformers  # noqa: PLC0415 (an optional extra, imported on use)

    return transformers


@_seeded
def tiny_gpt2(
    seed: int = 0, *, attn_implementation: str = "sdpa", dropout: float = 0.0, positions: int = 32
) -> Any:
    """Returns a ``GPT2LMHeadModel``: 2 layers, width 32, 4 heads, ``positions`` positions."""
    t = _transformers()
    config = t.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=positions, bos_token_id=0, eos_token_id=0,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, attn_implementation=attn_implementation,
    )  # fmt: skip
    return t.GPT2LMHeadModel(config)


def _bert_config(attn_implementation: str, dropout: float, positions: int, **extra: Any) -> Any:
    return _transformers().BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB,
        max_position_embeddings=positions, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        pad_token_id=0, attn_implementation=attn_implementation, **extra,
    )  # fmt: skip


@_seeded
def tiny_bert_mlm(
    seed: int = 0, *, attn_implementation: str = "sdpa", dropout: float = 0.0, positions: int = 32
) -> Any:
    """Returns a ``BertForMaskedLM``: 2 layers, width 32, 4 heads."""
    return _transformers().BertForMaskedLM(_bert_config(attn_implementation, dropout, positions))


@_seeded
def tiny_bert_classifier(
    seed: int = 0,
    *,
    attn_implementation: str = "sdpa",
    dropout: float = 0.0,
    positions: int = 32,
    num_labels: int = 3,
) -> Any:
    """Returns a ``BertForSequenceClassification`` of ``num_labels`` classes: 2 layers, width 32, 4 heads."""
    config = _bert_config(attn_implementation, dropout, positions, num_labels=num_labels)
    return _transformers().BertForSequenceClassification(config)


@_seeded
def tiny_llama(
    seed: int = 0, *, attn_implementation: str = "sdpa", dropout: float = 0.0, positions: int = 32
) -> Any:
    """Returns a ``LlamaForCausalLM``: 2 layers, width 32, 4 query heads sharing 2 key-value heads."""
    t = _transformers()
    config = t.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=positions, attention_dropout=dropout, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, attn_implementation=attn_implementation,
    )  # fmt: skip
    return t.LlamaForCausalLM(config)


LANGUAGE_MODELS = {
    "gpt2": tiny_gpt2,
    "bert-mlm": tiny_bert_mlm,
    "bert-classification": tiny_bert_classifier,
    "llama": tiny_llama,
}
"""The tiny language models by name."""


def language_model(name: str, seed: int = 0, **options: Any) -> Any:
    """Returns ``LANGUAGE_MODELS[name](seed, **options)``; raises ValueError naming the known models."""
    if name not in LANGUAGE_MODELS:
        raise ValueError(f"name={name!r} must be one of {', '.join(LANGUAGE_MODELS)}")
    return LANGUAGE_MODELS[name](seed, **options)


def token_batches(
    count: int,
    *,
    batch_size: int = 4,
    length: int = 16,
    kind: str = "causal",
    num_labels: int = 3,
    seed: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """Returns ``count`` right-padded token batches of ``[batch_size, length]``, as a collator makes them.

    Every row keeps at least a quarter of its tokens. ``kind``: ``"causal"`` (labels are the tokens, ``-100`` at
    the pads), ``"masked"`` (labels at a random 15% of the kept tokens, at least one per row, ``-100``
    elsewhere) or ``"classification"`` (one label per row, of ``num_labels`` classes).
    """
    if kind not in ("causal", "masked", "classification"):
        raise ValueError(f"kind={kind!r} must be 'causal', 'masked' or 'classification'")
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, VOCAB, (batch_size, length), generator=generator)
        lengths = torch.randint(max(1, length // 4), length + 1, (batch_size,), generator=generator)
        mask = (torch.arange(length) < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, 0)
        if kind == "causal":
            labels = ids.masked_fill(mask == 0, -100)
        elif kind == "masked":
            chosen = (torch.rand(batch_size, length, generator=generator) < 0.15) & (mask == 1)
            chosen[:, 0] = True
            labels = ids.masked_fill(~chosen, -100)
        else:
            labels = torch.randint(0, num_labels, (batch_size,), generator=generator)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


VISION_MODELS = (
    "torchvision/resnet18",
    "torchvision/resnet50",
    "torchvision/mobilenet_v3_small",
    "torchvision/efficientnet_b0",
    "torchvision/convnext_tiny",
    "torchvision/vit_b_16",
    "timm/resnet18",
    "timm/efficientnet_b0",
    "timm/convnext_atto",
    "timm/vit_tiny_patch16_224",
)
"""The vision models ``vision_model`` builds, as ``library/name``."""


@_seeded
def vision_model(name: str, seed: int = 0, *, num_classes: int = 10) -> nn.Module:
    """Returns the model ``name`` (one of ``VISION_MODELS``) with random weights and ``num_classes`` outputs.

    The families that take a width are built small (ViT-B/16: 2 layers of width 64; timm's ViT: 2 layers at
    image size 32); the others are the library's own architecture.
    """
    if name not in VISION_MODELS:
        raise ValueError(f"name={name!r} must be one of {', '.join(VISION_MODELS)}")
    library, _, architecture = name.partition("/")
    if library == "torchvision":
        import torchvision  # noqa: PLC0415

        if architecture == "vit_b_16":
            return torchvision.models.VisionTransformer(
                image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
                num_classes=num_classes,
            )  # fmt: skip
        return torchvision.models.get_model(architecture, weights=None, num_classes=num_classes)  # type: ignore[no-any-return]
    import timm  # noqa: PLC0415

    if architecture.startswith("vit"):
        return timm.create_model(  # type: ignore[no-any-return]
            architecture, pretrained=False, num_classes=num_classes, img_size=32, depth=2
        )
    return timm.create_model(architecture, pretrained=False, num_classes=num_classes)  # type: ignore[no-any-return]
