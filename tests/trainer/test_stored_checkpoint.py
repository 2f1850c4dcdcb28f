"""A checkpoint written by an earlier version of the trainer still loads and resumes to the run's result.

``checkpoints/digits-blurpool-ema-adamw-ep0-ba6.pt`` was written by commit 55b9da0 (``python
tests/trainer/test_stored_checkpoint.py`` writes it again): a run of ``_trainer`` stopped at batch 6 of 12, with
a surgery recorded (BlurPool), an algorithm state (EMA), AdamW's moments and per-parameter step counts, a warm-up
schedule and metadata. However the trainer's code is arranged, that file must resume to the uninterrupted run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from composer_fn import optim
from composer_fn.algorithms import EMA, BlurPool, LabelSmoothing
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import SmallCNN
from composer_fn.trainer import Trainer
from composer_fn.trainer.checkpoint import checkpoint_metadata

STORED = Path(__file__).parent / "checkpoints" / "digits-blurpool-ema-adamw-ep0-ba6.pt"


def _trainer(**kwargs: object) -> Trainer:
    task = load_digits_task()
    torch.manual_seed(0)
    return Trainer(
        SmallCNN(1, 10, width=8),
        TensorLoader(task.train, 100, seed=0),
        max_duration="12ba",
        optimizer=optim.adamw(0.01, weight_decay=0.05),
        schedule=optim.CosineAnnealingWithWarmupScheduler(t_warmup="3ba"),
        algorithms=[BlurPool(min_channels=8), EMA(half_life="2ba"), LabelSmoothing(0.1)],
        seed=3,
        progress_bar=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_checkpoint_written_by_an_earlier_version_resumes_to_the_uninterrupted_run() -> None:
    uninterrupted = _trainer()
    uninterrupted.fit()
    resumed = _trainer(load_path=STORED)
    assert resumed.timestamp.batch == 6
    resumed.fit()
    assert resumed.timestamp.batch == uninterrupted.timestamp.batch == 12
    # The same numbers up to this machine's rounding: the file's first six steps ran on the machine that wrote it.
    expected, got = pytree.tree_leaves(uninterrupted.state), pytree.tree_leaves(resumed.state)
    assert len(expected) == len(got)
    for left, right in zip(expected, got, strict=True):
        torch.testing.assert_close(right, left, rtol=1e-5, atol=1e-6)
    inputs = load_digits_task().train[0][:16]
    torch.testing.assert_close(resumed.model(inputs), uninterrupted.model(inputs), rtol=1e-5, atol=1e-5)


def test_a_stored_checkpoint_keeps_its_metadata_and_its_recorded_surgery() -> None:
    assert checkpoint_metadata(STORED) == {"task": "digits", "width": 8}
    resumed = _trainer(load_path=STORED)
    assert "BlurConv2d" in repr(resumed.static.module)


if __name__ == "__main__":
    STORED.parent.mkdir(exist_ok=True)
    _trainer(save_folder=sys.argv[1] if len(sys.argv) > 1 else STORED.parent / "run", save_interval="6ba",
             save_metadata={"task": "digits", "width": 8}).fit()  # fmt: skip
