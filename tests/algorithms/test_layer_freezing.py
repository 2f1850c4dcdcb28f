"""LayerFreezing: Composer's schedule and layers; frozen parameters get no gradient, no update; resume is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given
from hypothesis import strategies as st

from composer_fn import optim
from composer_fn.algorithms import LayerFreezing
from composer_fn.callbacks import Callback
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.functional import freezable_layers, freeze_layers, freeze_schedule
from composer_fn.models import SmallCNN
from composer_fn.trainer import Trainer

SMALL_CNN_LAYERS = [
    "features.0.0", "features.0.1", "features.1.0", "features.1.1", "features.2.0", "features.2.1", "head",
]  # fmt: skip


@given(st.floats(0.0, 1.0), st.floats(0.0, 0.99), st.floats(0.0, 1.0))
def test_the_schedule_is_composers_linear_ramp(duration, start, level) -> None:
    expected = 0.0 if duration <= start else level * (duration - start) / (1 - start)
    assert freeze_schedule(duration, start, level) == pytest.approx(expected)


def test_layers_are_the_parameter_holding_leaves_in_definition_order() -> None:
    assert freezable_layers(SmallCNN(1, 10, width=4)) == SMALL_CNN_LAYERS


@pytest.mark.parametrize(("duration", "depth"), [(0.5, 0), (0.6, 1), (0.75, 3), (0.99, 5), (1.0, 6)])
def test_the_depth_is_the_fraction_of_all_layers_but_the_last(duration, depth) -> None:
    model = SmallCNN(1, 10, width=4)
    names, frozen_depth, fraction = freeze_layers(model, duration)
    assert frozen_depth == depth == int(fraction * 6)
    expected = {
        f"{layer}.{p}"
        for layer in SMALL_CNN_LAYERS[:depth]
        for p in ("weight", "bias")
        if f"{layer}.{p}" in dict(model.named_parameters())
    }
    assert names == expected
    assert not any(name.startswith("head.") for name in names)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"freeze_start": 1.0}, "freeze_start=1.0"),
        ({"freeze_level": 1.5}, "freeze_level=1.5"),
        ({"freeze_start": -0.1}, "freeze_start=-0.1"),
    ],
)
def test_bad_hyperparameters_are_refused_naming_argument_and_value(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        LayerFreezing(**kwargs)


def test_the_record_round_trips_through_its_config() -> None:
    algorithm = LayerFreezing(freeze_start=0.25, freeze_level=0.5)
    assert algorithm_from_config(algorithm.to_config()) == algorithm


def test_freezing_reads_the_last_epoch_end_and_nothing_before_the_first() -> None:
    algorithm = LayerFreezing(freeze_start=0.0)
    model = SmallCNN(1, 10, width=4)
    run = Time(30, TimeUnit.BATCH)
    assert (
        algorithm.frozen_parameters(model, Timestamp(batch=9, batch_in_epoch=9).with_max_duration(run))
        == frozenset()
    )
    after_one = Timestamp(epoch=1, batch=14, batch_in_epoch=4).with_max_duration(run)
    # The first epoch ended at batch 10: a third of the run, so int(6 / 3) = 2 layers.
    assert algorithm.frozen_parameters(model, after_one) == freeze_layers(model, 10 / 30, 0.0)[0]
    assert len(freeze_layers(model, 10 / 30, 0.0)[0]) == 3  # conv weight, norm weight and bias


def _digits():
    # Equal batches (drop_last), so each frozen set compiles for one batch shape.
    task = load_digits_task()
    return TensorLoader(task.train, 120, seed=0, drop_last=True)


def _trainer(algorithms=(), max_duration="3ep", **kwargs) -> Trainer:
    return Trainer(
        SmallCNN(1, 10, width=8),
        _digits(),
        max_duration=max_duration,
        optimizer=optim.sgd(0.1, momentum=0.9, weight_decay=5e-4),
        algorithms=algorithms,
        seed=0,
        progress_bar=False,
        **kwargs,
    )


class _Snapshots(Callback):
    def __init__(self) -> None:
        self.params: dict[int, dict[str, torch.Tensor]] = {}
        self.momentum: dict[int, dict[str, torch.Tensor]] = {}

    def batch_end(self, view) -> None:
        self.params[view.timestamp.batch] = {n: p.clone() for n, p in view.state.params.items()}
        buffers = view.state.opt["momentum"].momentum_buffer
        self.momentum[view.timestamp.batch] = {n: b.clone() for n, b in buffers.items()}


@pytest.mark.parametrize("compile", [False, "aot_eager"])
def test_frozen_parameters_and_their_state_stay_still_while_the_rest_trains(compile, fresh_compiler) -> None:
    snapshots = _Snapshots()
    trainer = _trainer([LayerFreezing(freeze_start=0.0)], max_duration="2ep", callbacks=[snapshots], compile=compile)
    trainer.fit()
    per_epoch = trainer.steps_per_epoch
    model = SmallCNN(1, 10, width=8)
    frozen = freeze_layers(model, per_epoch / trainer.max_steps, 0.0)[0]
    assert frozen
    first, last = per_epoch, 2 * per_epoch
    for name, tensor in snapshots.params[last].items():
        if name in frozen:
            assert torch.equal(tensor, snapshots.params[first][name]), name
            assert torch.equal(snapshots.momentum[last][name], snapshots.momentum[first][name]), name
        else:
            assert not torch.equal(tensor, snapshots.params[first][name]), name
    assert not torch.equal(
        snapshots.params[first]["features.0.0.weight"], snapshots.params[1]["features.0.0.weight"]
    )
    if compile:
        # One step per frozen set: none, then the set after the first epoch's end.
        assert trainer.compiles == 2


def test_the_step_computes_no_gradient_for_frozen_parameters() -> None:
    from composer_fn.core.engine import make_plan
    from composer_fn.testing import make_setup
    from composer_fn.trainer.step import make_train_step

    setup = make_setup([])
    frozen = frozenset(n for n in setup.state.params if n.startswith("features.0."))
    seen: list[set[str]] = []
    original = torch.autograd.grad

    def recording(outputs, inputs, *args, **kwargs):
        seen.append({id(t) for t in inputs})
        return original(outputs, inputs, *args, **kwargs)

    step = make_train_step(
        setup.static, make_plan([]), setup.loss_fn, optim.sgd(0.1, momentum=0.9), frozen=frozen
    )
    torch.autograd.grad = recording
    try:
        new_state, _ = step(setup.state, setup.batches[0])
    finally:
        torch.autograd.grad = original
    assert len(seen) == 1 and len(seen[0]) == len(setup.state.params) - len(frozen)
    for name, tensor in new_state.params.items():
        assert torch.equal(tensor, setup.state.params[name]) == (name in frozen), name


def test_resuming_mid_freeze_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    algorithms = [LayerFreezing(freeze_start=0.2, freeze_level=0.8)]
    uninterrupted = _trainer(algorithms, save_folder=tmp_path / "a", save_interval="25ba")
    uninterrupted.fit()
    checkpoint = tmp_path / "a" / "ep2-ba25.pt"
    assert checkpoint.is_file()
    resumed = _trainer(algorithms, load_path=checkpoint)
    resumed.fit()
    left, right = pytree.tree_leaves(uninterrupted.state), pytree.tree_leaves(resumed.state)
    assert len(left) == len(right) and all(torch.equal(a, b) for a, b in zip(left, right, strict=True))
