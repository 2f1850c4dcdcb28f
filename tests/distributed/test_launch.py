"""``composer-fn train --nproc 2`` runs torchrun and trains what one process trains with microbatches."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


@functools.cache  # the one-process reference is the same for two tests
def _one_process() -> list[str]:
    return _train("--microbatch-size", "32", "--threads", "1")


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
    assert len(two) == 1
    assert two == _one_process()


def test_two_sharded_processes_by_torchrun_print_the_metrics_of_one_process_and_save_a_folder_that_exports_and_predicts(
    tmp_path: Path,
) -> None:
    from composer_fn.app.cli import main

    run = tmp_path / "run"
    two = _train("--nproc", "2", "--fsdp", "--save-folder", str(run))
    assert len(two) == 1
    assert two == _one_process()
    saved = [path for path in run.iterdir() if path.is_dir() and not path.is_symlink() and not path.name.startswith(".")]
    assert len(saved) == 1 and (run / "latest").resolve() == saved[0].resolve()
    assert main(["export", str(run / "latest"), "--format", "torchscript", "--output", str(tmp_path / "m.pt")]) == 0
    assert main(["predict", str(run / "latest"), "--output", str(tmp_path / "p.csv")]) == 0
    assert len((tmp_path / "p.csv").read_text().splitlines()) > 1


def test_a_deepspeed_config_trains_sharded_what_its_options_train_in_one_process(tmp_path: Path) -> None:
    import json

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 3, "overlap_comm": True}, "gradient_clipping": 0.1, "steps_per_print": 10,
    }))  # fmt: skip
    two = _train("--nproc", "2", "--deepspeed", str(config))
    # ZeRO-3 over 2 processes of 32 in microbatches of 16, clipped at 0.1: one process with 4 microbatches.
    one = _train("--microbatch-size", "16", "--threads", "1", algorithms="mixup,label_smoothing,gradient_clipping")
    assert len(two) == 1
    assert two == one
