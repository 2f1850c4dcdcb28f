"""One process of a two-process run that goes wrong on rank 1 at step 3: ``python fault_worker.py <fault>``.

Faults: ``kill`` (SIGKILL), ``raise`` (an exception), ``nan`` (a NaN input, so a NaN loss).
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from composer_fn.callbacks import Callback, NaNMonitor
from composer_fn.callbacks.base import RunView
from composer_fn.core.random import key
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.models.cnn import SmallCNN
from composer_fn.optim import sgd
from composer_fn.trainer import Trainer


class Fault(Callback):
    """Kills or breaks this process at step 3 on rank 1."""

    def __init__(self, fault: str) -> None:
        self.fault = fault

    def batch_end(self, view: RunView) -> None:
        if os.environ["RANK"] == "1" and view.timestamp.batch == 3:
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "raise":
                raise RuntimeError("rank 1 broke at step 3")


def main(fault: str) -> None:
    torch.set_num_threads(1)
    images, labels = synthetic_images(key(1), 64, num_classes=4, shape=(1, 8, 8))
    if fault == "nan" and os.environ["RANK"] == "1":
        images = images.clone()
        images[:] = float("nan")
    trainer = Trainer(
        SmallCNN(1, 4, width=4),
        TensorLoader((images, labels), 4, shuffle=False),
        max_duration="8ba",
        optimizer=sgd(0.1),
        callbacks=[Fault(fault), NaNMonitor()],
        progress_bar=False,
        dist_timeout=20,
    )
    trainer.fit()


if __name__ == "__main__":
    main(sys.argv[1])
