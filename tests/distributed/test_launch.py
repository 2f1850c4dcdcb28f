"""``composer-fn train --nproc 2`` runs torchrun and trains what one process trains with microbatches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _train(*flags: str, algorithms: str = "mixup,label_smoothing") -> list[str]:
    command = [sys.executable, "-m", "composer_fn", "train", "--task", "digits", "--max-duration", "3ba"]
    done = subprocess.run(
        [*command, "--batch-size", "64", "--no-progress", "--algorithms", algorithms, *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("held-out")]


def test_two_processes_by_torchrun_print_the_metrics_of_one_process_with_two_microbatches() -> None:
    two = _train("--nproc", "2")
    one = _train("--microbatch-size", "32", "--threads", "1")
    assert len(two) == 1
    assert two == one


def test_two_sharded_processes_by_torchrun_print_the_metrics_of_one_process_with_two_microbatches() -> None:
    two = _train("--nproc", "2", "--fsdp", algorithms="")
    one = _train("--microbatch-size", "32", "--threads", "1", algorithms="")
    assert len(two) == 1
    assert two == one
