"""The ``composer-fn`` command: ``train`` a task with algorithms, print the ``plan`` of a run without training,
``profile`` a few steps, or draw a run's log as a ``report``."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from composer_fn.core import validate
from composer_fn.core.time import Time, TimeUnit
from composer_fn.recipes import OPTIMIZERS, Recipe, RecipeError, load_recipe

if TYPE_CHECKING:
    import torch
    from torch import nn

    from composer_fn.core.algorithm import Algorithm

__all__ = ["main", "TASKS"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Task:
    """A training task: its data, its model and the optimizer settings that train it well."""

    description: str
    data: Callable[[int, bool], tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
    """``data(seed, unit_range)``: training and held-out ``(inputs, labels)``; pixels in [0, 1] on request."""
    model: Callable[[], nn.Module]
    batch_size: int
    learning_rate: float


# Torch and the package's modules load inside the functions that need them, so that ``--help`` answers at once.
def _digits_data(
    seed: int, unit_range: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    from composer_fn.data import load_digits_task

    task = load_digits_task(standardize=not unit_range)
    return task.train, task.heldout


def _synthetic_data(
    seed: int, unit_range: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    from composer_fn.core import random as R
    from composer_fn.data import synthetic_images

    images, labels = synthetic_images(R.key(seed), 2560, num_classes=10, shape=(3, 16, 16), noise=2.0)
    if unit_range:
        # Mapped affinely with the training part's extremes, the held-out part clipped to the same range.
        low, high = images[:2048].min(), images[:2048].max()
        images = ((images - low) / (high - low)).clamp(0.0, 1.0)
    return (images[:2048], labels[:2048]), (images[2048:], labels[2048:])


def _small_cnn(in_channels: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from composer_fn.models import SmallCNN

        return SmallCNN(in_channels=in_channels, num_classes=10)

    return build


def _digits_mlp() -> nn.Module:
    from composer_fn.models import MLP

    return MLP(64, 10, hidden=(128,))


MODELS = ("small_cnn", "mlp")


def _model(name: str, inputs: torch.Tensor) -> nn.Module:
    """Returns the model ``name`` for a task whose inputs are ``inputs``: a SmallCNN, or an MLP on the
    flattened inputs."""
    from composer_fn.models import MLP, SmallCNN

    if name == "small_cnn":
        return SmallCNN(in_channels=inputs.shape[1], num_classes=10)
    return MLP(math.prod(inputs.shape[1:]), 10, hidden=(128,))


_DIGITS = "scikit-learn's bundled 8x8 handwritten digits (1437 train / 360 held out), a small CNN with BatchNorm"
_SYNTHETIC = "a keyed synthetic 10-class 3x16x16 image task, a small CNN"
TASKS: dict[str, Task] = {
    # name: Task(description, data, model, batch size, learning rate)
    "digits": Task(_DIGITS, _digits_data, _small_cnn(1), 64, 0.1),
    "digits-mlp": Task("the same digits with an MLP", _digits_data, _digits_mlp, 64, 0.1),
    "synthetic": Task(_SYNTHETIC, _synthetic_data, _small_cnn(3), 128, 0.05),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the command, the flag, the value and what is accepted."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _checked(accepted: str, parse: Callable[[str], _T | None], valid: Callable[[_T], bool]) -> Callable[[str], _T]:
    """Returns an argparse ``type`` that parses a flag's text and rejects a bad value, saying what is accepted."""

    def convert(text: str) -> _T:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; accepted: {accepted}")
        return value

    return convert


def _epochs_or_batches(text: str) -> Time:
    return validate.time("--max-duration", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "10ep")


def _interval(text: str) -> Time:
    return validate.time("--log-interval", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "50ba")


