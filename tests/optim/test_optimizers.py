"""Optimizers equal their torch.optim and Composer twins step by step, stay pure, and compile."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from composer_fn.optim import (
    CosineAnnealingWithWarmupScheduler,
    GradientTransformation,
    adam,
    adamw,
    apply_updates,
    chain,
    decoupled_adamw,
    scale_by_schedule,
    sgd,
    sgdw,
)
from composer_fn.optim.base import merge_state, restrict_state

TOLERANCE = 1e-6
SHAPES = {"conv.weight": (4, 3, 2, 2), "linear.weight": (5, 3), "linear.bias": (5,), "temperature": ()}

MakeTorchOptimizer = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def make_params(seed: int = 0) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {name: 0.5 * torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def make_grads(steps: int, seed: int = 1) -> list[dict[str, Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}
        for _ in range(steps)
    ]


def warmup_then_cosine(steps: int) -> list[float]:
    """Multipliers for steps 0..steps: linear warmup over 5 steps, then cosine decay to 0.1."""
    multipliers = []
    for step in range(steps + 1):
        if step < 5:
            multipliers.append((step + 1) / 5)
        else:
            progress = (step - 5) / max(1, steps - 5)
            multipliers.append(0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
    return multipliers


def table_schedule(multipliers: Sequence[float]) -> Callable[[Tensor], Tensor]:
    table = torch.tensor(multipliers, dtype=torch.float64)
    return lambda count: table[count]


def run_torch(
    make_optimizer: MakeTorchOptimizer,
    params: dict[str, Tensor],
    grads: list[dict[str, Tensor]],
    multipliers: Sequence[float] | None = None,
) -> list[dict[str, Tensor]]:
    """The parameters after each step of a torch optimizer fed ``grads`` through ``p.grad``."""
    parameters = {name: torch.nn.Parameter(p.clone()) for name, p in params.items()}
    optimizer = make_optimizer(list(parameters.values()))
    scheduler = None
    if multipliers is not None:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: multipliers[step])
    history = []
    for step_grads in grads:
        for name, parameter in parameters.items():
            parameter.grad = step_grads[name].clone()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        history.append({name: p.detach().clone() for name, p in parameters.items()})
    return history


def run_ours(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    state = tx.init(params)
    history = []
    for step_grads in grads:
        updates, state = tx.update(step_grads, state, params)
        params = apply_updates(params, updates)
        history.append(params)
    return history


def assert_same_trajectory(
    ours: list[dict[str, Tensor]], reference: list[dict[str, Tensor]], tolerance: float = TOLERANCE
) -> None:
    assert len(ours) == len(reference)
    for step, (mine, theirs) in enumerate(zip(ours, reference, strict=True)):
        assert list(mine) == list(theirs)
        for name in theirs:
            difference = (mine[name].double() - theirs[name].double()).abs().max().item()
            assert difference <= tolerance, f"step {step}, {name}: max abs difference {difference:.3g}"


def to_float64(tree: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.double() for name, t in tree.items()}


def assert_matches_exact_reference(
    build: Callable[[], GradientTransformation],
    reference: Callable[[dict[str, Tensor], list[dict[str, Tensor]]], list[dict[str, Tensor]]],
    params: dict[str, Tensor],
    grads: list[dict[str, Tensor]],
) -> None:
    """Ours equals ``reference`` run in float64: to rounding in float64, and within 1e-6 in float32.

    The float32 comparison is against the exact trajectory, not against a float32 run of a loop that
    multiplies the weights by ``1 − λ`` rounded to float32 every step: that loop drifts from the exact
    result by about one float32 ulp per step, while our decay enters as the small term ``−λ·p``.
    """
    params64, grads64 = to_float64(params), [to_float64(g) for g in grads]
    exact = reference(params64, grads64)
    assert_same_trajectory(run_ours(build(), params64, grads64), exact, tolerance=1e-12)
    assert_same_trajectory(run_ours(build(), params, grads), exact)


SGD_CASES: dict[str, dict[str, Any]] = {
    "plain": {"learning_rate": 0.05},
    "momentum": {"learning_rate": 0.05, "momentum": 0.9},
    "nesterov": {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True},
    "dampening": {"learning_rate": 0.05, "momentum": 0.8, "dampening": 0.3},
    "weight_decay": {"learning_rate": 0.05, "weight_decay": 0.05},
    "everything": {"learning_rate": 0.03, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
}

_TORCH_SGD_NAMES = {"learning_rate": "lr"}


@pytest.mark.parametrize("case", SGD_CASES, ids=list(SGD_CASES))
def test_sgd_matches_torch_sgd_every_step(case: str) -> None:
    hyper = SGD_CASES[case]
    torch_hyper = {_TORCH_SGD_NAMES.get(k, k): v for k, v in hyper.items()}
    params, grads = make_params(), make_grads(20)
    reference = run_torch(lambda ps: torch.optim.SGD(ps, foreach=True, **torch_hyper), params, grads)
    assert_same_trajectory(run_ours(sgd(**hyper), params, grads), reference)


def test_sgd_with_momentum_matches_torch_for_fifty_steps() -> None:
    params, grads = make_params(2), make_grads(50, seed=3)
    reference = run_torch(
        lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9, dampening=0.1, weight_decay=0.01, foreach=True),
        params,
        grads,
    )
    ours = run_ours(sgd(0.02, momentum=0.9, dampening=0.1, weight_decay=0.01), params, grads)
    assert_same_trajectory(ours, reference)


ADAM_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "tuned": {"learning_rate": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05},
    "no_first_moment": {"learning_rate": 0.005, "betas": (0.0, 0.999)},
}


@pytest.mark.parametrize("case", ADAM_CASES, ids=list(ADAM_CASES))
def test_adam_matches_torch_adam_every_step(case: str) -> None:
    hyper = ADAM_CASES[case]
    torch_hyper = {_TORCH_SGD_NAMES.get(k, k): v for k, v in hyper.items()}
    params, grads = make_params(), make_grads(20)
    reference = run_torch(lambda ps: torch.optim.Adam(ps, foreach=True, **torch_hyper), params, grads)
    assert_same_trajectory(run_ours(adam(**hyper), params, grads), reference)


@pytest.mark.parametrize("case", ADAM_CASES, ids=list(ADAM_CASES))
def test_adamw_matches_torch_adamw_every_step(case: str) -> None:
    hyper = ADAM_CASES[case]
    torch_hyper = {_TORCH_SGD_NAMES.get(k, k): v for k, v in hyper.items()}
    params, grads = make_params(), make_grads(20)
    reference = run_torch(lambda ps: torch.optim.AdamW(ps, foreach=True, **torch_hyper), params, grads)
    assert_same_trajectory(run_ours(adamw(**hyper), params, grads), reference)


@pytest.mark.parametrize("kind", ["ndarray", "tensor", "list"])
def test_betas_as_an_array_of_two_train_as_the_pair_does_as_torch_takes_them(kind: str) -> None:
    import numpy as np

    given = {"ndarray": np.array([0.8, 0.95]), "tensor": torch.tensor([0.8, 0.95], dtype=torch.float64), "list": [0.8, 0.95]}[kind]
    params, grads = make_params(), make_grads(5)
    as_torch_takes = [0.8, 0.95] if kind == "tensor" else given  # torch's foreach AdamW refuses tensor betas
    reference = run_torch(lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=as_torch_takes, foreach=True), params, grads)
    assert_same_trajectory(run_ours(adamw(0.01, betas=given), params, grads), reference)
    with pytest.raises(TypeError, match=r"betas must be a pair \(beta1, beta2\), got array\(\[0.9\]\)"):
        adamw(0.01, betas=np.array([0.9]))


def test_adamw_matches_torch_for_fifty_steps() -> None:
    """Fifty steps agree to rounding in float64, and our float32 run stays within 1e-6 of that trajectory.

    Over many float32 steps torch's AdamW drifts from the exact result by a few 1e-6: it multiplies the
    weights by ``1 − lr·λ`` rounded to float32 every step. Our decay enters as the small term ``−lr·λ·p``,
    which loses far less, so the fair long-run comparison is against torch in float64.
    """
    hyper: dict[str, Any] = {"betas": (0.9, 0.95), "weight_decay": 0.05}
    assert_matches_exact_reference(
        lambda: adamw(0.01, **hyper),
        lambda params, grads: run_torch(
            lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True, **hyper), params, grads
        ),
        make_params(4),
        make_grads(50, seed=5),
    )


def test_sgd_with_schedule_matches_torch_sgd_with_lambda_lr() -> None:
    steps = 20
    params, grads, multipliers = make_params(), make_grads(steps), warmup_then_cosine(steps)
    reference = run_torch(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=True),
        params,
        grads,
        multipliers,
    )
    tx = chain(sgd(0.05, momentum=0.9, weight_decay=0.01), scale_by_schedule(table_schedule(multipliers)))
    assert_same_trajectory(run_ours(tx, params, grads), reference)


def test_adamw_with_schedule_matches_torch_adamw_with_lambda_lr() -> None:
    steps = 20
    params, grads, multipliers = make_params(), make_grads(steps), warmup_then_cosine(steps)
    reference = run_torch(
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True), params, grads, multipliers
    )
    tx = chain(adamw(0.01, weight_decay=0.1), scale_by_schedule(table_schedule(multipliers)))
    assert_same_trajectory(run_ours(tx, params, grads), reference)


def test_adamw_with_a_composer_schedule_matches_torch_adamw_with_lambda_lr() -> None:
    steps = 20
    schedule = CosineAnnealingWithWarmupScheduler(t_warmup="4ba", alpha_f=0.1).resolve(
        steps_per_epoch=10, max_steps=steps
    )
    params, grads = make_params(), make_grads(steps)
    reference = run_torch(
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05, foreach=True),
        params,
        grads,
        [float(schedule(step)) for step in range(steps + 1)],
    )
    tx = chain(adamw(0.01, weight_decay=0.05), scale_by_schedule(schedule))
    assert_same_trajectory(run_ours(tx, params, grads), reference)


def composer_sgdw_reference(
    params: dict[str, Tensor],
    grads: list[dict[str, Tensor]],
    *,
    lr: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
    multipliers: Sequence[float] | None = None,
) -> list[dict[str, Tensor]]:
    """Composer's ``DecoupledSGDW.sgdw`` loop, with ``lr = initial_lr · multiplier``."""
    initial_lr = lr
    current = {name: p.clone() for name, p in params.items()}
    buffers: dict[str, Tensor] = {}
    history = []
    for step, step_grads in enumerate(grads):
        lr = initial_lr * (1.0 if multipliers is None else multipliers[step])
        for name, param in current.items():
            d_p = step_grads[name]
            if momentum != 0:
                if name not in buffers:
                    buffers[name] = d_p.clone()
                else:
                    buffers[name].mul_(momentum).add_(d_p, alpha=1 - dampening)
                d_p = d_p.add(buffers[name], alpha=momentum) if nesterov else buffers[name]
            if weight_decay != 0:
                param.mul_(1 - (lr / initial_lr) * weight_decay)
            param.add_(d_p, alpha=-lr)
        history.append({name: p.clone() for name, p in current.items()})
    return history


