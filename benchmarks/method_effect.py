"""Measures each algorithm's effect on the digits task: held-out accuracy and wall time, mean over seeds.

Usage: python benchmarks/method_effect.py [--seeds 3] [--epochs 12] [--threads 2] [--json PATH]
Every configuration trains the same SmallCNN recipe (SGD, Nesterov momentum, cosine with one warm-up epoch)
from the same seeds; only the algorithms differ. Runs are interleaved seed by seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from composer_fn import optim
from composer_fn.algorithms import ChannelsLast, LabelSmoothing, MixUp
from composer_fn.core.algorithm import Algorithm
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import SmallCNN
from composer_fn.trainer import Trainer

CONFIGURATIONS: dict[str, tuple[Algorithm, ...]] = {
    "baseline": (),
    "mixup": (MixUp(alpha=0.2),),
    "label_smoothing": (LabelSmoothing(0.1),),
    "channels_last": (ChannelsLast(),),
    "mixup+label_smoothing+channels_last": (MixUp(alpha=0.2), LabelSmoothing(0.1), ChannelsLast()),
}


def run(algorithms: tuple[Algorithm, ...], seed: int, epochs: int) -> tuple[float, float]:
    """Returns (held-out accuracy, training wall seconds) of one run."""
    task = load_digits_task()
    trainer = Trainer(
        SmallCNN(in_channels=1, num_classes=10),
        TensorLoader(task.train, 64, seed=seed),
        TensorLoader(task.heldout, 512, shuffle=False),
        max_duration=f"{epochs}ep",
        optimizer=optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
        schedule=optim.CosineAnnealingWithWarmupScheduler(t_warmup="1ep"),
        algorithms=algorithms,
        seed=seed,
        eval_interval=f"{epochs}ep",
        progress_bar=False,
    )
    started = time.perf_counter()
    metrics = trainer.fit()
    return metrics["eval_accuracy"], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in CONFIGURATIONS}
    for seed in range(args.seeds):
        for name, algorithms in CONFIGURATIONS.items():
            results[name].append(run(algorithms, seed, args.epochs))
    baseline_time = statistics.mean(t for _, t in results["baseline"])
    print(f"digits, SmallCNN, {args.epochs} epochs, seeds 0..{args.seeds - 1}, {args.threads} threads")
    print(f"{'configuration':<38} {'accuracy mean':>13} {'min':>7} {'max':>7} {'time s':>7} {'vs base':>7}")
    for name, runs in results.items():
        accuracies = [a for a, _ in runs]
        seconds = statistics.mean(t for _, t in runs)
        print(
            f"{name:<38} {statistics.mean(accuracies):>13.2%} {min(accuracies):>7.2%} {max(accuracies):>7.2%} "
            f"{seconds:>7.2f} {seconds / baseline_time:>6.2f}x"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({name: [list(r) for r in runs] for name, runs in results.items()}, stream, indent=2)


if __name__ == "__main__":
    main()
