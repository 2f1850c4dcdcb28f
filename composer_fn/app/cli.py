"""The ``composer-fn`` command: ``train`` a model with algorithms, print the ``plan`` of a run without training,
``profile`` a few steps, ``export`` or ``convert`` a checkpoint, ``predict`` with it, sweep recipes with ``pareto``,
draw a run's log as a ``report``, or list the ``algorithms`` and their hyperparameters. A recipe file
(``--config``) sets what the flags set and more; ``--set FIELD=VALUE`` sets any of its fields."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from composer_fn.app.recipes import OPTIMIZERS, Recipe, RecipeError, load_recipe
from composer_fn.core import validate
from composer_fn.core.time import Time, TimeUnit

if TYPE_CHECKING:
    import torch
    from torch import nn

    from composer_fn.core.algorithm import Algorithm

__all__ = ["main", "load_trained", "TASKS", "ALGORITHMS"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Inputs:
    """What a run's model takes: images in ``[0, 1]`` standardised per channel with ``mean`` and ``std`` (None: as
    they are), for the classes ``classes`` names in label order."""

    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    classes: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """An embedded training task: its data, its model and the optimizer settings that train it well."""

    description: str
    data: Callable[[int, bool], tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]
    """``data(seed, unit_range)``: training and held-out ``(inputs, labels)``; pixels in [0, 1] on request."""
    model: str
    """The model's name (``composer_fn.models.zoo``)."""
    batch_size: int
    learning_rate: float
    inputs: Callable[[], Inputs] | None = None
    """The standardisation of its images in ``[0, 1]`` and its class names; None: inputs that are not images."""