SGDW_CASES: dict[str, dict[str, Any]] = {
    "decay_only": {"lr": 0.05, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.01},
    "momentum": {"lr": 0.05, "momentum": 0.9, "dampening": 0.2, "nesterov": False, "weight_decay": 0.01},
    "nesterov": {"lr": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "weight_decay": 0.005},
}


@pytest.mark.parametrize("case", SGDW_CASES, ids=list(SGDW_CASES))
def test_sgdw_matches_composer_decoupled_sgdw(case: str) -> None:
    hyper = SGDW_CASES[case]
    assert_matches_exact_reference(
        lambda: sgdw(
            hyper["lr"],
            momentum=hyper["momentum"],
            dampening=hyper["dampening"],
            nesterov=hyper["nesterov"],
            weight_decay=hyper["weight_decay"],
        ),
        lambda params, grads: composer_sgdw_reference(params, grads, **hyper),
        make_params(),
        make_grads(20),
    )


def test_sgdw_with_schedule_scales_the_decay_by_lr_over_initial_lr() -> None:
    steps = 20
    multipliers = warmup_then_cosine(steps)
    assert_matches_exact_reference(
        lambda: chain(
            sgdw(0.05, momentum=0.9, weight_decay=0.02), scale_by_schedule(table_schedule(multipliers))
        ),
        lambda params, grads: composer_sgdw_reference(
            params,
            grads,
            lr=0.05,
            momentum=0.9,
            dampening=0.0,
            nesterov=False,
            weight_decay=0.02,
            multipliers=multipliers,
        ),
        make_params(),
        make_grads(steps),
    )


