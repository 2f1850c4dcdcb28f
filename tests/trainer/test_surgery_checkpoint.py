"""A checkpoint of a surgered model loads into a trainer given only the plain model: the surgery is re-applied."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

from composer_fn import optim
from composer_fn.algorithms import BlurPool, LabelSmoothing, SqueezeExcite
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import SmallCNN
from composer_fn.trainer import Trainer


def _trainer(algorithms=(), max_duration="20ba", **kwargs) -> Trainer:
    task = load_digits_task()
    return Trainer(
        SmallCNN(1, 10, width=8),
        TensorLoader(task.train, 120, seed=0),
        max_duration=max_duration,
        optimizer=optim.sgd(0.1, momentum=0.9),
        algorithms=algorithms,
        seed=0,
        progress_bar=False,
        **kwargs,
    )


def test_a_fresh_trainer_without_the_surgeries_re_applies_them_and_resumes_bit_for_bit(tmp_path: Path) -> None:
    surgeries = [BlurPool(min_channels=8), SqueezeExcite(latent_channels=4, min_channels=16)]
    uninterrupted = _trainer([*surgeries, LabelSmoothing(0.1)], save_folder=tmp_path, save_interval="8ba")
    uninterrupted.fit()
    resumed = _trainer([LabelSmoothing(0.1)], load_path=tmp_path / "ep0-ba8.pt")
    assert resumed.algorithms == (*surgeries, LabelSmoothing(0.1))
    assert repr(resumed.static.module) == repr(uninterrupted.static.module)
    resumed.fit()
    left, right = pytree.tree_leaves(uninterrupted.state), pytree.tree_leaves(resumed.state)
    assert len(left) == len(right) and all(torch.equal(a, b) for a, b in zip(left, right, strict=True))


def test_a_checkpoint_with_other_non_surgery_algorithms_is_still_refused(tmp_path: Path) -> None:
    _trainer([BlurPool(min_channels=8), LabelSmoothing(0.1)], save_folder=tmp_path, max_duration="2ba").fit()
    with pytest.raises(ValueError, match="trained with algorithms"):
        _trainer([LabelSmoothing(0.2)], load_path=tmp_path / "latest.pt")