# Torch and the package's modules load inside the functions that need them, so that ``--help`` answers at once.
def _digits_data(
    seed: int, unit_range: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    from composer_fn.data import load_digits_task

    task = load_digits_task(standardize=not unit_range)
    return task.train, task.heldout


def _digits_inputs() -> Inputs:
    from composer_fn.data import load_digits_task

    task = load_digits_task(standardize=False)
    return Inputs(task.mean, task.std, task.classes)


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


ZOO = ("small_cnn", "two_conv_bn", "mlp", "cifar_resnet20", "cifar_resnet56", "resnet18", "resnet34", "resnet50")
"""The models ``--model`` names in its help; any classification model of ``torchvision.models`` is taken too."""

DATA = (
    "fashion-mnist",
    "mnist",
    "kmnist",
    "emnist-balanced",
    "emnist-byclass",
    "emnist-bymerge",
    "emnist-digits",
    "emnist-letters",
    "emnist-mnist",
    "cifar10",
    "cifar100",
    "imagefolder",
)
"""The image datasets ``--data`` reads from disk (``composer_fn.data.DATASETS``)."""

ALGORITHMS = (
    "alibi", "augmix", "blurpool", "channels_last", "colout", "cutmix", "cutout", "early_stopper", "ema", "factorize",
    "gated_linear_units", "ghost_batchnorm", "gradient_clipping", "gyro_dropout", "label_smoothing", "layer_freezing",
    "low_precision_groupnorm", "low_precision_layernorm", "mixup", "progressive_resizing", "randaugment",
    "random_crop_flip", "sam", "selective_backprop", "seq_length_warmup", "squeeze_excite", "stochastic_depth", "swa",
    "threshold_stopper", "weight_standardization",
)  # fmt: skip
"""The registered algorithms' names, sorted, as ``--help`` lists them (kept equal to the registry's, written out so
that help answers without loading torch)."""

_DATA_BATCH_SIZE, _DATA_LEARNING_RATE, _DATA_MODEL = 128, 0.1, "cifar_resnet20"
_TEXT_BATCH_SIZE, _TEXT_LEARNING_RATE, _TEXT_MODEL = 32, 1e-3, "gpt2"

_DIGITS = "scikit-learn's bundled 8x8 handwritten digits (1437 train / 360 held out), a small CNN with BatchNorm"
_SYNTHETIC = "a keyed synthetic 10-class 3x16x16 image task, a small CNN"
TASKS: dict[str, Task] = {
    # name: Task(description, data, model, batch size, learning rate)
    "digits": Task(_DIGITS, _digits_data, "small_cnn", 64, 0.1, _digits_inputs),
    "digits-mlp": Task("the same digits with an MLP", _digits_data, "mlp", 64, 0.1, _digits_inputs),
    "synthetic": Task(_SYNTHETIC, _synthetic_data, "small_cnn", 128, 0.05),
}


@dataclass(frozen=True)
class Prepared:
    """What a run trains on: its loaders, the shape of a sample (an image's ``(C, H, W)``, a text row's
    ``(sequence_length,)``), its classes (a text corpus: its tokens), its defaults, and a text run's corpus."""

    name: str
    train: Any
    heldout: Any
    sample_shape: tuple[int, ...]
    num_classes: int
    model: str
    batch_size: int
    learning_rate: float
    unit_range: bool
    corpus: Any = None
    inputs: Inputs | None = None


def _is_text(name: str | None) -> bool:
    return name is not None and (name == "python-docs" or name.startswith("hf:"))


def _source(args: argparse.Namespace) -> tuple[str, int, float, str]:
    """Returns the run's data name and its default batch size, learning rate and model (before loading it)."""
    if args.data is not None and args.task is not None:
        raise ValueError(f"--task={args.task} and --data={args.data} both name the data; give one of them")
    if args.data is None:
        name = args.task or "digits"
        task = TASKS[name]
        return name, task.batch_size, task.learning_rate, task.model
    if _is_text(args.data):
        return args.data, _TEXT_BATCH_SIZE, _TEXT_LEARNING_RATE, _TEXT_MODEL
    return args.data, _DATA_BATCH_SIZE, _DATA_LEARNING_RATE, _DATA_MODEL


def _check_combination(args: argparse.Namespace) -> None:
    """Raises ValueError naming a flag that would do nothing with the others given (rather than ignore it)."""
    name = _source(args)[0]
    data = f"--data {name}" if args.data else f"--task {name}"
    unused: list[tuple[str, str]] = []
    if not _is_text(name):
        for flag in ("text_column", "tokenizer", "sequence_length"):
            if getattr(args, flag, None) is not None:
                unused.append((f"--{flag.replace('_', '-')}={getattr(args, flag)}", "it reads text data: python-docs, hf:PATH"))
    if args.data_dir is not None and (args.data is None or name.startswith("hf:")):
        unused.append((f"--data-dir={args.data_dir}", "it locates a dataset --data names; hf:PATH is its own path"))
    if args.image_size is not None and name != "imagefolder":
        unused.append((f"--image-size={args.image_size}", "it resizes imagefolder images"))
    if getattr(args, "num_workers", 0) and name != "imagefolder":
        unused.append((f"--num-workers={args.num_workers}", "they decode imagefolder images; this data is in memory"))
    if getattr(args, "overwrite_log", False) and getattr(args, "log_file", None) is None:
        unused.append(("--overwrite-log", "it lets a run replace its --log-file, and none is given"))
    alone: list[tuple[str, str]] = []
    if getattr(args, "save_folder", None) is None:
        if getattr(args, "save_interval", None) is not None:
            alone.append((f"--save-interval={args.save_interval}", "it sets how often checkpoints go to --save-folder"))
        if getattr(args, "autoresume", False):
            alone.append(("--autoresume", "it resumes from the newest checkpoint in --save-folder"))
    if getattr(args, "fsdp", False) and getattr(args, "nproc", None) is None and getattr(args, "deepspeed", None) is None and "WORLD_SIZE" not in os.environ:
        alone.append(("--fsdp", "it shards the model over the --nproc processes"))
    found = [f"with {data} these flags would do nothing, drop them: " + "; ".join(f"{f} ({why})" for f, why in unused)] if unused else []
    if alone:
        found.append("these flags would do nothing without the flag they work with: " + "; ".join(f"{f} ({why}, and none is given)" for f, why in alone))
    if found:
        raise ValueError(". ".join(found))
    micro = getattr(args, "microbatch_size", None)
    if isinstance(micro, int) and args.command in ("train", "profile"):
        batch = args.batch_size if args.batch_size is not None else _source(args)[1]
        processes = getattr(args, "nproc", None) or 1
        if micro > batch // processes:
            given = f"--batch-size={batch}" if args.batch_size is not None else f"the default batch of {batch}"
            each = f" over --nproc={processes} processes, {batch // processes} each" if processes > 1 else ""
            raise ValueError(
                f"--microbatch-size={micro} is larger than a process's batch ({given}{each}): a microbatch is a part "
                "of it; expected at most that, or leave --microbatch-size out to step on the whole batch"
            )


def _prepare(args: argparse.Namespace, unit_range: bool, world_size: int = 1) -> Prepared:
    """Returns the run's data, read as ``args`` say: an embedded task, or a dataset on disk (``--data``)."""
    from composer_fn.data import TensorLoader

    name, default_batch, learning_rate, model = _source(args)
    batch_size = args.batch_size if args.batch_size is not None else default_batch
    if batch_size % world_size:
        raise ValueError(f"--batch-size={batch_size} must be a multiple of the {world_size} processes (the global batch)")
    rank_batch = batch_size // world_size
    if _is_text(name):
        return _prepare_text(args, name, batch_size, rank_batch, learning_rate, model)
    if name in TASKS:
        train, heldout = TASKS[name].data(args.seed, unit_range)
        shape = tuple(train[0].shape[1:])
        loaders: tuple[Any, Any] = (
            TensorLoader(train, rank_batch, shuffle=True, seed=args.seed),
            TensorLoader(heldout, 512, shuffle=False),
        )
        num_classes = 10
        task = TASKS[name]
        inputs = task.inputs() if task.inputs is not None else Inputs(None, None, tuple(map(str, range(num_classes))))
    else:
        from composer_fn.data import ImageTask, load_dataset

        folder = name == "imagefolder"  # the other data sets are read into memory and batched below
        data = load_dataset(
            name,
            getattr(args, "data_dir", None),
            standardize=not unit_range,
            image_size=getattr(args, "image_size", None),
            batch_size=rank_batch if folder else None,
            num_workers=(getattr(args, "num_workers", 0) or 0) if folder else None,
            seed=args.seed if folder else None,
        )
        shape, num_classes = tuple(data.image_shape), data.num_classes
        inputs = Inputs(tuple(data.mean), tuple(data.std), tuple(data.classes))
        if isinstance(data, ImageTask):
            loaders = (
                TensorLoader(data.train, rank_batch, shuffle=True, seed=args.seed),
                TensorLoader(data.heldout, 512, shuffle=False),
            )
        else:
            loaders = (data.train, data.heldout)
    return Prepared(name, *loaders, shape, num_classes, model, batch_size, learning_rate, unit_range, inputs=inputs)  # type: ignore[arg-type]


def _prepare_text(
    args: argparse.Namespace, name: str, batch_size: int, rank_batch: int, learning_rate: float, model: str
) -> Prepared:
    """Returns a text corpus's rows (``composer_fn.data.corpus``): ``--data python-docs`` (its folder may be given
    with ``--data-dir``) or ``hf:PATH``, tokenized with ``--tokenizer`` into rows of ``--sequence-length``."""
    from composer_fn.data.corpus import load_text_corpus
    from composer_fn.data.hf import DatasetLoader

    source: str | Path = name[len("hf:") :] if name.startswith("hf:") else name
    if name == "python-docs" and getattr(args, "data_dir", None) is not None:
        source = args.data_dir
    corpus = load_text_corpus(
        source,
        sequence_length=getattr(args, "sequence_length", None) or 128,
        text_column=getattr(args, "text_column", None) or "text",
        tokenizer=getattr(args, "tokenizer", None) or "bpe",
    )
    columns = ("input_ids", "labels")
    train = DatasetLoader(corpus.train, rank_batch, columns=columns, shuffle=True, drop_last=True, seed=args.seed)
    heldout = DatasetLoader(corpus.heldout, 64, columns=columns, shuffle=False)
    return Prepared(
        name, train, heldout, (corpus.sequence_length,), corpus.vocab_size, model, batch_size, learning_rate, False, corpus
    )


def _model(name: str, data: Prepared, seed: int, options: dict[str, object]) -> nn.Module:
    """Returns the untrained model ``name`` fitted to the data's images and classes (a text corpus: its tokens and
    row length), its weights drawn from the run's seed."""
    from composer_fn.core import random as R

    if data.corpus is not None:
        from composer_fn.models.hf_lm import build_causal_lm

        return build_causal_lm(
            name, data.num_classes, data.sample_shape[0], key=R.key(seed), options=options, end_of_text=data.corpus.end_of_text
        )
    from composer_fn.models.zoo import build_model

    return build_model(name, data.sample_shape, data.num_classes, key=R.key(seed), options=options)  # type: ignore[arg-type]


class _HelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default (unless its text already says what happens without it) and lists
    the algorithm names ``--algorithms`` accepts."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.dest == "algorithms" and action.option_strings:
            text += f"; accepted: {', '.join(ALGORITHMS)}"
        default = action.default
        if not action.option_strings or "default" in text or "if omitted" in text:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return text + " (off by default)"
        if default is not None and default is not argparse.SUPPRESS and default != [] and default != {}:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: the command, the flag, the value and what is accepted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        # A value that starts with a minus and a digit (-1ba, -0.5) is a flag's value, not an unknown flag: so the
        # flag's own check names the value and what is accepted, instead of "expected one argument".
        self._negative_number_matcher = re.compile(r"^-\.?\d")

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
    # A bare number counts epochs, as the Trainer's max_duration takes it.
    number = text.isdigit()
    return validate.time("--max-duration", int(text) if number else text, (TimeUnit.EPOCH, TimeUnit.BATCH), "10ep", number_unit=TimeUnit.EPOCH)


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
    "a whole number >= 1 of epochs or batches, e.g. 10ep or 500ba (a bare number counts epochs)", _epochs_or_batches, lambda t: t.value >= 1
)
_LOG_INTERVAL = _checked("a whole number >= 1 of batches or epochs, e.g. 50ba or 1ep", _interval, lambda t: t.value >= 1)
_SAVE_INTERVAL = _checked(
    "a whole number >= 1 of batches or epochs, e.g. 500ba or 1ep",
    lambda text: validate.time("--save-interval", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "1ep"),
    lambda t: t.value >= 1,
)
_EVAL_INTERVAL = _checked(
    "a whole number >= 1 of batches or epochs, e.g. 500ba or 1ep",
    lambda text: validate.time("--eval-interval", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "1ep"),
    lambda t: t.value >= 1,
)
_RATIO = _checked("a finite number > 0, e.g. 0.5", float, lambda x: math.isfinite(x) and x > 0)
_COUNT = _checked("a whole number >= 0", int, lambda n: n >= 0)
_DIRECTORY = _checked("an existing folder", Path, Path.is_dir)
_MODEL = _checked(
    "a model name: small_cnn, mlp, cifar_resnet20, cifar_resnet56, or a torchvision.models classification model "
    "(for text data: a transformers causal language model type, e.g. gpt2)",
    str,
    lambda name: bool(name) and name.replace("_", "").replace("-", "").isalnum(),
)
def _model_kwargs(text: str) -> dict[str, object] | None:
    """Returns ``name=value`` pairs separated by commas as a dict: ints, floats, true/false, else strings."""
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        if not equals or not name.strip().isidentifier() or not value.strip() or name.strip() in options:
            return None
        options[name.strip()] = _plain(value.strip())
    return options


def _plain(text: str) -> object:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


_MODEL_KWARGS = _checked("comma-separated name=value pairs, each name once, e.g. width=16,dropout=0.1", _model_kwargs, lambda d: True)
def _location(text: str) -> Path | str:
    # A URL of a bucket as it is (checked when the run is built: object_store), else a local path. Imported here:
    # the trainer package imports torch, which --help does without.
    from composer_fn.trainer.object_store import is_url, local_path

    return text if is_url(text) else Path(local_path(text))


