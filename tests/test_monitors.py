"""Monitors: their numbers reach every logger at each log step and read back from TensorBoard; each figure is
the arithmetic of the clock and counters it read, checked under a clock the test sets."""

from __future__ import annotations

import mmap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.callbacks import (
    LRMonitor,
    MemoryMonitor,
    RuntimeEstimator,
    SpeedMonitor,
    SystemMetricsMonitor,
    measure_flops_per_sample,
)
from composer_fn.callbacks import monitors as monitors_module
from composer_fn.callbacks.base import RunView
from composer_fn.core.event import Event
from composer_fn.core.state import Static, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.data import TensorLoader
from composer_fn.loggers import InMemoryLogger, TensorBoardLogger
from composer_fn.models import MLP
from composer_fn.optim import schedules

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))


def _monitors() -> list[Any]:
    return [SpeedMonitor(window_size=3, flops_per_sample=1e3, peak_flops=1e9), LRMonitor(), MemoryMonitor(),
            RuntimeEstimator(), SystemMetricsMonitor()]


def test_every_monitor_reaches_tensorboard_at_each_log_step(tmp_path: Path) -> None:
    memory = InMemoryLogger()
    Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        max_duration="3ep",
        optimizer=optim.sgd(0.2),
        schedule=schedules.LinearScheduler(alpha_i=1.0, alpha_f=0.5),
        log_interval="2ba",
        callbacks=_monitors(),
        loggers=[TensorBoardLogger(tmp_path / "tb"), memory],
        progress_bar=False,
    ).fit()
    records = [r for r in memory.records if r["kind"] == "train"]
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    for record in records:
        assert record["lr"] == pytest.approx(0.2 * record["lr_multiplier"], rel=1e-12)
        assert record["throughput/samples_per_second"] > 0
        assert record["throughput/mfu"] == pytest.approx(record["throughput/flops_per_second"] / 1e9)
        assert record["throughput/flops_per_second"] == pytest.approx(record["throughput/samples_per_second"] * 1e3)
        assert record["memory/rss_bytes"] > 2**20
        assert 0 <= record["sys/cpu_percent"]
    # The estimate starts after the first log step past the skipped batch; at the last step nothing remains.
    remaining = [r.get("time/remaining_seconds") for r in records]
    assert remaining[0] is None and remaining[-1] == 0.0 and all(value > 0 for value in remaining[1:-1])
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for tag in ("throughput/samples_per_second", "time/step_ms", "throughput/mfu", "memory/rss_bytes", "sys/cpu_percent"):
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert logged == [(r["step"], pytest.approx(r[tag], rel=1e-6)) for r in records]
    assert [event.step for event in events.Scalars("train/lr")] == [2, 4, 6, 8, 10, 12]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _view(batch: int, samples: int, max_steps: int = 100) -> RunView:
    model = nn.Linear(2, 2)
    stamp = Timestamp(batch=batch, sample=samples)
    return RunView(Event.BATCH_END, Static(module=model), initial_state(model, R.key(0)), stamp, max_steps, {})


@given(st.lists(st.tuples(st.integers(1, 4), st.floats(0.01, 2.0)), min_size=1, max_size=12), st.integers(1, 6))
def test_speed_is_the_samples_and_seconds_of_the_last_window(steps: list[tuple[int, float]], window: int) -> None:
    # Each log step covers ``batches`` batches of 8 samples in ``seconds``.
    clock = _Clock()
    monitor = SpeedMonitor(window_size=window)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(monitors_module.time, "perf_counter", clock)
        monitor.fit_start(_view(0, 0))
        points = [(clock.now, 0)]
        batch = 0
        for batches, seconds in steps:
            clock.now += seconds
            batch += batches
            values = monitor.log_metrics(_view(batch, 8 * batch))
            points.append((clock.now, batch))
            # The oldest point that still leaves a whole window (or the start).
            start = max((p for p in points if batch - p[1] >= window), key=lambda p: p[1], default=points[0])
            elapsed, counted = clock.now - start[0], batch - start[1]
            assert values["time/step_ms"] == pytest.approx(1e3 * elapsed / counted)
            assert values["throughput/samples_per_second"] == pytest.approx(8 * counted / elapsed)


