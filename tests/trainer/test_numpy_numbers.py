"""NumPy scalars are numbers wherever a Python number is accepted: a run given ``np.int64``/``np.float32`` values
trains, logs, saves and resumes exactly as one given the Python numbers of the same values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from composer_fn import Checkpointing, CutMix, EarlyStopper, Evaluator, MixUp, Trainer, optim
from composer_fn import random as R
from composer_fn.callbacks import NaNMonitor, SpeedMonitor
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.loggers import JSONLLogger
from composer_fn.models import MLP
from composer_fn.profiler import Profiler

ROWS = (torch.randn(16, 2, generator=torch.Generator().manual_seed(0)), torch.arange(16) % 2)


def _run(tmp_path: Path, number: type, real: type) -> tuple[dict[str, float], list[dict], Trainer]:
    folder = tmp_path / number.__name__
    trainer = Trainer(
        MLP(2, 2),
        TensorLoader(ROWS, number(4), seed=number(1)),
        max_duration=number(2),
        optimizer=optim.sgd(real(0.1), momentum=real(0.9)),
        algorithms=[MixUp(alpha=real(0.2))],
        loggers=[JSONLLogger(folder / "log.jsonl")],
        save_folder=folder,
        seed=number(3),
        scale_schedule_ratio=real(0.5),
        progress_bar=False,
    )
    metrics = trainer.fit()
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return metrics, records, trainer


def test_a_run_given_numpy_numbers_equals_one_given_python_numbers(tmp_path: Path) -> None:
    ours, our_log, trainer = _run(tmp_path, np.int64, np.float32)
    theirs, their_log, _ = _run(tmp_path, int, lambda v: float(np.float32(v)))
    assert ours["loss"] == theirs["loss"]
    assert [r.get("loss") for r in our_log] == [r.get("loss") for r in their_log]
    assert type(trainer.algorithms[0].alpha) is float
    with pytest.warns(UserWarning, match="the schedule's length changed"):
        resumed = Trainer(
            MLP(2, 2),
            TensorLoader(ROWS, 4),
            max_duration=np.int64(3),
            optimizer=optim.sgd(np.float32(0.1), momentum=np.float32(0.9)),
            algorithms=[MixUp(alpha=np.float32(0.2))],
            load_path=tmp_path / "int64" / "latest.pt",
            seed=np.int64(3),
            progress_bar=False,
        )
    assert resumed.fit()["loss"] > 0


@pytest.mark.parametrize(
    "build",
    [
        lambda: TensorLoader(list(ROWS), np.int64(4)),
        lambda: EarlyStopper(patience=np.int64(2), min_delta=np.float32(0.1)),
        lambda: SpeedMonitor(window_size=np.int64(5), flops_per_sample=np.float32(1e6)),
        lambda: NaNMonitor(interval=np.int64(1)),
        lambda: Profiler("unused", schedule=(np.int64(1), np.int64(1), np.int64(1), np.int64(1))),
        lambda: R.key(np.uint64(3)),
        lambda: Evaluator("held_out", TensorLoader(ROWS, 4), subset_num_batches=np.int64(1)),
        lambda: CutMix(alpha=np.float64(1.0)),
        lambda: synthetic_images(R.key(0), np.int64(4), num_classes=np.int32(3), noise=np.float32(0.5)),
        lambda: optim.adamw(np.float32(0.01), betas=(np.float32(0.9), np.float64(0.99)), weight_decay=np.float16(0)),
    ],
)
def test_a_numpy_number_is_accepted_where_a_python_number_is(build) -> None:
    build()


def test_a_numpy_number_in_an_algorithm_is_held_as_the_python_number_of_its_value() -> None:
    mixup = MixUp(alpha=np.float32(0.2))
    assert type(mixup.alpha) is float and mixup == MixUp(alpha=float(np.float32(0.2)))
    assert json.dumps(mixup.to_config())


def test_numpy_bools_and_integers_in_the_checkpoint_metadata_are_held_as_python_values() -> None:
    metadata = Checkpointing(metadata={"augment": np.True_, "sizes": {np.int64(1): np.int64(28)}}).metadata
    assert metadata == {"augment": True, "sizes": {1: 28}}
    assert type(metadata["augment"]) is bool and [type(size) for size in metadata["sizes"]] == [int]
