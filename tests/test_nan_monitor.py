"""NaNMonitor: a diverging run ends at the first non-finite step with the step and tensor named; a healthy run
is not touched."""

from __future__ import annotations

import pytest
import torch

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.callbacks import NaNMonitor
from composer_fn.callbacks.base import Callback, RunView
from composer_fn.data import TensorLoader
from composer_fn.models import MLP

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))


class _FirstNonFinite(Callback):
    """Records the first step at which a parameter is not finite (the reference for the monitor)."""

    def __init__(self) -> None:
        self.step: int | None = None

    def batch_end(self, view: RunView) -> None:
        if self.step is None and not all(torch.isfinite(p).all() for p in view.state.params.values()):
            self.step = view.timestamp.batch


def _trainer(learning_rate: float, *callbacks: Callback) -> Trainer:
    return Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        max_duration="5ep",
        optimizer=optim.sgd(learning_rate),
        callbacks=list(callbacks),
        progress_bar=False,
    )


def test_a_diverging_run_stops_at_its_first_non_finite_step_naming_it() -> None:
    reference = _FirstNonFinite()
    # Without the monitor, the run's own watch names the same step: its loss overflowed, and so its gradient.
    with pytest.raises(FloatingPointError, match=r"^step (\d+): the loss is NaN or infinite") as stopped:
        _trainer(1e37, reference).fit()
    assert reference.step is not None
    assert stopped.match(rf"^step {reference.step}: ")
    monitored = _trainer(1e37, NaNMonitor())
    with pytest.raises(FloatingPointError, match=rf"step {reference.step} \(epoch \d+\): parameter '1.weight' holds NaN"):
        monitored.fit()
    assert monitored.timestamp.batch == reference.step


def test_a_healthy_run_is_not_touched() -> None:
    plain, monitored = _trainer(0.1), _trainer(0.1, NaNMonitor(interval=2))
    plain.fit()
    monitored.fit()
    assert all(torch.equal(monitored.state.params[n], p) for n, p in plain.state.params.items())


def test_a_bad_interval_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="interval=0 must be an int >= 1"):
        NaNMonitor(interval=0)