def test_the_estimate_is_the_time_per_batch_so_far_times_the_batches_left() -> None:
    clock = _Clock()
    monitor = RuntimeEstimator(skip_batches=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(monitors_module.time, "perf_counter", clock)
        monitor.fit_start(_view(0, 0, max_steps=10))
        assert monitor.log_metrics(_view(1, 8, max_steps=10)) == {}
        assert monitor.log_metrics(_view(2, 16, max_steps=10)) == {}  # the clock starts here
        clock.now += 3.0
        assert monitor.log_metrics(_view(4, 32, max_steps=10)) == {"time/remaining_seconds": pytest.approx(9.0)}


def test_flops_per_sample_are_counted_once_and_leave_the_gradients_as_they_were() -> None:
    layer = nn.Linear(10, 5, bias=False)
    layer.weight.grad = torch.ones(5, 10)
    # Forward 2·10·5 per sample; backward: the weight's gradient, 2·10·5 (the input needs none).
    assert measure_flops_per_sample(layer, torch.randn(4, 10)) == 200
    assert torch.equal(layer.weight.grad, torch.ones(5, 10))
    with pytest.raises(ValueError, match="batch=.*at least one sample"):
        measure_flops_per_sample(layer, torch.randn(0, 10))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SpeedMonitor(window_size=0), "window_size=0"),
        (lambda: SpeedMonitor(peak_flops=0.0), "peak_flops=0.0"),
        (lambda: SpeedMonitor(flops_per_sample=-1.0), "flops_per_sample=-1.0"),
        (lambda: RuntimeEstimator(skip_batches=-1), "skip_batches=-1"),
    ],
)
def test_bad_monitor_arguments_are_refused_naming_them(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_the_console_line_shows_the_step_time_and_the_time_left() -> None:
    import io

    from composer_fn.loggers import ConsoleLogger

    stream = io.StringIO()
    Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        max_duration="2ep",
        optimizer=optim.sgd(0.1),
        log_interval="2ba",
        callbacks=[SpeedMonitor(), RuntimeEstimator(skip_batches=0)],
        loggers=[ConsoleLogger(stream)],
        progress_bar=False,
    ).fit()
    lines = [line for line in stream.getvalue().splitlines() if "samples/s" in line]
    assert len(lines) == 4 and all(" ms/step" in line for line in lines)
    assert all(" left" in line for line in lines[1:]) and lines[-1].endswith("| 0:00 left")


@pytest.mark.parametrize("per_layer", [True, False])
def test_the_optimizer_monitor_logs_gradient_and_update_norms_of_the_logged_step(per_layer: bool) -> None:
    from composer_fn.callbacks import OptimizerMonitor

    memory = InMemoryLogger()
    model = MLP(6, 2)
    names = [name for name, _ in model.named_parameters()]
    Trainer(
        model,
        TensorLoader(DATA, batch_size=8),
        max_duration="1ep",
        optimizer=optim.sgd(0.1),  # plain SGD: each update is -0.1 times the gradient
        log_interval="2ba",
        callbacks=[OptimizerMonitor(per_layer=per_layer)],
        loggers=[memory],
        progress_bar=False,
    ).fit()
    records = [r for r in memory.records if r["kind"] == "train"]
    assert len(records) == 2
    for record in records:
        norms = {name: value for name, value in record.items() if name.startswith("l2_norm/")}
        layers = [f"l2_norm/{kind}/{name}" for kind in ("grad", "update") for name in names]
        assert set(norms) == {"l2_norm/grad/global", "l2_norm/update/global", *(layers if per_layer else [])}
        assert record["l2_norm/update/global"] == pytest.approx(0.1 * record["l2_norm/grad/global"], rel=1e-5)
        if per_layer:
            squares = sum(record[f"l2_norm/grad/{name}"] ** 2 for name in names)
            assert record["l2_norm/grad/global"] == pytest.approx(squares**0.5, rel=1e-5)
            for name in names:
                assert record[f"l2_norm/update/{name}"] == pytest.approx(0.1 * record[f"l2_norm/grad/{name}"], rel=1e-5)


def test_the_resident_memory_on_the_cpu_is_the_figure_psutil_reports() -> None:
    import psutil

    monitor = MemoryMonitor()
    view = SimpleNamespace(static=SimpleNamespace(device=torch.device("cpu")))
    first = monitor.log_metrics(view)["memory/rss_bytes"]  # type: ignore[arg-type]
    reported = psutil.Process().memory_info().rss
    # Fresh pages, written: resident (a freed block of the heap could be resident already).
    grown = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(grown), mmap.PAGESIZE):
        grown[offset] = 1
    second = monitor.log_metrics(view)["memory/rss_bytes"]  # type: ignore[arg-type]
    assert abs(first - reported) < 8 * 2**20
    assert second - first > 48 * 2**20
    grown.close()
    monitor.close()
    assert monitor.log_metrics(view)["memory/rss_bytes"] > 0  # type: ignore[arg-type]
    monitor.close()
