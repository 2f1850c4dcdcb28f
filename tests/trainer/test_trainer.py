"""The trainer: it learns the digits, resumes bit for bit, saves atomically, and reports bad input clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

from composer_fn import optim
from composer_fn.algorithms import LabelSmoothing, MixUp
from composer_fn.callbacks import Callback
from composer_fn.core.event import Event
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.loggers import InMemoryLogger, JSONLLogger
from composer_fn.models import MLP, SmallCNN
from composer_fn.trainer import Trainer


def _digits(batch_size: int = 64):
    task = load_digits_task()
    return TensorLoader(task.train, batch_size, seed=0), TensorLoader(task.heldout, 360, shuffle=False)


def _trainer(model=None, algorithms=(), max_duration="2ep", **kwargs) -> Trainer:
    train, heldout = _digits()
    return Trainer(
        model if model is not None else MLP(64, 10, hidden=(32,)),
        train,
        heldout,
        max_duration=max_duration,
        optimizer=optim.sgd(0.1, momentum=0.9),
        schedule=optim.CosineAnnealingScheduler(),
        algorithms=algorithms,
        seed=0,
        progress_bar=False,
        **kwargs,
    )


def test_the_digits_cnn_reaches_97_percent_held_out_accuracy() -> None:
    trainer = _trainer(SmallCNN(1, 10), [MixUp(), LabelSmoothing()], max_duration="8ep")
    metrics = trainer.fit()
    assert metrics["eval/eval/accuracy"] >= 0.97


def test_resuming_from_a_mid_epoch_checkpoint_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    algorithms = [MixUp(alpha=0.4), LabelSmoothing(0.1)]
    uninterrupted = _trainer(SmallCNN(1, 10, width=8), algorithms, save_folder=tmp_path / "a", save_interval="7ba")
    uninterrupted.fit()
    checkpoint = tmp_path / "a" / "ep0-ba14.pt"
    assert checkpoint.is_file()
    resumed = _trainer(SmallCNN(1, 10, width=8), algorithms, load_path=checkpoint)
    assert resumed.timestamp.batch == 14 and resumed.timestamp.batch_in_epoch == 14
    resumed.fit()
    finished, spec = pytree.tree_flatten(uninterrupted.state)
    again, spec_again = pytree.tree_flatten(resumed.state)
    assert spec == spec_again
    assert all(torch.equal(a, b) for a, b in zip(finished, again, strict=True))
    assert resumed.timestamp.to_dict() | {"total_wct": 0, "epoch_wct": 0, "batch_wct": 0} == (
        uninterrupted.timestamp.to_dict() | {"total_wct": 0, "epoch_wct": 0, "batch_wct": 0}
    )


def test_resuming_from_a_checkpoint_after_an_epochs_last_batch_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    steps_per_epoch = len(_digits()[0])
    uninterrupted = _trainer(save_folder=tmp_path / "a", save_interval=f"{steps_per_epoch}ba")
    uninterrupted.fit()
    checkpoint = tmp_path / "a" / f"ep0-ba{steps_per_epoch}.pt"
    assert checkpoint.is_file()
    resumed = _trainer(load_path=checkpoint)
    assert resumed.timestamp.epoch == 0 and resumed.timestamp.batch_in_epoch == steps_per_epoch
    resumed.fit()
    finished, again = pytree.tree_leaves(uninterrupted.state), pytree.tree_leaves(resumed.state)
    assert all(torch.equal(a, b) for a, b in zip(finished, again, strict=True))
    assert resumed.timestamp.batch == uninterrupted.timestamp.batch


def test_a_checkpoint_from_other_algorithms_is_refused_with_both_lists(tmp_path: Path) -> None:
    trainer = _trainer(algorithms=[MixUp()], max_duration="1ba", save_folder=tmp_path)
    trainer.fit()
    with pytest.raises(ValueError, match="trained with algorithms.*mixup"):
        _trainer(algorithms=[LabelSmoothing()], load_path=tmp_path / "latest.pt")


def test_a_checkpoint_of_another_model_is_refused_by_parameter_name(tmp_path: Path) -> None:
    _trainer(max_duration="1ba", save_folder=tmp_path).fit()
    with pytest.raises(ValueError, match=r"latest.pt': its parameters do not match the model's: 2 of the model's are not in it \(5.bias, 5.weight\)"):
        _trainer(MLP(64, 10, hidden=(16, 16)), load_path=tmp_path / "latest.pt")


def test_a_failed_checkpoint_write_leaves_the_previous_file_and_no_temporary(tmp_path: Path, monkeypatch) -> None:
    trainer = _trainer(max_duration="1ba")
    trainer.fit()
    target = tmp_path / "state.pt"
    trainer.save_checkpoint(target)
    before = target.read_bytes()

    def broken_save(obj, stream, *args, **kwargs):
        stream.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_the_jsonl_logger_gets_a_record_per_logged_step_and_per_evaluation(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    trainer = _trainer(max_duration="2ep", loggers=[JSONLLogger(log)], log_interval="5ba")
    trainer.fit()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    steps = trainer.timestamp.batch
    assert [r["step"] for r in train] == [s for s in range(1, steps + 1) if s % 5 == 0 or s == steps]
    assert [r["epoch"] for r in evals] == [0, 1]
    assert all(0.0 <= r["eval/eval/accuracy"] <= 1.0 for r in evals)


def test_callbacks_see_the_events_in_loop_order_and_counts() -> None:
    class Recorder(Callback):
        def __init__(self) -> None:
            self.events: list[Event] = []

        def __getattr__(self, name: str):
            if name in Event._value2member_map_:
                return lambda view: self.events.append(view.event)
            raise AttributeError(name)

    recorder = Recorder()
    trainer = _trainer(max_duration="2ep", callbacks=[recorder])
    trainer.fit()
    events = recorder.events
    steps = trainer.timestamp.batch
    assert events[:3] == [Event.INIT, Event.FIT_START, Event.EPOCH_START]
    assert events[-2:] == [Event.EVAL_AFTER_ALL, Event.FIT_END] or events[-1] == Event.FIT_END
    for event, count in [
        (Event.BATCH_START, steps),
        (Event.BATCH_END, steps),
        (Event.BEFORE_DATALOADER, steps),
        (Event.EPOCH_START, 2),
        (Event.EPOCH_END, 2),
        (Event.EPOCH_CHECKPOINT, 2),
    ]:
        assert events.count(event) == count, event
    first_end = events.index(Event.BATCH_END)
    assert events[first_end - 1] == Event.BATCH_START and events[first_end + 1] == Event.BATCH_CHECKPOINT


def test_the_timestamp_counts_samples_and_wall_clock_time() -> None:
    trainer = _trainer(max_duration="3ba")
    trainer.fit()
    assert trainer.timestamp.sample == 3 * 64 and trainer.timestamp.batch == 3
    assert trainer.timestamp.total_wct > 0 and trainer.timestamp.batch_wct > 0


def test_eval_reports_accuracy_and_leaves_the_state_alone() -> None:
    trainer = _trainer(max_duration="1ep")
    trainer.fit()
    params = {n: p.clone() for n, p in trainer.state.params.items()}
    results = trainer.eval()
    assert set(results) == {"eval/eval/accuracy", "eval/eval/loss"}
    assert all(torch.equal(params[n], p) for n, p in trainer.state.params.items())


def test_the_users_model_is_left_untouched() -> None:
    model = MLP(64, 10, hidden=(32,))
    before = {n: p.clone() for n, p in model.state_dict().items()}
    _trainer(model, max_duration="3ba").fit()
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_bf16_mixed_precision_trains() -> None:
    metrics = _trainer(max_duration="2ep", precision="bf16-mixed").fit()
    assert metrics["eval/eval/accuracy"] > 0.8


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"max_duration": "0.5dur"}, "max_duration='0.5dur'"),
        ({"max_duration": "ten epochs"}, "ten epochs"),
        ({"save_interval": "2sp", "save_folder": "x"}, "save_interval='2sp'"),
    ],
)
def test_bad_arguments_are_reported_with_their_value(arguments, message) -> None:
    with pytest.raises(ValueError, match=message):
        _trainer(**arguments)


def test_a_loader_without_length_is_refused() -> None:
    with pytest.raises(TypeError, match="train_dataloader"):
        Trainer(MLP(64, 10), iter([]), max_duration="1ep", optimizer=optim.sgd(0.1))


def test_a_loader_that_yields_nothing_is_reported_instead_of_looping() -> None:
    class Empty:
        def __len__(self) -> int:
            return 3

        def __iter__(self):
            return iter(())

    trainer = Trainer(MLP(64, 10), Empty(), max_duration="1ep", optimizer=optim.sgd(0.1), progress_bar=False)
    with pytest.raises(ValueError, match="yielded no batch in epoch 0"):
        trainer.fit()


def test_the_trainer_keeps_the_global_random_state() -> None:
    state = torch.random.get_rng_state()
    _trainer(algorithms=[MixUp()], max_duration="3ba").fit()
    assert torch.equal(torch.random.get_rng_state(), state)


def test_in_memory_logger_holds_the_hyperparameters_record() -> None:
    logger = InMemoryLogger()
    _trainer(algorithms=[MixUp()], max_duration="2ba", loggers=[logger]).fit()
    hparams = [r for r in logger.records if r["kind"] == "hparams"]
    assert hparams and hparams[0]["algorithms"][0]["algorithm"] == "mixup"


@pytest.mark.parametrize("standardize", [True, False])
def test_an_augmentation_of_unit_pixels_refuses_standardised_inputs_and_takes_unit_ones(standardize) -> None:
    from composer_fn.algorithms import AugMix, RandAugment

    task = load_digits_task(standardize=standardize)
    for algorithm in (RandAugment(), AugMix()):
        trainer = Trainer(
            SmallCNN(in_channels=1, num_classes=10, width=4),
            TensorLoader(task.train, 32, seed=0),
            max_duration="2ba",
            optimizer=optim.sgd(0.05),
            algorithms=[algorithm],
            progress_bar=False,
        )
        if standardize:
            with pytest.raises(ValueError, match=rf"{algorithm.name} takes floating-point inputs in \[0.0, 1.0\]"):
                trainer.fit()
        else:
            trainer.fit()
            assert trainer.timestamp.batch == 2


@pytest.mark.parametrize(("ratio", "steps", "multipliers"), [(1.0, 8, [1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5]), (0.5, 4, [1, 1, 0.5, 0.5])])
def test_the_scale_schedule_ratio_scales_the_run_and_the_schedule_alike(ratio, steps, multipliers) -> None:
    task = load_digits_task()
    trainer = Trainer(
        MLP(64, 10, hidden=(8,)),
        TensorLoader(task.train, 64, seed=0),
        max_duration="8ba",
        optimizer=optim.sgd(0.1),
        schedule=optim.StepScheduler("4ba", gamma=0.5),
        scale_schedule_ratio=ratio,
        progress_bar=False,
    )
    assert trainer.max_steps == steps
    assert [float(trainer.lr_multiplier(step)) for step in range(steps)] == multipliers
    trainer.fit()
    assert trainer.timestamp.batch == steps


@pytest.mark.parametrize("ratio", [0, -0.5, float("nan"), "0.5", True, 0.01])
def test_a_bad_or_vanishing_scale_schedule_ratio_is_refused(ratio) -> None:
    task = load_digits_task()
    with pytest.raises(ValueError, match="scale_schedule_ratio="):
        Trainer(
            MLP(64, 10, hidden=(8,)),
            TensorLoader(task.train, 64, seed=0),
            max_duration="8ba",
            optimizer=optim.sgd(0.1),
            scale_schedule_ratio=ratio,
            progress_bar=False,
        )


@pytest.mark.parametrize(
    "algorithm_names",
    [("sam",), ("ema",), ("gradient_clipping",), ("sam", "ema", "gradient_clipping", "label_smoothing")],
    ids="+".join,
)
def test_resuming_with_optimization_side_algorithms_equals_the_uninterrupted_run(
    tmp_path: Path, algorithm_names: tuple[str, ...]
) -> None:
    from composer_fn.algorithms import EMA, SAM, GradientClipping

    made = {
        "sam": lambda: SAM(rho=0.05, interval=2),
        "ema": lambda: EMA(half_life="3ba"),
        "gradient_clipping": lambda: GradientClipping("norm", 0.5),
        "label_smoothing": lambda: LabelSmoothing(0.1),
    }
    algorithms = [made[name]() for name in algorithm_names]
    uninterrupted = _trainer(SmallCNN(1, 10, width=4), algorithms, save_folder=tmp_path / "a", save_interval="9ba")
    uninterrupted.fit()
    resumed = _trainer(SmallCNN(1, 10, width=4), algorithms, load_path=tmp_path / "a" / "ep0-ba18.pt")
    resumed.fit()
    finished, spec = pytree.tree_flatten(uninterrupted.state)
    again, spec_again = pytree.tree_flatten(resumed.state)
    assert spec == spec_again
    assert all(torch.equal(a, b) for a, b in zip(finished, again, strict=True))


def test_predict_returns_the_models_outputs_batch_by_batch_in_eval_mode() -> None:
    from torch.func import functional_call

    from composer_fn import random as R
    from composer_fn.callbacks.base import RunView

    seen: list[str] = []

    class Events(Callback):
        def predict_start(self, view: RunView) -> None:
            seen.append("start")

        def predict_batch_end(self, view: RunView) -> None:
            seen.append("batch")

        def predict_end(self, view: RunView) -> None:
            seen.append("end")

    images = R.normal(R.key(4), (20, 1, 8, 8))
    labels = R.randint(R.key(5), 0, 4, (20,))
    model = SmallCNN(1, 4, width=4)
    trainer = Trainer(model, TensorLoader((images, labels), 8), max_duration="3ba", callbacks=[Events()], progress_bar=False)
    trainer.fit()
    by_tuples = trainer.predict(TensorLoader((images, labels), 8, shuffle=False))
    by_tensors = trainer.predict([images[:8], images[8:16], images[16:]])
    assert [o.shape for o in by_tuples] == [(8, 4), (8, 4), (4, 4)]
    assert trainer.static.module.training  # back in training mode
    model.eval()
    expected = functional_call(model, ({**trainer.state.params, **trainer.state.buffers},), (images,))
    assert torch.allclose(torch.cat(by_tuples), expected, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(by_tuples, by_tensors, strict=True))
    assert seen == ["start", "batch", "batch", "batch", "end"] * 2
