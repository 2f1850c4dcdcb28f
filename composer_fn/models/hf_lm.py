"""Hugging Face causal language models by name, built from a configuration (no weights are downloaded).

``build_causal_lm(name, vocab_size, sequence_length, key=...)`` returns an untrained model of ``transformers``'
``AutoModelForCausalLM`` for the model type ``name`` (``gpt2``, ``llama``, ``gpt_neox``, ``qwen2``, ...), whose
token table has ``vocab_size`` rows and whose position table (where it has one) ``sequence_length`` positions.
``options`` are the configuration's own fields (``n_layer``, ``hidden_size``, ...); a field the configuration does
not have is refused by name. ``gpt2`` and ``llama`` start from the small sizes of ``SMALL`` (about a million
parameters with a vocabulary of 4096, which train on a CPU) and without dropout, as a short pre-training run is
usually configured; every other type starts from its configuration's defaults, which are those of a released
model and large.

The parameters follow the model's own initialisation (GPT-2's N(0, 0.02), for instance), drawn from a generator
seeded from the key (``key(0)`` if None) inside ``torch.random.fork_rng``, so the global random state is left as
it was and the same key gives the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from composer_fn.core import random as R
from composer_fn.core.extras import install_command
from composer_fn.core.random import Key
from composer_fn.core.validate import integer
from composer_fn.nn.init import built_from_key

__all__ = ["build_causal_lm", "causal_lm_names", "SMALL"]

SMALL: Mapping[str, Mapping[str, object]] = {
    "gpt2": {"n_layer": 4, "n_head": 4, "n_embd": 128, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "llama": {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 128, "intermediate_size": 512},
}
"""The starting configuration fields of the model types that have small defaults here."""

_POSITIONS = ("n_positions", "max_position_embeddings")


def _transformers() -> Any:
    try:
        import transformers
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"language models need transformers: {install_command('hf')}") from None
    return transformers


def causal_lm_names() -> tuple[str, ...]:
    """Returns the model types ``build_causal_lm`` accepts (those of ``AutoModelForCausalLM``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def build_causal_lm(
    name: str,
    vocab_size: int,
    sequence_length: int,
    *,
    key: Key | None = None,
    options: Mapping[str, object] | None = None,
    end_of_text: int | None = None,
) -> nn.Module:
    """Returns the untrained causal language model of type ``name`` (see the module docstring).

    ``end_of_text`` becomes the configuration's ``bos_token_id`` and ``eos_token_id`` (the id
    that joins the documents), when given. Raises ValueError naming a type that is not a causal language model
    of ``transformers``, and an option its configuration does not have.
    """
    transformers = _transformers()
    integer("vocab_size", vocab_size, minimum=1)
    integer("sequence_length", sequence_length, minimum=1)
    known = causal_lm_names()
    if name not in known:
        raise ValueError(
            f"model={name!r} is not a causal language model type of transformers; accepted: gpt2, llama, or another "
            f"of AutoModelForCausalLM's {len(known)} types (gpt_neox, qwen2, mistral, ...)"
        )
    given = dict(options or {})
    blank = transformers.AutoConfig.for_model(name)
    unknown = sorted(field for field in given if not hasattr(blank, field))
    if unknown:
        raise ValueError(
            f"model={name!r}: its configuration ({type(blank).__name__}) has no field {', '.join(map(repr, unknown))}; "
            f"it has e.g. {', '.join(sorted(k for k in blank.to_dict() if not k.startswith('_'))[:12])}"
        )
    fields: dict[str, object] = {**SMALL.get(name, {}), **given, "vocab_size": vocab_size}
    # The row length sizes the position table unless the options do; GPT-2's configuration has both names, one an
    # alias of the other, so a table given under either name is kept.
    if not any(positions in given for positions in _POSITIONS):
        fields.update({positions: sequence_length for positions in _POSITIONS if hasattr(blank, positions)})
    if end_of_text is not None:
        fields.update(bos_token_id=end_of_text, eos_token_id=end_of_text)
    try:
        config = transformers.AutoConfig.for_model(name, **fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"model={name!r} does not take the options {given}: {error}") from None
    try:
        model: nn.Module = built_from_key(key if key is not None else R.key(0), lambda: transformers.AutoModelForCausalLM.from_config(config))
    except (TypeError, ValueError) as error:
        raise ValueError(f"model={name!r} with the options {given}: {str(error).splitlines()[0]}") from None
    return model