def composer_decoupled_adamw_reference(
    params: dict[str, Tensor],
    grads: list[dict[str, Tensor]],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    multipliers: Sequence[float] | None = None,
) -> list[dict[str, Tensor]]:
    """Composer's ``DecoupledAdamW.adamw`` loop, with ``lr = initial_lr · multiplier``."""
    beta1, beta2 = betas
    initial_lr = lr
    current = {name: p.clone() for name, p in params.items()}
    exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
    exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}
    history = []
    for step, step_grads in enumerate(grads, start=1):
        lr = initial_lr * (1.0 if multipliers is None else multipliers[step - 1])
        for name, param in current.items():
            grad = step_grads[name]
            if weight_decay != 0:
                param.mul_(1 - (lr / initial_lr) * weight_decay)
            exp_avg[name].mul_(beta1).add_(grad, alpha=1 - beta1)
            exp_avg_sq[name].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            denom = (exp_avg_sq[name].sqrt() / math.sqrt(bias_correction2)).add_(eps)
            param.addcdiv_(exp_avg[name], denom, value=-lr / bias_correction1)
        history.append({name: p.clone() for name, p in current.items()})
    return history


def test_decoupled_adamw_matches_composer_decoupled_adamw() -> None:
    steps = 20
    params, grads, multipliers = make_params(), make_grads(steps), warmup_then_cosine(steps)
    hyper: dict[str, Any] = {"lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 1e-3}
    assert_matches_exact_reference(
        lambda: decoupled_adamw(0.01, betas=(0.9, 0.95), weight_decay=1e-3),
        lambda params, grads: composer_decoupled_adamw_reference(params, grads, **hyper),
        params,
        grads,
    )
    assert_matches_exact_reference(
        lambda: chain(
            decoupled_adamw(0.01, betas=(0.9, 0.95), weight_decay=1e-3),
            scale_by_schedule(table_schedule(multipliers)),
        ),
        lambda params, grads: composer_decoupled_adamw_reference(
            params, grads, **hyper, multipliers=multipliers
        ),
        params,
        grads,
    )


OPTIMIZERS: dict[str, Callable[[], GradientTransformation]] = {
    "sgd": lambda: sgd(0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda: sgd(0.1, momentum=0.9, nesterov=True),
    "sgdw": lambda: sgdw(0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda: adam(0.01, weight_decay=0.01),
    "adamw": lambda: adamw(0.01),
    "decoupled_adamw": lambda: decoupled_adamw(0.01),
    "adamw_scheduled": lambda: chain(adamw(0.01), scale_by_schedule(lambda count: 1.0 / (1.0 + count))),
}


def _leaves(tree: Any) -> list[Tensor]:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, Tensor)]


@pytest.mark.parametrize("name", OPTIMIZERS, ids=list(OPTIMIZERS))
def test_update_leaves_params_grads_and_state_untouched(name: str) -> None:
    tx = OPTIMIZERS[name]()
    params, grads = make_params(), make_grads(3)
    state = tx.init(params)
    # Two updates first, so the state holds non-trivial buffers and counts.
    for step_grads in grads[:2]:
        _, state = tx.update(step_grads, state, params)
    inputs = _leaves((params, grads[2], state))
    values = [t.clone() for t in inputs]
    versions = [t._version for t in inputs]
    updates, new_state = tx.update(grads[2], state, params)
    apply_updates(params, updates)
    assert [t._version for t in inputs] == versions
    for before, after in zip(values, inputs, strict=True):
        assert torch.equal(before, after)
    assert pytree.tree_structure(new_state) == pytree.tree_structure(state)
    assert all(not t.requires_grad for t in _leaves((updates, new_state)))


@pytest.mark.parametrize("name", OPTIMIZERS, ids=list(OPTIMIZERS))
def test_params_and_state_keep_each_parameter_dtype(name: str) -> None:
    tx = OPTIMIZERS[name]()
    params = {
        "half": torch.linspace(-1, 1, 6, dtype=torch.bfloat16),
        "single": torch.linspace(-1, 1, 6),
        "double": torch.linspace(-1, 1, 6, dtype=torch.float64),
    }
    grads = {name: torch.full_like(p, 0.25) for name, p in params.items()}
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grads, state, params)
        params_after = apply_updates(params, updates)
    assert {n: p.dtype for n, p in params_after.items()} == {n: p.dtype for n, p in params.items()}
    assert all(u.dtype == params[n].dtype for n, u in updates.items())
    per_parameter = 0
    for path, leaf in pytree.tree_flatten_with_path(state)[0]:
        key = path[-1]
        if isinstance(key, pytree.MappingKey) and key.key in params and leaf.dim() > 0:
            assert leaf.dtype == params[key.key].dtype, path
            per_parameter += 1
        elif isinstance(key, pytree.MappingKey) and key.key in params:
            # Each parameter's step count, int64 (momentum) or float32 (Adam, as torch's ``step``).
            assert leaf.dtype in (torch.int64, torch.float32) and leaf.item() == 2, path
    assert per_parameter > 0 and per_parameter % len(params) == 0


