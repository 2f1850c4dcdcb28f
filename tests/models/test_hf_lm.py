"""Hugging Face causal language models built by type: sized as asked, drawn from the key alone."""

from __future__ import annotations

import pytest
import torch

from composer_fn.core import random as R
from composer_fn.models.hf_lm import build_causal_lm

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_same_key_builds_the_same_model_and_leaves_the_global_generator_alone(name: str) -> None:
    before = torch.random.get_rng_state()
    first = build_causal_lm(name, 300, 24, key=R.key(1))
    second = build_causal_lm(name, 300, 24, key=R.key(1))
    other = build_causal_lm(name, 300, 24, key=R.key(2))
    assert torch.equal(torch.random.get_rng_state(), before)
    pairs = list(zip(first.state_dict().values(), second.state_dict().values(), other.state_dict().values(), strict=True))
    assert all(torch.equal(a, b) for a, b, _ in pairs) and not all(torch.equal(a, c) for a, _, c in pairs)
    logits = first(input_ids=torch.zeros(2, 24, dtype=torch.int64)).logits
    assert logits.shape == (2, 24, 300)


def test_options_set_the_configuration_and_positions_follow_the_row_length() -> None:
    model = build_causal_lm("gpt2", 256, 48, options={"n_layer": 1, "n_embd": 16, "n_head": 2}, end_of_text=0)
    config = model.config
    assert (config.n_layer, config.n_embd, config.n_positions, config.vocab_size, config.eos_token_id) == (1, 16, 48, 256, 0)
    assert config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == 0.0
    with pytest.raises(ValueError, match="has no field 'layers'"):
        build_causal_lm("gpt2", 256, 48, options={"layers": 1})
    with pytest.raises(ValueError, match="'bert' is not a causal language model type|'resnet' is not"):
        build_causal_lm("resnet", 256, 48)


@pytest.mark.parametrize(("name", "field"), [("gpt2", "n_positions"), ("gpt2", "max_position_embeddings"), ("llama", "max_position_embeddings")])
def test_a_position_table_given_in_the_options_is_kept_under_either_of_its_names(name: str, field: str) -> None:
    # GPT-2's configuration names its table n_positions and, as an alias, max_position_embeddings: the row length
    # must not replace a table the options size under one of them.
    model = build_causal_lm(name, 256, 48, options={field: 96})
    assert model.config.max_position_embeddings == 96
    if name == "gpt2":
        assert model.transformer.wpe.weight.shape == (96, model.config.n_embd)
    assert model(input_ids=torch.zeros(1, 96, dtype=torch.int64)).logits.shape == (1, 96, 256)
