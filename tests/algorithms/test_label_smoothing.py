"""Label smoothing: the smoothed targets are a distribution, argmax-preserving, and 0 is the identity."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core import random as R
from composer_fn.functional import smooth_labels

seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, 9)
classes = st.integers(2, 12)


def _case(seed: int, batch: int, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = R.normal(R.fold_in(R.key(seed), 0), (batch, num_classes))
    target = R.randint(R.fold_in(R.key(seed), 1), 0, num_classes, (batch,))
    return logits, target


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_smoothed_targets_sum_to_one_and_are_non_negative(seed, batch, num_classes, smoothing) -> None:
    logits, target = _case(seed, batch, num_classes)
    smoothed = smooth_labels(logits, target, smoothing)
    assert smoothed.shape == (batch, num_classes)
    torch.testing.assert_close(smoothed.sum(dim=1), torch.ones(batch), rtol=0, atol=1e-6)
    assert (smoothed >= 0).all()


@given(seeds, sizes, classes)
def test_zero_smoothing_gives_the_one_hot_targets(seed, batch, num_classes) -> None:
    logits, target = _case(seed, batch, num_classes)
    assert torch.equal(smooth_labels(logits, target, 0.0), F.one_hot(target, num_classes).float())


@given(seeds, sizes, classes, st.floats(0.0, 0.999))
def test_smoothing_below_one_minus_one_over_c_keeps_the_argmax(seed, batch, num_classes, fraction) -> None:
    smoothing = fraction * (1 - 1 / num_classes)
    logits, target = _case(seed, batch, num_classes)
    assert torch.equal(smooth_labels(logits, target, smoothing).argmax(dim=1), target)


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_smoothing_follows_the_formula_for_index_and_one_hot_targets(seed, batch, num_classes, smoothing) -> None:
    logits, target = _case(seed, batch, num_classes)
    one_hot = F.one_hot(target, num_classes).float()
    expected = one_hot * (1 - smoothing) + smoothing / num_classes
    torch.testing.assert_close(smooth_labels(logits, target, smoothing), expected)
    torch.testing.assert_close(smooth_labels(logits, one_hot, smoothing), expected)


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_smooth_labels_leaves_its_inputs_unchanged(seed, batch, num_classes, smoothing) -> None:
    logits, target = _case(seed, batch, num_classes)
    copies, versions = (logits.clone(), target.clone()), (logits._version, target._version)
    smooth_labels(logits, target, smoothing)
    assert torch.equal(logits, copies[0]) and torch.equal(target, copies[1])
    assert (logits._version, target._version) == versions


def test_segmentation_targets_are_smoothed_along_the_class_dimension() -> None:
    logits = torch.zeros(2, 3, 4, 4)
    target = torch.arange(32).remainder(3).reshape(2, 4, 4)
    smoothed = smooth_labels(logits, target, 0.3)
    assert smoothed.shape == (2, 3, 4, 4)
    torch.testing.assert_close(smoothed.sum(dim=1), torch.ones(2, 4, 4))


@pytest.mark.parametrize("smoothing", [-0.1, 1.5])
def test_out_of_range_smoothing_is_rejected_with_its_value(smoothing) -> None:
    from composer_fn.algorithms import LabelSmoothing

    with pytest.raises(ValueError, match=f"smoothing={smoothing}"):
        smooth_labels(torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), smoothing)
    with pytest.raises(ValueError, match=f"smoothing={smoothing}"):
        LabelSmoothing(smoothing=smoothing)


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_an_integer_one_hot_target_of_the_logits_rank_is_a_probability_target(
    seed, batch, num_classes, smoothing
) -> None:
    logits, target = _case(seed, batch, num_classes)
    one_hot = F.one_hot(target, num_classes)
    assert one_hot.dtype == torch.int64
    smoothed = smooth_labels(logits, one_hot, smoothing)
    assert smoothed.shape == (batch, num_classes)
    assert torch.equal(smoothed, smooth_labels(logits, target, smoothing))


@pytest.mark.parametrize(
    ("logits_shape", "target_shape"), [((8, 10), (5,)), ((8, 10), (8, 9)), ((2, 3, 4), (2, 5)), ((4, 3), (4, 3, 1, 1))]
)
def test_a_target_that_does_not_fit_the_logits_is_refused_naming_both_shapes(logits_shape, target_shape) -> None:
    target = torch.zeros(target_shape, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape(f"target of shape {target_shape}")) as raised:
        smooth_labels(torch.zeros(logits_shape), target)
    assert str(logits_shape) in str(raised.value)


def test_a_class_index_beyond_the_logits_classes_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"target holds class 7: class indices must lie in \[0, 2\]"):
        smooth_labels(torch.zeros(2, 3), torch.tensor([0, 7]))


@given(seeds, st.integers(1, 3), st.integers(2, 6), st.integers(2, 9), st.floats(0.0, 1.0))
def test_causal_lm_targets_are_smoothed_over_the_vocabulary(seed, batch, length, vocab, smoothing) -> None:
    from composer_fn.algorithms import LabelSmoothing
    from composer_fn.core.state import State, StepCtx

    if length == vocab:
        length += 1  # [B, S, S] logits are read as Composer does: classes along dim 1.
    logits = R.normal(R.fold_in(R.key(seed), 0), (batch, length, vocab))
    tokens = R.randint(R.fold_in(R.key(seed), 1), 0, vocab, (batch, length))
    smoothed = smooth_labels(logits, tokens, smoothing)
    expected = F.one_hot(tokens, vocab).float() * (1 - smoothing) + smoothing / vocab
    assert smoothed.shape == (batch, length, vocab)
    torch.testing.assert_close(smoothed, expected)
    # Probability targets of the logits' shape would be read with classes along dim 1, so the loss is smoothed.
    algorithm = LabelSmoothing(smoothing=smoothing)
    ctx = StepCtx(batch=(tokens, tokens), key=R.key(seed), loss_fn=lambda o, b: o.sum(), outputs=logits)
    state = State.__new__(State)
    _, ctx = algorithm._smooth(state, ctx)
    assert ctx.batch[1] is tokens
    _, ctx = algorithm._restore(state, ctx.replace(loss=F.cross_entropy(logits.movedim(-1, 1), tokens)))
    reference = F.cross_entropy(logits.movedim(-1, 1), tokens, label_smoothing=smoothing)
    torch.testing.assert_close(ctx.loss, reference)