def _may_be_checkpoint(path: Path | str) -> bool:
    # A URL is read when the run is built; a folder may be a sharded checkpoint; a file must start as torch.save's
    # do (a zip archive, or the pickle of its older format), so that a log or a recipe is refused by its flag.
    if not isinstance(path, Path) or path.is_dir():
        return True
    try:
        with path.open("rb") as stream:
            head = stream.read(4)
    except OSError:
        return False
    return head == b"PK\x03\x04" or head[:1] == b"\x80"


_CHECKPOINT: Callable[[str], Path | str] = _checked(
    "an existing checkpoint file (torch.save's zip archive) or sharded checkpoint folder, e.g. runs/latest.pt, or "
    "its URL (s3://bucket/run/latest)",
    _location,
    _may_be_checkpoint,
)
_FOLDER: Callable[[str], Path | str] = _checked(
    "a folder (created if missing), not a file, or a bucket's URL (s3://bucket/run)",
    _location,
    lambda path: not isinstance(path, Path) or not path.is_file(),
)
_LOCAL_FOLDER = _checked("a folder (created if missing), not a file", Path, lambda path: not path.is_file())
_FILE = _checked("a file (created if missing), not a folder", Path, lambda path: not path.is_dir())


def _deepspeed_file(text: str) -> Path:
    """Returns the path of a DeepSpeed JSON config whose keys this project maps; the config's own error otherwise."""
    from composer_fn.trainer.deepspeed import deepspeed_options

    try:
        deepspeed_options(Path(text))
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return Path(text)


_DATA_NAME = _checked(
    f"one of {', '.join(DATA)}, python-docs, or hf:PATH (a local file or folder of text or tables)",
    str,
    lambda name: name in DATA or name == "python-docs" or (name.startswith("hf:") and len(name) > len("hf:")),
)
_SEQUENCE_LENGTH = _checked("a whole number >= 2 of tokens", int, lambda n: n >= 2)
_TEXT_COLUMN = _checked("a column's name", str, lambda name: bool(name.strip()))
_TOKENIZER = _checked(
    "bpe, bpe:N (a byte-level BPE of N >= 257 tokens trained on the training text), a tokenizer.json file, or a "
    "folder holding a transformers tokenizer",
    str,
    lambda text: (text.startswith("bpe") and (text == "bpe" or (text[:4] == "bpe:" and text[4:].isdigit() and int(text[4:]) >= 257)))
    or Path(text).exists(),
)


