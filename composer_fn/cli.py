"""The ``composer-fn`` command: ``train`` a task with algorithms, or print the ``plan`` of a run without training."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from composer_fn import optim
from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY, Algorithm
from composer_fn.data import TensorLoader, load_digits_task, synthetic_images
from composer_fn.dry_run import dry_run
from composer_fn.loggers import JSONLLogger, Logger
from composer_fn.models import MLP, SmallCNN

__all__ = ["main", "TASKS"]


@dataclass(frozen=True)
class Task:
    """A training task: its data, its model and the optimizer settings that train it well."""

    description: str
    data: Callable[[int, bool], tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
    """``data(seed, unit_range)``: training and held-out ``(inputs, labels)``; pixels in [0, 1] on request."""
    model: Callable[[], nn.Module]
    batch_size: int
    learning_rate: float


def _digits_data(
    seed: int, unit_range: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    task = load_digits_task(standardize=not unit_range)
    return task.train, task.heldout


def _synthetic_data(
    seed: int, unit_range: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    images, labels = synthetic_images(R.key(seed), 2560, num_classes=10, shape=(3, 16, 16), noise=2.0)
    if unit_range:
        # Mapped affinely with the training part's extremes, the held-out part clipped to the same range.
        low, high = images[:2048].min(), images[:2048].max()
        images = ((images - low) / (high - low)).clamp(0.0, 1.0)
    return (images[:2048], labels[:2048]), (images[2048:], labels[2048:])


_DIGITS = "scikit-learn's bundled 8x8 handwritten digits (1437 train / 360 held out), a small CNN with BatchNorm"
_SYNTHETIC = "a keyed synthetic 10-class 3x16x16 image task, a small CNN"
TASKS: dict[str, Task] = {
    # name: Task(description, data, model, batch size, learning rate)
    "digits": Task(_DIGITS, _digits_data, lambda: SmallCNN(in_channels=1, num_classes=10), 64, 0.1),
    "digits-mlp": Task("the same digits with an MLP", _digits_data, lambda: MLP(64, 10, hidden=(128,)), 64, 0.1),
    "synthetic": Task(_SYNTHETIC, _synthetic_data, lambda: SmallCNN(in_channels=3, num_classes=10), 128, 0.05),
}


def _choice(kind: str, name: str, valid: Sequence[str]) -> None:
    if name not in valid:
        raise SystemExit(f"composer-fn: unknown {kind} {name!r}; valid {kind}s: {', '.join(sorted(valid))}")


def parse_algorithms(text: str) -> tuple[Algorithm, ...]:
    """Returns the algorithms named in a comma-separated list, each with its default hyperparameters."""
    import composer_fn.algorithms  # noqa: F401  (registers every algorithm)

    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        _choice("algorithm", name, list(REGISTRY))
    return tuple(REGISTRY[name]() for name in names)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="composer-fn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in (("train", "train a task"), ("plan", "print which algorithm runs when, without training")):
        sub = commands.add_parser(command, help=text)
        sub.add_argument("--task", default="digits", help=f"one of: {', '.join(TASKS)}")
        sub.add_argument("--algorithms", default="", help="comma-separated names, e.g. mixup,label_smoothing")
        sub.add_argument("--max-duration", default="10ep", help="e.g. 10ep or 500ba")
        sub.add_argument("--batch-size", type=int, default=None)
        sub.add_argument("--seed", type=int, default=0)
    train = commands.choices["train"]
    train.add_argument("--lr", type=float, default=None, help="base learning rate (task default if omitted)")
    train.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed"))
    train.add_argument("--compile", action="store_true", help="compile the step with torch.compile")
    train.add_argument("--save-folder", default=None)
    train.add_argument("--load-path", default=None)
    train.add_argument("--log-file", default=None, help="a JSON-lines file receiving every logged record")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return parser


def _wants_unit_range(algorithms: tuple[Algorithm, ...]) -> bool:
    """Returns whether an algorithm takes pixels in [0, 1] (then the task's inputs are not standardised)."""
    return any(a.capabilities().input_range is not None for a in algorithms)


def _train(args: argparse.Namespace, algorithms: tuple[Algorithm, ...], task: Task) -> int:
    from composer_fn.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    train, heldout = task.data(args.seed, _wants_unit_range(algorithms))
    batch_size = args.batch_size or task.batch_size
    loader = TensorLoader(train, batch_size, shuffle=True, seed=args.seed)
    eval_loader = TensorLoader(heldout, 512, shuffle=False)
    loggers: list[Logger] = [JSONLLogger(args.log_file)] if args.log_file else []
    trainer = Trainer(
        task.model(),
        loader,
        eval_loader,
        max_duration=args.max_duration,
        optimizer=optim.sgd(args.lr or task.learning_rate, momentum=0.9, nesterov=True, weight_decay=5e-4),
        schedule=optim.CosineAnnealingWithWarmupScheduler(t_warmup="1ep"),
        algorithms=algorithms,
        seed=args.seed,
        precision=args.precision,
        compile=args.compile,
        loggers=loggers,
        save_folder=args.save_folder,
        load_path=args.load_path,
        progress_bar=not args.no_progress,
    )
    metrics = trainer.fit()
    wall = time.perf_counter() - started
    names = ", ".join(a.name for a in algorithms) or "none"
    print(f"task {args.task} | algorithms {names} | {trainer.timestamp.batch} steps, {trainer.timestamp.epoch} epochs")
    print(f"held-out accuracy {metrics['eval_accuracy']:.2%} | held-out loss {metrics['eval_loss']:.4f}")
    print(f"wall time {wall:.1f} s (training {metrics['wall_time']:.1f} s)")
    if trainer.compiles:
        print(f"compiled graphs: {trainer.compiles}")
    return 0


def _plan(args: argparse.Namespace, algorithms: tuple[Algorithm, ...], task: Task) -> int:
    train, _ = task.data(args.seed, _wants_unit_range(algorithms))
    batch_size = args.batch_size or task.batch_size
    steps_per_epoch = len(TensorLoader(train, batch_size, shuffle=False))
    input_shape = (batch_size, *train[0].shape[1:])
    report = dry_run(algorithms, args.max_duration, steps_per_epoch, batch_size=batch_size, input_shape=input_shape)
    print(report.format())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Returns the exit status of the ``composer-fn`` command line."""
    args = _parser().parse_args(argv)
    _choice("task", args.task, list(TASKS))
    algorithms = parse_algorithms(args.algorithms)
    run: Callable[[argparse.Namespace, tuple[Algorithm, ...], Task], int] = (
        _train if args.command == "train" else _plan
    )
    try:
        return run(args, algorithms, TASKS[args.task])
    except ValueError as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
