"""TensorBoard and console loggers: what the trainer logs is read back with TensorBoard's own reader, and the
console shows one line per logged step and per evaluation."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.loggers import ConsoleLogger, InMemoryLogger, TensorBoardLogger
from composer_fn.models import MLP

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))


def _fit(*loggers) -> None:
    Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        TensorLoader(DATA, batch_size=16, shuffle=False),
        max_duration="2ep",
        optimizer=optim.sgd(0.1),
        log_interval="1ba",
        loggers=list(loggers),
        progress_bar=False,
    ).fit()


def test_tensorboard_holds_every_logged_scalar_at_its_step_and_the_settings_once(tmp_path: Path) -> None:
    memory = InMemoryLogger()
    _fit(TensorBoardLogger(tmp_path / "tb"), memory)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    for kind in ("train", "eval"):
        records = [r for r in memory.records if r["kind"] == kind]
        assert records
        for name in ("loss", "lr_multiplier", "samples_per_second") if kind == "train" else ("eval/eval/accuracy", "eval/eval/loss"):
            tag = name if "/" in name else f"{kind}/{name}"
            assert tag in scalars
            logged = [(e.step, e.value) for e in events.Scalars(tag)]
            assert logged == [(r["step"], pytest.approx(r[name], rel=1e-6)) for r in records]
    assert "fit/wall_time" in scalars
    texts = [tag for tag in events.Tags()["tensors"] if tag.startswith("hparams")]
    assert len(texts) == 1
    text = events.Tensors(texts[0])[0].tensor_proto.string_val[0].decode()
    assert '"max_duration": "2ep"' in text and '"seed": 0' in text


def test_the_console_shows_one_line_per_logged_step_and_per_evaluation() -> None:
    stream = io.StringIO()
    _fit(ConsoleLogger(stream))
    lines = stream.getvalue().splitlines()
    assert sum("samples/s" in line for line in lines) == 8
    evaluations = [line for line in lines if "eval/eval/accuracy" in line]
    assert len(evaluations) == 2 and all("%" in line and "eval/eval/loss" in line for line in evaluations)
    assert lines[0].startswith("[epoch 0 | batch 1] loss ")
    assert lines[-1].startswith("[done at batch 8]")


def test_a_bad_flush_interval_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_secs=0 must be an int >= 1"):
        TensorBoardLogger(tmp_path, flush_secs=0)


def test_console_lines_that_come_quickly_wait_and_go_out_together_in_order_none_lost() -> None:
    stream = io.StringIO()
    console = ConsoleLogger(stream, flush_interval=3600.0)
    train = {"kind": "train", "epoch": 0, "loss": 1.0, "lr_multiplier": 1.0, "samples_per_second": 5.0}
    for step in range(1, 5):
        console.log({**train, "step": step})
    # The first line goes out at once; the next three wait for a record that is not training's.
    assert stream.getvalue().splitlines() == ["[epoch 0 | batch 1] loss 1.0000 | lr × 1 | 5 samples/s"]
    console.log({"kind": "eval", "step": 4, "epoch": 0, "eval/eval/accuracy": 0.5})
    lines = stream.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == [f"[epoch 0 | batch {step}" for step in range(1, 5)] + [
        "[epoch 0 | batch 4"
    ]
    console.log({**train, "step": 5})
    console.log({**train, "step": 6})
    console.close()
    assert stream.getvalue().splitlines()[-1].startswith("[epoch 0 | batch 6]")


def test_a_bad_console_flush_interval_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="flush_interval"):
        ConsoleLogger(flush_interval=-1.0)


def test_loggers_receive_every_record_in_order_even_when_the_run_fails() -> None:
    from composer_fn.callbacks import Callback

    class Fails(Callback):
        def batch_end(self, view) -> None:
            if view.timestamp.batch == 6:
                raise RuntimeError("stop here")

    memory = InMemoryLogger()
    trainer = Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        max_duration="2ep",
        optimizer=optim.sgd(0.1),
        log_interval="1ba",
        loggers=[memory],
        callbacks=[Fails()],
        progress_bar=False,
    )
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.fit()
    assert [r["step"] for r in memory.records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_the_plan_is_logged_once_at_the_start_as_the_plan_command_prints_it(tmp_path: Path) -> None:
    from composer_fn.algorithms import LabelSmoothing, MixUp
    from composer_fn.core.dry_run import dry_run

    algorithms = [MixUp(), LabelSmoothing(0.1)]
    memory, stream = InMemoryLogger(), io.StringIO()
    Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        max_duration="2ep",
        optimizer=optim.sgd(0.1),
        algorithms=algorithms,
        loggers=[memory, ConsoleLogger(stream), TensorBoardLogger(tmp_path / "tb")],
        progress_bar=False,
    ).fit()
    schedules = [r for r in memory.records if r["kind"] == "schedule"]
    expected = dry_run(algorithms, "8ba", 4).format()
    assert schedules == [{"kind": "schedule", "table": expected}]
    assert expected in stream.getvalue()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["tensors"] if tag.startswith("schedule")]
    assert len(tags) == 1
    assert "BEFORE_LOSS" in events.Tensors(tags[0])[0].tensor_proto.string_val[0].decode()
    plain = InMemoryLogger()
    Trainer(MLP(6, 2), TensorLoader(DATA, batch_size=8), max_duration="1ba", optimizer=optim.sgd(0.1), loggers=[plain], progress_bar=False).fit()
    assert not [r for r in plain.records if r["kind"] == "schedule"]  # no algorithm, no plan