def _data_flags(command: argparse.ArgumentParser, omitted: str = "the embedded --task", text: bool = True) -> None:
    command.add_argument(
        "--data",
        type=_DATA_NAME,
        default=None,
        help=f"a dataset on disk: {', '.join(DATA)}; or a text corpus for a causal language model: python-docs (Debian's "
        f"python3-doc), hf:PATH (a local file or folder read with Hugging Face datasets) ({omitted} if omitted)",
    )
    command.add_argument(
        "--data-dir",
        type=_DIRECTORY,
        default=None,
        help="where it is: torchvision's root (<dir>/FashionMNIST/raw, <dir>/cifar-10-batches-bin), the files' own "
        "folder, or an image folder (one subfolder a class); Fashion-MNIST and python-docs default to the Debian "
        "package's",
    )
    command.add_argument(
        "--image-size", type=_POSITIVE_INT, default=None, help="imagefolder: the side images are resized to (their own size if omitted)"
    )
    if not text:
        return
    command.add_argument(
        "--text-column", type=_TEXT_COLUMN, default=None, help="text data: the column holding the documents (default: text)"
    )
    command.add_argument(
        "--tokenizer",
        type=_TOKENIZER,
        default=None,
        help="text data (default: bpe): bpe or bpe:N (a byte-level BPE of N tokens, 4096 by default, trained on the training "
        "documents), a tokenizer.json file, or a transformers tokenizer's folder",
    )
    command.add_argument(
        "--sequence-length", type=_SEQUENCE_LENGTH, default=None, help="text data: the tokens of a training row (default: 128)"
    )


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """Returns the command's parser and its subcommands' parsers by name."""
    parser = _Parser(prog="composer-fn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, text in (
        ("train", "train a model on an embedded task or on data from disk"),
        ("plan", "print which algorithm runs when, without training"),
        ("profile", "train a few steps under the profiler; print the slowest operators and each algorithm's time"),
    ):
        sub = commands.add_parser(command, help=text)
        sub.add_argument("--task", default=None, choices=tuple(TASKS), help=f"an embedded task: {', '.join(TASKS)} (default digits)")
        _data_flags(sub)
        sub.add_argument(
            "--config", type=Path, default=None, help="a recipe file (TOML); flags override its fields (none if omitted)"
        )
        sub.add_argument(
            "--algorithms",
            default=None,
            help="comma-separated names, each with its defaults or with hyperparameters, e.g. "
            "'ema(half_life=50ba),mixup(alpha=0.2),label_smoothing' (the recipe's, or none, if omitted; "
            "composer-fn algorithms NAME lists one's hyperparameters)",
        )
        sub.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="FIELD=VALUE",
            help="set a recipe field, a table's by its dotted path, over the recipe's: algorithms.ema.half_life=50ba, "
            "optimizer.name=adamw, schedule.t_warmup=0.1dur, loggers.tensorboard=runs/tb, callbacks='[\"lr\"]' "
            "(repeatable; none if omitted)",
        )
        sub.add_argument(
            "--model",
            type=_MODEL,
            default=None,
            help=f"{', '.join(ZOO)}, or any torchvision.models classification model by name; for text data, a "
            "transformers causal language model type: gpt2, llama, ... (the task's if omitted)",
        )
        sub.add_argument(
            "--model-kwargs",
            type=_MODEL_KWARGS,
            default={},
            help="the model constructor's own arguments, e.g. width=16,dropout=0.1 (SmallCNN) or dropout=0.3 "
            "(torchvision); none by default",
        )
        sub.add_argument(
            "--max-duration", type=_MAX_DURATION, default="10ep", help="the run's length in epochs or batches, e.g. 500ba"
        )
        sub.add_argument(
            "--batch-size", type=_POSITIVE_INT, default=None, help="samples a step, all processes together (task default if omitted)"
        )
        sub.add_argument(
            "--seed",
            type=_SEED,
            default=0,
            help="the run's seed: the model's initial weights, the data's order and every algorithm's random draws",
        )
    for command in ("train", "profile"):
        train = commands.choices[command]
        train.add_argument("--lr", type=_LEARNING_RATE, default=None, help="base learning rate (task default if omitted)")
        train.add_argument("--optimizer", default=None, choices=OPTIMIZERS, help="task default (SGD) if omitted")
        train.add_argument(
            "--precision",
            default=None,
            choices=("fp32", "bf16-mixed", "fp16-mixed"),
            help="fp32, or autocast to bfloat16 or float16 inside the step (for GPUs: on a CPU without 16-bit "
            "instructions it is several times slower); --deepspeed's, else fp32, if omitted",
        )
        train.add_argument("--compile", action="store_true", help="compile the step with torch.compile")
        train.add_argument(
            "--scale-schedule-ratio",
            type=_RATIO,
            default=1.0,
            help="train this fraction of --max-duration, the schedule stretched to fit (Composer's scale schedule)",
        )
        train.add_argument(
            "--save-folder", type=_FOLDER, default=None, help="where checkpoints go (created if missing; none saved if omitted)"
        )
        train.add_argument(
            "--save-interval", type=_SAVE_INTERVAL, default=None, help="how often to checkpoint, with --save-folder (default: 1ep)"
        )
        train.add_argument("--eval-interval", type=_EVAL_INTERVAL, default="1ep", help="how often to evaluate")
        train.add_argument("--num-workers", type=_COUNT, default=0, help="processes decoding images for imagefolder data")
        train.add_argument(
            "--load-path", type=_CHECKPOINT, default=None, help="a checkpoint to resume from (a fresh run if omitted)"
        )
        train.add_argument(
            "--autoresume",
            action="store_true",
            help="resume from the newest checkpoint in --save-folder when there is one (rerun an interrupted job as is)",
        )
        train.add_argument(
            "--log-file", type=_FILE, default=None, help="a JSON-lines file receiving every logged record (none if omitted)"
        )
        train.add_argument(
            "--overwrite-log",
            action="store_true",
            help="let a fresh run replace what --log-file holds (by default it refuses a file with an earlier run's "
            "records; a resumed run appends)",
        )
        train.add_argument(
            "--log-interval",
            type=_LOG_INTERVAL,
            default=None,
            help="how often loggers and monitors get a training record (default 50ba)",
        )
        train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        train.add_argument(
            "--threads", type=_POSITIVE_INT, default=None, help="torch intra-op threads (torch's default if omitted)"
        )
        train.add_argument(
            "--microbatch-size",
            type=_MICROBATCH,
            default=None,
            help="samples per device microbatch (gradient accumulation), or auto (halve on out-of-memory); the whole "
            "batch at once if omitted",
        )
        train.add_argument(
            "--nproc",
            type=_POSITIVE_INT,
            default=None,
            help="run on this many processes with torchrun (one per GPU); --batch-size is then the global batch "
            "(one process if omitted)",
        )
        train.add_argument("--dist-timeout", type=_TIMEOUT, default=300.0, help="seconds a collective waits")
        train.add_argument(
            "--fsdp",
            action="store_true",
            help="shard the parameters, gradients and optimizer state over the --nproc processes (FSDP; each holds "
            "the whole model if omitted)",
        )
        train.add_argument(
            "--deepspeed",
            type=_deepspeed_file,
            default=None,
            metavar="FILE",
            help="a DeepSpeed JSON config: its ZeRO stage, bf16/fp16, gradient clipping and batch keys set the run's "
            "sharding, precision, clipping, batch and microbatch (composer_fn.trainer.deepspeed; none if omitted); "
            "a flag that disagrees with it is an error",
        )
    profile = commands.choices["profile"]
    profile.add_argument("--steps", type=_POSITIVE_INT, default=5, help="steps recorded, after one skipped and one warm-up")
    profile.add_argument("--trace-folder", type=_LOCAL_FOLDER, default=Path("runs/profile"), help="where the traces go")
    export = commands.add_parser(
        "export", help="write a checkpoint's trained model as TorchScript, torch.export (pt2) or ONNX, checked on a batch"
    )
    export.add_argument("checkpoint", type=_CHECKPOINT, help="a checkpoint written by composer-fn train")
    export.add_argument(
        "--format", default="torchscript", choices=("torchscript", "pt2", "onnx"), help="the exported program's format"
    )
    export.add_argument("--output", type=_FILE, default=None, help="the file to write (default: by the checkpoint)")
    export.add_argument("--data-dir", type=_DIRECTORY, default=None, help="where the run's data is (for the check batch; its usual place if omitted)")
    export.add_argument(
        "--inputs",
        default=None,
        choices=("unit", "standardized"),
        help="what an image model's program takes: unit (the default), images in [0, 1] (pixels / 255) that it "
        "standardises itself as the run did; standardized, images already standardised (the model as it is). A "
        "language model's program takes token ids",
    )
    convert = commands.add_parser(
        "convert", help="write a checkpoint (a sharded run's folder included) as one checkpoint file, or its weights as safetensors"
    )
    convert.add_argument("checkpoint", type=_CHECKPOINT, help="a checkpoint file or a sharded checkpoint's folder")
    convert.add_argument("--output", type=_FILE, required=True, help="the file to write")
    convert.add_argument(
        "--format",
        default="torch",
        choices=("torch", "safetensors"),
        help="one torch.save checkpoint file, or the parameters as safetensors (Hugging Face from_pretrained); default %(default)s",
    )
    predict = commands.add_parser("predict", help="write a checkpoint's predictions for a dataset as CSV")
    predict.add_argument("checkpoint", type=_CHECKPOINT, help="a checkpoint written by composer-fn train")
    _data_flags(predict, "the checkpoint's data", text=False)
    predict.add_argument("--task", default=None, choices=tuple(TASKS), help="an embedded task (default: the run's)")
    predict.add_argument("--split", default="heldout", choices=("heldout", "train"), help="which part of the data")
    predict.add_argument("--output", type=_FILE, default=None, help="the CSV to write (default: by the checkpoint)")
    predict.add_argument("--batch-size", type=_POSITIVE_INT, default=256, help="images (or text rows) a forward pass")
    predict.add_argument(
        "--sequence-length",
        type=_SEQUENCE_LENGTH,
        default=None,
        help="a language model's checkpoint: the rows' length in tokens, e.g. twice the training length to measure "
        "extrapolation (the run's if omitted)",
    )
    pareto = commands.add_parser(
        "pareto",
        help="run a sweep of recipes x lengths x seeds; write held-out accuracy (or perplexity) against wall time "
        "(table and PNG)",
    )
    pareto.add_argument("--config", type=Path, required=True, help="the sweep file (TOML; see composer_fn.app.pareto)")
    pareto.add_argument(
        "--jobs", type=_POSITIVE_INT, default=1, help="runs at once (default %(default)s: the timings share no CPU)"
    )
    report = commands.add_parser("report", help="draw a run's log (loss, held-out metric, learning rate, throughput) as a PNG")
    report.add_argument("run", type=Path, help="a run folder holding one JSON-lines log (--log-file), or the log")
    report.add_argument("--compare", type=Path, nargs="+", default=[], metavar="RUN", help="more runs, overlaid (none by default)")
    report.add_argument(
        "--labels", default="", help="comma-separated names of the runs, in order (by default each run's folder name)"
    )
    report.add_argument("--output", type=Path, default=None, help="the PNG to write (default: report.png by the run)")
    listing = commands.add_parser("algorithms", help="list the algorithms, or one's hyperparameters with their defaults")
    listing.add_argument("name", nargs="?", default=None, help="an algorithm's name (all of them, one line each, if omitted)")
    return parser, dict(commands.choices)


def parse_algorithms(text: str) -> tuple[Algorithm, ...]:
    """Returns the algorithms named in a comma-separated list, each with its default hyperparameters or those given
    in parentheses: ``'ema(half_life=50ba),mixup(alpha=0.2),label_smoothing'``.

    Raises ValueError naming an unknown or repeated name, an unknown hyperparameter or a bad value, and what is
    accepted.
    """
    from composer_fn.app.catalog import build_algorithms
    from composer_fn.app.recipes import parse_algorithm_list

    return build_algorithms(parse_algorithm_list(text))


def _wants_unit_range(algorithms: tuple[Algorithm, ...]) -> bool:
    """Returns whether an algorithm takes pixels in [0, 1] (then the task's inputs are not standardised)."""
    return any(a.capabilities().input_range is not None for a in algorithms)


