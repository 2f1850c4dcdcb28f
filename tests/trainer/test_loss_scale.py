"""fp16 dynamic loss scaling: the scale rule equals torch's, a training run's scale values and skipped steps equal
a hand loop's with ``torch.amp.GradScaler`` step by step, the compiled step skips by a select, and the Trainer
trains and resumes in fp16-mixed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.state import Static, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.trainer.loss_scale import GROWTH_TRACKER, LOSS_SCALE, DynamicLossScale
from composer_fn.trainer.step import compile_step, cross_entropy_loss, make_train_step

STEPS = 50
OVERFLOWS = {3, 4, 11, 20, 21, 22, 37}
"""Steps whose batch holds an infinite input: their gradients are not finite."""


@settings(max_examples=30, deadline=None)
@given(
    finite=st.lists(st.booleans(), min_size=1, max_size=40),
    interval=st.integers(1, 5),
    init=st.sampled_from([1.0, 2.0**16, 3.0e38]),
)
def test_the_scale_rule_equals_torchs_amp_update_scale(finite: list[bool], interval: int, init: float) -> None:
    rule = DynamicLossScale(init_scale=init, growth_interval=interval)
    ours = rule.init()
    scale = torch.full((), init, dtype=torch.float32)
    tracker = torch.zeros((), dtype=torch.int32)
    for ok in finite:
        ours = rule.update(ours, torch.tensor(ok))
        torch._amp_update_scale_(scale, tracker, torch.tensor(0.0 if ok else 1.0), 2.0, 0.5, interval)
        assert torch.equal(ours[LOSS_SCALE], scale) and torch.equal(ours[GROWTH_TRACKER], tracker)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches = []
    for step in range(STEPS):
        images = R.normal(R.fold_in(R.key(0), step), (16, 12))
        labels = R.randint(R.fold_in(R.key(1), step), 0, 3, (16,))
        if step in OVERFLOWS:
            images = images.index_fill(0, torch.tensor([2]), float("inf"))
        batches.append((images, labels))
    return batches


def _hand_loop(model: torch.nn.Module, rule: DynamicLossScale) -> tuple[list[float], list[int], torch.nn.Module]:
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=rule.init_scale, growth_factor=rule.growth_factor, backoff_factor=rule.backoff_factor,
        growth_interval=rule.growth_interval,
    )
    scales, skipped = [], []
    for step, (images, labels) in enumerate(_batches()):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() < before:
            skipped.append(step)
        scales.append(scaler.get_scale())
    return scales, skipped, model


def _our_run(
    model: torch.nn.Module, rule: DynamicLossScale, backend: str | None = None
) -> tuple[list[float], list[int], dict[str, torch.Tensor]]:
    static = Static(module=model, precision="fp16-mixed")
    tx = optim.sgd(0.05, momentum=0.9)
    state = initial_state(model, R.key(0))
    state = state.replace(opt=tx.init(state.params), hparams=rule.init())
    plan = make_plan([], timestamp=Timestamp())
    step = make_train_step(
        static, plan, cross_entropy_loss(), tx, grad_mode="func" if backend else "autograd", loss_scale=rule
    )
    if backend is not None:
        step = compile_step(step, backend)
    scales, skipped = [], []
    for index, batch in enumerate(_batches()):
        before = float(state.hparams[LOSS_SCALE])
        state, _ = step(state, batch)
        if float(state.hparams[LOSS_SCALE]) < before:
            skipped.append(index)
        scales.append(float(state.hparams[LOSS_SCALE]))
    return scales, skipped, dict(state.params)


def _model() -> torch.nn.Module:
    return MLP(12, 3, hidden=(16,))


@pytest.mark.parametrize("backend", [None, pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_scale_values_and_skipped_steps_equal_gradscalers_over_fifty_steps(backend: str | None, request) -> None:
    if backend is not None:
        torch._dynamo.reset()
        request.addfinalizer(torch._dynamo.reset)
    rule = DynamicLossScale(init_scale=2.0**10, growth_interval=4)
    model = _model()
    their_scales, their_skipped, theirs = _hand_loop(model, rule)
    our_scales, our_skipped, ours = _our_run(model, rule, backend)
    assert our_skipped == their_skipped == sorted(OVERFLOWS)
    assert our_scales == their_scales
    assert max(their_scales) > rule.init_scale  # the scale grew between overflows
    for name, parameter in theirs.named_parameters():
        assert torch.isfinite(ours[name]).all()
        torch.testing.assert_close(ours[name], parameter.detach(), rtol=1e-4, atol=1e-5)


def test_a_skipped_step_leaves_parameters_and_optimizer_state_as_they_were() -> None:
    rule = DynamicLossScale()
    model = _model()
    static = Static(module=model, precision="fp16-mixed")
    tx = optim.adamw(1e-3)
    state = initial_state(model, R.key(0))
    state = state.replace(opt=tx.init(state.params), hparams=rule.init())
    step = make_train_step(static, make_plan([], timestamp=Timestamp()), cross_entropy_loss(), tx)
    images, labels = _batches()[3]
    after, _ = step(state, (images, labels))
    assert all(torch.equal(after.params[n], p) for n, p in state.params.items())
    leaves = zip(torch.utils._pytree.tree_leaves(after.opt), torch.utils._pytree.tree_leaves(state.opt), strict=True)
    assert all(torch.equal(a, b) for a, b in leaves)
    assert float(after.hparams[LOSS_SCALE]) == rule.init_scale / 2 and int(after.step) == 1


def test_the_trainer_trains_in_fp16_mixed_and_resumes_with_its_scale(tmp_path: Path) -> None:
    data = (R.normal(R.key(0), (64, 12)), R.randint(R.key(1), 0, 3, (64,)))

    def trainer(**options) -> Trainer:
        return Trainer(
            _model(), TensorLoader(data, batch_size=16, seed=0), max_duration="8ba", optimizer=optim.sgd(0.1),
            precision="fp16-mixed", progress_bar=False, save_folder=tmp_path, save_interval="1ba", **options,
        )

    whole = trainer()
    metrics = whole.fit()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert whole.state.hparams[LOSS_SCALE].dtype == torch.float32
    resumed = trainer(load_path=next(tmp_path.glob("ep*-ba3.pt")))
    assert float(resumed.state.hparams[LOSS_SCALE]) == 2.0**16
    resumed.fit()
    assert all(torch.equal(resumed.state.params[n], p) for n, p in whole.state.params.items())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"init_scale": 0.0}, "init_scale=0.0 must be a finite number > 0"),
        ({"growth_factor": 1.0}, "growth_factor=1.0 must be a finite number > 1"),
        ({"backoff_factor": 1.0}, r"backoff_factor=1.0 must be a finite number in \(0, 1\)"),
        ({"growth_interval": 0}, "growth_interval=0 must be an int >= 1"),
    ],
)
def test_bad_loss_scale_arguments_are_refused_naming_them(arguments, message) -> None:
    with pytest.raises(ValueError, match=message):
        DynamicLossScale(**arguments)


def test_a_state_without_a_loss_scale_is_refused_saying_what_to_add() -> None:
    model = _model()
    static = Static(module=model, precision="fp16-mixed")
    tx = optim.sgd(0.1)
    state = initial_state(model, R.key(0))
    state = state.replace(opt=tx.init(state.params))
    step = make_train_step(static, make_plan([], timestamp=Timestamp()), cross_entropy_loss(), tx)
    with pytest.raises(KeyError, match="DynamicLossScale\\(\\).init"):
        step(state, _batches()[0])
