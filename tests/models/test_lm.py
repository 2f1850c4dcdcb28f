"""CausalLM: shapes, causality, keyed initialisation, the surgery protocol, its loss, and that it learns."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn.core.random import fold_in, key, normal, randint
from composer_fn.models import init_parameters
from composer_fn.models.lm import CausalLM, CausalSelfAttention, FeedForward, TransformerBlock, causal_lm_loss


def _tokens(seed: int, batch: int, length: int, vocab_size: int) -> Tensor:
    return randint(key(seed), 0, vocab_size, (batch, length))


@pytest.mark.parametrize(
    ("batch", "length", "vocab_size", "d_model", "n_heads", "n_layers"),
    [(1, 1, 2, 8, 1, 1), (3, 17, 50, 16, 4, 2), (2, 32, 11, 32, 8, 3)],
)
def test_logits_have_shape_batch_by_sequence_by_vocabulary(
    batch: int, length: int, vocab_size: int, d_model: int, n_heads: int, n_layers: int
) -> None:
    model = CausalLM(vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_seq_len=32)
    logits = model(_tokens(0, batch, length, vocab_size))
    assert logits.shape == (batch, length, vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@settings(max_examples=15)
@given(st.integers(0, 2**31 - 1), st.integers(2, 24), st.data())
def test_changing_token_t_leaves_the_logits_before_t_unchanged_and_changes_those_from_t(
    seed: int, length: int, data: st.DataObject
) -> None:
    model = CausalLM(13, d_model=16, n_heads=2, max_seq_len=24)
    position = data.draw(st.integers(0, length - 1))
    tokens = _tokens(seed, 2, length, 13)
    changed = tokens.clone()
    changed[:, position] = (tokens[:, position] + 1) % 13
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :position], before[:, :position], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, position], before[:, position])


class _ZeroBias(nn.Module):
    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        return query.new_zeros(query.shape[-2], key.shape[-2])


class _DistancePenalty(nn.Module):
    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        positions = torch.arange(query.shape[-2], device=query.device, dtype=query.dtype)
        return -(positions[:, None] - positions[None, :]).abs()


def test_a_zero_position_bias_computes_the_same_logits_as_no_bias() -> None:
    model = CausalLM(20, d_model=16, n_heads=4, max_seq_len=16)
    tokens = _tokens(3, 2, 16, 20)
    with torch.no_grad():
        plain = model(tokens)
        for block in model.blocks:
            block.attention.position_bias = _ZeroBias()
        biased = model(tokens)
    torch.testing.assert_close(biased, plain, rtol=1e-5, atol=1e-5)


def test_a_position_bias_changes_the_logits_and_keeps_them_causal() -> None:
    model = CausalLM(20, d_model=16, n_heads=4, max_seq_len=16)
    tokens = _tokens(4, 2, 16, 20)
    with torch.no_grad():
        plain = model(tokens)
        for block in model.blocks:
            block.attention.position_bias = _DistancePenalty()
        model.position_embedding = None
        biased = model(tokens)
        changed = tokens.clone()
        changed[:, 9] = (tokens[:, 9] + 1) % 20
        biased_changed = model(changed)
    assert not torch.allclose(biased, plain)
    torch.testing.assert_close(biased_changed[:, :9], biased[:, :9], rtol=0, atol=1e-6)


def test_without_a_position_embedding_a_repeated_token_gives_the_same_logits_at_every_position() -> None:
    model = CausalLM(20, d_model=16, n_heads=4, max_seq_len=16)
    model.position_embedding = None
    tokens = _tokens(5, 1, 8, 20)
    repeated = tokens[:, :1].expand(1, 8)
    with torch.no_grad():
        logits = model(repeated)
        assert model(tokens).shape == (1, 8, 20)
    # With no positions and identical tokens, every prefix attends to copies of one vector.
    torch.testing.assert_close(logits, logits[:, :1].expand_as(logits), rtol=1e-5, atol=1e-5)


def test_the_structure_follows_the_documented_protocol() -> None:
    model = CausalLM(30, d_model=24, n_heads=3, n_layers=2, d_ff=40, max_seq_len=12)
    assert isinstance(model.token_embedding, nn.Embedding) and model.token_embedding.weight.shape == (30, 24)
    positions = model.position_embedding
    assert isinstance(positions, nn.Embedding) and positions.weight.shape == (12, 24)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    for block in model.blocks:
        assert isinstance(block, TransformerBlock)
        assert isinstance(block.attention, CausalSelfAttention) and block.attention.num_heads == 3
        assert block.attention.qkv.weight.shape == (72, 24) and block.attention.out.weight.shape == (24, 24)
        assert block.attention.position_bias is None
        assert isinstance(block.feed_forward, FeedForward)
        assert (block.feed_forward.up.in_features, block.feed_forward.up.out_features) == (24, 40)
        assert (block.feed_forward.down.in_features, block.feed_forward.down.out_features) == (40, 24)
        assert isinstance(block.feed_forward.activation, nn.GELU)
    assert model.head.weight.shape == (30, 24)
    assert model.head.weight.data_ptr() != model.token_embedding.weight.data_ptr()
    assert CausalLM(5, d_model=8, n_heads=2).blocks[0].feed_forward.up.out_features == 32


def test_replacing_the_feed_forward_changes_what_the_block_computes() -> None:
    model = CausalLM(10, d_model=8, n_heads=2, n_layers=1, max_seq_len=8)
    tokens = _tokens(6, 2, 8, 10)
    with torch.no_grad():
        before = model(tokens)
        model.blocks[0].feed_forward = nn.Identity()
        after = model(tokens)
    assert not torch.allclose(before, after)


def test_the_model_starts_from_the_keyed_initialisation_with_key_zero() -> None:
    model = CausalLM(40, max_seq_len=32)
    expected = init_parameters(model, key(0))
    assert all(torch.equal(p, expected[n]) for n, p in model.named_parameters())
    again = CausalLM(40, max_seq_len=32)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))


def test_different_keys_draw_different_parameters_and_equal_keys_equal_ones() -> None:
    model = CausalLM(40, max_seq_len=32)
    first, second, other = (init_parameters(model, key(s)) for s in (7, 7, 8))
    assert all(torch.equal(first[n], second[n]) for n in first)
    drawn = [n for n in first if "norm" not in n]
    assert drawn and all(not torch.equal(first[n], other[n]) for n in drawn if first[n].numel() > 1)


def test_building_and_running_does_not_touch_the_global_random_state() -> None:
    before = torch.random.get_rng_state()
    model = CausalLM(40, max_seq_len=32)
    model(torch.zeros(2, 16, dtype=torch.int64))
    assert torch.equal(torch.random.get_rng_state(), before)


@settings(max_examples=20)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 9), st.integers(2, 15))
def test_causal_lm_loss_is_the_mean_cross_entropy_over_every_position(
    seed: int, batch: int, length: int, vocab_size: int
) -> None:
    logits = normal(fold_in(key(seed), 0), (batch, length, vocab_size))
    labels = randint(fold_in(key(seed), 1), 0, vocab_size, (batch, length))
    reference = torch.stack(
        [F.cross_entropy(logits[b, s], labels[b, s]) for b in range(batch) for s in range(length)]
    ).mean()
    for batch_format, target_key in (((labels, labels), 1), ({"labels": labels}, "labels")):
        loss = causal_lm_loss(target_key)(logits, batch_format)
        torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)


def test_training_a_few_steps_lowers_the_loss_on_a_fixed_batch() -> None:
    model = CausalLM(16, d_model=32, n_heads=4, max_seq_len=32)
    # A periodic sequence: learnable from context alone.
    tokens = (torch.arange(33) % 5 + torch.arange(4)[:, None]).remainder(16)
    batch = (tokens[:, :-1], tokens[:, 1:])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = causal_lm_loss()
    losses = []
    for _ in range(30):
        loss = loss_fn(model(batch[0]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_sequences_longer_than_max_seq_len_are_rejected() -> None:
    model = CausalLM(10, max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(9, dtype=torch.int64))


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_size": 10, "d_model": 10, "n_heads": 4}, "d_model=10"),
        ({"vocab_size": 10, "n_layers": 0}, "n_layers"),
        ({"vocab_size": 10, "d_ff": 0}, "d_ff"),
        ({"vocab_size": 10, "max_seq_len": 2.0}, "max_seq_len"),
        ({"vocab_size": True}, "vocab_size"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(arguments: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CausalLM(**arguments)  # type: ignore[arg-type]