def _train(args: argparse.Namespace, algorithms: tuple[Algorithm, ...]) -> int:
    import torch

    from composer_fn.callbacks import LRMonitor, SpeedMonitor
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
    world = environment_world() or World()
    algorithms, execution = _execution(args, algorithms, world.size)
    data = _prepare(args, _wants_unit_range(algorithms), world.size)
    model_name = args.model or data.model
    model = _model(model_name, data, args.seed, args.model_kwargs)
    recipe: Recipe = args.recipe
    # The optimizer: --optimizer (with its default arguments), else the recipe's table, else the task's SGD.
    task_optimizer: dict[str, Any] = {
        "name": "sgd",
        "learning_rate": data.learning_rate,
        "momentum": 0.9,
        "nesterov": True,
        "weight_decay": 5e-4,
    }
    if data.corpus is not None:
        # A language model's usual AdamW (GPT-2-style pre-training: beta2 0.95, decay 0.1).
        task_optimizer = {"name": "adamw", "learning_rate": data.learning_rate, "betas": (0.9, 0.95), "weight_decay": 0.1}
    if args.optimizer:
        optimizer = Recipe(recipe.path, {}).build_optimizer({"name": args.optimizer, "learning_rate": data.learning_rate}, args.lr)
    else:
        optimizer = recipe.build_optimizer(task_optimizer, args.lr)
    schedule = recipe.build_schedule({"name": "cosine_warmup", "t_warmup": _warmup(args.max_duration)})
    # Under torchrun the batch is global: each process takes its share, and the run equals one process's run with
    # --microbatch-size of that share.
    eval_loader: Any = data.heldout
    if recipe.evaluators:
        eval_loader = recipe.build_evaluators(eval_loader, num_classes=data.num_classes)
    main_process = world.main
    try:
        log_file = JSONLLogger(args.log_file, overwrite=args.overwrite_log) if args.log_file is not None else None
    except ValueError as error:
        raise ValueError(f"--log-file: {error}") from None
    loggers: list[Logger] = [log_file] if log_file is not None else []
    loggers = [*loggers, *recipe.build_loggers(args.save_folder)] if main_process else []
    callbacks = recipe.build_callbacks()
    if loggers and not recipe.callbacks:
        callbacks = [SpeedMonitor(), LRMonitor()]
    trainer = Trainer(
        model,
        data.train,
        eval_loader,
        max_duration=args.max_duration,
        scale_schedule_ratio=args.scale_schedule_ratio,
        optimizer=optimizer,
        schedule=schedule,
        algorithms=algorithms,
        seed=args.seed,
        precision=execution["precision"],
        compile=args.compile,
        loggers=loggers,
        callbacks=callbacks,
        save_folder=args.save_folder,
        save_interval=args.save_interval,
        save_metadata=_metadata(data, model_name, args.model_kwargs),
        eval_interval=args.eval_interval,
        load_path=args.load_path,
        autoresume=args.autoresume,
        progress_bar=not args.no_progress,
        **({"log_interval": args.log_interval} if args.log_interval is not None else {}),
        device_train_microbatch_size=execution["microbatch_size"],
        dist_timeout=args.dist_timeout,
        parallelism=execution["parallelism"],
        profiler=profiler,
    )
    resumed_at = trainer.timestamp.sample  # a resumed run counts only the samples this process trains
    metrics = trainer.fit()
    if not main_process:
        return 0
    if profiler is not None:
        from composer_fn.profiler import summarize

        print(summarize(trainer.profile_traces))
        print("traces: " + ", ".join(str(path) for path in trainer.profile_traces))
        return 0
    wall = time.perf_counter() - started
    names = ", ".join(a.name + (" (no effect)" if a.name in trainer.no_effect else "") for a in algorithms) or "none"
    print(
        f"{'data' if args.data else 'task'} {data.name} | model {model_name} | algorithms {names} | "
        f"{trainer.timestamp.batch} steps, {trainer.timestamp.epoch} epochs"
    )
    if data.corpus is not None and "eval/eval/loss" in metrics:
        loss = metrics["eval/eval/loss"]
        print(
            f"held-out loss {loss:.4f} | perplexity {math.exp(min(loss, 700.0)):.2f} | bits per byte "
            f"{data.corpus.bits_per_byte(loss):.4f} | next-token accuracy {metrics['eval/eval/accuracy']:.2%}"
        )
    elif "eval/eval/accuracy" in metrics:
        print(f"held-out accuracy {metrics['eval/eval/accuracy']:.2%} | held-out loss {metrics['eval/eval/loss']:.4f}")
    else:
        print("held-out " + " | ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name.startswith("eval/")))
    samples = trainer.timestamp.sample - resumed_at
    print(
        f"wall time {wall:.1f} s (training {metrics['wall_time']:.1f} s, "
        f"{samples / max(metrics['wall_time'], 1e-9):,.0f} samples/s with evaluation)"
    )
    if trainer.compiles:
        print(f"compiled graphs: {trainer.compiles}")
    return 0


def _execution(
    args: argparse.Namespace, algorithms: tuple[Algorithm, ...], world_size: int
) -> tuple[tuple[Algorithm, ...], dict[str, Any]]:
    """Returns the run's algorithms and its ``precision``, ``microbatch_size`` and ``parallelism``: the flags', with
    ``--deepspeed``'s settings applied (the batch too: ``args.batch_size`` becomes the config's where not given).

    Raises naming both where a flag disagrees with the config, and where the config shards a run that has no
    processes to shard over.
    """
    from composer_fn.trainer import FSDP

    execution: dict[str, Any] = {
        "precision": args.precision or "fp32",
        "microbatch_size": args.microbatch_size,
        "parallelism": FSDP() if args.fsdp else None,
    }
    if args.deepspeed is None:
        return algorithms, execution
    from composer_fn.trainer.deepspeed import deepspeed_options
    from composer_fn.trainer.distributed import environment_world, grouped

    named = f"--deepspeed {args.deepspeed}"
    deepspeed = deepspeed_options(args.deepspeed, precision=args.precision)
    if deepspeed.precision is not None:
        if args.precision is not None and args.precision != deepspeed.precision:
            block = deepspeed.precision.split("-")[0]
            raise ValueError(
                f"--precision={args.precision} and {named}'s {block}.enabled=true ({deepspeed.precision}) disagree: "
                "drop one of them"
            )
        execution["precision"] = deepspeed.precision
    if deepspeed.zero_stage is not None:
        sharding = deepspeed.parallelism
        if args.fsdp and (sharding is None or not sharding.reshard_after_forward):
            raise ValueError(
                f"--fsdp (ZeRO-3: the parameters sharded too) and {named}'s zero_optimization.stage="
                f"{deepspeed.zero_stage} disagree: drop --fsdp (the config's stage decides), or set the stage to 3"
            )
        execution["parallelism"] = sharding
    if deepspeed.parallelism is not None and environment_world() is None and not grouped():
        raise ValueError(
            f"{named}: zero_optimization.stage={deepspeed.zero_stage} shards over the processes of a process group: "
            "add --nproc N (torchrun launches N processes), or launch with torchrun"
        )
    if args.batch_size is not None and deepspeed.train_batch_size not in (None, args.batch_size):
        raise ValueError(
            f"--batch-size={args.batch_size} and {named}'s train_batch_size={deepspeed.train_batch_size} disagree (both "
            "are the global batch): drop one of them"
        )
    args.batch_size = args.batch_size or deepspeed.batch_size(world_size) or _source(args)[1]
    try:
        microbatch = deepspeed.microbatch_size_for(args.batch_size, world_size)
    except ValueError as error:
        raise ValueError(f"{named}: {error}") from None
    if deepspeed.microbatch_size is not None or deepspeed.gradient_accumulation_steps is not None:
        per_process = args.batch_size // world_size
        given = args.microbatch_size
        if given is not None and (given == "auto" or min(given, per_process) != (microbatch or per_process)):
            key = "train_micro_batch_size_per_gpu" if deepspeed.microbatch_size is not None else "gradient_accumulation_steps"
            raise ValueError(
                f"--microbatch-size={given} and {named}'s {key} (microbatches of {microbatch or per_process} samples of "
                f"each process's {per_process}) disagree: drop one of them"
            )
        execution["microbatch_size"] = microbatch
    if deepspeed.gradient_clipping is not None:
        from composer_fn.algorithms import GradientClipping

        if any(algorithm.name == "gradient_clipping" for algorithm in algorithms):
            raise ValueError(
                f"the algorithm gradient_clipping and {named}'s gradient_clipping={deepspeed.gradient_clipping:g} both "
                "clip the gradients: drop one of them"
            )
        algorithms = (*algorithms, GradientClipping(clipping_type="norm", clipping_threshold=deepspeed.gradient_clipping))
    return algorithms, execution


def _metadata(data: Prepared, model: str, options: dict[str, object]) -> dict[str, Any]:
    """Returns what a checkpoint records to rebuild its model and read its data again (export, predict); a text
    run's also its tokenizer (as JSON) and how its corpus was read."""
    if data.corpus is not None:
        from composer_fn.data.corpus import tokenizer_json

        corpus = data.corpus
        return {
            "data": data.name,
            "model": model,
            "model_kwargs": dict(options),
            "sequence_length": corpus.sequence_length,
            "vocab_size": corpus.vocab_size,
            "end_of_text": corpus.end_of_text,
            "bytes_per_token": corpus.bytes_per_token,
            "text_column": corpus.text_column,
            "tokenizer": tokenizer_json(corpus.tokenizer),
        }
    inputs = data.inputs
    return {
        "data": data.name,
        "model": model,
        "model_kwargs": dict(options),
        "image_shape": list(data.sample_shape),
        "num_classes": data.num_classes,
        "unit_range": data.unit_range,
        # Images in [0, 1] reach the model as (x - input_mean) / input_std (none: as they are).
        "input_mean": list(inputs.mean) if inputs is not None and inputs.mean is not None and not data.unit_range else None,
        "input_std": list(inputs.std) if inputs is not None and inputs.std is not None and not data.unit_range else None,
        "classes": list(inputs.classes) if inputs is not None else None,
    }


def _trained(args: argparse.Namespace) -> tuple[nn.Module, dict[str, Any]]:
    return load_trained(args.checkpoint)


def load_trained(checkpoint: str | os.PathLike[str]) -> tuple[nn.Module, dict[str, Any]]:
    """Returns the trained model of a checkpoint that ``composer-fn train`` wrote, in eval mode (its surgeries replayed,
    the weights evaluation used), and the checkpoint's record of the run (``checkpoint_metadata``): its data, model and
    options, image shape and classes, and how its images were standardised (``input_mean``, ``input_std``; a language
    model's: its tokenizer as JSON, ``sequence_length``, ``vocab_size``).

    The model is rebuilt from that record (``composer_fn.models.zoo.build_model``, or a ``transformers`` causal
    language model) and loaded with ``composer_fn.load_model``. A checkpoint of a Python ``Trainer`` records no model:
    rebuild the architecture and call ``load_model(checkpoint, model)``.
    """
    from composer_fn.models.zoo import build_model
    from composer_fn.trainer import load_model
    from composer_fn.trainer.checkpoint import checkpoint_metadata

    if isinstance(checkpoint, os.PathLike):
        checkpoint = Path(checkpoint)
    metadata = checkpoint_metadata(checkpoint)
    if "sequence_length" in metadata:
        from composer_fn.models.hf_lm import build_causal_lm

        language_model = build_causal_lm(
            metadata["model"],
            int(metadata["vocab_size"]),
            int(metadata["sequence_length"]),
            options=metadata.get("model_kwargs") or {},
            end_of_text=metadata.get("end_of_text"),
        )
        return load_model(checkpoint, language_model), metadata
    needed = ("data", "model", "image_shape", "num_classes")
    if not all(key in metadata for key in needed):
        raise ValueError(
            f"checkpoint={str(checkpoint)!r} does not record its model and data (written by an older version, or "
            "by a Trainer without save_metadata); rebuild the architecture and call composer_fn.load_model(checkpoint, model)"
        )
    shape = tuple(int(d) for d in metadata["image_shape"])
    architecture = build_model(
        metadata["model"], shape, int(metadata["num_classes"]), options=metadata.get("model_kwargs") or {}  # type: ignore[arg-type]
    )
    return load_model(checkpoint, architecture), metadata


def _recorded_data(args: argparse.Namespace, metadata: dict[str, Any], unit_range: bool | None = None) -> Prepared:
    """Returns the data a checkpoint's run trained on (or ``--data``/``--task``), read as that run read it (its
    images in [0, 1] with ``unit_range``); its training loader takes one sample a batch (any folder fills one),
    and only serves ``_in_order``."""
    recorded = metadata["data"]
    given_data, given_task = getattr(args, "data", None), getattr(args, "task", None)
    if given_data is None and given_task is None:
        given_data, given_task = (None, recorded) if recorded in TASKS else (recorded, None)
    if "sequence_length" in metadata:
        # A text corpus is read again with the run's tokenizer, so that its rows are the run's.
        from composer_fn.data.corpus import tokenizer_from_json

        if not metadata.get("tokenizer"):
            raise ValueError(
                f"checkpoint={str(args.checkpoint)!r} records no tokenizer to read its text with (its tokenizer had no "
                "JSON form); load it in Python: composer_fn.load_model(checkpoint, model)"
            )
        if given_task is not None or not _is_text(given_data):
            raise ValueError(
                f"checkpoint={str(args.checkpoint)!r} holds a language model of text data ({recorded}); "
                f"--data {given_data or given_task} is not text (give python-docs or hf:PATH)"
            )
        text_view = argparse.Namespace(
            data=given_data,
            task=None,
            data_dir=args.data_dir,
            text_column=metadata.get("text_column", "text"),
            tokenizer=tokenizer_from_json(metadata["tokenizer"]),
            sequence_length=getattr(args, "sequence_length", None) or int(metadata["sequence_length"]),
            batch_size=1,
            seed=0,
        )
        return _prepare(text_view, False)
    view = argparse.Namespace(
        data=given_data,
        task=given_task,
        data_dir=args.data_dir,
        # An image folder is resized as the run's was: to the image shape the model was trained on.
        image_size=getattr(args, "image_size", None) or (tuple(metadata["image_shape"][1:]) if given_data == "imagefolder" else None),
        num_workers=0,
        batch_size=1,
        seed=0,
    )
    return _prepare(view, bool(metadata.get("unit_range", False)) if unit_range is None else unit_range)


def _export(args: argparse.Namespace) -> int:
    import torch

    from composer_fn.core import random as R
    from composer_fn.export import SUFFIXES, export_model

    model, metadata = _trained(args)
    text = "sequence_length" in metadata
    if text:
        model = _logits_of_ids(model)
    if text and args.inputs is not None:
        raise ValueError(
            f"--inputs {args.inputs}: {args.checkpoint} holds a language model, whose program takes token ids "
            "(int64 [N, S]); --inputs chooses what an image model's program takes: leave it out"
        )
    # By default an image model's program takes images in [0, 1] (pixels / 255) and standardises them itself.
    unit = not text and args.inputs in (None, "unit")
    try:
        if metadata.get("data") == "imagefolder" and args.data_dir is None and getattr(args, "data", None) is None:
            raise FileNotFoundError("no --data-dir names the image folder")
        data = _recorded_data(args, metadata, unit_range=True if unit else None)
        if data.corpus is not None:
            rows = next(iter(data.heldout))["input_ids"]
            inputs, more = rows[:8], [rows[8:13]] if len(rows) > 8 else []
            where = f"{len(rows[:13])} held-out rows of {data.name}, in batches of 8 and {len(rows[8:13])}"
        else:
            images = next(iter(data.heldout))[0]
            inputs, more = images[:64], [images[64:101]] if len(images) > 64 else []
            where = f"{len(images[:101])} held-out images of {data.name}, in batches of {len(inputs)}" + (
                f" and {len(more[0])}" if more else ""
            )
    except FileNotFoundError as error:
        if text:
            raise
        data = None
        shape = tuple(int(d) for d in metadata["image_shape"])
        draw = R.uniform if unit else R.normal
        inputs, more = draw(R.key(0), (8, *shape)).to(torch.float32), [draw(R.key(1), (5, *shape)).to(torch.float32)]
        where = f"13 keyed random images in batches of 8 and 5 (the data was not found: {str(error).splitlines()[0]})"
    standardization = _standardization(metadata, data) if unit else None
    if standardization is not None:
        from composer_fn.export import Standardized

        model = Standardized(model, *standardization)
    output = args.output or _beside(args.checkpoint).with_suffix(SUFFIXES[args.format])
    _refuse_an_input(output, "--output", checkpoint=args.checkpoint)
    _writable(Path(output), "--output")
    check = export_model(model, inputs, output, format=args.format, check_batches=more)
    about = _write_export_card(check.path, args, metadata, data, standardization, inputs)
    print(f"wrote {check.path} ({args.format}); on {where} its outputs differ from the module's by at most {check.max_difference:.3g}")
    if check.specialised:
        print(f"the trace is specialised to the check batches' shapes where the model's code reads them: {check.specialised[0]}")
    print(f"wrote {about}: {json.loads(about.read_text())['input']}")
    return 0


def _standardization(metadata: dict[str, Any], data: Prepared | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Returns the ``(mean, std)`` that standardised the run's images in [0, 1] (None: the model took them as they
    are): the checkpoint's record, else (an older checkpoint) the statistics of the data read again."""
    if metadata.get("unit_range"):
        return None
    if "input_mean" in metadata:
        mean, std = metadata["input_mean"], metadata["input_std"]
        return None if mean is None else (tuple(map(float, mean)), tuple(map(float, std)))
    if data is None or data.inputs is None:
        raise ValueError(
            "the checkpoint does not record how its images were standardised, and its data was not found to measure "
            "it; give --data-dir, or --inputs standardized to export the model as it is"
        )
    if data.inputs.mean is None or data.inputs.std is None:  # data without pixels (the synthetic task)
        return None
    return data.inputs.mean, data.inputs.std


def _write_export_card(
    path: Path,
    args: argparse.Namespace,
    metadata: dict[str, Any],
    data: Prepared | None,
    standardization: tuple[tuple[float, ...], tuple[float, ...]] | None,
    example: Any,
) -> Path:
    """Writes ``<export>.json`` beside the exported program, atomically: what it takes and returns, and the names of
    its classes."""
    shape = ["N", *[int(d) for d in example.shape[1:]]]
    if "sequence_length" in metadata:
        card: dict[str, Any] = {
            "input": f"input_ids: int64 {shape} token ids of the run's tokenizer (recorded in the checkpoint)",
            "output": f"logits: float32 [N, {shape[1]}, {metadata['vocab_size']}] next-token logits",
        }
    else:
        classes = metadata.get("classes") or (list(data.inputs.classes) if data is not None and data.inputs is not None else None)
        if standardization is not None:
            described = (
                f"images: float32 {shape} in [0, 1] (pixels / 255); the program standardises them per channel with the "
                "run's mean and std"
            )
        elif metadata.get("unit_range"):
            described = f"images: float32 {shape} in [0, 1] (pixels / 255), as the run's model took them"
        elif args.inputs == "standardized":
            described = f"images: float32 {shape} standardised as in training: (x - mean) / std, x in [0, 1]"
        else:
            described = f"inputs: float32 {shape} as the run's model took them (its data has no pixels to standardise)"
        card = {
            "input": described,
            "mean": list(standardization[0]) if standardization is not None else metadata.get("input_mean"),
            "std": list(standardization[1]) if standardization is not None else metadata.get("input_std"),
            "standardised_inside": standardization is not None,
            "output": f"logits: float32 [N, {metadata['num_classes']}], one per class in the order of classes",
            "classes": classes,
        }
    card = {"format": args.format, "program": path.name, **card, "checkpoint": str(args.checkpoint), "data": metadata.get("data")}
    about = path.with_name(path.name + ".json")
    temporary = about.with_name(f".{about.name}.tmp")
    temporary.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    temporary.replace(about)
    return about


def _logits_of_ids(model: nn.Module) -> nn.Module:
    """Returns a module taking token ids ``int64 [B, S]`` to the language model's logits ``[B, S, vocab]`` (what an
    exported program computes)."""
    from torch import nn

    class Logits(nn.Module):
        def __init__(self, language_model: nn.Module) -> None:
            super().__init__()
            self.language_model = language_model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.language_model(input_ids=input_ids).logits  # type: ignore[no-any-return]

    return Logits(model).eval()


def _writable(output: Path, flag: str) -> None:
    """Raises ValueError naming ``flag`` and ``output`` when the file cannot be written there (its folder cannot be
    made, or a file cannot be created in it), before any work that would end in writing it."""
    if "://" in str(output):  # a bucket: checked by its store when written
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        probe = output.with_name(f".{output.name}.probe")
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ValueError(f"{flag}={str(output)!r} cannot be written ({error.strerror or error}); expected a file path in a writable folder") from None


def _refuse_an_input(output: Path | str, flag: str, **inputs: Any) -> None:
    """Raises ValueError when ``output`` is one of the command's ``inputs`` (by argument name) or lies inside one
    (an input folder): writing it would replace what the command reads."""
    if not isinstance(output, Path) and "://" in str(output):
        return
    written = Path(output).resolve()
    for name, value in inputs.items():
        if value is None or "://" in str(value):
            continue
        source = Path(value).resolve()
        if written == source or source in written.parents:
            where = "is" if written == source else "lies inside"
            raise ValueError(
                f"{flag}={str(output)!r} {where} the {name.replace('_', '-')} this command reads ({str(value)!r}): "
                "writing it would replace its input; expected another path"
            )


def _beside(checkpoint: Path | str) -> Path:
    # Where a file made from a checkpoint goes by default: beside it, or in the working folder for one in a bucket.
    from composer_fn.trainer.object_store import split_url

    return Path(split_url(checkpoint)[1]).resolve() if isinstance(checkpoint, str) else checkpoint.resolve()


def _convert(args: argparse.Namespace) -> int:
    from composer_fn.trainer.checkpoint import convert_checkpoint

    _refuse_an_input(args.output, "--output", checkpoint=args.checkpoint)
    _writable(Path(args.output), "--output")
    written = convert_checkpoint(args.checkpoint, args.output, format=args.format)
    print(f"wrote {written} ({args.format}) from {args.checkpoint}")
    return 0


def _predict(args: argparse.Namespace) -> int:
    import csv

    import torch

    model, metadata = _trained(args)
    if args.sequence_length is not None and "sequence_length" not in metadata:
        raise ValueError(
            f"--sequence-length={args.sequence_length}: checkpoint={str(args.checkpoint)!r} holds an image model; the "
            "flag sets a language model's rows"
        )
    data = _recorded_data(args, metadata)
    if data.corpus is not None:
        return _predict_text(args, model, data)
    if data.num_classes != int(metadata["num_classes"]) or tuple(data.sample_shape) != tuple(metadata["image_shape"]):
        raise ValueError(
            f"--data {data.name} has {data.num_classes} classes of {tuple(data.sample_shape)} images; the checkpoint's model "
            f"takes {tuple(metadata['image_shape'])} images of {metadata['num_classes']} classes"
        )
    recorded = metadata.get("classes")
    classes = list(data.inputs.classes) if data.inputs is not None else [str(i) for i in range(data.num_classes)]
    if recorded is not None and list(recorded) != classes:
        differ = [f"{i}: {a!r} / {b!r}" for i, (a, b) in enumerate(zip(recorded, classes, strict=True)) if a != b]
        raise ValueError(
            f"--data {data.name} names its classes otherwise than the checkpoint's run did (label: checkpoint / data: "
            f"{', '.join(differ[:5])}{', ...' if len(differ) > 5 else ''}), so its labels mean other classes; expected "
            "the data the run trained on, or a folder with the same class names"
        )
    loader = data.heldout if args.split == "heldout" else _in_order(data.train, args.batch_size)
    source = _beside(args.checkpoint)
    output = args.output or source.with_name(f"{source.stem}-{data.name}-{args.split}.csv")
    _refuse_an_input(output, "--output", checkpoint=args.checkpoint, data_dir=args.data_dir)
    _writable(output, "--output")
    temporary = output.with_name(f".{output.name}.tmp")
    correct = total = 0
    device = next(model.parameters()).device
    with temporary.open("w", newline="") as stream, torch.no_grad():
        writer = csv.writer(stream)
        writer.writerow(["index", "label", "prediction", "probability", "label_name", "prediction_name"])
        for images, labels in loader:
            probabilities = torch.softmax(model(images.to(device)).float(), dim=1).cpu()
            confidence, predicted = probabilities.max(dim=1)
            for row in zip(range(total, total + len(labels)), labels.tolist(), predicted.tolist(), confidence.tolist(), strict=True):
                writer.writerow([*row[:3], f"{row[3]:.6f}", classes[row[1]], classes[row[2]]])
            correct += int((predicted == labels).sum())
            total += len(labels)
    temporary.replace(output)
    print(f"wrote {total} predictions for the {args.split} part of {data.name} to {output} (accuracy {correct / max(total, 1):.2%})")
    return 0


def _predict_text(args: argparse.Namespace, model: nn.Module, data: Prepared) -> int:
    """Writes each row's next-token loss and accuracy for a language model's corpus as CSV; prints the part's loss,
    perplexity and bits per byte."""
    import csv

    import torch
    import torch.nn.functional as F

    from composer_fn.data.hf import DatasetLoader

    rows = data.corpus.heldout if args.split == "heldout" else data.corpus.train
    loader = DatasetLoader(rows, args.batch_size, columns=("input_ids",), shuffle=False, rank=0, world_size=1)
    source = _beside(args.checkpoint)
    name = data.name.replace("hf:", "hf-").replace("/", "-")
    output = args.output or source.with_name(f"{source.stem}-{name}-{args.split}.csv")
    corpus = args.data.removeprefix("hf:") if (args.data or "").startswith("hf:") else None
    _refuse_an_input(output, "--output", checkpoint=args.checkpoint, data_dir=args.data_dir, data=corpus)
    _writable(output, "--output")
    temporary = output.with_name(f".{output.name}.tmp")
    total_loss, total_tokens, index = 0.0, 0, 0
    device = next(model.parameters()).device
    model.eval()
    length = data.sample_shape[0]
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, length, dtype=torch.int64, device=device))
    except (IndexError, RuntimeError, ValueError) as error:
        config = getattr(model, "config", None)
        positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        raise ValueError(
            f"--sequence-length={length}: the model does not take rows of {length} tokens ({str(error).splitlines()[0]}); "
            f"its position table has {positions} positions (train with a larger n_positions in --model-kwargs, or with "
            "ALiBi, to evaluate longer rows)"
        ) from None
    with temporary.open("w", newline="") as stream, torch.no_grad():
        writer = csv.writer(stream)
        writer.writerow(["index", "tokens", "loss", "accuracy"])
        for batch in loader:
            ids = batch["input_ids"].to(device)
            logits = model(input_ids=ids).logits[:, :-1].float()
            targets = ids[:, 1:]
            losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").cpu()
            hits = (logits.argmax(-1) == targets).float().cpu()
            for row_loss, row_hits in zip(losses, hits, strict=True):
                writer.writerow([index, row_loss.numel(), f"{float(row_loss.mean()):.6f}", f"{float(row_hits.mean()):.6f}"])
                index += 1
            total_loss += float(losses.sum())
            total_tokens += losses.numel()
    temporary.replace(output)
    loss = total_loss / max(total_tokens, 1)
    print(
        f"wrote {index} rows' losses for the {args.split} part of {data.name} to {output} (loss {loss:.4f}, perplexity "
        f"{math.exp(min(loss, 700.0)):.2f}, bits per byte {data.corpus.bits_per_byte(loss):.4f})"
    )
    return 0


