"""The profiler: its Chrome trace is valid JSON holding the run's markers and the machine's counters, a profiled
run trains exactly as an unprofiled one, and ``composer-fn profile`` says where the time went."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.algorithms import LabelSmoothing, MixUp
from composer_fn.app.cli import main
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.models import SmallCNN
from composer_fn.profiler import Profiler, summarize

DATA = synthetic_images(R.key(1), 64, num_classes=4, shape=(1, 8, 8))


def _fit(profiler: Profiler | None, compile: Any = False) -> Trainer:
    trainer = Trainer(
        SmallCNN(1, 4, width=4),
        TensorLoader(DATA, 8, seed=3),
        max_duration="6ba",
        optimizer=optim.sgd(0.1, momentum=0.9),
        algorithms=[MixUp(), LabelSmoothing()],
        progress_bar=False,
        compile=compile,
        profiler=profiler,
    )
    trainer.fit()
    return trainer


def _events(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["traceEvents"])


def test_the_trace_holds_the_runs_markers_and_counters_and_the_run_is_unchanged(tmp_path: Path) -> None:
    profiled = _fit(Profiler(tmp_path, schedule=(1, 1, 3, 1)))
    assert [path.name for path in profiled.profile_traces] == ["rank0.5.pt.trace.json"]
    events = _events(profiled.profile_traces[0])
    names = {event["name"] for event in events}
    assert {"event/BATCH_START", "mixup/batch_start", "mixup/before_forward", "label_smoothing/before_loss"} <= names
    assert sum(name.startswith("ProfilerStep#") for name in names) == 3
    counters = [event for event in events if event.get("ph") == "C" and event["name"] == "cpu_percent"]
    assert len(counters) == 3
    steps = [event for event in events if event["name"].startswith("ProfilerStep#")]
    # The counters sit on the trace's own clock, inside the recorded steps.
    assert min(e["ts"] for e in steps) <= counters[0]["ts"] <= max(e["ts"] + e["dur"] for e in steps) + 1e6
    plain = _fit(None)
    for name, value in plain.state.params.items():
        assert torch.equal(profiled.state.params[name], value)
    text = summarize(profiled.profile_traces)
    assert "mixup" in text and "label_smoothing" in text and "aten::" in text


@pytest.mark.slow
def test_a_compiled_step_is_profiled_whole_with_the_host_markers(tmp_path: Path) -> None:
    trainer = _fit(Profiler(tmp_path, schedule=(1, 1, 2, 1)), compile="aot_eager")
    names = {event["name"] for event in _events(trainer.profile_traces[0])}
    assert "event/BATCH_START" in names and "mixup/batch_start" in names
    assert trainer.compiles == 1  # the markers add no graph break


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"schedule": (1, 1, 0, 1)}, "schedule's active=0"),
        ({"schedule": (1, 1, 3)}, r"schedule=\(1, 1, 3\): expected \(wait, warmup, active, repeat\)"),
        ({"schedule": (-1, 1, 3, 1)}, "schedule's wait=-1"),
        ({"record_shapes": "yes"}, "record_shapes='yes' must be True or False"),
    ],
)
def test_bad_profiler_arguments_are_refused_naming_them(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Profiler(**arguments)


def test_a_profiler_of_another_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="profiler of type str: expected a composer_fn.profiler.Profiler"):
        Trainer(SmallCNN(1, 4, width=4), TensorLoader(DATA, 8), max_duration="1ba", profiler="torch")  # type: ignore[arg-type]


def test_the_profile_command_prints_operators_and_algorithms(tmp_path: Path, capsys) -> None:
    argv = ["profile", "--algorithms", "mixup", "--steps", "2", "--trace-folder", str(tmp_path), "--no-progress"]
    assert main([*argv, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "algorithm (its hooks)" in out and "\nmixup " in out and "aten::" in out
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rank0.4.pt.trace.json"]
