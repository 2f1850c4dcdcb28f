"""Measures model-surgery algorithms on a CIFAR ResNet: held-out accuracy and wall time, mean over seeds.

Usage: python benchmarks/surgery_effect.py [--seeds 3] [--epochs 10] [--threads 1] [--depth 20] [--upsample 4]
    [--device cpu] [--precision fp32] [--compile] [--json PATH] [--algorithm CONFIG ...]

Some surgeries act only on residual networks (StochasticDepth rewrites residual blocks, which SmallCNN lacks),
so this trains ``CIFARResNet(depth, in_channels=1)`` on the digits task upsampled to 32×32
(``load_digits_task(upsample=4)``) with the recipe of ``method_effect.py``: SGD with Nesterov momentum 0.9,
learning rate 0.1, weight decay 5e-4, cosine schedule with one warm-up epoch, batch 64. Each
``--algorithm`` (an algorithm's JSON config, ``Algorithm.to_config()``) is compared with the baseline;
without one, StochasticDepth runs block-wise and sample-wise with Composer's other defaults. Runs are
interleaved seed by seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from _recipe import print_effect_rows, train_digits

from composer_fn.algorithms import StochasticDepth
from composer_fn.core.algorithm import Algorithm, algorithm_from_config
from composer_fn.data import load_digits_task
from composer_fn.models.resnet import CIFARResNet

DEFAULT_CONFIGURATIONS: tuple[Algorithm, ...] = (
    StochasticDepth("BasicBlock", "block"),
    StochasticDepth("BasicBlock", "sample"),
)


def label(algorithm: Algorithm) -> str:
    """Returns the algorithm's name and the hyperparameters it sets away from their defaults."""
    changed = {
        f.name: getattr(algorithm, f.name)
        for f in dataclasses.fields(algorithm)
        if getattr(algorithm, f.name) != f.default
    }
    return f"{algorithm.name} {json.dumps(changed)}" if changed else algorithm.name


def run(algorithms: tuple[Algorithm, ...], seed: int, args: argparse.Namespace) -> tuple[float, float]:
    """Returns (held-out accuracy, training wall seconds) of one run with ``algorithms``."""
    task = load_digits_task(upsample=args.upsample)
    model = CIFARResNet(args.depth, num_classes=task.num_classes, in_channels=1)
    return train_digits(
        model, task, algorithms, seed, args.epochs, device=args.device, precision=args.precision, compile=args.compile
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth, 6n + 2 (default 20)")
    parser.add_argument("--upsample", type=int, default=4, help="image side 8 x this (bilinear), default 4")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed"))
    parser.add_argument(
        "--compile", action="store_true", help="compile each step with torch.compile (inductor)"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--algorithm", action="append", default=[], help="an algorithm's JSON config (repeatable)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    given = tuple(algorithm_from_config(json.loads(config)) for config in args.algorithm)
    configurations: dict[str, tuple[Algorithm, ...]] = {"baseline": ()}
    configurations.update({label(a): (a,) for a in given or DEFAULT_CONFIGURATIONS})
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in configurations}
    for seed in range(args.seeds):
        for name, algorithms in configurations.items():
            results[name].append(run(algorithms, seed, args))
    side = 8 * args.upsample
    print(
        f"digits {side}x{side}, CIFARResNet-{args.depth}, {args.epochs} epochs, seeds 0..{args.seeds - 1}, "
        f"{args.device}, {args.precision}{', compiled' if args.compile else ''}, {args.threads} threads"
    )
    print(
        f"{'configuration':<58} {'accuracy mean':>13} {'min':>7} {'max':>7} {'Δ mean':>7} {'time s':>7} {'vs base':>7}"
    )
    print_effect_rows(results, "baseline", 58)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({name: [list(r) for r in runs] for name, runs in results.items()}, stream, indent=2)


if __name__ == "__main__":
    main()
