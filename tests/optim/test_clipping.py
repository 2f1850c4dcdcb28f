"""Clipping transforms: equal to torch's clip_grad_norm_/clip_grad_value_, AGC's per-unit formula, pure, traceable."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from composer_fn.core import random as R
from composer_fn.optim import (
    EmptyState,
    adaptive_clip,
    chain,
    clip_by_global_norm,
    clip_by_value,
    scale,
)

PROPERTY = settings(max_examples=40, deadline=None, database=None)
SHAPES = [(), (1,), (5,), (3, 4), (6, 1), (2, 3, 2, 2), (4, 1, 3)]

seeds = st.integers(0, 2**32 - 1)
shape_lists = st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5)
gradient_scales = st.floats(1e-3, 1e2)
thresholds = st.floats(1e-3, 10.0)


def tensors(
    seed: int, shapes: list[tuple[int, ...]], stream: int, magnitude: float = 1.0
) -> dict[str, Tensor]:
    root = R.fold_in(R.key(seed), stream)
    return {f"p{i}": R.normal(R.fold_in(root, i), shape) * magnitude for i, shape in enumerate(shapes)}


def torch_clipped(grads: dict[str, Tensor], clip) -> dict[str, Tensor]:
    holders = []
    for grad in grads.values():
        holder = torch.zeros_like(grad, requires_grad=True)
        holder.grad = grad.clone()
        holders.append(holder)
    clip(holders)
    return {name: holder.grad for name, holder in zip(grads, holders, strict=True)}


def reference_agc(
    grads: dict[str, Tensor], params: dict[str, Tensor], clipping_threshold: float, eps: float
) -> dict[str, Tensor]:
    """AGC unit by unit in double precision: a unit is a row of the first dimension, or the whole of a vector."""
    result = {}
    for name, grad in grads.items():
        weight = params[name].double()
        g = grad.double()
        units = [(g, weight)] if grad.dim() <= 1 else [(g[i], weight[i]) for i in range(grad.shape[0])]
        clipped = []
        for unit_grad, unit_weight in units:
            grad_norm = math.sqrt(float((unit_grad**2).sum()))
            max_norm = clipping_threshold * max(math.sqrt(float((unit_weight**2).sum())), eps)
            clipped.append(unit_grad * (max_norm / grad_norm if grad_norm > max_norm else 1.0))
        result[name] = (clipped[0] if grad.dim() <= 1 else torch.stack(clipped)).to(grad.dtype)
    return result


def composer_agc(
    grads: dict[str, Tensor], params: dict[str, Tensor], clipping_threshold: float
) -> dict[str, Tensor]:
    """Composer's ``_get_clipped_gradient_coeff``: ``clamp(nan_to_num(λ‖w‖ᵤ / ‖g‖ᵤ, nan=1), max=1)``."""

    def unit_norm(tensor: Tensor) -> Tensor:
        if tensor.dim() <= 1:
            return torch.linalg.vector_norm(tensor, dim=0)
        return torch.linalg.vector_norm(tensor, dim=tuple(range(1, tensor.dim())), keepdim=True)

    result = {}
    for name, grad in grads.items():
        coefficient = (unit_norm(params[name]) * clipping_threshold).div(unit_norm(grad))
        result[name] = grad * coefficient.nan_to_num(nan=1.0).clamp(max=1.0)
    return result


def assert_all_close(actual: dict[str, Tensor], expected: dict[str, Tensor], tolerance: float = 1e-6) -> None:
    assert list(actual) == list(expected)
    for name in expected:
        assert actual[name].shape == expected[name].shape and actual[name].dtype == expected[name].dtype, name
        torch.testing.assert_close(actual[name], expected[name], rtol=tolerance, atol=tolerance, msg=name)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, thresholds)
def test_clip_by_global_norm_equals_torch_clip_grad_norm(seed, shapes, magnitude, max_norm) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    clipped, state = clip_by_global_norm(max_norm).update(grads, EmptyState())
    expected = torch_clipped(grads, lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm))
    assert state == EmptyState()
    assert_all_close(clipped, expected)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, thresholds)
def test_clip_by_value_equals_torch_clip_grad_value(seed, shapes, magnitude, max_value) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    clipped, _ = clip_by_value(max_value).update(grads, EmptyState())
    expected = torch_clipped(grads, lambda ps: torch.nn.utils.clip_grad_value_(ps, max_value))
    assert_all_close(clipped, expected, tolerance=0.0)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, st.floats(1e-3, 1.0), st.sampled_from([0.0, 1e-3, 0.5]))
def test_adaptive_clip_follows_the_per_unit_formula(seed, shapes, magnitude, clipping_threshold, eps) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    clipped, _ = adaptive_clip(clipping_threshold, eps).update(grads, EmptyState(), params)
    assert_all_close(clipped, reference_agc(grads, params, clipping_threshold, eps), tolerance=1e-5)


@PROPERTY
@given(
    seeds,
    shape_lists,
    gradient_scales,
    st.floats(1e-3, 1.0),
    st.sampled_from(["weights", "gradient", "both"]),
)
def test_adaptive_clip_without_eps_is_composers_apply_agc(
    seed, shapes, magnitude, clipping_threshold, zero
) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    # Zero units are where 0/0 and x/0 arise: Composer zeroes a gradient whose weights are zero and keeps the rest.
    if zero in ("weights", "both"):
        params["p0"] = torch.zeros_like(params["p0"])
    if zero in ("gradient", "both"):
        grads["p0"] = torch.zeros_like(grads["p0"])
    clipped, _ = adaptive_clip(clipping_threshold, eps=0.0).update(grads, EmptyState(), params)
    assert_all_close(clipped, composer_agc(grads, params, clipping_threshold), tolerance=1e-5)


