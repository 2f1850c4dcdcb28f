"""Gradient clipping: the functional is the transform of its type, is pure, and the hook applies it."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.func import functional_call

from composer_fn import GradientClipping, optim
from composer_fn.core import random as R
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.core.event import Event
from composer_fn.functional import apply_gradient_clipping
from composer_fn.optim import apply_updates, sgd
from composer_fn.optim.base import EmptyState
from composer_fn.testing import CHECKS, make_setup, train_steps
from composer_fn.testing.settings import settings_for

PROPERTY = settings(max_examples=40, deadline=None, database=None)
SHAPES = [(), (1,), (5,), (3, 4), (6, 1), (2, 3, 2, 2), (4, 1, 3)]
CLIPPING_TYPES = ["adaptive", "norm", "value"]

seeds = st.integers(0, 2**32 - 1)
shape_lists = st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5)
gradient_scales = st.floats(1e-3, 1e2)
thresholds = st.floats(1e-3, 10.0)


def tensors(
    seed: int, shapes: list[tuple[int, ...]], stream: int, magnitude: float = 1.0
) -> dict[str, Tensor]:
    root = R.fold_in(R.key(seed), stream)
    return {
        f"layer{i}.weight": R.normal(R.fold_in(root, i), shape) * magnitude for i, shape in enumerate(shapes)
    }


TRANSFORMS = {
    "norm": optim.clip_by_global_norm,
    "value": optim.clip_by_value,
    "adaptive": optim.adaptive_clip,
}
"""The gradient transformation of each clipping type; tests/optim/test_clipping.py checks them against torch."""


@PROPERTY
@given(seeds, shape_lists, gradient_scales, thresholds, st.sampled_from(CLIPPING_TYPES))
def test_apply_gradient_clipping_is_the_transform_of_its_type(seed, shapes, magnitude, threshold, kind) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    clipped = apply_gradient_clipping(grads, kind, threshold, params)
    reference, _ = TRANSFORMS[kind](threshold).update(grads, EmptyState(), params)
    assert list(clipped) == list(grads)
    assert all(torch.equal(clipped[name], reference[name]) for name in grads)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, thresholds, st.sampled_from(CLIPPING_TYPES))
def test_apply_gradient_clipping_is_pure(seed, shapes, magnitude, threshold, kind) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    snapshot = [
        (tree, name, t, t.clone(), t._version) for tree in (grads, params) for name, t in tree.items()
    ]
    grads_before, params_before = dict(grads), dict(params)
    clipped = apply_gradient_clipping(grads, kind, threshold, params)
    assert grads == grads_before and params == params_before
    for tree, name, tensor, copy, version in snapshot:
        assert tree[name] is tensor and tensor._version == version and torch.equal(tensor, copy), name
    assert all(clipped[name] is not grads[name] for name in grads)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, st.sampled_from(CLIPPING_TYPES))
def test_a_threshold_above_every_norm_leaves_the_gradients_unchanged(seed, shapes, magnitude, kind) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    total = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads.values()])))
    if kind == "adaptive":
        # A unit's gradient norm is at most the total norm; its weight norm counts as at least 1e-3.
        smallest = min(
            float(p.norm()) if p.dim() <= 1 else float(p.flatten(1).norm(dim=1).min())
            for p in params.values()
        )
        threshold = 2.0 * total / max(smallest, 1e-3) + 1.0
    else:
        threshold = 2.0 * total + 1.0
    clipped = apply_gradient_clipping(grads, kind, threshold, params)
    assert all(torch.equal(clipped[name], grads[name]) for name in grads)


def one_clipped_step(kind: str, threshold: float, seed: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Returns the parameters after one training step with the algorithm, and those computed by hand."""
    setup = make_setup([GradientClipping(kind, threshold)], seed=seed, steps=1)
    trained, _ = train_steps(setup)
    state, (input, target) = setup.state, setup.batches[0]
    leaves = {name: p.detach().requires_grad_() for name, p in state.params.items()}
    buffers = {name: b.clone() for name, b in state.buffers.items()}
    loss = F.cross_entropy(functional_call(setup.static.module, (leaves, buffers), (input,)), target)
    grads = dict(zip(leaves, torch.autograd.grad(loss, tuple(leaves.values())), strict=True))
    clipped = apply_gradient_clipping(grads, kind, threshold, state.params)
    updates, _ = sgd(0.05, momentum=0.9).update(clipped, state.opt, state.params)
    return dict(trained.params), apply_updates(state.params, updates)


