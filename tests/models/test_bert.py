"""MaskedLM: shapes, bidirectional attention, the shared protocol, BERT's keyed 80/10/10 masking and the masked loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn.core.random import fold_in, key, normal, randint
from composer_fn.models import init_parameters
from composer_fn.models.bert import IGNORE_INDEX, MaskedLM, mask_tokens, masked_lm_loss
from composer_fn.models.lm import CausalLM
from composer_fn.models.transformer import FeedForward, SelfAttention, TransformerBlock

seeds = st.integers(0, 2**31 - 1)


def _tokens(seed: int, batch: int, length: int, vocab_size: int) -> Tensor:
    return randint(key(seed), 0, vocab_size, (batch, length))


@pytest.mark.parametrize(
    ("batch", "length", "vocab_size", "d_model", "n_heads", "n_layers"),
    [(1, 1, 2, 8, 1, 1), (3, 17, 50, 16, 4, 2), (2, 32, 11, 24, 3, 3)],
)
def test_logits_have_shape_batch_by_sequence_by_vocabulary(
    batch: int, length: int, vocab_size: int, d_model: int, n_heads: int, n_layers: int
) -> None:
    model = MaskedLM(vocab_size, d_model, n_heads, n_layers, 32)
    logits = model(_tokens(0, batch, length, vocab_size))
    assert logits.shape == (batch, length, vocab_size)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@settings(max_examples=10, deadline=None)
@given(seeds, st.integers(2, 16), st.data())
def test_changing_token_t_changes_the_logits_before_t(seed: int, length: int, data: st.DataObject) -> None:
    model = MaskedLM(13, d_model=16, n_heads=2, max_seq_len=16)
    position = data.draw(st.integers(1, length - 1))
    tokens = _tokens(seed, 2, length, 13)
    changed = tokens.clone()
    changed[:, position] = (tokens[:, position] + 1) % 13
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    # Every earlier position of every row sees the change: attention runs both ways.
    earlier = (after[:, :position] - before[:, :position]).abs().amax(dim=-1)
    assert (earlier > 1e-6).all()


def test_the_structure_follows_the_protocol_of_the_causal_model_with_bidirectional_attention() -> None:
    masked = MaskedLM(30, d_model=24, n_heads=3, n_layers=2, max_seq_len=12, d_ff=40)
    causal = CausalLM(30, d_model=24, n_heads=3, n_layers=2, max_seq_len=12, d_ff=40)
    assert [n for n, _ in masked.named_parameters()] == [n for n, _ in causal.named_parameters()]
    assert masked.max_seq_len == 12 and isinstance(masked.position_embedding, nn.Embedding)
    for block in masked.blocks:
        assert isinstance(block, TransformerBlock) and isinstance(block.feed_forward, FeedForward)
        attention = block.attention
        assert isinstance(attention, SelfAttention) and not attention.causal and attention.num_heads == 3
        assert attention.position_bias is None and "position_bias" in attention._modules
    assert all(block.attention.causal for block in causal.blocks)


def test_the_model_starts_from_the_keyed_initialisation_without_the_global_generator() -> None:
    before = torch.random.get_rng_state()
    model = MaskedLM(40, max_seq_len=32)
    model(torch.zeros(2, 16, dtype=torch.int64))
    assert torch.equal(torch.random.get_rng_state(), before)
    expected = init_parameters(model, key(0))
    assert all(torch.equal(p, expected[n]) for n, p in model.named_parameters())


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from([0.15, 0.3, 0.5]))
def test_masking_selects_at_the_rate_and_splits_80_10_10(seed: int, probability: float) -> None:
    vocab_size, mask_id = 1000, 1000
    tokens = _tokens(seed, 64, 512, vocab_size)
    inputs, labels = mask_tokens(
        tokens,
        key=fold_in(key(seed), 1),
        mask_token_id=mask_id,
        vocab_size=vocab_size,
        mlm_probability=probability,
    )
    positions = tokens.numel()
    selected = labels != IGNORE_INDEX
    count = int(selected.sum())
    # Five standard deviations of each binomial count: a false alarm is a one-in-a-million event.
    assert abs(count - positions * probability) < 5 * math.sqrt(positions * probability * (1 - probability))
    masked = int((inputs[selected] == mask_id).sum())
    kept = int((inputs[selected] == tokens[selected]).sum())
    replaced = count - masked - kept
    # A random replacement equals the original with probability 1 / vocab_size, and then counts as kept.
    for observed, share in (
        (masked, 0.8),
        (replaced, 0.1 * (1 - 1 / vocab_size)),
        (kept, 0.1 + 0.1 / vocab_size),
    ):
        assert abs(observed - count * share) < 5 * math.sqrt(count * share * (1 - share)), (observed, share)
    assert int((inputs[selected] >= vocab_size).sum()) == masked


@settings(max_examples=10, deadline=None)
@given(seeds, st.integers(1, 4), st.integers(1, 40), st.integers(2, 30))
def test_labels_are_the_original_tokens_where_selected_and_unselected_inputs_are_untouched(
    seed: int, batch: int, length: int, vocab_size: int
) -> None:
    tokens = _tokens(seed, batch, length, vocab_size)
    original = tokens.clone()
    inputs, labels = mask_tokens(tokens, key=key(seed), mask_token_id=vocab_size, vocab_size=vocab_size)
    assert torch.equal(tokens, original)
    selected = labels != IGNORE_INDEX
    assert torch.equal(labels[selected], tokens[selected])
    assert torch.equal(inputs[~selected], tokens[~selected])
    assert inputs.dtype == labels.dtype == torch.int64 and inputs.shape == labels.shape == tokens.shape
    assert int(inputs.max()) <= vocab_size and int(inputs.min()) >= 0


@settings(max_examples=10, deadline=None)
@given(seeds)
def test_masking_is_a_function_of_the_key(seed: int) -> None:
    tokens = _tokens(seed, 4, 64, 50)
    first = mask_tokens(tokens, key=key(seed), mask_token_id=50, vocab_size=50, mlm_probability=0.3)
    again = mask_tokens(tokens, key=key(seed), mask_token_id=50, vocab_size=50, mlm_probability=0.3)
    other = mask_tokens(
        tokens, key=fold_in(key(seed), 7), mask_token_id=50, vocab_size=50, mlm_probability=0.3
    )
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])


def test_masking_leaves_the_global_generator_alone_and_covers_the_edge_probabilities() -> None:
    tokens = _tokens(1, 3, 20, 9)
    before = torch.random.get_rng_state()
    none_inputs, none_labels = mask_tokens(
        tokens, key=key(2), mask_token_id=9, vocab_size=9, mlm_probability=0.0
    )
    _, all_labels = mask_tokens(tokens, key=key(2), mask_token_id=9, vocab_size=9, mlm_probability=1.0)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(none_inputs, tokens) and (none_labels == IGNORE_INDEX).all()
    assert torch.equal(all_labels, tokens)


@settings(max_examples=10, deadline=None)
@given(seeds, st.integers(1, 4), st.integers(1, 9), st.integers(2, 15))
def test_the_loss_is_the_mean_cross_entropy_over_labelled_positions_only(
    seed: int, batch: int, length: int, vocab_size: int
) -> None:
    logits = normal(fold_in(key(seed), 0), (batch, length, vocab_size))
    tokens = randint(fold_in(key(seed), 1), 0, vocab_size, (batch, length))
    _, labels = mask_tokens(
        tokens, key=fold_in(key(seed), 2), mask_token_id=0, vocab_size=vocab_size, mlm_probability=0.5
    )
    labelled = [(b, s) for b in range(batch) for s in range(length) if labels[b, s] != IGNORE_INDEX]
    loss = masked_lm_loss()(logits, (tokens, labels))
    if not labelled:
        assert float(loss) == 0.0
        return
    reference = torch.stack([F.cross_entropy(logits[b, s], labels[b, s]) for b, s in labelled]).mean()
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    # Logits at unlabelled positions do not count at all.
    ignored = (labels == IGNORE_INDEX)[..., None]
    noisy = torch.where(ignored, logits + normal(fold_in(key(seed), 3), logits.shape) * 10, logits)
    torch.testing.assert_close(masked_lm_loss("labels")(noisy, {"labels": labels}), loss, rtol=0, atol=0)


def test_a_batch_with_nothing_labelled_has_loss_zero_and_gradient_zero() -> None:
    logits = normal(key(0), (2, 5, 7)).requires_grad_()
    labels = torch.full((2, 5), IGNORE_INDEX)
    loss = masked_lm_loss()(logits, (labels, labels))
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad is not None and not logits.grad.any()


def test_training_a_few_steps_lowers_the_masked_loss_on_a_fixed_batch() -> None:
    model = MaskedLM(17, d_model=32, n_heads=4, max_seq_len=32)
    tokens = (torch.arange(32) % 5 + torch.arange(4)[:, None]).remainder(16)
    batch = mask_tokens(tokens, key=key(0), mask_token_id=16, vocab_size=16, mlm_probability=0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = masked_lm_loss()
    losses = []
    for _ in range(30):
        loss = loss_fn(model(batch[0]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize(
    ("arguments", "error", "name"),
    [
        ({"tokens": torch.zeros(2, 3)}, TypeError, "tokens"),
        ({"mask_token_id": -1}, ValueError, "mask_token_id"),
        ({"vocab_size": 0}, ValueError, "vocab_size"),
        ({"mlm_probability": 1.5}, ValueError, "mlm_probability"),
        ({"mlm_probability": "0.1"}, TypeError, "mlm_probability"),
        ({"key": torch.zeros(2)}, ValueError, "key"),
    ],
)
def test_invalid_masking_arguments_raise_naming_the_argument(
    arguments: dict[str, object], error: type[Exception], name: str
) -> None:
    given_arguments: dict[str, object] = {
        "tokens": torch.zeros(2, 3, dtype=torch.int64),
        "key": key(0),
        "mask_token_id": 5,
        "vocab_size": 5,
        **arguments,
    }
    tokens = given_arguments.pop("tokens")
    with pytest.raises(error, match=name):
        mask_tokens(tokens, **given_arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "name"),
    [({"vocab_size": 0}, "vocab_size"), ({"d_model": 10, "n_heads": 4}, "d_model=10"), ({"d_ff": 0}, "d_ff")],
)
def test_invalid_model_arguments_raise_naming_the_argument(arguments: dict[str, int], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        MaskedLM(**{"vocab_size": 10, **arguments})