def test_adaptive_clip_keeps_a_zero_initialised_bias_trainable_with_eps() -> None:
    grads = {"bias": torch.full((4,), 0.5)}
    params = {"bias": torch.zeros(4)}
    with_eps, _ = adaptive_clip(0.01).update(grads, EmptyState(), params)
    without_eps, _ = adaptive_clip(0.01, eps=0.0).update(grads, EmptyState(), params)
    torch.testing.assert_close(torch.linalg.vector_norm(with_eps["bias"]), torch.tensor(0.01 * 1e-3))
    assert torch.equal(without_eps["bias"], torch.zeros(4))


TRANSFORMS = {
    "norm": lambda threshold: clip_by_global_norm(threshold),
    "value": lambda threshold: clip_by_value(threshold),
    "adaptive": lambda threshold: adaptive_clip(threshold),
}


@PROPERTY
@given(seeds, shape_lists, gradient_scales, st.sampled_from(sorted(TRANSFORMS)))
def test_clipping_leaves_its_inputs_unchanged_and_returns_new_tensors(seed, shapes, magnitude, kind) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1)
    snapshot = [
        (tree, name, t, t.clone(), t._version) for tree in (grads, params) for name, t in tree.items()
    ]
    grads_before, params_before = dict(grads), dict(params)
    clipped, _ = TRANSFORMS[kind](0.1).update(grads, EmptyState(), params)
    assert grads == grads_before and params == params_before
    for tree, name, tensor, copy, version in snapshot:
        assert tree[name] is tensor and tensor._version == version and torch.equal(tensor, copy), name
    assert all(clipped[name] is not grads[name] for name in grads)


@PROPERTY
@given(seeds, shape_lists, gradient_scales, st.sampled_from(sorted(TRANSFORMS)))
def test_a_threshold_above_every_norm_leaves_the_gradients_unchanged(seed, shapes, magnitude, kind) -> None:
    grads = tensors(seed, shapes, 0, magnitude)
    params = tensors(seed, shapes, 1, magnitude=1.0)
    if kind == "adaptive":
        # A unit's gradient norm is at most its whole gradient's norm; its weight norm at least the smallest unit's.
        smallest = min(
            float(p.norm()) if p.dim() <= 1 else float(p.flatten(1).norm(dim=1).min())
            for p in params.values()
        )
        largest = max(float(g.norm()) for g in grads.values())
        threshold = 2.0 * largest / max(smallest, 1e-3) + 1.0
    else:
        threshold = (
            2.0 * float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads.values()]))) + 1.0
        )
    clipped, _ = TRANSFORMS[kind](threshold).update(grads, EmptyState(), params)
    for name in grads:
        assert torch.equal(clipped[name], grads[name]), name


def test_every_transform_traces_as_one_graph_and_equals_eager() -> None:
    shapes = [(3, 4), (4,), (), (2, 3, 2, 2)]
    grads = tensors(7, shapes, 0, 5.0)
    params = tensors(7, shapes, 1)
    clip = chain(clip_by_value(1.5), adaptive_clip(0.2), clip_by_global_norm(0.5), scale(-0.1))

    def step(grads: dict[str, Tensor], params: dict[str, Tensor]) -> dict[str, Tensor]:
        return clip.update(grads, clip.init(params), params)[0]

    torch._dynamo.reset()
    try:
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(grads, params)
    finally:
        torch._dynamo.reset()
    assert_all_close(compiled, step(grads, params))


def test_bf16_gradients_keep_their_dtype() -> None:
    grads = {name: t.bfloat16() for name, t in tensors(3, [(3, 4), (4,)], 0, 10.0).items()}
    params = tensors(3, [(3, 4), (4,)], 1)
    for kind, make in TRANSFORMS.items():
        clipped, _ = make(0.1).update(grads, EmptyState(), params)
        assert all(clipped[name].dtype == torch.bfloat16 for name in grads), kind


def test_empty_updates_give_empty_updates() -> None:
    for make in TRANSFORMS.values():
        assert make(1.0).update({}, EmptyState(), {}) == ({}, EmptyState())


@pytest.mark.parametrize(
    "make, argument",
    [(clip_by_global_norm, "max_norm"), (clip_by_value, "max_value"), (adaptive_clip, "clipping_threshold")],
)
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_thresholds_must_be_finite_and_positive(make, argument, value) -> None:
    with pytest.raises(ValueError, match=argument):
        make(value)


def test_bad_arguments_name_the_argument_and_value() -> None:
    with pytest.raises(TypeError, match="max_norm must be a real number .*'1'"):
        clip_by_global_norm("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps=-0.1 must be a finite number >= 0"):
        adaptive_clip(0.01, eps=-0.1)
    with pytest.raises(ValueError, match="params=None: adaptive_clip"):
        adaptive_clip(0.01).update({"w": torch.ones(2)}, EmptyState(), None)
    with pytest.raises(ValueError, match="missing \\['v'\\]"):
        adaptive_clip(0.01).update(
            {"w": torch.ones(2)}, EmptyState(), {"w": torch.ones(2), "v": torch.ones(1)}
        )
