"""The in-place optimizer steps equal torch.optim (foreach) and Composer over fifty steps, and the pure form is pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from test_optimizers import (
    ADAM_CASES,
    OPTIMIZERS,
    SGD_CASES,
    SGDW_CASES,
    SOMETIMES,
    SOMETIMES_CASES,
    assert_same_trajectory,
    composer_decoupled_adamw_reference,
    composer_sgdw_reference,
    make_grads,
    make_params,
    run_ours,
    run_torch,
    run_torch_sometimes,
    sometimes,
    warmup_then_cosine,
)
from torch import Tensor
from torch.utils import _pytree as pytree

from composer_fn.optim import (
    GradientTransformation,
    adam,
    adamw,
    decoupled_adamw,
    fused_step,
    scheduled,
    sgd,
    sgdw,
)
from composer_fn.optim.base import merge_state, restrict_state

STEPS = 50
_TORCH_NAMES = {"learning_rate": "lr"}

IMPLEMENTATIONS = ["fused", "foreach"]
"""torch's fused kernels (the default on the CPU and CUDA), or the foreach sequence used on other devices; each
is compared with torch.optim run the same way."""


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "foreach":
        monkeypatch.setattr("composer_fn.optim.fused._FUSED_DEVICES", ())
    return str(request.param)


def run_fused(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    """The parameters after each in-place step on tensors this function owns."""
    assert tx.fused is not None
    owned = {name: p.clone() for name, p in params.items()}
    state = tx.init(owned)
    history = []
    for step_grads in grads:
        state = tx.fused(owned, step_grads, state, 1.0)
        history.append({name: p.clone() for name, p in owned.items()})
    return history


@pytest.mark.parametrize("case", SGD_CASES, ids=list(SGD_CASES))
def test_sgd_in_place_matches_torch_sgd_for_fifty_steps(case: str, implementation: str) -> None:
    hyper = {_TORCH_NAMES.get(k, k): v for k, v in SGD_CASES[case].items()}
    params, grads = make_params(5), make_grads(STEPS, seed=6)
    reference = run_torch(lambda ps: torch.optim.SGD(ps, **{implementation: True}, **hyper), params, grads)
    hyper = SGD_CASES[case]
    assert_same_trajectory(run_fused(sgd(**hyper), params, grads), reference)


@pytest.mark.parametrize("case", ADAM_CASES, ids=list(ADAM_CASES))
@pytest.mark.parametrize(
    ("ours", "theirs"), [(adam, torch.optim.Adam), (adamw, torch.optim.AdamW)], ids=["adam", "adamw"]
)
def test_adam_in_place_matches_torch_for_fifty_steps(
    case: str, ours: Callable[..., Any], theirs: Any, implementation: str
) -> None:
    hyper = ADAM_CASES[case]
    params, grads = make_params(7), make_grads(STEPS, seed=8)
    torch_hyper = {_TORCH_NAMES.get(k, k): v for k, v in hyper.items()}
    reference = run_torch(lambda ps: theirs(ps, **{implementation: True}, **torch_hyper), params, grads)
    assert_same_trajectory(run_fused(ours(**hyper), params, grads), reference)


@pytest.mark.parametrize(
    ("build", "make_torch"),
    [
        (
            lambda: sgd(0.05, momentum=0.9, weight_decay=0.01),
            {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
        ),
        (lambda: adamw(0.01, weight_decay=0.1), {"lr": 0.01, "weight_decay": 0.1}),
    ],
    ids=["sgd", "adamw"],
)
def test_a_scheduled_in_place_step_matches_torch_with_lambda_lr(
    build: Callable[[], GradientTransformation], make_torch: dict[str, float], implementation: str
) -> None:
    multipliers = warmup_then_cosine(STEPS)
    params, grads = make_params(), make_grads(STEPS)
    kind = torch.optim.SGD if "momentum" in make_torch else torch.optim.AdamW
    reference = run_torch(
        lambda ps: kind(ps, **{implementation: True}, **make_torch), params, grads, multipliers
    )
    tx = scheduled(build(), lambda count: multipliers[int(count)])
    assert_same_trajectory(run_fused(tx, params, grads), reference)


def _float32(history: Sequence[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    return [{name: t.float() for name, t in step.items()} for step in history]


@pytest.mark.parametrize("case", SGDW_CASES, ids=list(SGDW_CASES))
def test_sgdw_in_place_matches_composers_loop_for_fifty_steps(case: str) -> None:
    hyper = SGDW_CASES[case]
    multipliers = warmup_then_cosine(STEPS)
    params, grads = make_params(), make_grads(STEPS)
    reference = composer_sgdw_reference(params, grads, **hyper, multipliers=multipliers)
    tx = scheduled(
        sgdw(
            hyper["lr"],
            momentum=hyper["momentum"],
            dampening=hyper["dampening"],
            nesterov=hyper["nesterov"],
            weight_decay=hyper["weight_decay"],
        ),
        lambda count: multipliers[int(count)],
    )
    assert_same_trajectory(run_fused(tx, params, grads), reference)


def test_decoupled_adamw_in_place_matches_composers_loop_for_fifty_steps() -> None:
    multipliers = warmup_then_cosine(STEPS)
    params, grads = make_params(), make_grads(STEPS)
    hyper: dict[str, Any] = {"lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 1e-3}
    reference = composer_decoupled_adamw_reference(params, grads, **hyper, multipliers=multipliers)
    tx = scheduled(
        decoupled_adamw(0.01, betas=(0.9, 0.95), weight_decay=1e-3), lambda count: multipliers[int(count)]
    )
    assert_same_trajectory(run_fused(tx, params, grads), reference)


@pytest.mark.parametrize("name", OPTIMIZERS, ids=list(OPTIMIZERS))
def test_the_in_place_step_computes_what_the_functional_update_computes(name: str) -> None:
    tx = OPTIMIZERS[name]()
    if name == "adamw_scheduled":
        tx = scheduled(adamw(0.01), lambda count: 1.0 / (1.0 + count))
    # Same mathematics, different rounding (torch's in-place order against separate update and sum): compared
    # in float64, where rounding is far below the tolerance, over the full fifty steps.
    params = {n: p.double() for n, p in make_params(3).items()}
    grads = [{n: g.double() for n, g in step.items()} for step in make_grads(STEPS, seed=4)]
    assert_same_trajectory(run_fused(tx, params, grads), run_ours(tx, params, grads), tolerance=1e-12)


@pytest.mark.parametrize("name", ["sgd", "sgdw", "adam", "decoupled_adamw"])
def test_the_pure_step_changes_no_input_and_equals_the_in_place_step(name: str) -> None:
    tx = OPTIMIZERS[name]()
    params, grads = make_params(), make_grads(3)
    state = tx.init(params)
    for step_grads in grads[:2]:
        params, state = fused_step(tx, params, step_grads, state)
    saved = [t.clone() for t in pytree.tree_leaves((params, grads[2], state)) if isinstance(t, Tensor)]
    new_params, new_state = fused_step(tx, params, grads[2], state)
    after = [t for t in pytree.tree_leaves((params, grads[2], state)) if isinstance(t, Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(saved, after, strict=True))
    assert pytree.tree_structure(new_state) == pytree.tree_structure(state)
    owned = {n: p.clone() for n, p in params.items()}
    owned_state = pytree.tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, state)
    owned_state = tx.fused(owned, grads[2], owned_state, 1.0)
    assert all(torch.equal(owned[n], new_params[n]) for n in owned)
    assert all(
        torch.equal(a, b)
        for a, b in zip(pytree.tree_leaves(owned_state), pytree.tree_leaves(new_state), strict=True)
    )


def test_the_in_place_step_keeps_each_parameters_dtype() -> None:
    params = {"half": torch.ones(3, dtype=torch.bfloat16), "full": torch.ones(2, dtype=torch.float64)}
    grads = {
        "half": torch.full((3,), 0.5, dtype=torch.bfloat16),
        "full": torch.full((2,), 0.5, dtype=torch.float64),
    }
    for tx in (sgd(0.1, momentum=0.9), adamw(0.1)):
        owned = {n: p.clone() for n, p in params.items()}
        state = tx.fused(owned, grads, tx.init(owned), 1.0)  # type: ignore[misc]
        assert {n: p.dtype for n, p in owned.items()} == {n: p.dtype for n, p in params.items()}
        assert not torch.equal(owned["full"], params["full"])
        assert pytree.tree_structure(state) == pytree.tree_structure(tx.init(params))


LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


@pytest.mark.parametrize("state_layout", list(LAYOUTS))
@pytest.mark.parametrize("grad_layout", list(LAYOUTS))
@pytest.mark.parametrize("param_layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["sgd", "sgd_nesterov", "adam", "adamw"])
def test_the_in_place_step_pairs_each_element_with_its_own_gradient_and_state_in_any_memory_layout(
    name: str, param_layout: str, grad_layout: str, state_layout: str, implementation: str
) -> None:
    # torch's fused kernels pair elements in memory order: a gradient laid out otherwise than its parameter (as
    # the backward returns one after a permute) must still update each element by its own gradient.
    tx = OPTIMIZERS[name]()
    generator = torch.Generator().manual_seed(3)
    params = {
        "conv": torch.randn(6, 5, 3, 2, generator=generator, dtype=torch.float64),
        "bias": torch.randn(6, generator=generator, dtype=torch.float64),
    }
    grads = [
        {n: torch.randn(p.shape, generator=generator, dtype=torch.float64) for n, p in params.items()}
        for _ in range(3)
    ]
    expected = run_ours(tx, params, grads)

    def laid_out(tensor: Tensor, layout: str) -> Tensor:
        return tensor.contiguous(memory_format=LAYOUTS[layout]) if tensor.dim() == 4 else tensor

    owned = {n: laid_out(p.clone(), param_layout) for n, p in params.items()}
    state = pytree.tree_map(
        lambda t: laid_out(t, state_layout) if isinstance(t, Tensor) else t, tx.init(params)
    )
    history = []
    for step_grads in grads:
        state = tx.fused(owned, {n: laid_out(g, grad_layout) for n, g in step_grads.items()}, state, 1.0)  # type: ignore[misc]
        history.append({n: p.clone() for n, p in owned.items()})
    assert_same_trajectory(history, expected, tolerance=1e-12)


def run_fused_sometimes(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    """The in-place step on the parameters each step has gradients for, with their own state, as the
    training step runs it."""
    assert tx.fused is not None
    owned = {name: p.clone() for name, p in params.items()}
    names = tuple(owned)
    state = tx.init(owned)
    history = []
    for step_grads in grads:
        given = {name: p for name, p in owned.items() if name in step_grads}
        part = tx.fused(given, step_grads, restrict_state(state, names, tuple(given)), 1.0)
        state = merge_state(state, part, names)
        history.append({name: p.clone() for name, p in owned.items()})
    return history


@pytest.mark.parametrize("case", SOMETIMES_CASES, ids=list(SOMETIMES_CASES))
def test_in_place_steps_skip_a_parameter_without_a_gradient_as_torch_does(case: str, implementation: str) -> None:
    build, make_torch = SOMETIMES_CASES[case]
    params, grads = make_params(4), sometimes(make_grads(len(SOMETIMES), seed=5))
    reference = run_torch_sometimes(make_torch, params, grads)
    assert_same_trajectory(run_fused_sometimes(build(), params, grads), reference)