@pytest.mark.parametrize("name", OPTIMIZERS, ids=list(OPTIMIZERS))
def test_optimizers_accept_a_model_without_parameters(name: str) -> None:
    tx = OPTIMIZERS[name]()
    updates, _ = tx.update({}, tx.init({}), {})
    assert apply_updates({}, updates) == {}


def test_update_records_no_autograd_history_for_parameters_that_require_grad() -> None:
    params = {name: p.requires_grad_() for name, p in make_params().items()}
    tx = adamw(0.01)
    updates, state = tx.update(make_grads(1)[0], tx.init(params), params)
    assert all(u.grad_fn is None and not u.requires_grad for u in updates.values())
    assert all(t.grad_fn is None for t in _leaves(state))


def test_update_keeps_parameter_order() -> None:
    names = ["z.weight", "a.bias", "m.scale"]
    params = {name: torch.arange(3, dtype=torch.float32) + i for i, name in enumerate(names)}
    grads = {name: torch.full((3,), 0.5) for name in reversed(names)}
    for tx in (sgd(0.1, momentum=0.9), adamw(), sgdw(0.1, weight_decay=0.1)):
        updates, _ = tx.update(grads, tx.init(params), params)
        assert list(updates) == list(grads)
        assert list(apply_updates(params, updates)) == names


