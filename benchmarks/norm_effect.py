"""Measures LowPrecisionGroupNorm and GyroDropout on the digits task, on models that have the layers they replace.

Usage: python benchmarks/norm_effect.py [--seeds 3] [--epochs 12] [--threads 1] [--only groupnorm,dropout]

SmallCNN has neither GroupNorm nor dropout, so ``benchmarks/method_effect.py`` cannot show these two methods:

- ``groupnorm``: a SmallCNN with ``GroupNorm(8, channels)`` in place of BatchNorm, trained under
  ``precision="bf16-mixed"`` (CPU autocast), with and without ``LowPrecisionGroupNorm``;
- ``dropout``: ``MLP(64, 10, (256, 256), dropout=0.5)`` (keyed dropout after each hidden layer), with and
  without ``GyroDropout`` (Composer's p=0.5, sigma=256, tau=16).

Both follow method_effect.py's recipe (SGD with Nesterov momentum 0.9, lr 0.1, weight decay 5e-4, cosine with
one warm-up epoch, batch 64, standardised digits), each configuration from the same seeds, interleaved seed by
seed. Held-out accuracy is over the 360 held-out digits; time is the wall time of ``fit()``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from _recipe import print_effect_rows, train_digits
from torch import nn

from composer_fn.algorithms.gyro_dropout import GyroDropout
from composer_fn.algorithms.low_precision_groupnorm import LowPrecisionGroupNorm
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.state import Precision
from composer_fn.data import load_digits_task
from composer_fn.models import MLP, SmallCNN


def GroupNormCNN() -> nn.Module:  # noqa: N802  (named as the model it builds)
    """Returns ``SmallCNN(norm="group")``: ``GroupNorm(8, channels)`` after each convolution instead of BatchNorm."""
    return SmallCNN(1, 10, norm="group")


Configuration = tuple[Callable[[], nn.Module], tuple[Algorithm, ...], Precision]

CONFIGURATIONS: dict[str, dict[str, Configuration]] = {
    "groupnorm": {
        "GroupNorm CNN, bf16-mixed": (GroupNormCNN, (), "bf16-mixed"),
        "+ low_precision_groupnorm": (GroupNormCNN, (LowPrecisionGroupNorm(),), "bf16-mixed"),
    },
    "dropout": {
        "MLP 256-256, dropout 0.5": (lambda: MLP(64, 10, (256, 256), dropout=0.5), (), "fp32"),
        "+ gyro_dropout": (lambda: MLP(64, 10, (256, 256), dropout=0.5), (GyroDropout(),), "fp32"),
    },
}


def run(configuration: Configuration, seed: int, epochs: int) -> tuple[float, float]:
    """Returns (held-out accuracy, training wall seconds) of one run."""
    build, algorithms, precision = configuration
    return train_digits(build(), load_digits_task(), algorithms, seed, epochs, device="cpu", precision=precision)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--only", default=",".join(CONFIGURATIONS), help="comma-separated: groupnorm, dropout"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups = [name.strip() for name in args.only.split(",")]
    unknown = [name for name in groups if name not in CONFIGURATIONS]
    if unknown:
        parser.error(f"--only names {unknown}; known: {', '.join(CONFIGURATIONS)}")
    print(f"digits 8x8, {args.epochs} epochs, seeds 0..{args.seeds - 1}, cpu, eager, {args.threads} threads")
    print(
        f"{'configuration':<30} {'accuracy mean':>13} {'min':>7} {'max':>7} {'Δ mean':>7} {'time s':>7} {'vs base':>7}"
    )
    for group in groups:
        configurations = CONFIGURATIONS[group]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in configurations}
        for seed in range(args.seeds):
            for name, configuration in configurations.items():
                results[name].append(run(configuration, seed, args.epochs))
        print_effect_rows(results, next(iter(results)), 30)


if __name__ == "__main__":
    main()
