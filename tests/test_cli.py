"""The command line: plans print, bad names list the valid ones, a short run trains."""

from __future__ import annotations

import pytest

from composer_fn.cli import main


def test_plan_prints_the_schedule_table(capsys) -> None:
    assert main(["plan", "--algorithms", "mixup,label_smoothing", "--max-duration", "2ep"]) == 0
    out = capsys.readouterr().out
    assert "BEFORE_LOSS" in out and "mixup, label_smoothing" in out and "46 steps" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--algorithms", "mixup,blurpoool"], "unknown algorithm 'blurpoool'; valid algorithms: "),
        (["plan", "--task", "cifar"], "unknown task 'cifar'; valid tasks: digits"),
    ],
)
def test_unknown_names_are_refused_with_the_valid_ones(argv, message) -> None:
    with pytest.raises(SystemExit, match=message):
        main(argv)


def test_train_runs_and_reports_accuracy_and_time(capsys, tmp_path) -> None:
    log = tmp_path / "log.jsonl"
    status = main(
        ["train", "--task", "digits-mlp", "--algorithms", "label_smoothing", "--max-duration", "2ep",
         "--no-progress", "--log-file", str(log)]
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "wall time" in out
    assert log.read_text().count('"kind": "eval"') == 2


@pytest.mark.parametrize("task", ["digits", "synthetic"])
def test_an_augmentation_of_unit_pixels_trains_on_unit_pixels(capsys, task) -> None:
    status = main(
        ["train", "--task", task, "--algorithms", "randaugment", "--max-duration", "1ep", "--no-progress"]
    )
    assert status == 0
    assert "held-out accuracy" in capsys.readouterr().out