def test_state_is_named_by_what_it_holds() -> None:
    params = make_params()
    assert list(sgd(0.1, momentum=0.9).init(params)) == ["weight_decay", "momentum", "learning_rate"]
    assert list(adamw().init(params)) == ["adam", "weight_decay", "learning_rate"]
    assert list(sgdw(0.1).init(params)) == ["momentum", "learning_rate", "weight_decay"]
    # Without momentum no buffer is kept, as in torch.optim.SGD.
    assert _leaves(sgd(0.1).init(params)) == []


def test_compiled_step_equals_eager_step() -> None:
    steps = 3
    schedule = CosineAnnealingWithWarmupScheduler(t_warmup="2ba").resolve(
        steps_per_epoch=steps, max_steps=steps
    )
    tx = chain(sgd(0.05, momentum=0.9, nesterov=True, weight_decay=0.01), scale_by_schedule(schedule))

    def step(
        params: dict[str, Tensor], grads: dict[str, Tensor], state: Any
    ) -> tuple[dict[str, Tensor], Any]:
        updates, state = tx.update(grads, state, params)
        return apply_updates(params, updates), state

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_params = compiled_params = make_params()
    eager_state = compiled_state = tx.init(eager_params)
    for index, step_grads in enumerate(make_grads(steps)):
        eager_params, eager_state = step(eager_params, step_grads, eager_state)
        # Counts and schedule values are tensors, so later steps must reuse the first step's graph.
        with torch.compiler.set_stance("fail_on_recompile" if index else "default"):
            compiled_params, compiled_state = compiled(compiled_params, step_grads, compiled_state)
        for name in eager_params:
            torch.testing.assert_close(compiled_params[name], eager_params[name], rtol=0, atol=1e-6)
    for eager_leaf, compiled_leaf in zip(_leaves(eager_state), _leaves(compiled_state), strict=True):
        torch.testing.assert_close(compiled_leaf, eager_leaf, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: sgd(-0.1), "learning_rate"),
        (lambda: sgd(0.1, momentum=-0.5), "momentum"),
        (lambda: sgd(0.1, nesterov=True), "nesterov"),
        (lambda: sgd(0.1, momentum=0.9, dampening=0.1, nesterov=True), "nesterov"),
        (lambda: sgd(0.1, weight_decay=-1e-4), "weight_decay"),
        (lambda: sgdw(float("nan")), "learning_rate"),
        (lambda: sgdw(0.1, weight_decay=-0.1), "weight_decay"),
        (lambda: adam(betas=(0.9, 1.0)), r"betas\[1\]"),
        (lambda: adamw(betas=(-0.1, 0.999)), r"betas\[0\]"),
        (lambda: adamw(eps=-1e-8), "eps"),
        (lambda: decoupled_adamw(-1.0), "learning_rate"),
    ],
)
def test_bad_hyperparameters_raise_value_error_naming_the_argument(
    build: Callable[[], GradientTransformation], argument: str
) -> None:
    with pytest.raises(ValueError, match=argument):
        build()


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: sgd("0.1"), "learning_rate"),  # type: ignore[arg-type]
        (lambda: sgd(0.1, momentum=0.9, nesterov=1), "nesterov"),  # type: ignore[arg-type]
        (lambda: adamw(betas=0.9), "betas"),  # type: ignore[arg-type]
        (lambda: adam(weight_decay=True), "weight_decay"),
    ],
)
def test_hyperparameters_of_the_wrong_type_raise_type_error(
    build: Callable[[], GradientTransformation], argument: str
) -> None:
    with pytest.raises(TypeError, match=argument):
        build()