def _in_order(loader: Any, batch_size: int) -> Any:
    """Returns the training loader's batches in the data's own order (not shuffled, none dropped), for predictions."""
    from composer_fn.data import TensorLoader

    if isinstance(loader, TensorLoader):
        return TensorLoader(loader.tensors, batch_size, shuffle=False)
    return loader.in_order(batch_size)


def _warmup(max_duration: Time) -> str:
    """Returns the warm-up of the tasks' schedule: one epoch, or a tenth of a run shorter than two epochs."""
    return "1ep" if max_duration.unit is TimeUnit.EPOCH and max_duration.value >= 2 else "0.1dur"


def _plan(args: argparse.Namespace, algorithms: tuple[Algorithm, ...]) -> int:
    from composer_fn.core.dry_run import dry_run

    data = _prepare(args, _wants_unit_range(algorithms))
    batch_size = data.batch_size
    steps_per_epoch = len(data.train)
    input_shape = (batch_size, *data.sample_shape)
    # Checked against the run's model: a surgery that finds nothing to rewrite there never runs.
    model = _model(args.model or data.model, data, args.seed, args.model_kwargs)
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
        if not action.option_strings or action.dest in ("help", "config", "algorithms", "set"):
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


def _pareto(args: argparse.Namespace) -> int:
    from composer_fn.app import pareto

    try:
        sweep = pareto.load_sweep(args.config)
        runs = sweep.runs()
        done = sum(pareto.read_result(run) is not None for run in runs)
        print(f"{len(runs)} runs in {sweep.folder} ({done} finished before), {args.jobs} at a time", flush=True)

        def finished(run: pareto.RunSpec, result: pareto.Result) -> None:
            value = sweep.metric.format(sweep.metric.of(result))
            print(f"{run.name} {run.length} seed {run.seed}: {sweep.metric.name} {value}, {result.wall_time:.1f} s", flush=True)

        results = pareto.run_sweep(sweep, jobs=args.jobs, on_result=finished)
        markdown, picture = pareto.write_pareto(sweep, results)
    except (ValueError, TypeError, RuntimeError, OSError) as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2
    print(markdown.read_text(encoding="utf-8"))
    print(f"wrote {markdown} and {picture}")
    return 0


