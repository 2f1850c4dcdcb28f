"""SelectiveBackprop: Composer's schedule, keyed draws by loss rank with the right probabilities, pruned steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms import ProgressiveResizing, SelectiveBackprop
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.time import Timestamp
from composer_fn.functional import (
    select_indices,
    select_using_loss,
    selection_weights,
    should_selective_backprop,
)
from composer_fn.optim import sgd
from composer_fn.testing import make_setup
from composer_fn.trainer.step import make_train_step

seeds = st.integers(0, 2**32 - 1)


@given(st.floats(0, 1, exclude_max=True), st.integers(0, 50), st.floats(0, 1), st.floats(0, 1), st.integers(0, 4))
def test_the_schedule_is_composers(duration, batch_idx, start, end, interrupt) -> None:
    start, end = min(start, end), max(start, end)
    expected = (start <= duration < end) and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)
    assert should_selective_backprop(duration, batch_idx, start, end, interrupt) == expected


@given(seeds, st.integers(1, 40), st.floats(0.05, 1.0))
def test_the_draw_keeps_int_keep_n_distinct_samples_and_is_keyed(seed, size, keep) -> None:
    losses = R.normal(R.key(seed), (size,))
    chosen = select_indices(R.key(seed), losses, keep)
    assert chosen.shape == (max(int(keep * size), 1),)
    assert chosen.unique().numel() == chosen.numel() and 0 <= int(chosen.min()) and int(chosen.max()) < size
    assert torch.equal(chosen, select_indices(R.key(seed), losses, keep))


def test_other_keys_draw_other_samples() -> None:
    losses = torch.arange(32.0)
    draws = {tuple(select_indices(R.key(seed), losses, 0.5).sort().values.tolist()) for seed in range(20)}
    assert len(draws) > 10


def test_one_draw_follows_the_rank_probabilities() -> None:
    # keep = 0.25 of 4 samples draws one: each loss rank must come up with its weight (chi-square, 3 dof).
    losses = torch.tensor([3.0, 0.0, 2.0, 1.0])  # ranks: sample 1 lowest ... sample 0 highest
    trials = 4000
    counts = torch.zeros(4)
    for seed in range(trials):
        counts[select_indices(R.key(seed), losses, 0.25)] += 1
    weights = selection_weights(4, 0.25).float()
    expected = weights[torch.argsort(torch.argsort(losses))] * trials
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 16.3  # p = 0.001 for 3 degrees of freedom


def test_select_using_loss_returns_the_drawn_rows_and_keeps_the_inputs() -> None:
    inputs = R.normal(R.key(0), (16, 5))
    targets = R.randint(R.key(1), 0, 3, (16,))
    model = torch.nn.Linear(5, 3)
    before = inputs.clone()
    pruned_x, pruned_y = select_using_loss(inputs, targets, model, F.cross_entropy, keep=0.5, key=R.key(2))
    with torch.no_grad():
        indices = select_indices(R.key(2), F.cross_entropy(model(inputs), targets, reduction="none"), 0.5)
    assert torch.equal(pruned_x, inputs[indices]) and torch.equal(pruned_y, targets[indices])
    assert torch.equal(inputs, before)
    with pytest.raises(ValueError, match="keep=0"):
        select_using_loss(inputs, targets, model, F.cross_entropy, keep=0, key=R.key(2))


def test_a_pruned_step_trains_on_the_kept_samples_only() -> None:
    setup = make_setup([SelectiveBackprop(start=0.0, interrupt=0, keep=0.5)], batch_size=8)
    seen: list[int] = []

    def loss_fn(outputs, batch):
        seen.append(outputs.shape[0])
        return F.cross_entropy(outputs, batch[1])

    plan = make_plan(setup.algorithms, timestamp=Timestamp().with_max_duration("3ba"))
    assert plan.names(Event.AFTER_DATALOADER) == ("selective_backprop",)
    step = make_train_step(setup.static, plan, loss_fn, sgd(0.1))
    state, _ = step(setup.state, setup.batches[0])
    # The scoring pass calls the loss per sample (vectorized, one row each); the training loss sees 4 rows.
    assert seen == [1, 4]
    assert state.step == 1


def test_it_runs_first_among_the_batch_transforms() -> None:
    plan = make_plan(
        [ProgressiveResizing(), SelectiveBackprop(start=0.0, interrupt=0)],
        timestamp=Timestamp().with_max_duration("10ba"),
    )
    assert plan.names(Event.AFTER_DATALOADER) == ("selective_backprop", "progressive_resizing")


def test_it_declares_what_it_needs_from_the_trainer() -> None:
    assert SelectiveBackprop.requires == {"extra_forward", "per_sample_loss"}
    with pytest.raises(ValueError, match="interrupt=-1"):
        SelectiveBackprop(interrupt=-1)


def test_a_loss_without_a_reduction_keyword_is_refused_before_the_model_runs() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran")

    def mean_loss(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, target)

    with pytest.raises(TypeError, match=r"loss_fun=.*mean_loss.* must take a reduction keyword"):
        select_using_loss(R.uniform(R.key(0), (4, 3)), torch.tensor([0, 1, 2, 0]), model, mean_loss, key=R.key(0))


def test_a_loss_taking_reduction_or_any_keyword_is_accepted() -> None:
    def loss(outputs: torch.Tensor, target: torch.Tensor, **options: str) -> torch.Tensor:
        return F.cross_entropy(outputs, target, **options)

    model = torch.nn.Linear(3, 3)
    input, target = R.uniform(R.key(1), (4, 3)), torch.tensor([0, 1, 2, 0])
    for loss_fun in (loss, F.cross_entropy):
        kept, kept_target = select_using_loss(input, target, model, loss_fun, key=R.key(0))
        assert kept.shape == (2, 3) and kept_target.shape == (2,)