SOMETIMES: list[frozenset[str]] = [
    frozenset({"conv.weight", "temperature"}),
    frozenset(SHAPES) - {"linear.bias"},
    frozenset({"linear.weight"}),
    frozenset(SHAPES),
    frozenset(SHAPES) - {"temperature"},
    frozenset({"linear.bias", "temperature"}),
    frozenset(SHAPES),
]
"""Which parameters get a gradient on each step: some on every step, some from a later step on, some skipped."""


def sometimes(grads: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    return [{name: g for name, g in step.items() if name in given} for step, given in zip(grads, SOMETIMES, strict=True)]


def run_torch_sometimes(
    make_optimizer: MakeTorchOptimizer, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    """A torch optimizer's parameters after each step, a parameter missing from a step's ``grads`` holding
    ``.grad = None`` there."""
    parameters = {name: torch.nn.Parameter(p.clone()) for name, p in params.items()}
    optimizer = make_optimizer(list(parameters.values()))
    history = []
    for step_grads in grads:
        for name, parameter in parameters.items():
            parameter.grad = step_grads[name].clone() if name in step_grads else None
        optimizer.step()
        history.append({name: p.detach().clone() for name, p in parameters.items()})
    return history


def run_ours_sometimes(
    tx: GradientTransformation, params: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    """Our parameters after each step, updating the parameters a step has gradients for with their own state
    (``restrict_state``), the rest of the state kept (``merge_state``), as the training step does."""
    names = tuple(params)
    state = tx.init(params)
    history = []
    for step_grads in grads:
        given = {name: p for name, p in params.items() if name in step_grads}
        part = restrict_state(state, names, tuple(given))
        updates, part = tx.update(step_grads, part, given)
        params = {**params, **apply_updates(given, updates)}
        state = merge_state(state, part, names)
        history.append(params)
    return history


SOMETIMES_CASES: dict[str, tuple[Callable[[], GradientTransformation], MakeTorchOptimizer]] = {
    "sgd_dampening": (
        lambda: sgd(0.05, momentum=0.8, dampening=0.3, weight_decay=0.05),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.05, foreach=True),
    ),
    "sgd_nesterov": (
        lambda: sgd(0.05, momentum=0.9, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, foreach=True),
    ),
    "adam": (
        lambda: adam(0.01, weight_decay=0.05),
        lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.05, foreach=True),
    ),
    "adamw": (
        lambda: adamw(0.1, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, foreach=True),
    ),
}


@pytest.mark.parametrize("case", SOMETIMES_CASES, ids=list(SOMETIMES_CASES))
def test_a_parameter_without_a_gradient_keeps_its_value_and_state_as_in_torch(case: str) -> None:
    # torch.optim skips a parameter whose .grad is None: no decay, no moment update, no step count; a parameter
    # that gets its first gradient late starts its bias correction (Adam) or buffer (SGD) there.
    build, make_torch = SOMETIMES_CASES[case]
    params, grads = make_params(4), sometimes(make_grads(len(SOMETIMES), seed=5))
    reference = run_torch_sometimes(make_torch, params, grads)
    assert_same_trajectory(run_ours_sometimes(build(), params, grads), reference)
    assert torch.equal(reference[1]["linear.bias"], params["linear.bias"])