def _algorithms(args: argparse.Namespace) -> int:
    from composer_fn.app.catalog import algorithm_page, algorithm_table

    try:
        print(algorithm_table() if args.name is None else algorithm_page(args.name))
    except ValueError as error:
        print(f"composer-fn: argument name: {error}", file=sys.stderr)
        return 2
    return 0


def _report(args: argparse.Namespace) -> int:
    from composer_fn.app.report import write_report

    labels = [label.strip() for label in args.labels.split(",")] if args.labels else []
    runs = 1 + len(args.compare)
    if labels and len(labels) != runs:
        print(
            f"composer-fn: --labels {args.labels} names {len(labels)} runs, and {runs} are given (the run and "
            f"{len(args.compare)} --compare): expected one name a run, in order",
            file=sys.stderr,
        )
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if args.output is not None:
                for index, run in enumerate([args.run, *args.compare]):
                    if run.is_file():  # a log given as the run (a run folder cannot be the PNG)
                        _refuse_an_input(args.output, "--output", **{"run" if index == 0 else "--compare run": run})
                if args.output.suffix.lower() != ".png":
                    raise ValueError(f"--output {args.output}: the report is a PNG picture; expected a path ending in .png")
            path = write_report([args.run, *args.compare], args.output, labels=labels)
    except (ValueError, TypeError, OSError) as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2
    for warning in caught:
        print(f"composer-fn: warning: {warning.message}", file=sys.stderr)
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
    if args.command == "pareto":
        return _pareto(args)
    if args.command in ("export", "predict", "convert"):
        try:
            return {"export": _export, "predict": _predict, "convert": _convert}[args.command](args)
        except (ValueError, TypeError, OSError, ImportError) as error:
            print(f"composer-fn: {error}", file=sys.stderr)
            return 2
    if args.command == "algorithms":
        return _algorithms(args)
    recipe = None
    if args.config is not None or args.set:
        # The recipe's fields (and --set's over them) become the command's defaults: a flag still wins.
        try:
            recipe = load_recipe(args.config, _converters(commands["train"]), args.set)
        except (ValueError, TypeError, OSError) as error:
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
    try:
        _check_combination(args)
    except ValueError as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2
    if args.command in ("train", "profile") and args.nproc is not None and "WORLD_SIZE" not in os.environ:
        batch = args.batch_size if args.batch_size is not None else _source(args)[1]
        if batch % args.nproc:  # refused here, once, rather than by each process under torchrun
            given = f"--batch-size={batch}" if args.batch_size is not None else f"the default batch of {batch}"
            print(
                f"composer-fn: {given} must be a multiple of --nproc={args.nproc} (the global batch is split evenly "
                f"over the processes); expected e.g. --batch-size={max(batch - batch % args.nproc, args.nproc)}",
                file=sys.stderr,
            )
            return 2
        return _launch(list(sys.argv[1:] if argv is None else argv), args.nproc)
    run: Callable[[argparse.Namespace, tuple[Algorithm, ...]], int] = (
        _train if args.command in ("train", "profile") else _plan
    )
    try:
        return run(args, algorithms)
    except (ValueError, TypeError, OSError, FloatingPointError, ImportError) as error:
        print(f"composer-fn: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
