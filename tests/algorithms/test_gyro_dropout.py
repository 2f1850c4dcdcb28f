"""GyroDropout: identity in evaluation; in training tau keyed masks of a bank of sigma, re-drawn every period."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.algorithms.gyro_dropout import (
    GyroDropout,
    GyroDropoutLayer,
    apply_gyro_dropout,
    gyro_dropout_masks,
    selection_period,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import State, Static
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models.mlp import MLP
from composer_fn.optim import sgd
from composer_fn.trainer import Trainer
from composer_fn.trainer.step import compile_step, cross_entropy_loss, make_train_step

seeds = st.integers(0, 2**32 - 1)


def _layer(seed: int, p: float = 0.5, sigma: int = 8, tau: int = 4, period: int = 3) -> GyroDropoutLayer:
    return GyroDropoutLayer(p, sigma, tau, period, R.key(seed))


@given(seeds, st.sampled_from([(5, 7), (4, 3, 2, 2)]))
@settings(max_examples=10, deadline=None)
def test_in_evaluation_it_is_the_identity(seed, shape) -> None:
    layer = _layer(seed).eval()
    x = R.normal(R.key(seed), shape)
    assert layer(x) is x and int(layer.training_step) == 0


@given(seeds, st.sampled_from([0.1, 0.5, 0.8]))
@settings(max_examples=10, deadline=None)
def test_training_keeps_one_minus_p_of_the_features_and_scales_them(seed, p) -> None:
    layer = _layer(seed, p, sigma=64, tau=16)
    x = R.uniform(R.key(seed), (16, 1024), low=1.0, high=2.0)
    output = layer(x)
    kept = output != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.03
    torch.testing.assert_close(output[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)


@given(seeds, st.integers(1, 20), st.integers(1, 6))
@settings(max_examples=10, deadline=None)
def test_sample_i_of_b_uses_active_mask_i_times_tau_over_b(seed, batch, tau) -> None:
    layer = _layer(seed, tau=tau)
    x = torch.ones(batch, 3, 10)
    masks = gyro_dropout_masks(layer.mask_key, 0, 10, 0.5, 8, tau, 3)
    output = layer(x)
    for sample in range(batch):
        expected = masks[sample * tau // batch].float()[None, :].expand(3, 10) * 2
        assert torch.equal(output[sample], expected)


@given(seeds, st.integers(1, 5))
@settings(max_examples=10, deadline=None)
def test_masks_stay_for_a_period_then_change_and_repeat_for_the_same_step(seed, period) -> None:
    layer = _layer(seed, sigma=256, tau=4, period=period)
    x = torch.ones(4, 64)
    outputs = [layer(x) for _ in range(3 * period)]
    assert int(layer.training_step) == 3 * period
    rounds = [outputs[r * period : (r + 1) * period] for r in range(3)]
    assert all(torch.equal(out, group[0]) for group in rounds for out in group)
    assert not torch.equal(rounds[0][0], rounds[1][0]) and not torch.equal(rounds[1][0], rounds[2][0])
    replay = _layer(seed, sigma=256, tau=4, period=period)
    replay.training_step.fill_(period)
    assert torch.equal(replay(x), rounds[1][0])


def test_the_period_is_composers_with_at_least_one_round_of_tau_steps() -> None:
    assert selection_period(196 * 100, 256, 16) == (196 * 100 // 256) * 16
    assert selection_period(100, 256, 16) == 16
    assert selection_period(None, 256, 16) == 16


@given(seeds)
@settings(max_examples=10, deadline=None)
def test_the_functional_form_replaces_dropout_and_leaves_the_input_model_alone(seed) -> None:
    model = MLP(16, 3, (8, 8), dropout=0.5)
    before = {name: (id(t), t.clone(), t._version) for name, t in model.state_dict(keep_vars=True).items()}
    rewritten = apply_gyro_dropout(model, 10, 5, key=R.key(seed))
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity, value, version = before[name]
        assert id(tensor) == identity and tensor._version == version and torch.equal(tensor, value)
    layers = [m for m in rewritten if isinstance(m, GyroDropoutLayer)]
    assert len(layers) == 2 and not any(isinstance(m, GyroDropoutLayer) for m in model)
    assert all(layer.period == 16 for layer in layers) and not torch.equal(
        layers[0].mask_key, layers[1].mask_key
    )


@given(seeds)
@settings(max_examples=10, deadline=None)
def test_rewriting_twice_equals_rewriting_once(seed) -> None:
    algorithm = GyroDropout(sigma=16, tau=2)
    once = algorithm.rewrite(nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.3)), R.key(seed))
    twice = algorithm.rewrite(once, R.key(seed + 1))
    assert algorithm.targets(once) == frozenset() and repr(twice) == repr(once)
    assert all(torch.equal(t, once.state_dict()[n]) for n, t in twice.state_dict().items())
    x = R.normal(R.key(seed), (4, 4))
    assert torch.equal(twice.train()(x), once.train()(x))


def _setup(seed: int, steps: int = 3) -> tuple[Static, State, list]:
    model = MLP(16, 3, (32,), dropout=0.5)
    static = Static(module=model, seed=seed)
    state = State(
        params={n: p.detach().clone() for n, p in model.named_parameters()},
        buffers={n: b.detach().clone() for n, b in model.named_buffers()},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64),
        key=R.key(seed),
    )
    algorithms = [GyroDropout(sigma=4, tau=2)]
    start = Timestamp().with_max_duration(Time(steps, TimeUnit.BATCH))
    static, state = run_host_event(Event.INIT, make_plan(algorithms, timestamp=start), static, state, start)
    batches = [
        (R.normal(R.fold_in(R.key(7), i), (8, 16)), R.randint(R.fold_in(R.key(8), i), 0, 3, (8,)))
        for i in range(steps)
    ]
    return static, state.replace(opt=sgd(0.1).init(state.params)), batches


def _train(static: Static, state: State, batches: list, compiled: bool = False) -> State:
    step = make_train_step(
        static, make_plan([]), cross_entropy_loss(), sgd(0.1), grad_mode="func" if compiled else "autograd"
    )
    if compiled:
        step = compile_step(step, "aot_eager")
    for batch in batches:
        state, _ = step(state, batch)
    return state


def test_training_steps_advance_the_counter_without_writing_into_their_input() -> None:
    static, state, batches = _setup(0)
    assert isinstance(static.module[3], GyroDropoutLayer) and static.module[3].period == 2
    snapshot = {n: t.clone() for n, t in state.buffers.items()}
    trained = _train(static, state, batches)
    assert all(torch.equal(state.buffers[n], t) for n, t in snapshot.items())
    assert int(trained.buffers["3.training_step"]) == 3


def test_the_same_key_gives_the_same_run_and_another_key_another() -> None:
    first = _train(*_setup(0))
    again = _train(*_setup(0))
    other = _train(*_setup(1))
    assert all(torch.equal(first.params[n], again.params[n]) for n in first.params)
    assert not torch.equal(first.buffers["3.mask_key"], other.buffers["3.mask_key"])
    assert not all(torch.equal(first.params[n], other.params[n]) for n in first.params)


def test_compiled_training_matches_eager(fresh_compiler) -> None:
    eager = _train(*_setup(0))
    compiled = _train(*_setup(0), compiled=True)
    assert int(compiled.buffers["3.training_step"]) == 3
    for name in eager.params:
        torch.testing.assert_close(compiled.params[name], eager.params[name], rtol=1e-5, atol=1e-6)


def test_a_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path) -> None:
    task = load_digits_task()

    def trainer(duration: str, **options: object) -> Trainer:
        return Trainer(
            MLP(64, 10, (16,), dropout=0.5),
            TensorLoader(task.train, 64, seed=0),
            max_duration=duration,
            optimizer=sgd(0.1, momentum=0.9),
            progress_bar=False,
            **options,  # type: ignore[arg-type]
        )

    algorithms = [GyroDropout(sigma=64, tau=4)]
    whole = trainer("2ep", algorithms=algorithms)
    whole.fit()
    trainer("1ep", algorithms=algorithms, save_folder=tmp_path).fit()
    # Given the plain model, the trainer re-applies the recorded surgery before loading.
    resumed = trainer("2ep", load_path=tmp_path / "latest.pt")
    resumed.fit()
    assert int(resumed.state.buffers["3.training_step"]) == int(whole.state.buffers["3.training_step"]) > 23
    assert all(torch.equal(resumed.state.params[n], t) for n, t in whole.state.params.items())


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: GyroDropout(p=1.0), "p"),
        (lambda: GyroDropout(sigma=0), "sigma"),
        (lambda: GyroDropout(tau=2.5), "tau"),
        (lambda: GyroDropoutLayer(period=0), "period"),
        (lambda: apply_gyro_dropout(nn.Dropout(), 0, 3, key=R.key(0)), "iters_per_epoch"),
        (lambda: _layer(0)(torch.ones(4)), "input"),
    ],
)
def test_bad_arguments_are_refused_naming_them(build, name) -> None:
    with pytest.raises(ValueError, match=name):
        build()
