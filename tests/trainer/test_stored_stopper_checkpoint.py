"""A checkpoint written before the algorithms' states were records still loads and resumes to the run's result.

``checkpoints/mlp-swa-early-stopper-sgd-ep1-ba8.pt`` was written by commit 0e24c28 (``python
tests/trainer/test_stored_stopper_checkpoint.py`` writes it again), when SWA kept a dictionary and EarlyStopper
five values packed in one float64 tensor: a run of ``_trainer`` stopped at batch 8 of 16, inside SWA's window,
with a best accuracy recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from composer_fn import optim
from composer_fn import random as R
from composer_fn.algorithms import SWA, EarlyStopper
from composer_fn.algorithms.stopping import StopperState
from composer_fn.algorithms.swa import SWAState
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.trainer import Trainer, load_model

STORED = Path(__file__).parent / "checkpoints" / "mlp-swa-early-stopper-sgd-ep1-ba8.pt"
DATA = (R.normal(R.key(0), (48, 6)), R.randint(R.key(1), 0, 3, (48,)))
HELD_OUT = (R.normal(R.key(2), (24, 6)), R.randint(R.key(3), 0, 3, (24,)))


def _trainer(**kwargs: object) -> Trainer:
    torch.manual_seed(0)
    return Trainer(
        MLP(6, 3, hidden=(8,)),
        TensorLoader(DATA, batch_size=8, seed=4),
        TensorLoader(HELD_OUT, batch_size=24, shuffle=False),
        max_duration="16ba",
        eval_interval="2ba",
        optimizer=optim.sgd(0.1, momentum=0.9),
        algorithms=[SWA(swa_start="0.25dur", swa_end="0.9dur", update_interval="1ba"), EarlyStopper("accuracy", patience=100)],
        seed=5,
        progress_bar=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_checkpoint_written_before_the_states_were_records_resumes_to_the_uninterrupted_run() -> None:
    uninterrupted = _trainer()
    uninterrupted.fit()
    resumed = _trainer(load_path=STORED)
    assert resumed.timestamp.batch == 8
    resumed.fit()
    assert resumed.timestamp.batch == uninterrupted.timestamp.batch == 16
    # The same numbers up to this machine's rounding: the file's first eight steps ran on the machine that wrote it.
    expected, got = pytree.tree_leaves(uninterrupted.state), pytree.tree_leaves(resumed.state)
    assert len(expected) == len(got)
    for left, right in zip(expected, got, strict=True):
        assert right.dtype == left.dtype
        torch.testing.assert_close(right, left, rtol=1e-5, atol=1e-6)


def test_the_stoppers_packed_values_load_into_its_record_field_by_field() -> None:
    payload = torch.load(STORED, weights_only=True)
    packed, n_averaged = payload["algos"][-1], payload["algos"][-2]
    assert tuple(packed.shape) == (5,) and bool(packed[2]), "the file must hold a best value for this test to mean anything"
    loaded = _trainer(load_path=STORED).state.algos
    stopper, swa = loaded["early_stopper"], loaded["swa"]
    assert isinstance(stopper, StopperState) and isinstance(swa, SWAState)
    assert stopper.best.dtype == torch.float64 and float(stopper.best) == float(packed[0])
    assert int(stopper.checks_since) == int(packed[1])
    assert bool(stopper.has_best) is True
    assert (int(stopper.best_batch), int(stopper.best_epoch)) == (int(packed[3]), int(packed[4]))
    assert torch.equal(swa.n_averaged, n_averaged) and int(n_averaged) > 0
    assert all(torch.equal(swa.params[n], t) for n, t in zip(swa.params, payload["algos"][:-2], strict=True))


def test_a_model_loads_from_a_checkpoint_written_before_the_states_were_records() -> None:
    module = load_model(STORED, MLP(6, 3, hidden=(8,)))
    payload = torch.load(STORED, weights_only=True)
    for name, parameter in module.named_parameters():
        assert torch.equal(parameter, payload["params"][name])


if __name__ == "__main__":
    STORED.parent.mkdir(exist_ok=True)
    _trainer(save_folder=sys.argv[1] if len(sys.argv) > 1 else STORED.parent / "run", save_interval="8ba").fit()
