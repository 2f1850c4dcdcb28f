"""The digits recipe every method-effect benchmark trains with, so their rows compare with each other."""

from __future__ import annotations

import statistics
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
    return metrics["eval/eval/accuracy"], time.perf_counter() - started


def print_effect_rows(results: dict[str, list[tuple[float, float]]], base: str, width: int) -> None:
    """Prints one row per configuration of ``(accuracy, seconds)`` runs: mean, min and max accuracy, the mean's
    difference from ``base``'s in points, mean time and its ratio to ``base``'s."""
    base_accuracy = statistics.mean(a for a, _ in results[base])
    base_seconds = statistics.mean(t for _, t in results[base])
    for name, runs in results.items():
        accuracies = [a for a, _ in runs]
        seconds = statistics.mean(t for _, t in runs)
        delta = statistics.mean(accuracies) - base_accuracy
        print(
            f"{name:<{width}} {statistics.mean(accuracies):>13.2%} {min(accuracies):>7.2%} {max(accuracies):>7.2%} "
            f"{delta * 100:>+6.2f}p {seconds:>7.2f} {seconds / base_seconds:>6.2f}x"
        )
