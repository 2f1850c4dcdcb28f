"""The Trainer's read-only attributes: each a view of the part that holds it, the built run (``Run``) or the option
records (``Options``); the Trainer keeps no copy of its own."""

from __future__ import annotations

import operator
from typing import Any

from composer_fn.trainer.build import Run
from composer_fn.trainer.options import Options

__all__ = ["RunAttributes"]


class _Read:
    """A read-only attribute that one of the Trainer's parts holds (``'run.max_steps'``)."""

    def __init__(self, path: str, doc: str) -> None:
        self._get = operator.attrgetter(path)
        self.__doc__ = doc

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        return self if trainer is None else self._get(trainer)


class RunAttributes:
    """The attributes a Trainer shows of its run and its options (the Trainer's base class)."""

    run: Run
    options: Options

    algorithms = _Read("run.algorithms", "The run's algorithms, in order (a checkpoint's recorded surgeries first).")
    passes = _Read("run.passes", "The passes that order the algorithms at each event.")
    world = _Read("run.world", "The run's processes (``distributed.World``).")
    evaluators = _Read("run.evaluators", "The run's evaluators.")
    train_dataloader = _Read("run.train_dataloader", "The training loader.")
    eval_dataloader = _Read("run.eval_dataloader", "The ``eval_dataloader`` argument.")
    steps_per_epoch = _Read("run.steps_per_epoch", "Batches an epoch (the training loader's length).")
    max_duration = _Read("run.max_duration", "The run's length as given (``Time``).")
    scale_schedule_ratio = _Read("run.scale_schedule_ratio", "Composer's scale-schedule ratio.")
    max_steps = _Read("run.max_steps", "The run's length in steps.")
    tx = _Read("run.tx", "The optimizer, with the learning-rate schedule folded in.")
    lr_multiplier = _Read("run.lr_multiplier", "The learning-rate multiplier by step.")
    loss_fn = _Read("run.losses.loss_fn", "The loss: the given one (checked to be one number) or the default.")
    per_sample_loss_fn = _Read("run.losses.per_sample_loss_fn", "The per-sample loss algorithms read.")
    eval_interval = _Read("run.eval_interval", "How often the run evaluates, or None.")
    save_folder = _Read("run.save_folder", "Where checkpoints go, or None.")
    input_key = _Read("options.layout.input_key", "Where a batch holds the model's input (``BatchLayout``).")
    target_key = _Read("options.layout.target_key", "Where a batch holds the targets (``BatchLayout``).")
    compile = _Read("options.execution.compile", "The ``torch.compile`` backend, or None.")
    grad_mode = _Read("options.execution.step_grad_mode", "``'autograd'`` or ``'func'``.")
    save_interval = _Read("options.checkpointing.interval", "How often the run checkpoints, or None.")
    log_interval = _Read("options.reporting.log_interval", "How often loggers receive a training record.")
    profiler = _Read("options.reporting.profiler", "The profiler, or None.")
    callbacks = _Read("options.reporting.callbacks", "The run's callbacks.")
    loggers = _Read("options.reporting.loggers", "The run's loggers.")

    @property
    def progress_bar(self) -> bool:
        """Returns whether this process shows a progress bar (rank 0 only)."""
        return bool(self.options.reporting.progress_bar) and self.run.world.main