_POSITIVE_INT = _checked("a whole number >= 1", int, lambda n: n >= 1)
_SEED = _checked("a whole number in [0, 2**64)", int, lambda n: 0 <= n < 2**64)
_TIMEOUT = _checked("a finite number of seconds > 0, e.g. 300", float, lambda x: math.isfinite(x) and x > 0)
_MICROBATCH = _checked(
    "a whole number >= 1 or auto",
    lambda text: text if text == "auto" else int(text),
    lambda size: size == "auto" or (isinstance(size, int) and size >= 1),
)
_LEARNING_RATE = _checked("a finite number > 0, e.g. 0.1", float, lambda x: math.isfinite(x) and x > 0)
_MAX_DURATION = _checked(
    "a whole number >= 1 of epochs or batches, e.g. 10ep or 500ba", _epochs_or_batches, lambda t: t.value >= 1
)
_LOG_INTERVAL = _checked("a whole number >= 1 of batches or epochs, e.g. 50ba or 1ep", _interval, lambda t: t.value >= 1)
_CHECKPOINT = _checked("an existing checkpoint file, e.g. runs/latest.pt", Path, Path.is_file)
_FOLDER = _checked("a folder (created if missing), not a file", Path, lambda path: not path.is_file())
_FILE = _checked("a file (created if missing), not a folder", Path, lambda path: not path.is_dir())


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """Returns the command's parser and its subcommands' parsers by name."""
    parser = _Parser(prog="composer-fn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for command, text in (
        ("train", "train a task"),
        ("plan", "print which algorithm runs when, without training"),
        ("profile", "train a few steps under the profiler; print the slowest operators and each algorithm's time"),
    ):
        sub = commands.add_parser(command, help=text)
        sub.add_argument("--task", default="digits", choices=tuple(TASKS), help=f"one of: {', '.join(TASKS)}")
        sub.add_argument("--config", type=Path, default=None, help="a recipe file (TOML); flags override its fields")
        sub.add_argument("--algorithms", default=None, help="comma-separated names, e.g. mixup,label_smoothing")
        sub.add_argument("--model", default=None, choices=MODELS, help="the task's model if omitted")
        sub.add_argument("--max-duration", type=_MAX_DURATION, default="10ep", help="e.g. 10ep or 500ba")
        sub.add_argument("--batch-size", type=_POSITIVE_INT, default=None, help="task default if omitted")
        sub.add_argument("--seed", type=_SEED, default=0)
    for command in ("train", "profile"):
        train = commands.choices[command]
        train.add_argument("--lr", type=_LEARNING_RATE, default=None, help="base learning rate (task default if omitted)")
        train.add_argument("--optimizer", default=None, choices=OPTIMIZERS, help="task default (SGD) if omitted")
        train.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed", "fp16-mixed"))
        train.add_argument("--compile", action="store_true", help="compile the step with torch.compile")
        train.add_argument("--save-folder", type=_FOLDER, default=None)
        train.add_argument("--load-path", type=_CHECKPOINT, default=None)
        train.add_argument(
            "--autoresume",
            action="store_true",
            help="resume from the newest checkpoint in --save-folder when there is one (rerun an interrupted job as is)",
        )
        train.add_argument("--log-file", type=_FILE, default=None, help="a JSON-lines file receiving every logged record")
        train.add_argument(
            "--log-interval",
            type=_LOG_INTERVAL,
            default=None,
            help="how often loggers and monitors get a training record (default 50ba)",
        )
        train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        train.add_argument("--threads", type=_POSITIVE_INT, default=None, help="torch intra-op threads")
        train.add_argument(
            "--microbatch-size",
            type=_MICROBATCH,
            default=None,
            help="samples per device microbatch (gradient accumulation), or auto (halve on out-of-memory)",
        )
        train.add_argument(
            "--nproc",
            type=_POSITIVE_INT,
            default=None,
            help="run on this many processes with torchrun (one per GPU); --batch-size is then the global batch",
        )
        train.add_argument("--dist-timeout", type=_TIMEOUT, default=300.0, help="seconds a collective waits (default 300)")
    profile = commands.choices["profile"]
    profile.add_argument("--steps", type=_POSITIVE_INT, default=5, help="steps recorded, after one skipped and one warm-up")
    profile.add_argument("--trace-folder", type=_FOLDER, default=Path("runs/profile"), help="where the traces go")
    report = commands.add_parser("report", help="draw a run's log (loss, held-out metric, learning rate, throughput) as a PNG")
    report.add_argument("run", type=Path, help="a run folder holding one JSON-lines log (--log-file), or the log")
    report.add_argument("--compare", type=Path, nargs="+", default=[], metavar="RUN", help="more runs, overlaid")
    report.add_argument("--labels", default="", help="comma-separated names of the runs, in order")
    report.add_argument("--output", type=Path, default=None, help="the PNG to write (default: report.png by the run)")
    return parser, dict(commands.choices)


def parse_algorithms(text: str) -> tuple[Algorithm, ...]:
    """Returns the algorithms named in a comma-separated list, each with its default hyperparameters.

    Raises ValueError naming an unknown or repeated name and the accepted names.
    """
    import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
    from composer_fn.core.algorithm import REGISTRY

    names = [name.strip() for name in text.split(",") if name.strip()]
    for index, name in enumerate(names):
        if name not in REGISTRY:
            raise ValueError(f"unknown algorithm {name!r}; accepted: comma-separated names among {', '.join(sorted(REGISTRY))}")
        if name in names[:index]:
            raise ValueError(f"algorithm {name!r} is named twice; accepted: each name once")
    return tuple(REGISTRY[name]() for name in names)


