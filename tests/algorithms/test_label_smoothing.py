"""Label smoothing: the smoothed targets are a distribution, argmax-preserving, and 0 is the identity."""

from __future__ import annotations

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
