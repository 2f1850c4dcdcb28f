"""The transformation contract: composition laws, each transform's math, purity, masking and applying."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.utils import _pytree as pytree

from composer_fn.optim import (
    EmptyState,
    GradientTransformation,
    MaskedState,
    ScaleByAdamState,
    ScaleByScheduleState,
    TraceState,
    add_decayed_weights,
    apply_updates,
    apply_updates_,
    chain,
    identity,
    in_layout_of,
    masked,
    named_chain,
    scale,
    scale_by_adam,
    scale_by_schedule,
    trace,
)

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None)
SHAPES = {"encoder.weight": (3, 4), "encoder.bias": (4,), "gain": (), "decoder.weight": (2, 2, 2)}


def tensors(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=generator, dtype=dtype) for name, shape in SHAPES.items()}


def leaves(tree: Any) -> list[Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, Tensor)]


def assert_trees_equal(left: Any, right: Any) -> None:
    assert pytree.tree_structure(left) == pytree.tree_structure(right)
    for a, b in zip(leaves(left), leaves(right), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def multiplier_by_count(count: Tensor) -> Tensor:
    return 1.0 / (1.0 + count.to(torch.float32))


TRANSFORMS: dict[str, Callable[[], GradientTransformation]] = {
    "identity": identity,
    "scale": lambda: scale(-0.3),
    "scale_by_schedule": lambda: scale_by_schedule(multiplier_by_count),
    "add_decayed_weights": lambda: add_decayed_weights(0.1),
    "trace": lambda: trace(0.9, dampening=0.2),
    "trace_nesterov": lambda: trace(0.9, nesterov=True),
    "scale_by_adam": lambda: scale_by_adam(0.9, 0.99, 1e-6),
    "masked": lambda: masked(trace(0.5), {name: name.endswith("weight") for name in SHAPES}),
    "chain": lambda: chain(add_decayed_weights(0.01), scale_by_adam(), scale(-0.1)),
    "named_chain": lambda: named_chain(("momentum", trace(0.9)), ("learning_rate", scale(-0.1))),
}

transform_names = st.sampled_from(sorted(TRANSFORMS))
seeds = st.integers(0, 2**32 - 1)


def run(tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]) -> list[Any]:
    state = tx.init(params)
    outputs = []
    for step_grads in grads:
        updates, state = tx.update(step_grads, state, params)
        outputs.append((updates, state))
    return outputs


@PROPERTY
@given(seed=seeds)
def test_identity_leaves_updates_unchanged(seed: int) -> None:
    grads = tensors(seed)
    updates, state = identity().update(grads, identity().init(tensors(seed + 1)), None)
    assert list(updates) == list(grads)
    assert all(updates[name] is grads[name] for name in grads)
    assert state == EmptyState()


@PROPERTY
@given(first=transform_names, second=transform_names, seed=seeds)
def test_chain_equals_applying_one_transform_then_the_other(first: str, second: str, seed: int) -> None:
    a, b = TRANSFORMS[first](), TRANSFORMS[second]()
    params = tensors(seed)
    grads = [tensors(seed + step + 1) for step in range(3)]
    chained = run(chain(a, b), params, grads)
    state_a, state_b = a.init(params), b.init(params)
    for step_grads, (chained_updates, chained_state) in zip(grads, chained, strict=True):
        middle, state_a = a.update(step_grads, state_a, params)
        expected, state_b = b.update(middle, state_b, params)
        assert list(chained_updates) == list(step_grads)
        assert_trees_equal(chained_updates, expected)
        assert_trees_equal(chained_state, (state_a, state_b))


@PROPERTY
@given(first=transform_names, second=transform_names, seed=seeds)
def test_named_chain_equals_chain_with_state_keyed_by_name(first: str, second: str, seed: int) -> None:
    params = tensors(seed)
    grads = [tensors(seed + step + 1) for step in range(2)]
    positional = run(chain(TRANSFORMS[first](), TRANSFORMS[second]()), params, grads)
    named = run(named_chain(("first", TRANSFORMS[first]()), ("second", TRANSFORMS[second]())), params, grads)
    for (updates, state), (named_updates, named_state) in zip(positional, named, strict=True):
        assert_trees_equal(named_updates, updates)
        assert list(named_state) == ["first", "second"]
        assert_trees_equal((named_state["first"], named_state["second"]), state)


def test_chain_of_nothing_is_the_identity() -> None:
    grads = tensors(0)
    updates, state = chain().update(grads, chain().init(grads), None)
    assert_trees_equal(updates, grads)
    assert state == ()


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_update_leaves_updates_state_and_params_untouched(name: str) -> None:
    tx = TRANSFORMS[name]()
    params, grads = tensors(0), [tensors(1), tensors(2), tensors(3)]
    state = tx.init(params)
    for step_grads in grads[:2]:
        _, state = tx.update(step_grads, state, params)
    inputs = leaves((grads[2], state, params))
    values = [t.clone() for t in inputs]
    versions = [t._version for t in inputs]
    updates, new_state = tx.update(grads[2], state, params)
    assert [t._version for t in inputs] == versions
    assert all(torch.equal(a, b) for a, b in zip(values, inputs, strict=True))
    assert pytree.tree_structure(new_state) == pytree.tree_structure(state)
    assert list(updates) == list(grads[2])


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_counts_are_zero_dimensional_and_start_at_zero(name: str) -> None:
    state = TRANSFORMS[name]().init(tensors(0))
    for count in (leaf for leaf in leaves(state) if leaf.dim() == 0):
        assert count.dtype in (torch.int64, torch.float32) and count.item() == 0


@pytest.mark.parametrize("name", sorted(set(TRANSFORMS) - {"masked"}))
def test_a_transform_over_no_parameters_returns_no_updates(name: str) -> None:
    tx = TRANSFORMS[name]()
    updates, _ = tx.update({}, tx.init({}), {})
    assert updates == {}


def test_masking_out_every_parameter_passes_updates_through() -> None:
    params, grads = tensors(0), tensors(1)
    tx = masked(chain(trace(0.9), scale_by_adam()), {name: False for name in SHAPES})
    state = tx.init(params)
    # Counts are kept per parameter, so the inner transforms keep nothing for no parameters.
    assert leaves(state) == []
    updates, _ = tx.update(grads, state, params)
    assert_trees_equal(updates, grads)


def test_scale_multiplies_every_update() -> None:
    grads = tensors(0)
    updates, _ = scale(-2.5).update(grads, EmptyState(), None)
    for name in grads:
        assert torch.equal(updates[name], grads[name] * -2.5)


def test_add_decayed_weights_adds_scaled_params_and_needs_them() -> None:
    params, grads = tensors(0), tensors(1)
    tx = add_decayed_weights(0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    for name in grads:
        torch.testing.assert_close(updates[name], grads[name] + 0.1 * params[name], rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="params=None"):
        tx.update(grads, tx.init(params), None)


def test_scale_by_schedule_counts_from_zero_and_scales_by_the_multiplier() -> None:
    seen: list[int] = []

    def schedule(count: Tensor) -> Tensor:
        seen.append(int(count))
        return torch.tensor(0.5) ** count

    params = tensors(0)
    tx = scale_by_schedule(schedule)
    state = tx.init(params)
    for step in range(3):
        updates, state = tx.update(params, state, None)
        for name in params:
            torch.testing.assert_close(updates[name], params[name] * 0.5**step, rtol=0, atol=0)
    assert seen == [0, 1, 2]
    assert isinstance(state, ScaleByScheduleState) and state.count.item() == 3


def test_scale_by_schedule_rejects_a_multiplier_that_is_not_a_scalar() -> None:
    tx = scale_by_schedule(lambda count: torch.ones(2))
    with pytest.raises(ValueError, match="0-d"):
        tx.update(tensors(0), tx.init(tensors(0)), None)


@PROPERTY
@given(seed=seeds, momentum=st.floats(0.0, 0.99), dampening=st.floats(0.0, 0.9))
def test_trace_first_buffer_is_the_gradient_then_follows_torch_sgd(
    seed: int, momentum: float, dampening: float
) -> None:
    params = tensors(seed, torch.float64)
    grads = [tensors(seed + step + 1, torch.float64) for step in range(3)]
    outputs = run(trace(momentum, dampening=dampening), params, grads)
    first_updates, first_state = outputs[0]
    assert_trees_equal(first_updates, grads[0])
    assert_trees_equal(first_state.momentum_buffer, grads[0])
    buffers = grads[0]
    for step_grads, (updates, _) in zip(grads[1:], outputs[1:], strict=True):
        buffers = {n: momentum * buffers[n] + (1 - dampening) * step_grads[n] for n in buffers}
        for name in buffers:
            torch.testing.assert_close(updates[name], buffers[name], rtol=1e-12, atol=1e-12)
    assert isinstance(outputs[-1][1], TraceState)
    assert {name: count.item() for name, count in outputs[-1][1].count.items()} == dict.fromkeys(params, 3)


def test_trace_with_nesterov_looks_ahead_along_the_buffer() -> None:
    params, grads = tensors(0, torch.float64), [tensors(1, torch.float64), tensors(2, torch.float64)]
    (first, _), (second, _) = run(trace(0.9, nesterov=True), params, grads)
    for name in params:
        torch.testing.assert_close(first[name], grads[0][name] + 0.9 * grads[0][name])
        buffer = 0.9 * grads[0][name] + grads[1][name]
        torch.testing.assert_close(second[name], grads[1][name] + 0.9 * buffer)


@pytest.mark.parametrize(("b1", "b2", "eps"), [(0.9, 0.999, 1e-8), (0.0, 0.99, 1e-3), (0.5, 0.99999, 0.0)])
def test_scale_by_adam_is_the_bias_corrected_moment_ratio(b1: float, b2: float, eps: float) -> None:
    params = tensors(0, torch.float64)
    grads = [tensors(step + 1, torch.float64) for step in range(4)]
    outputs = run(scale_by_adam(b1, b2, eps), params, grads)
    mu = {name: torch.zeros_like(p) for name, p in params.items()}
    nu = {name: torch.zeros_like(p) for name, p in params.items()}
    for t, (step_grads, (updates, state)) in enumerate(zip(grads, outputs, strict=True), start=1):
        for name, g in step_grads.items():
            mu[name] = b1 * mu[name] + (1 - b1) * g
            nu[name] = b2 * nu[name] + (1 - b2) * g * g
            expected = (mu[name] / (1 - b1**t)) / ((nu[name] / (1 - b2**t)).sqrt() + eps)
            torch.testing.assert_close(updates[name], expected, rtol=1e-10, atol=1e-12)
        assert isinstance(state, ScaleByAdamState)
        assert {name: count.item() for name, count in state.count.items()} == dict.fromkeys(params, t)


def test_masked_transforms_only_the_selected_parameters() -> None:
    params, grads = tensors(0), tensors(1)
    mask = {name: name.endswith("weight") for name in SHAPES}
    tx = masked(scale(3.0), mask)
    updates, state = tx.update(grads, tx.init(params), params)
    assert list(updates) == list(grads)
    for name in grads:
        expected = grads[name] * 3.0 if mask[name] else grads[name]
        assert torch.equal(updates[name], expected)
    assert state == MaskedState(EmptyState())


def test_masked_keeps_inner_state_for_the_selected_parameters_only() -> None:
    params = tensors(0)
    tx = masked(trace(0.9), lambda tree: {name: tensor.dim() >= 2 for name, tensor in tree.items()})
    state = tx.init(params)
    assert sorted(state.inner_state.momentum_buffer) == ["decoder.weight", "encoder.weight"]
    updates, state = tx.update(tensors(1), state, params)
    assert torch.equal(updates["gain"], tensors(1)["gain"])


def test_masked_rejects_masks_that_do_not_name_every_parameter_with_a_bool() -> None:
    params = tensors(0)
    with pytest.raises(ValueError, match="mask"):
        masked(identity(), {"gain": True}).init(params)
    with pytest.raises(TypeError, match="mask"):
        masked(identity(), {name: 1 for name in SHAPES}).init(params)  # type: ignore[misc]


def test_apply_updates_returns_new_params_and_leaves_inputs_alone() -> None:
    params, updates = tensors(0), tensors(1)
    versions = [t._version for t in (*params.values(), *updates.values())]
    new = apply_updates(params, dict(reversed(list(updates.items()))))
    assert list(new) == list(params)
    for name in params:
        assert torch.equal(new[name], params[name] + updates[name])
        assert new[name] is not params[name]
    assert [t._version for t in (*params.values(), *updates.values())] == versions


def test_apply_updates_keeps_each_parameter_dtype() -> None:
    params = {"w": torch.arange(4, dtype=torch.bfloat16)}
    new = apply_updates(params, {"w": torch.full((4,), 0.5)})
    assert new["w"].dtype == torch.bfloat16
    assert torch.equal(new["w"], torch.tensor([0.5, 1.5, 2.5, 3.5], dtype=torch.bfloat16))


def test_apply_updates_in_place_writes_into_the_given_params() -> None:
    params = {name: torch.nn.Parameter(t) for name, t in tensors(0).items()}
    updates = tensors(1)
    expected = {name: p.detach() + updates[name] for name, p in params.items()}
    storage = {name: p.data_ptr() for name, p in params.items()}
    apply_updates_(params, updates)
    for name, p in params.items():
        assert p.data_ptr() == storage[name]
        assert torch.equal(p.detach(), expected[name])


def test_apply_updates_rejects_mismatched_names() -> None:
    params = tensors(0)
    updates = {**tensors(1), "extra": torch.zeros(())}
    with pytest.raises(ValueError, match="extra"):
        apply_updates(params, updates)
    with pytest.raises(ValueError, match="extra"):
        apply_updates_(params, updates)


def test_state_that_does_not_belong_to_the_chain_is_rejected() -> None:
    params = tensors(0)
    with pytest.raises(ValueError, match="state"):
        chain(identity(), identity()).update(params, (EmptyState(),), None)
    with pytest.raises(ValueError, match="state"):
        named_chain(("a", identity())).update(params, {"b": EmptyState()}, None)
    with pytest.raises(ValueError, match="updates"):
        trace(0.9).update({"other": torch.zeros(())}, trace(0.9).init(params), None)


@pytest.mark.parametrize(
    ("build", "error", "argument"),
    [
        (lambda: chain(identity(), "sgd"), TypeError, r"transforms\[1\]"),  # type: ignore[arg-type]
        (lambda: named_chain(("a", identity()), ("a", identity())), ValueError, "'a'"),
        (lambda: named_chain(identity()), TypeError, r"transforms\[0\]"),  # type: ignore[arg-type]
        (lambda: masked(identity(), 3), TypeError, "mask"),  # type: ignore[arg-type]
        (lambda: scale("2"), TypeError, "factor"),  # type: ignore[arg-type]
        (lambda: add_decayed_weights(None), TypeError, "weight_decay"),  # type: ignore[arg-type]
        (lambda: scale_by_schedule(0.1), TypeError, "schedule"),  # type: ignore[arg-type]
        (lambda: trace(-0.1), ValueError, "momentum"),
        (lambda: trace(0.0, nesterov=True), ValueError, "nesterov"),
        (lambda: trace(0.9, nesterov="yes"), TypeError, "nesterov"),  # type: ignore[arg-type]
        (lambda: scale_by_adam(b1=1.0), ValueError, "b1"),
        (lambda: scale_by_adam(b2=-0.5), ValueError, "b2"),
        (lambda: scale_by_adam(eps=float("nan")), ValueError, "eps"),
    ],
)
def test_bad_arguments_raise_errors_naming_them(
    build: Callable[[], GradientTransformation], error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        build()


@given(
    st.permutations(range(4)),
    st.permutations(range(4)),
    st.sampled_from([torch.float32, torch.bfloat16]),
    st.integers(0, 2**16),
)
def test_in_layout_of_gives_the_templates_strides_and_keeps_every_value(
    tensor_order: list[int], template_order: list[int], dtype: torch.dtype, seed: int
) -> None:
    # A tensor laid out in memory as dims ``order`` (outermost first), with the logical shape (2, 3, 4, 5).
    def laid_out(values: Tensor, order: list[int]) -> Tensor:
        return values.permute(*order).contiguous().permute(*[order.index(d) for d in range(4)])

    values = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(seed)).to(dtype)
    given_tensor = laid_out(values, tensor_order)
    template = laid_out(torch.zeros(2, 3, 4, 5), template_order)
    before = given_tensor.clone()
    result = in_layout_of({"w": given_tensor}, {"w": template})["w"]
    assert torch.equal(result, values) and result.dtype == dtype
    assert result.stride() == template.stride()
    assert torch.equal(given_tensor, before)
    if given_tensor.stride() == template.stride():
        assert result is given_tensor
