"""An optimizer's facts beside its (init, update) pair, ``fused`` and ``learning_rate``, survive each
combinator where the combination computes the same, and only there; a kept in-place step computes what the
functional update computes, and what torch.optim computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_optimizers import assert_same_trajectory, make_grads, make_params, run_torch
from torch import Tensor
from torch.utils import _pytree as pytree

from composer_fn.optim import (
    GradientTransformation,
    adam,
    adamw,
    adaptive_clip,
    add_decayed_weights,
    apply_updates,
    chain,
    clip_by_global_norm,
    clip_by_value,
    decoupled_adamw,
    identity,
    masked,
    named_chain,
    scale,
    scale_by_adam,
    scale_by_schedule,
    scheduled,
    sgd,
    sgdw,
    trace,
)

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True, database=None)

PLAIN: dict[str, Callable[[], GradientTransformation]] = {
    "identity": identity,
    "scale": lambda: scale(0.7),
    "scale_by_schedule": lambda: scale_by_schedule(lambda count: 1.0 / (1.0 + count)),
    "add_decayed_weights": lambda: add_decayed_weights(0.05),
    "clip_by_global_norm": lambda: clip_by_global_norm(1.0),
    "clip_by_value": lambda: clip_by_value(0.5),
    "adaptive_clip": lambda: adaptive_clip(0.1),
    "trace": lambda: trace(0.9),
    "scale_by_adam": lambda: scale_by_adam(),
    "masked_decay": lambda: masked(add_decayed_weights(0.1), lambda tree: {k: k.endswith("weight") for k in tree}),
}
"""Transforms without facts: they change gradients (or updates); no in-place step, no rate."""

OPTIMIZERS: dict[str, Callable[[], GradientTransformation]] = {
    "sgd": lambda: sgd(0.05, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov": lambda: sgd(0.05, momentum=0.9, nesterov=True),
    "sgd_plain": lambda: sgd(0.1),
    "sgdw": lambda: sgdw(0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "adam": lambda: adam(0.01, weight_decay=0.01),
    "adamw": lambda: adamw(0.01),
    "decoupled_adamw": lambda: decoupled_adamw(0.01),
    "scheduled_sgd": lambda: scheduled(sgd(0.05, momentum=0.9), lambda count: 0.5 + 0.5 / (1.0 + count)),
}
"""Transforms with both facts."""

EVERY = {**PLAIN, **OPTIMIZERS}
names = st.sampled_from(sorted(EVERY))
optimizer_names = st.sampled_from(sorted(OPTIMIZERS))
plain_names = st.sampled_from(sorted(PLAIN))


def _facts(tx: GradientTransformation) -> tuple[bool, float | None]:
    return tx.fused is not None, tx.learning_rate


def _expected_chain_facts(transforms: list[GradientTransformation]) -> tuple[bool, float | None]:
    """The documented rule: the last transform's fused step; its rate unless one before it has a rate."""
    if not transforms:
        return False, None
    rate = transforms[-1].learning_rate
    if any(t.learning_rate is not None for t in transforms[:-1]):
        rate = None
    return transforms[-1].fused is not None, rate


@PROPERTY
@given(chosen=st.lists(names, max_size=4))
def test_a_chain_keeps_the_last_transforms_fused_step_and_its_rate_when_none_before_it_has_one(
    chosen: list[str],
) -> None:
    transforms = [EVERY[name]() for name in chosen]
    expected = _expected_chain_facts(transforms)
    assert _facts(chain(*transforms)) == expected
    named = [(f"{index}_{name}", t) for index, (name, t) in enumerate(zip(chosen, transforms, strict=True))]
    assert _facts(named_chain(*named)) == expected


@PROPERTY
@given(leading=st.lists(plain_names, max_size=3), optimizer=optimizer_names)
def test_transforms_before_an_optimizer_keep_its_facts_and_transforms_after_it_drop_them(
    leading: list[str], optimizer: str
) -> None:
    inner = OPTIMIZERS[optimizer]()
    before = chain(*(PLAIN[name]() for name in leading), inner)
    assert _facts(before) == (True, inner.learning_rate)
    if leading:
        assert _facts(chain(inner, *(PLAIN[name]() for name in leading))) == (False, None)


@PROPERTY
@given(name=names)
def test_masked_keeps_its_transforms_facts(name: str) -> None:
    inner = EVERY[name]()
    assert _facts(masked(inner, lambda tree: {k: k.startswith("linear") for k in tree})) == _facts(inner)


def test_an_empty_chain_has_no_facts() -> None:
    assert _facts(chain()) == (False, None)
    assert _facts(named_chain()) == (False, None)


def test_two_rates_in_one_chain_leave_the_chain_without_a_rate_but_with_the_last_in_place_step() -> None:
    combined = chain(sgd(0.1), sgd(0.2))
    assert _facts(combined) == (True, None)


Combine = Callable[[list[GradientTransformation], GradientTransformation], GradientTransformation]