@settings(max_examples=6, deadline=None, database=None)
@given(seeds, st.sampled_from(CLIPPING_TYPES), st.sampled_from([1e-3, 0.05, 0.5]))
def test_the_traced_hook_applies_the_functional_before_the_update(seed, kind, threshold) -> None:
    trained, by_hand = one_clipped_step(kind, threshold, seed)
    for name in by_hand:
        torch.testing.assert_close(trained[name], by_hand[name], rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", CLIPPING_TYPES)
def test_clipping_changes_the_step_when_the_threshold_binds(kind) -> None:
    clipped, _ = train_steps(make_setup([GradientClipping(kind, 1e-4)], seed=1, steps=1))
    plain, _ = train_steps(make_setup([], seed=1, steps=1))
    assert any(not torch.allclose(clipped.params[n], plain.params[n]) for n in plain.params)


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "algorithm", [GradientClipping("adaptive", 0.01), GradientClipping("value", 0.01)], ids=repr
)
def test_value_and_adaptive_clipping_honour_the_contract(fresh_compiler, algorithm, check) -> None:
    check(algorithm)


def test_it_runs_at_after_train_batch_only() -> None:
    assert set(GradientClipping().traced_hooks()) == {Event.AFTER_TRAIN_BATCH} and not GradientClipping().host_hooks()
    assert not settings_for("gradient_clipping").stochastic(GradientClipping())


def test_the_record_round_trips_through_its_config_and_repr() -> None:
    for algorithm in (GradientClipping(), GradientClipping("adaptive", 0.01), GradientClipping("value", 2)):
        assert algorithm_from_config(algorithm.to_config()) == algorithm
        assert eval(repr(algorithm)) == algorithm
        assert hash(algorithm) == hash(eval(repr(algorithm)))


def test_defaults_are_norm_clipping_at_0_1() -> None:
    assert (GradientClipping().clipping_type, GradientClipping().clipping_threshold) == ("norm", 0.1)


@pytest.mark.parametrize("clipping_type", ["l2", "Norm", "", None])
def test_an_unknown_clipping_type_is_rejected_with_its_value_and_the_accepted_ones(clipping_type) -> None:
    pattern = f"clipping_type={clipping_type!r} must be one of 'adaptive', 'norm', 'value'"
    with pytest.raises(ValueError, match=re.escape(pattern)):
        GradientClipping(clipping_type=clipping_type)
    with pytest.raises(ValueError, match="clipping_type="):
        apply_gradient_clipping({"w": torch.ones(2)}, clipping_type, 1.0)


@pytest.mark.parametrize("clipping_threshold", [0.0, -1.0, math.nan, math.inf])
def test_a_non_positive_or_non_finite_threshold_is_rejected_with_its_value(clipping_threshold) -> None:
    with pytest.raises(ValueError, match="clipping_threshold"):
        GradientClipping(clipping_threshold=clipping_threshold)
    with pytest.raises(ValueError, match="clipping_threshold"):
        apply_gradient_clipping({"w": torch.ones(2)}, "norm", clipping_threshold)


def test_a_threshold_that_is_not_a_number_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="clipping_threshold must be a real number"):
        GradientClipping(clipping_threshold="0.1")  # type: ignore[arg-type]


def test_adaptive_clipping_needs_the_parameters() -> None:
    with pytest.raises(ValueError, match="params=None: clipping_type='adaptive'"):
        apply_gradient_clipping({"w": torch.ones(2)}, "adaptive", 0.01)


def test_empty_gradients_give_empty_gradients() -> None:
    for kind in CLIPPING_TYPES:
        assert apply_gradient_clipping({}, kind, 1.0, {}) == {}
