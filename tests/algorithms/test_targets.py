"""Class-index targets become one-hot probabilities the same way eagerly and compiled, and classes outside\nthe logits' classes are refused by name."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.algorithms._targets import ensure_targets_one_hot
from composer_fn.core import random as R

_compiled = torch.compile(ensure_targets_one_hot, backend="aot_eager", fullgraph=True, dynamic=False)


# A few shapes (each compiles once): class indices [B], per-token [B, T], per-pixel [B, H, W].
@pytest.mark.parametrize(("num_classes", "dims"), [(5, ()), (3, (4,)), (4, (2, 3))])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_compiled_one_hot_equals_the_eager_one_for_any_target_shape(
    num_classes: int, dims: tuple[int, ...], seed: int
) -> None:
    target = R.randint(R.key(seed), 0, num_classes, (3, *dims))
    eager = ensure_targets_one_hot(target, num_classes)
    assert eager.shape == (3, num_classes, *dims) and eager.dtype == torch.float32
    assert torch.equal(eager.sum(dim=1), torch.ones(3, *dims))
    assert torch.equal(_compiled(target, num_classes), eager)


@pytest.mark.parametrize("label", [5, 7, -1])
def test_a_class_outside_the_classes_is_refused_naming_the_class_and_the_range(label: int) -> None:
    with pytest.raises(ValueError, match=rf"target holds class {label}: class indices must lie in \[0, 4\]"):
        ensure_targets_one_hot(torch.tensor([0, label]), 5)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_class_last_one_hot_puts_the_classes_last_eagerly_and_compiled(seed: int) -> None:
    target = R.randint(R.key(seed), 0, 6, (2, 3))
    eager = ensure_targets_one_hot(target, 6, class_last=True)
    assert torch.equal(eager, torch.nn.functional.one_hot(target, 6).float())
    compiled = torch.compile(ensure_targets_one_hot, backend="aot_eager", fullgraph=True, dynamic=False)
    assert torch.equal(compiled(target, 6, class_last=True), eager)