def _wants_unit_range(algorithms: tuple[Algorithm, ...]) -> bool:
    """Returns whether an algorithm takes pixels in [0, 1] (then the task's inputs are not standardised)."""
    return any(a.capabilities().input_range is not None for a in algorithms)


def _train(args: argparse.Namespace, algorithms: tuple[Algorithm, ...], task: Task) -> int:
    import torch

    from composer_fn.callbacks import LRMonitor, SpeedMonitor
    from composer_fn.data import TensorLoader
    from composer_fn.loggers import JSONLLogger, Logger
    from composer_fn.trainer import Trainer
    from composer_fn.trainer.distributed import World, environment_world

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    profiler = None
    if args.command == "profile":
        from composer_fn.profiler import Profiler

        # One step skipped, one warm-up, then the recorded ones: the run is just as long.
        args.max_duration = Time(2 + args.steps, TimeUnit.BATCH)
        profiler = Profiler(args.trace_folder, schedule=(1, 1, args.steps, 1))
    started = time.perf_counter()
    train, heldout = task.data(args.seed, _wants_unit_range(algorithms))
    batch_size = args.batch_size if args.batch_size is not None else task.batch_size
    recipe: Recipe = args.recipe
    # The optimizer: --optimizer (with its default arguments), else the recipe's table, else the task's SGD.
    task_optimizer = {
        "name": "sgd",
        "learning_rate": task.learning_rate,
        "momentum": 0.9,
        "nesterov": True,
        "weight_decay": 5e-4,
    }
    if args.optimizer:
        optimizer = Recipe(recipe.path, {}).build_optimizer({"name": args.optimizer, "learning_rate": task.learning_rate}, args.lr)
    else:
        optimizer = recipe.build_optimizer(task_optimizer, args.lr)
    schedule = recipe.build_schedule({"name": "cosine_warmup", "t_warmup": _warmup(args.max_duration)})
    world = environment_world() or World()
    world_size = world.size
    if batch_size % world_size:
        raise ValueError(f"--batch-size={batch_size} must be a multiple of the {world_size} processes (the global batch)")
    # Under torchrun the batch is global: each process takes its share, and the run equals one process's run with
    # --microbatch-size of that share.
    loader = TensorLoader(train, batch_size // world_size, shuffle=True, seed=args.seed)
    eval_loader: Any = TensorLoader(heldout, 512, shuffle=False)
    if recipe.evaluators:
        eval_loader = recipe.build_evaluators(eval_loader, num_classes=10)
    main_process = world.main
    loggers: list[Logger] = [JSONLLogger(args.log_file)] if args.log_file is not None else []
    loggers = [*loggers, *recipe.build_loggers()] if main_process else []
    callbacks = recipe.build_callbacks()
    if loggers and not recipe.callbacks:
        callbacks = [SpeedMonitor(), LRMonitor()]
    trainer = Trainer(
        _model(args.model, train[0]) if args.model else task.model(),
        loader,
        eval_loader,
        max_duration=args.max_duration,
        optimizer=optimizer,
        schedule=schedule,
        algorithms=algorithms,
        seed=args.seed,
        precision=args.precision,
        compile=args.compile,
        loggers=loggers,
        callbacks=callbacks,
        save_folder=args.save_folder,
        load_path=args.load_path,
        autoresume=args.autoresume,
        progress_bar=not args.no_progress,
        **({"log_interval": args.log_interval} if args.log_interval is not None else {}),
        device_train_microbatch_size=args.microbatch_size,
        dist_timeout=args.dist_timeout,
        profiler=profiler,
    )
    metrics = trainer.fit()
    if not main_process:
        return 0
    if profiler is not None:
        from composer_fn.profiler import summarize

        print(summarize(trainer.profile_traces))
        print("traces: " + ", ".join(str(path) for path in trainer.profile_traces))
        return 0
    wall = time.perf_counter() - started
    names = ", ".join(a.name for a in algorithms) or "none"
    print(f"task {args.task} | algorithms {names} | {trainer.timestamp.batch} steps, {trainer.timestamp.epoch} epochs")
    if "eval/eval/accuracy" in metrics:
        print(f"held-out accuracy {metrics['eval/eval/accuracy']:.2%} | held-out loss {metrics['eval/eval/loss']:.4f}")
    else:
        print("held-out " + " | ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name.startswith("eval/")))
    print(f"wall time {wall:.1f} s (training {metrics['wall_time']:.1f} s)")
    if trainer.compiles:
        print(f"compiled graphs: {trainer.compiles}")
    return 0


def _warmup(max_duration: Time) -> str:
    """Returns the warm-up of the tasks' schedule: one epoch, or a tenth of a run shorter than two epochs."""
    return "1ep" if max_duration.unit is TimeUnit.EPOCH and max_duration.value >= 2 else "0.1dur"


def _plan(args: argparse.Namespace, algorithms: tuple[Algorithm, ...], task: Task) -> int:
    from composer_fn.data import TensorLoader
    from composer_fn.dry_run import dry_run

    train, _ = task.data(args.seed, _wants_unit_range(algorithms))
    batch_size = args.batch_size if args.batch_size is not None else task.batch_size
    steps_per_epoch = len(TensorLoader(train, batch_size, shuffle=False))
    input_shape = (batch_size, *train[0].shape[1:])
    # Checked against the run's model: a surgery that finds nothing to rewrite there never runs.
    model = _model(args.model, train[0]) if args.model else task.model()
    inert = [a for a in algorithms if (rewrites := a.capabilities().rewrites) is not None and not rewrites(model)]
    acting = tuple(a for a in algorithms if a not in inert)
    report = dry_run(acting, args.max_duration, steps_per_epoch, batch_size=batch_size, input_shape=input_shape)
    print(report.format())
    for algorithm in inert:
        print(
            f"warning: {algorithm.name} is left out: it finds nothing to rewrite in the task's model "
            f"({type(model).__name__}), so it would change nothing"
        )
    return 0


def _converters(command: argparse.ArgumentParser) -> dict[str, Callable[[str], object]]:
    """Returns, by field name, how the command converts each flag's text (a recipe's fields go through it)."""
    converters: dict[str, Callable[[str], object]] = {}
    for action in command._actions:
        if not action.option_strings or action.dest in ("help", "config", "algorithms"):
            continue
        if isinstance(action, argparse._StoreTrueAction):
            converters[action.dest] = bool
        elif action.choices is not None:
            converters[action.dest] = _choice(action.option_strings[0], tuple(action.choices))
        else:
            converters[action.dest] = action.type if callable(action.type) else str
    return converters


def _choice(flag: str, choices: tuple[object, ...]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; accepted: {', '.join(map(str, choices))}")
        return text

    return convert


def _report(args: argparse.Namespace) -> int:
    from composer_fn.report import write_report

    labels = [label.strip() for label in args.labels.split(",")] if args.labels else []
    try:
        path = write_report([args.run, *args.compare], args.output, labels=labels)
    except (ValueError, OSError) as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _launch(argv: Sequence[str], processes: int) -> int:
    """Returns the exit status of this command run by torchrun on ``processes`` processes of this machine."""
    import subprocess

    rest, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc":
            skip = True
        elif not item.startswith("--nproc="):
            rest.append(item)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return subprocess.call([*command, "-m", "composer_fn", *rest])


def main(argv: Sequence[str] | None = None) -> int:
    """Returns the exit status of the ``composer-fn`` command line.

    A flag with a bad value exits with status 2 and one line on stderr naming the flag, the value and what is
    accepted; so does a run that its set-up refuses (a checkpoint that does not fit the task, a folder that cannot
    be written).
    """
    parser, commands = _parser()
    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(args)
    recipe = None
    if args.config is not None:
        # The recipe's fields become the command's defaults: a flag given on the command line still wins.
        try:
            recipe = load_recipe(args.config, _converters(commands["train"]))
        except RecipeError as error:
            print(f"composer-fn: {error}", file=sys.stderr)
            return 2
        known = {action.dest for action in commands[args.command]._actions}
        commands[args.command].set_defaults(**{k: v for k, v in recipe.flags.items() if k in known})
        args = parser.parse_args(argv)
    args.recipe = recipe if recipe is not None else Recipe(Path("(flags)"), {})
    try:
        if args.algorithms is None and recipe is not None:
            algorithms = recipe.build_algorithms()
        else:
            algorithms = parse_algorithms(args.algorithms or "")
    except RecipeError as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        commands[args.command].error(f"argument --algorithms: {error}")
    if args.command in ("train", "profile") and args.nproc is not None and "WORLD_SIZE" not in os.environ:
        return _launch(list(sys.argv[1:] if argv is None else argv), args.nproc)
    run: Callable[[argparse.Namespace, tuple[Algorithm, ...], Task], int] = (
        _train if args.command in ("train", "profile") else _plan
    )
    try:
        return run(args, algorithms, TASKS[args.task])
    except (ValueError, TypeError, OSError) as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
