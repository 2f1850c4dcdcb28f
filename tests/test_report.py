"""Pictures of runs: the PNG decodes to its size, the switches it marks are when algorithms started and stopped
acting, and a log that is not one is refused naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.image import imread

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.algorithms import LabelSmoothing, SelectiveBackprop
from composer_fn.app.cli import main
from composer_fn.app.report import DPI, HEIGHT, WIDTH, read_run, write_report
from composer_fn.data import TensorLoader
from composer_fn.loggers import JSONLLogger
from composer_fn.models import MLP
from composer_fn.trainer.reporting import Switches

DATA = (R.normal(R.key(0), (64, 6)), R.randint(R.key(1), 0, 3, (64,)))
HELD_OUT = (R.normal(R.key(2), (32, 6)), R.randint(R.key(3), 0, 3, (32,)))


def _run(folder: Path, *algorithms: object) -> Path:
    Trainer(
        MLP(6, 3),
        TensorLoader(DATA, batch_size=8),
        TensorLoader(HELD_OUT, batch_size=16, shuffle=False),
        max_duration="5ep",
        optimizer=optim.sgd(0.1),
        algorithms=list(algorithms),
        log_interval="4ba",
        eval_interval="1ep",
        loggers=[JSONLLogger(folder / "log.jsonl")],
        progress_bar=False,
    ).fit()
    return folder


def test_a_run_and_a_comparison_are_drawn_with_the_switches_of_its_algorithms(tmp_path: Path) -> None:
    # SelectiveBackprop acts on every other batch from 50% to 90% of the 40 steps: 20, 22, ..., 34; so it is on
    # from 20 and off from 35, once, not switched at every batch.
    run = _run(tmp_path / "sb", LabelSmoothing(), SelectiveBackprop(start=0.5, end=0.9))
    base = _run(tmp_path / "base")
    read = read_run(run)
    assert [(r["step"], r.get("on"), r.get("off")) for r in read.plan] == [
        (0, ["label_smoothing"], None),
        (20, ["selective_backprop"], None),
        (35, None, ["selective_backprop"]),
    ]
    assert read.label == "sb" and len(read.eval) == 5 and all("wall_time" in r for r in read.train + read.eval)
    path = write_report([run])
    assert path == run / "report.png"
    assert imread(path).shape[:2] == (HEIGHT * DPI, WIDTH * DPI)
    compared = write_report([run, base], tmp_path / "both.png", labels=["selective backprop", "baseline"])
    assert imread(compared).shape[:2] == (HEIGHT * DPI, WIDTH * DPI)
    assert main(["report", str(run), "--compare", str(base), "--output", str(tmp_path / "cli.png")]) == 0
    assert (tmp_path / "cli.png").stat().st_size > 10_000


def _expected(steps: list[set[str]], gap: int) -> list[tuple[int, str, list[str]]]:
    # By the definition: on at the first step acting (again); off at the first step of an absence that lasts
    # more than ``gap`` steps, or to the end of the run.
    switches: list[tuple[int, str, list[str]]] = []
    on: set[str] = set()
    for step, acting in enumerate(steps):
        gone = sorted(
            name
            for name in on - acting
            if (step == 0 or name in steps[step - 1])
            and all(name not in later for later in steps[step : step + gap + 1])
        )
        if gone:
            switches.append((step, "off", gone))
            on -= set(gone)
        if acting - on:
            switches.append((step, "on", sorted(acting - on)))
            on |= acting
    return sorted(switches)


@given(st.lists(st.sets(st.sampled_from("abc")), min_size=1, max_size=40))
def test_switches_fold_gaps_shorter_than_the_gap_and_mark_the_rest(steps: list[set[str]]) -> None:
    switches = Switches()
    logged = []
    for step, acting in enumerate(steps):
        if step == 0 or acting != steps[step - 1]:
            switches.seen(set(acting), step)
        logged.extend(switches.due(step))
    logged.extend(switches.due(len(steps) - 1 + Switches.GAP))  # the end of the run
    assert sorted(logged) == _expected(steps, Switches.GAP)


def test_what_is_not_a_run_log_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        write_report([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds 0 JSON-lines logs"):
        write_report([tmp_path / "empty"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not a JSON record"):
        write_report([bad])
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"kind": "hparams"}) + "\n")
    with pytest.raises(ValueError, match="holds no training or evaluation record"):
        write_report([other])
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"kind": "train", "step": 1, "loss": 1.0, "wall_time": 0.1}) + "\n")
    with pytest.raises(ValueError, match=r"output=.*report.jpg.*\.png"):
        write_report([good], tmp_path / "report.jpg")
    with pytest.raises(ValueError, match="labels has 2 names for 1 runs"):
        write_report([good], labels=["a", "b"])


def test_the_command_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "composer_fn", "report", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "does not exist" in done.stderr


def test_a_named_evaluators_metric_is_drawn_when_there_is_no_plain_accuracy(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    records = [
        {"kind": "train", "step": 1, "loss": 1.0, "wall_time": 0.1, "samples_per_second": 10.0, "lr_multiplier": 1.0},
        {"kind": "eval", "step": 1, "wall_time": 0.2, "eval/val/f1": 0.5, "eval/val/loss": 0.9},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    from composer_fn.app.report import _held_out

    assert _held_out([read_run(log)]) == "eval/val/f1"  # no accuracy, no plain loss: the first logged
    assert imread(write_report([log])).shape[:2] == (HEIGHT * DPI, WIDTH * DPI)
