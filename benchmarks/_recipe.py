"""The digits recipe every method-effect benchmark trains with, so their rows compare with each other."""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from composer_fn import optim
from composer_fn.core.algorithm import Algorithm
from composer_fn.data import TensorLoader
from composer_fn.trainer import Trainer


def train_digits(
    model: nn.Module, task: Any, algorithms: tuple[Algorithm, ...], seed: int, epochs: int, **trainer: Any
) -> tuple[float, float]:
    """Returns (held-out accuracy, training wall seconds) of one run of the recipe on ``task``.

    The recipe: batches of 64, SGD with Nesterov momentum 0.9, lr 0.1, weight decay 5e-4, cosine with one
    warm-up epoch, ``epochs`` epochs, evaluation once at the end. ``trainer`` passes device, precision, compile.
    """
    run = Trainer(
        model,
        TensorLoader(task.train, 64, seed=seed),
        TensorLoader(task.heldout, 512, shuffle=False),
        max_duration=f"{epochs}ep",
        optimizer=optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
        schedule=optim.CosineAnnealingWithWarmupScheduler(t_warmup="1ep"),
        algorithms=algorithms,
        seed=seed,
        eval_interval=f"{epochs}ep",
        progress_bar=False,
        **trainer,
    )
    started = time.perf_counter()
    metrics = run.fit()
    return metrics["eval_accuracy"], time.perf_counter() - started
