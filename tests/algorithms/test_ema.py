"""EMA: the update is the formula and torch's, the schedule is Composer's, eval sees the average, training does not."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from composer_fn import optim
from composer_fn.algorithms import EMA
from composer_fn.callbacks import Callback
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.functional import compute_ema, ema_update
from composer_fn.models import MLP, SmallCNN
from composer_fn.testing import make_setup, train_steps
from composer_fn.trainer import Trainer

seeds = st.integers(0, 2**32 - 1)
smoothings = st.floats(0.0, 1.0)


def _tensors(seed: int, count: int = 3) -> dict[str, torch.Tensor]:
    return {f"layer{i}.weight": R.normal(R.fold_in(R.key(seed), i), (i + 1, 3)) for i in range(count)}


@given(seeds, smoothings)
def test_the_update_is_smoothing_times_the_average_plus_the_rest_times_the_weights(seed, smoothing) -> None:
    average, params = _tensors(seed), _tensors(seed + 1)
    updated = ema_update(average, params, smoothing)
    for name in average:
        expected = smoothing * average[name] + (1 - smoothing) * params[name]
        torch.testing.assert_close(updated[name], expected, rtol=0, atol=1e-6)


@given(seeds, st.floats(0.5, 0.999))
@settings(max_examples=20, deadline=None)
def test_repeated_updates_equal_torchs_averaged_model(seed, decay) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch_average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
    average: dict[str, torch.Tensor] = {}
    for step in range(5):
        with torch.no_grad():
            for index, p in enumerate(model.parameters()):
                p.copy_(R.normal(R.fold_in(R.key(seed), 100 * step + index), tuple(p.shape)))
        torch_average.update_parameters(model)
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        # torch's first update copies the weights, as EMA's restart at ema_start does.
        average = ema_update(average, weights, decay) if average else weights
    for name, tensor in torch_average.module.named_parameters():
        torch.testing.assert_close(average[name], tensor.detach(), rtol=0, atol=1e-6)


@given(seeds, smoothings)
def test_the_update_leaves_its_inputs_alone(seed, smoothing) -> None:
    average, params = _tensors(seed), _tensors(seed + 1)

    def identities(n: str) -> tuple[int, int, int, int]:
        return id(average[n]), id(params[n]), average[n]._version, params[n]._version

    before = {n: identities(n) for n in average}
    copies = {n: (average[n].clone(), params[n].clone()) for n in average}
    updated = ema_update(average, params, smoothing)
    for name in average:
        assert identities(name) == before[name]
        assert torch.equal(average[name], copies[name][0]) and torch.equal(params[name], copies[name][1])
        assert updated[name] is not average[name] and updated[name] is not params[name]


def test_counters_take_the_training_value_and_are_new_tensors() -> None:
    count = {"bn.num_batches_tracked": torch.tensor(3)}
    updated = ema_update({"bn.num_batches_tracked": torch.tensor(1)}, count, 0.9)
    assert int(updated["bn.num_batches_tracked"]) == 3
    assert updated["bn.num_batches_tracked"] is not count["bn.num_batches_tracked"]


def test_compute_ema_moves_the_average_and_leaves_its_inputs() -> None:
    model = {"a": torch.ones(2), "b": torch.ones(2)}
    ema_model = {"a": torch.zeros(2), "b": torch.full((2,), 5.0)}
    result = compute_ema(model, ema_model, smoothing=0.75)
    assert set(result) == {"a", "b"}
    torch.testing.assert_close(result["a"], torch.full((2,), 0.25))
    torch.testing.assert_close(result["b"], torch.full((2,), 4.0))
    assert torch.equal(ema_model["a"], torch.zeros(2))


def test_compute_ema_refuses_names_that_only_one_side_holds() -> None:
    model = {"a": torch.ones(2), "b": torch.ones(2)}
    ema_model = {"a": torch.zeros(2), "c": torch.full((2,), 5.0)}
    with pytest.raises(ValueError, match=r"\['b'\] only in model, \['c'\] only in ema_model"):
        compute_ema(model, ema_model, smoothing=0.75)


@given(st.integers(1, 10_000))
def test_smoothing_from_a_half_life_is_composers(half_life) -> None:
    per_batch = EMA(half_life=f"{half_life}ba").update_smoothing
    assert per_batch == pytest.approx(math.exp(-math.log(2) / half_life), rel=1e-12)
    assert per_batch == pytest.approx(2 ** (-(1 / half_life)), rel=1e-12)
    assert per_batch**half_life == pytest.approx(0.5, rel=1e-9)


@given(st.integers(1, 1000), st.integers(1, 50))
def test_a_longer_interval_raises_the_per_unit_smoothing_to_its_length(half_life, interval) -> None:
    algorithm = EMA(half_life=f"{half_life}ba", update_interval=f"{interval}ba")
    per_unit = EMA(half_life=f"{half_life}ba").update_smoothing
    assert algorithm.update_smoothing == pytest.approx(per_unit**interval, rel=1e-9)
    assert algorithm.update_smoothing == pytest.approx(2 ** (-(interval / half_life)), rel=1e-12)


def test_an_explicit_smoothing_is_used_at_each_update_as_given() -> None:
    assert EMA(half_life=None, smoothing=0.9, update_interval="4ba").update_smoothing == 0.9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"half_life": None}, "exactly one of half_life and smoothing.*half_life=None, smoothing=None"),
        ({"smoothing": 0.9}, "exactly one of half_life and smoothing.*smoothing=0.9"),
        ({"half_life": None, "smoothing": 1.5}, r"smoothing=1.5 must be a finite number in \[0, 1\]"),
        ({"half_life": "10sp"}, "half_life='10sp' must be a time string in ba, ep"),
        ({"half_life": "0ba"}, "half_life='0ba' must be positive"),
        ({"half_life": "soon"}, "half_life='soon' must be a time string"),
        ({"ema_start": "3tok"}, "ema_start='3tok' must be a time string in ba, ep, dur"),
        ({"update_interval": "0ba"}, "update_interval='0ba' must be a positive whole number"),
        (
            {"half_life": "1ep", "update_interval": "2ba"},
            "update_interval='2ba' and half_life='1ep' must share a unit",
        ),
    ],
)
def test_bad_hyperparameters_are_refused_naming_argument_and_value(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        EMA(**kwargs)


def test_the_record_round_trips_through_its_config() -> None:
    from composer_fn.core.algorithm import algorithm_from_config

    algorithm = EMA(half_life="50ba", ema_start="0.25dur", update_interval="2ba")
    assert algorithm_from_config(algorithm.to_config()) == algorithm
    assert eval(repr(algorithm)) == algorithm


def _updates(algorithm: EMA, steps: int) -> tuple[list[int], list[int]]:
    """Returns the batch counts after which the average updates, and after which it restarts."""
    updated, restarted = [], []
    timestamp = Timestamp().with_max_duration(Time(steps, TimeUnit.BATCH))
    for _ in range(steps):
        plan = make_plan([algorithm], timestamp=timestamp)
        if "ema" in plan.names(Event.AFTER_OPTIMIZER_STEP):
            updated.append(timestamp.batch + 1)
        if dict(plan.keys)["ema"] == "start":
            restarted.append(timestamp.batch + 1)
        timestamp = timestamp.advance(8)
    return updated, restarted


def test_updates_follow_composers_start_and_interval() -> None:
    # Composer restarts the average at the first BATCH_END at or after ema_start, then updates every interval.
    assert _updates(EMA(half_life="9ba", ema_start="5ba", update_interval="3ba"), 20) == (
        [5, 6, 9, 12, 15, 18],
        [5],
    )
    assert _updates(EMA(half_life="9ba"), 6) == ([1, 2, 3, 4, 5, 6], [1])
    assert _updates(EMA(half_life="9ba", ema_start="0.5dur", update_interval="2ba"), 10) == (
        [5, 6, 8, 10],
        [5],
    )
    assert _updates(EMA(half_life=None, smoothing=0.5, ema_start="6ba", update_interval="2ba"), 9) == (
        [6, 8],
        [6],
    )


def test_the_average_restarts_at_ema_start_then_moves_at_each_interval() -> None:
    algorithm = EMA(half_life=None, smoothing=0.5, ema_start="3ba", update_interval="2ba")
    setup = make_setup([algorithm], steps=8)
    final, _ = train_steps(setup)
    weights = [train_steps(dataclasses.replace(setup, batches=setup.batches[:k]))[0].params for k in range(9)]
    expected = dict(weights[3])
    for k in (4, 6, 8):
        expected = {n: 0.5 * expected[n] + 0.5 * weights[k][n] for n in expected}
    for name, tensor in final.algos["ema"].params.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)
    assert bool(final.algos["ema"].started)


def test_evaluation_before_the_start_sees_the_training_weights() -> None:
    setup = make_setup([EMA(ema_start="0.5dur")], steps=1)
    state, _ = train_steps(setup)
    plan = make_plan(setup.algorithms, timestamp=Timestamp(batch=1))
    _, swapped = run_host_event(Event.EVAL_START, plan, setup.static, state, Timestamp(batch=1))
    assert all(torch.equal(swapped.params[n], state.params[n]) for n in state.params)


def _digits(batch_size: int = 64):
    task = load_digits_task()
    return TensorLoader(task.train, batch_size, seed=0), TensorLoader(task.heldout, 360, shuffle=False)


def _trainer(algorithms=(), max_duration="30ba", evaluate=True, model=None, **kwargs) -> Trainer:
    train, heldout = _digits()
    return Trainer(
        model if model is not None else SmallCNN(1, 10, width=8),
        train,
        heldout if evaluate else None,
        max_duration=max_duration,
        optimizer=optim.sgd(0.1, momentum=0.9),
        schedule=optim.CosineAnnealingScheduler(),
        algorithms=algorithms,
        seed=0,
        progress_bar=False,
        **kwargs,
    )


def _leaves_equal(left, right) -> bool:
    left_leaves, left_spec = pytree.tree_flatten(left)
    right_leaves, right_spec = pytree.tree_flatten(right)
    return left_spec == right_spec and all(
        torch.equal(a, b) for a, b in zip(left_leaves, right_leaves, strict=True)
    )


def test_the_trainer_evaluates_with_the_averaged_weights() -> None:
    trained = _trainer([EMA(half_life="5ba")], max_duration="12ba")
    metrics = trained.fit()
    average = trained.state.algos["ema"]
    assert not all(torch.equal(average.params[n], p) for n, p in trained.state.params.items())
    plain = _trainer(max_duration="12ba")
    plain.state = plain.state.replace(params=dict(average.params), buffers=dict(average.buffers))
    expected = plain.eval()
    assert metrics["eval/eval/accuracy"] == expected["eval/eval/accuracy"]
    assert metrics["eval/eval/loss"] == expected["eval/eval/loss"]


def test_training_after_evaluation_continues_bit_for_bit_from_the_training_weights() -> None:
    algorithms = [EMA(half_life="5ba")]
    evaluated = _trainer(algorithms, max_duration="12ba", eval_interval="4ba")
    evaluated.fit()
    unevaluated = _trainer(algorithms, max_duration="12ba", evaluate=False)
    unevaluated.fit()
    assert _leaves_equal(evaluated.state, unevaluated.state)


def test_resuming_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    algorithms = [EMA(half_life="8ba", ema_start="5ba", update_interval="2ba")]
    uninterrupted = _trainer(algorithms, save_folder=tmp_path / "a", save_interval="7ba", eval_interval="5ba")
    uninterrupted.fit()
    checkpoint = tmp_path / "a" / "ep0-ba14.pt"
    assert checkpoint.is_file()
    resumed = _trainer(algorithms, load_path=checkpoint, eval_interval="5ba")
    resumed.fit()
    assert _leaves_equal(uninterrupted.state, resumed.state)
    assert bool(resumed.state.algos["ema"].started)


class _EpochWeights(Callback):
    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def epoch_end(self, view) -> None:
        self.weights.append({n: p.clone() for n, p in view.state.params.items()})


def test_an_interval_in_epochs_updates_at_epoch_ends_from_ema_start() -> None:
    recorder = _EpochWeights()
    algorithm = EMA(half_life="2ep", ema_start="1ep")
    trainer = _trainer([algorithm], max_duration="3ep", model=MLP(64, 10, hidden=(16,)), callbacks=[recorder])
    trainer.fit()
    first, second, third = recorder.weights
    smoothing = algorithm.update_smoothing
    assert smoothing == pytest.approx(2**-0.5)
    # Composer's EPOCH_END counts the finished epoch, so ema_start='1ep' restarts at the end of the first one.
    expected = {n: smoothing * first[n] + (1 - smoothing) * second[n] for n in first}
    expected = {n: smoothing * expected[n] + (1 - smoothing) * third[n] for n in first}
    for name, tensor in trainer.state.algos["ema"].params.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6)