COMBINATORS: dict[str, Combine] = {
    "chain": lambda leading, last: chain(*leading, last),
    "named_chain": lambda leading, last: named_chain(
        *((f"leading_{index}", t) for index, t in enumerate(leading)), ("optimizer", last)
    ),
    "masked": lambda leading, last: chain(
        *leading, masked(last, lambda tree: {k: not k.endswith("bias") for k in tree})
    ),
    "nested": lambda leading, last: chain(
        *leading[:1], named_chain(*((str(index), t) for index, t in enumerate(leading[1:])), ("last", last))
    ),
    "scheduled": lambda leading, last: scheduled(chain(*leading, last), lambda count: 1.0 / (1.0 + count)),
}


def _float64(tree: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.double() for name, t in tree.items()}


def _functional(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]], step_scale: float
) -> list[dict[str, Tensor]]:
    """The parameters after each functional update, scaled by ``step_scale``, then applied."""
    state = tx.init(params)
    history = []
    for step_grads in grads:
        updates, state = tx.update(step_grads, state, params)
        params = apply_updates(params, {name: step_scale * u for name, u in updates.items()})
        history.append(params)
    return history


def _in_place(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]], step_scale: float
) -> tuple[list[dict[str, Tensor]], Any]:
    """The parameters after each in-place step with ``step_scale`` on tensors this function owns, and the state."""
    assert tx.fused is not None
    owned = {name: p.clone() for name, p in params.items()}
    state = tx.init(owned)
    history = []
    for step_grads in grads:
        state = tx.fused(owned, step_grads, state, step_scale)
        history.append({name: p.clone() for name, p in owned.items()})
    return history, state


@PROPERTY
@given(
    combinator=st.sampled_from(sorted(COMBINATORS)),
    leading=st.lists(plain_names, max_size=3),
    optimizer=optimizer_names,
    step_scale=st.sampled_from([1.0, 0.5, 0.125]),
    seed=st.integers(0, 2**16),
)
def test_a_kept_in_place_step_computes_what_the_combinations_update_computes(
    combinator: str, leading: list[str], optimizer: str, step_scale: float, seed: int
) -> None:
    tx = COMBINATORS[combinator]([PLAIN[name]() for name in leading], OPTIMIZERS[optimizer]())
    params = _float64(make_params(seed))
    grads = [_float64(g) for g in make_grads(6, seed=seed + 1)]
    history, state = _in_place(tx, params, grads, step_scale)
    assert_same_trajectory(history, _functional(tx, params, grads, step_scale), tolerance=1e-12)
    assert pytree.tree_structure(state) == pytree.tree_structure(tx.init(params))


IMPLEMENTATIONS = ["fused", "foreach"]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "foreach":
        monkeypatch.setattr("composer_fn.optim.fused._FUSED_DEVICES", ())
    return str(request.param)


def _run_in_place(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    return _in_place(tx, params, grads, 1.0)[0]


def test_clipping_chained_before_sgd_steps_in_place_as_torch_clips_then_steps(implementation: str) -> None:
    params, grads = make_params(1), make_grads(50, seed=2)
    hyper = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}

    def clipped(ps: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        inner = torch.optim.SGD(ps, **{implementation: True}, **hyper)
        step = inner.step

        def clip_then_step(closure: Any = None) -> Any:
            torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
            return step(closure)

        inner.step = clip_then_step  # type: ignore[method-assign]
        return inner

    reference = run_torch(clipped, params, grads)
    tx = chain(clip_by_global_norm(1.0), sgd(0.05, momentum=0.9, weight_decay=0.01))
    assert tx.learning_rate == 0.05
    assert_same_trajectory(_run_in_place(tx, params, grads), reference)


def test_a_masked_decay_before_adam_steps_in_place_as_torch_adam_with_a_decay_free_group(
    implementation: str,
) -> None:
    params, grads = make_params(3), make_grads(50, seed=4)
    decayed = [name for name in params if name.endswith("weight")]

    def grouped(ps: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        by_name = dict(zip(params, ps, strict=True))
        groups = [
            {"params": [by_name[n] for n in decayed], "weight_decay": 0.05},
            {"params": [p for n, p in by_name.items() if n not in decayed], "weight_decay": 0.0},
        ]
        return torch.optim.Adam(groups, lr=0.01, **{implementation: True})

    reference = run_torch(grouped, params, grads)
    tx = chain(masked(add_decayed_weights(0.05), {name: name in decayed for name in params}), adam(0.01))
    assert tx.learning_rate == 0.01
    assert_same_trajectory(_run_in_place(tx, params, grads), reference)


def test_sgd_masked_to_some_parameters_steps_them_in_place_as_torch_and_passes_the_rest_through(
    implementation: str,
) -> None:
    params, grads = make_params(5), make_grads(20, seed=6)
    chosen = {name: name != "temperature" for name in params}
    trained = {name: p for name, p in params.items() if chosen[name]}
    reference = run_torch(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, **{implementation: True}),
        trained,
        [{name: g for name, g in step.items() if chosen[name]} for step in grads],
    )
    tx = masked(sgd(0.05, momentum=0.9), chosen)
    history = _run_in_place(tx, params, grads)
    assert_same_trajectory([{n: p for n, p in step.items() if chosen[n]} for step in history], reference)
    # The parameter masked out takes its update as it is, as ``update`` passes it through: here the gradient.
    passed = params["temperature"] + torch.stack([step["temperature"] for step in grads]).cumsum(0)
    assert torch.allclose(torch.stack([step["temperature"] for step in history]), passed)
