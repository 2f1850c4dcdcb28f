"""The Trainer: the imperative shell around the pure core.

It owns every side effect: the device, the data loaders, compilation, the clock, the progress bar, loggers,
callbacks and checkpoint files. Everything that decides what training does (which algorithm runs when, the
step itself, the learning rate) is a pure function it calls. ``fit`` is the side effects of each tick of the
run schedule (``composer_fn.core.schedule``).

Longer than most modules: it is one class, kept whole so that every side effect of a run reads in one place,
and a fifth of it documents the arguments.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import itertools
import math
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from tqdm import tqdm

from composer_fn.callbacks.base import Callback, RunView, bind_callbacks, logging_callbacks
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import REQUIREMENTS, Algorithm, algorithms_to_json
from composer_fn.core.engine import (
    Plan,
    check_surgery_conflicts,
    frozen_parameters,
    make_plan,
    run_host_event,
)
from composer_fn.core.event import TRAIN_STEP_EVENTS, Event
from composer_fn.core.passes import DEFAULT_PASSES, Pass
from composer_fn.core.schedule import Action, Progress, run_schedule
from composer_fn.core.state import (
    BatchMeta,
    LossFn,
    State,
    Static,
    batch_get,
    batch_input,
    batch_meta,
    batch_set,
    batch_target,
    initial_state,
    target_key_of,
)
from composer_fn.core.time import Time, Timestamp, TimeUnit, to_steps
from composer_fn.loggers.base import Logger
from composer_fn.optim.base import GradientTransformation
from composer_fn.optim.optimizers import sgdw
from composer_fn.profiler import ProfileSession, marked
from composer_fn.trainer import distributed
from composer_fn.trainer.checkpoint import (
    autoresume_path,
    checkpoint_name,
    load_checkpoint,
    load_weights,
    prune_checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
    with_recorded_surgeries,
)
from composer_fn.trainer.checks import (
    available_device,
    check_predict_input,
    first_line,
    input_expectation,
    logged_metrics,
)
from composer_fn.trainer.evaluation import evaluate, measure
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.learning_rate import learning_rate
from composer_fn.trainer.loss_scale import DynamicLossScale
from composer_fn.trainer.microbatch import failed_contribution, norm_statistics, split_batch
from composer_fn.trainer.model import evaluation_state, module_with
from composer_fn.trainer.options import (
    BatchLayout,
    Checkpointing,
    Execution,
    Reporting,
    Resume,
    epochs_or_batches,
    options_from,
)
from composer_fn.trainer.outputs import (
    causal_shift,
    default_loss,
    default_per_sample_loss,
    is_causal_lm,
    keyword_names,
    labelled_positions,
    logits_of,
    positions_per_sample,
    settle_loss_function,
)
from composer_fn.trainer.randomness import ModelDraws
from composer_fn.trainer.step import (
    GradMode,
    StepFn,
    check_class_targets,
    compile_step,
    make_eval_step,
    make_train_step,
    unused_parameters,
)

__all__ = ["Trainer"]

_BATCH_EVENTS = frozenset((Event.BATCH_START, *TRAIN_STEP_EVENTS, Event.BATCH_END))

_T = TypeVar("_T")

SUPPORTED_REQUIREMENTS: frozenset[str] = frozenset(
    {"per_sample_loss", "extra_forward", "loss_closure", "train_data"}
)
"""What this trainer can provide to algorithms (see ``Algorithm.requires``)."""


class Trainer:
    """Trains ``model`` with ``algorithms`` composed over a functional step.

    Args:
        model: any ``nn.Module``, called as ``model(batch[input_key])``, or with a mapping batch's items as
            keyword arguments (a Hugging Face ``transformers`` model, see ``input_key``); the trainer works on a
            copy and leaves it untouched. An output that holds a ``loss`` (a ``transformers`` ``ModelOutput``) is
            the default loss, and its ``logits`` are what evaluation and per-sample losses read.
        train_dataloader: an iterable of batches with ``__len__`` (tuples, lists or dicts of tensors). A loader
            with ``set_epoch(epoch)`` (``composer_fn.data.TensorLoader``, ``DistributedSampler``-backed loaders)
            is told each epoch; with ``iter_from(epoch, batch)`` a resumed run starts mid-epoch without
            replaying batches.
        eval_dataloader: batches to evaluate on at ``eval_interval`` and at the end, the evaluator labelled
            ``'eval'`` (metrics ``eval/eval/accuracy`` and ``eval/eval/loss``); or one or more ``Evaluator``s, each
            with its label, loader and metrics (torchmetrics), logged as ``eval/<label>/<metric>``.
        max_duration: how long to train: ``'10ep'``, ``'500ba'`` or an int number of epochs.
        optimizer: a gradient transformation (``composer_fn.optim.sgd(...)``); default ``sgdw(0.1)``.
        schedule: a learning-rate multiplier schedule (``composer_fn.optim.CosineAnnealingScheduler()``).
        scale_schedule_ratio: Composer's scale-schedule ratio ``r``: the run trains ``int(r * steps)`` steps of
            ``max_duration`` and the schedule's times in ba and ep stretch by the same ``r``.
        algorithms: algorithm records, each at most once.
        seed: the root of every random draw of the run.
        eval_interval: how often to evaluate (default ``'1ep'``); needs ``eval_dataloader``. Before the first step,
            each evaluator's first batch goes through the model and its metrics once (nothing of the run changes),
            so that outputs its metrics cannot take, or labels the model has no class for, are refused up front.
        passes: the pure passes that order the algorithms at each event
            (``composer_fn.core.passes.DEFAULT_PASSES``: Composer's order).
        execution: where and how the step runs: device, precision, compile, gradient mode, microbatch size,
            process-group timeout (``Execution``).
        layout: where batches hold the model's input and the targets, and the losses (``BatchLayout``).
        checkpointing: where and how often checkpoints are written (``Checkpointing``).
        resume: the checkpoint the run starts from, whole or its weights only (``Resume``).
        reporting: callbacks, loggers, the log interval, the progress bar and the profiler (``Reporting``).
        composer_arguments: Composer's flat names for the records' fields, each mapped by
            ``composer_fn.trainer.options.COMPOSER_NAMES``: ``device``, ``precision``, ``compile``, ``grad_mode``,
            ``device_train_microbatch_size`` and ``dist_timeout`` (``Execution``); ``input_key``, ``target_key``,
            ``loss_fn`` and ``per_sample_loss_fn`` (``BatchLayout``); ``save_folder``, ``save_interval``,
            ``save_num_checkpoints_to_keep``, ``save_weights_only`` and ``save_metadata`` (``Checkpointing``);
            ``load_path``, ``autoresume``, ``load_weights_only``, ``load_strict_model_weights`` and
            ``load_ignore_keys`` (``Resume``); ``callbacks``, ``loggers``, ``log_interval``, ``progress_bar`` and
            ``profiler`` (``Reporting``). A record and a flat name for the same record are refused together.

    Under ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) or in an initialised process group, each
    process trains on its share of every global batch and the gradients are summed across processes once a
    step; data-side algorithms draw per microbatch from keys of the step and the microbatch's place in the
    global batch, so N processes with batch B compute what one process computes with batch N*B and
    ``device_train_microbatch_size=B``. Rank 0 writes checkpoints; every rank reads them.
    """

    def __init__(
        self,
        model: nn.Module,
        train_dataloader: Iterable[Any],
        eval_dataloader: Iterable[Any] | Evaluator | Sequence[Evaluator] | None = None,
        *,
        max_duration: str | int | Time,
        optimizer: GradientTransformation | None = None,
        schedule: Any = None,
        scale_schedule_ratio: float = 1.0,
        algorithms: Sequence[Algorithm] = (),
        seed: int = 0,
        eval_interval: str | int | Time | None = None,
        passes: Sequence[Pass] = DEFAULT_PASSES,
        execution: Execution | None = None,
        layout: BatchLayout | None = None,
        checkpointing: Checkpointing | None = None,
        resume: Resume | None = None,
        reporting: Reporting | None = None,
        **composer_arguments: Any,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
        records = {"execution": execution, "layout": layout, "checkpointing": checkpointing, "resume": resume}
        self.options = options = options_from({**records, "reporting": reporting}, composer_arguments)
        """The run's option records, flat arguments included (``Execution``, ``BatchLayout``, ...)."""
        execution, layout, saving, resuming = options.execution, options.layout, options.checkpointing, options.resume
        precision = execution.precision
        if not hasattr(train_dataloader, "__len__"):
            raise TypeError("train_dataloader must have a length (batches per epoch) to schedule epochs")
        evaluators = _evaluators(eval_dataloader)
        loaders = [("train_dataloader", train_dataloader)] + [
            (f"eval_dataloader ({e.label})" if e.dataloader is not eval_dataloader else "eval_dataloader", e.dataloader) for e in evaluators
        ]
        for argument, loader in loaders:
            if isinstance(loader, tuple | list) and loader and all(isinstance(item, Tensor) for item in loader):
                raise TypeError(
                    f"{argument} is a {type(loader).__name__} of {len(loader)} tensors, so each tensor would be a batch; "
                    "expected batches holding inputs and targets (tuples, lists or mappings): "
                    "composer_fn.data.TensorLoader((inputs, targets), batch_size), or [(inputs, targets)] for one batch"
                )
            if isinstance(loader, Iterator):
                raise TypeError(
                    f"{argument} is a one-shot iterator ({type(loader).__name__}), empty after its first pass; pass "
                    "something iterable again each epoch: a DataLoader, a TensorLoader, a list of batches"
                )
        for argument, loader in loaders[1:]:
            if hasattr(loader, "__len__") and len(loader) == 0:
                raise ValueError(f"{argument} is empty: an evaluation needs at least one batch")
        if not any(True for _ in model.parameters()):
            raise ValueError(f"model={type(model).__name__} has no parameters to train")
        self.algorithms = _algorithms(algorithms)
        target_device = _device(execution.device if execution.device is not None else distributed.local_device(None))
        native = {"bf16-mixed": "_is_mkldnn_bf16_supported", "fp16-mixed": "_is_mkldnn_fp16_supported"}.get(precision)
        if native is not None and target_device.type == "cpu" and not getattr(torch.ops.mkldnn, native)():
            warnings.warn(
                f"precision={precision!r} on this CPU, which lacks instructions for its 16-bit format, runs several "
                "times slower than 'fp32' (autocast emulates it); use precision='fp32' on this machine",
                stacklevel=2,
            )
        self.world = distributed.setup(target_device, execution.dist_timeout)
        distributed.check_loader(train_dataloader, "train_dataloader", self.world)
        for argument, loader in loaders[1:]:
            distributed.check_loader(loader, argument, self.world, evaluation=True)
        self._auto_microbatch = execution.microbatch_size == "auto"
        given_size = execution.microbatch_size
        self.device_train_microbatch_size: int | None = given_size if isinstance(given_size, int) else None
        self._checkpoints, self._resume_options = saving, resuming
        save_folder = Path(saving.folder) if saving.folder is not None else None
        given_path = resuming.path
        load_path: str | Path | None = given_path if given_path is None or isinstance(given_path, str) else Path(given_path)
        autoresume = resuming.autoresume
        given_load_path = load_path
        if autoresume:
            # Rank 0 decides, so that every rank resumes from the same checkpoint.
            load_path = self.world.broadcast(autoresume_path(save_folder, load_path) if self.world.main else None)
        # A run resumed from its own save folder loads all of it: load_weights_only is for the run's first start
        # from load_path (as Composer's autoresume).
        self._resuming = load_path is not None and load_path is not given_load_path
        self._load_argument = "save_folder's newest checkpoint" if self._resuming else "load_path"
        if load_path is not None:
            self.algorithms = with_recorded_surgeries(self.algorithms, load_path, argument=self._load_argument)
        for algorithm in self.algorithms:
            missing = algorithm.requires - SUPPORTED_REQUIREMENTS
            if missing:
                raise ValueError(
                    f"algorithm {algorithm.name!r} requires {sorted(missing)} from the trainer, which provides "
                    f"{sorted(SUPPORTED_REQUIREMENTS) or 'none'} of {sorted(REQUIREMENTS)}"
                )
        self.passes = _passes(passes)
        self.train_dataloader = train_dataloader
        self.evaluators = evaluators
        self.eval_dataloader = eval_dataloader
        self.steps_per_epoch = len(train_dataloader)  # type: ignore[arg-type]
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"train_dataloader has length {self.steps_per_epoch}: it yields no batch (drop_last=True with a "
                "batch_size larger than the dataset does); expected at least one batch an epoch"
            )
        self.max_duration = duration = epochs_or_batches(max_duration, "max_duration", "10ep")
        self.scale_schedule_ratio = validate.real(
            "scale_schedule_ratio", scale_schedule_ratio, minimum=0.0, open_below=True
        )
        # Composer multiplies max_duration by the ratio; counting in steps keeps a fractional epoch's batches.
        self.max_steps = int(
            to_steps(duration, steps_per_epoch=self.steps_per_epoch, max_steps=0) * self.scale_schedule_ratio
        )
        if self.max_steps < 1:
            raise ValueError(
                f"max_duration={max_duration!r} scaled by scale_schedule_ratio={scale_schedule_ratio!r} leaves "
                f"{self.max_steps} steps (steps_per_epoch={self.steps_per_epoch}); expected at least one"
            )
        self.input_key, self.target_key = layout.input_key, layout.target_key
        self._causal = is_causal_lm(model)
        loss_fn, per_sample_loss_fn = layout.loss_fn, layout.per_sample_loss_fn
        self._default_loss = loss_fn is None
        self.loss_fn = _scalar_loss(loss_fn) if loss_fn is not None else default_loss(self.target_key)
        if per_sample_loss_fn is None and loss_fn is None:
            per_sample_loss_fn = default_per_sample_loss(self.target_key, self._causal)
        self.per_sample_loss_fn = per_sample_loss_fn
        # The default loss averages over labelled positions (a language model's tokens): microbatches and
        # processes weigh their pieces by them (the unit, positions per sample, is fixed at the first batch).
        self._loss_units = (
            functools.partial(labelled_positions, target_key=self.target_key, causal=self._causal)
            if self._default_loss
            else None
        )
        self._units_scale: float | None = None
        self.compile: str | None = execution.compile  # type: ignore[assignment]
        self.grad_mode: GradMode = execution.step_grad_mode
        self.save_folder = save_folder
        self.save_metadata = dict(saving.metadata or {})
        if self.save_folder is not None and self.save_folder.exists() and not self.save_folder.is_dir():
            raise ValueError(f"save_folder={str(save_folder)!r} is a file; expected a folder (created if missing)")
        if self.save_folder is not None:
            try:
                self.save_folder.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise ValueError(
                    f"save_folder={str(save_folder)!r} cannot be created ({error.strerror or error}); expected a "
                    "folder that can be written"
                ) from None
            if self.world.main:
                remove_stale_temporaries(self.save_folder)
        if eval_interval is not None and not evaluators:
            shown = repr(str(eval_interval)) if isinstance(eval_interval, Time) else repr(eval_interval)
            raise ValueError(
                f"eval_interval={shown} needs eval_dataloader, which was not given: pass eval_dataloader or drop eval_interval"
            )
        self.save_interval: Time | None = saving.interval  # type: ignore[assignment]
        self.eval_interval = (
            epochs_or_batches("1ep" if eval_interval is None else eval_interval, "eval_interval", "1ep") if evaluators else None
        )
        self._every = {e.label: _every(e, self.eval_interval) for e in evaluators}
        reporting_options = options.reporting
        self.log_interval: Time = reporting_options.log_interval  # type: ignore[assignment]
        self.progress_bar = reporting_options.progress_bar and self.world.main
        self.profiler = reporting_options.profiler
        self._profile: ProfileSession | None = None
        self.profile_traces: list[Path] = []
        self.callbacks: tuple[Callback, ...] = tuple(reporting_options.callbacks)
        self.loggers: tuple[Logger, ...] = tuple(reporting_options.loggers)
        self._handlers = bind_callbacks(self.callbacks)
        self._log_handlers = logging_callbacks(self.callbacks)
        self._step_norms = any(c.step_norms for c in self.callbacks)
        self._norms: dict[str, Tensor] = {}
        self.compiles = 0
        self.metrics: dict[str, float] = {}
        self._steps: dict[Any, StepFn] = {}
        self._eval_steps: dict[Any, Callable[[State, Any], Tensor]] = {}
        self._input_ranges = tuple(
            (a.name, r) for a in self.algorithms if (r := a.capabilities().input_range) is not None
        )
        self._checks_at = {a.name: a.checks_at for a in self.algorithms}
        self._freezing = any(a.capabilities().freezes is not None for a in self.algorithms)
        self._stoppers = tuple((a.name, rule) for a in self.algorithms if (rule := a.capabilities().stops) is not None)
        self._measured: list[str] = []
        _check_watched(self.algorithms, self.evaluators)
        logged = logged_metrics(
            self.evaluators,
            [c for c in self.callbacks if type(c).log_metrics is not Callback.log_metrics],
            self._default_loss,
        )
        for algorithm in self.algorithms:
            capabilities = algorithm.capabilities()
            if capabilities.checks_logged is not None and capabilities.watches in logged:
                capabilities.checks_logged(logged[capabilities.watches])
            if capabilities.checks_length is not None:
                capabilities.checks_length(self.max_steps, self.steps_per_epoch)
        self._observed = frozenset(self._handlers) | {e for a in self.algorithms for e in a.host_hooks()}
        self._bar: Any = None
        self._window: tuple[float, int] = (0.0, 0)
        self._unchecked = False
        self._evaluators_checked = False
        self._trained_input: tuple[tuple[int, ...], torch.dtype] | None = None
        self._loss: Tensor | None = None
        self._last_plan: tuple[Timestamp | None, BatchMeta | None, Plan | None] = (None, None, None)
        self._last_step: tuple[Any, ...] = (None, None, None, None)
        self._logged_order: Any = None
        self._switches = _Switches()
        self._queued: list[dict[str, Any]] = []
        self._handed = time.perf_counter()
        self._fit_start = time.perf_counter()
        self._batches: Iterator[Any] | None = None
        self._batch: Any = None
        self._draws_told = False
        self._meta = BatchMeta(0)
        given = getattr(train_dataloader, "batch_size", None)
        self._rank_batch = given if isinstance(given, int) and given > 0 else None

        if optimizer is None:
            warnings.warn("no optimizer given: using sgdw(learning_rate=0.1)", stacklevel=2)
            optimizer = sgdw(0.1)
        _check_optimizer(optimizer)
        if schedule is not None and not callable(getattr(schedule, "resolve", None)):
            raise TypeError(
                f"schedule={schedule!r}: expected a schedule such as composer_fn.optim.CosineAnnealingScheduler() "
                "(the optimizer's learning rate is set in the optimizer)"
            )
        self.tx, self.lr_multiplier = learning_rate(
            optimizer,
            schedule,
            self.algorithms,
            steps_per_epoch=self.steps_per_epoch,
            max_steps=self.max_steps,
            scale_schedule_ratio=self.scale_schedule_ratio,
        )

        check_surgery_conflicts(self.algorithms, model)
        # Hugging Face models resolve their loss function once, here, so that no forward of the run logs doing it.
        structure = settle_loss_function(copy.deepcopy(model)).to(target_device).train()
        wants_data = any("train_data" in a.requires for a in self.algorithms)
        self.static = Static(
            module=structure,
            precision=precision,
            device=target_device,
            seed=int(seed) if validate.is_integer(seed) else seed,
            train_inputs=self._train_inputs if wants_data else None,
        )
        state = initial_state(structure, R.key(seed, device=target_device))
        self._draws = ModelDraws(self.static.seed, target_device)
        self.timestamp = Timestamp().with_max_duration(Time(self.max_steps, TimeUnit.BATCH))
        plan = self._plan(self.timestamp)
        for diagnostic in plan.diagnostics:
            warnings.warn(diagnostic, stacklevel=2)
        self.no_effect: tuple[str, ...] = ()
        """The names of the algorithms that warned they change nothing in this run (a surgery that finds nothing
        to rewrite, a method whose settings make it a no-op): summaries leave them out or mark them."""
        messages = _construction_warnings(self.algorithms)
        with _passed_on(messages) if self.algorithms else contextlib.nullcontext():
            self.static, state = run_host_event(Event.INIT, plan, self.static, state, self.timestamp)
        self.no_effect = _no_effect(self.algorithms, messages)
        state = state.replace(
            opt=self.tx.init(state.params),
            algos={a.name: a.init(self.static, state) for a in self.algorithms},
        )
        if precision == "fp16-mixed":
            state = state.replace(hparams={**state.hparams, **DynamicLossScale().init(self.static.device)})
        self.state = state
        self._notify(Event.INIT)
        if load_path is not None:
            self._load(load_path)

    def _plan(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Plan:
        # Several ticks in a row share a timestamp: plan once for them.
        last_timestamp, last_meta, plan = self._last_plan
        if timestamp is not last_timestamp or meta is not last_meta or plan is None:
            plan = make_plan(self.algorithms, self.passes, timestamp, meta=meta)
            if self.profiler is not None:
                plan = marked(plan)
            self._last_plan = (timestamp, meta, plan)
        return plan

    def _train_step(self, plan: Plan, frozen: frozenset[str] = frozenset()) -> StepFn:
        microbatch = self.device_train_microbatch_size
        cache_key = (self.static, plan.step_key, frozen, microbatch)
        step = self._steps.get(cache_key)
        if step is None:
            # Several processes, or microbatches asked for: the step cuts its batch (into one microbatch when no
            # size was given) and draws from the microbatches' places in the global batch; ranks before this one
            # hold B samples each, B being a process's batch.
            microbatched = microbatch is not None or self.world.size > 1 or self._auto_microbatch
            rank_batch = max(self._rank_batch or 1, 1)
            size = microbatch or rank_batch
            step = make_train_step(
                self.static,
                plan,
                self.loss_fn,
                self.tx,
                input_key=self.input_key,
                grad_mode=self.grad_mode,
                per_sample_loss_fn=self.per_sample_loss_fn,
                # The trainer owns its state: an eager step may update its tensors in place, unless a step that
                # runs out of memory is to be retried from the state before it.
                donate=not self.compile and not self._auto_microbatch,
                frozen=frozen | self._unused(plan, frozen, size),
                microbatch_size=size if microbatched else None,
                first_sample=self.world.rank * rank_batch,
                reduce=distributed.all_reduce_sum if self.world.size > 1 else None,
                overlap=distributed.Summation if self.world.size > 1 else None,
                guard_failures=self._auto_microbatch and self.world.size > 1,
                norms=self._step_norms,
                loss_units=self._loss_units,
                units_scale=self._units_scale or 1.0,
                # A compiled graph draws its seeds once, at its start.
                reseed=None if self.compile else self._draws.reseed,
            )
            if self.compile:
                step = compile_step(step, self._counting_backend())
            self._steps[cache_key] = step
        return step

    def _unused(self, plan: Plan, frozen: frozenset[str], size: int) -> frozenset[str]:
        # A func-mode step (the compiled one) cannot tell a parameter its loss does not reach from one with a zero
        # gradient; an autograd step on this batch's first microbatch names them, with the model's draws put back.
        if self.grad_mode != "func" or self._batch is None:
            return frozenset()
        part = split_batch(self._batch, self.input_key, size)[:1]
        if not part:
            return frozenset()
        with self._draws.around(self.timestamp.batch, self._first_sample()):
            return unused_parameters(
                self.static,
                plan,
                self.loss_fn,
                self.state,
                part[0][1],
                input_key=self.input_key,
                per_sample_loss_fn=self.per_sample_loss_fn,
                frozen=frozen,
            )

    def _eval_step(self, plan: Plan, predict: bool = False) -> Callable[[State, Any], Tensor]:
        cache_key = (self.static, plan.step_key, predict)
        step = self._eval_steps.get(cache_key)
        if step is None:
            step = make_eval_step(self.static, plan, input_key=self.input_key, predict=predict)
            if self.compile:
                step = compile_step(step, self._counting_backend())
            self._eval_steps[cache_key] = step
        return step

    def _check_input_range(self, batch: Any) -> None:
        # Once, on the first batch: an augmentation written for pixels in [0, 1] would silently mangle
        # standardised inputs (a traced step cannot read values to check them).
        input = batch_input(batch, self.input_key)
        if not self._input_ranges or not isinstance(input, Tensor) or not input.is_floating_point() or not input.numel():
            return
        low, high = float(input.min()), float(input.max())
        for name, (lowest, highest) in self._input_ranges:
            if low < lowest or high > highest:
                raise ValueError(
                    f"{name} takes floating-point inputs in [{lowest}, {highest}], but the first batch's "
                    f"inputs span [{low:.4g}, {high:.4g}]: give it pixels before normalisation (or uint8 images) "
                    "and normalise after it, e.g. in the model"
                )

    def _check_targets(self, batch: Any) -> None:
        # Once, on the first batch, with the default loss: a class index the model has no output for fails deep
        # inside cross-entropy (on a GPU, as a device-side assertion). One sample's evaluation forward, by the
        # evaluation step without hooks and uncompiled, gives the class count. Where the model computes its own
        # loss, the targets it checks are the labels it is given.
        if not self._default_loss:
            return
        where = "train_dataloader's first batch"
        accepted = keyword_names(self.static.module)
        # The model computes its own loss from the labels it is given: the labels are checked against its logits.
        own_loss = self._keywords(batch) and "labels" in batch and (accepted is None or "labels" in accepted)
        unlabelled = None
        if self._keywords(batch):
            # As the step calls it: with the labels (a sequence-to-sequence model builds its decoder's inputs from
            # them); where that fails (a label the model's own loss cannot take), without them, for the check below.
            first = pytree.tree_map(_first_sample, dict(batch))
            unlabelled = {k: v for k, v in first.items() if k != "labels"}
        else:
            key = self.input_key if self.input_key is not None else 0
            _item(batch, self.target_key, "target_key", where)
            first = batch_set(batch, key, pytree.tree_map(_first_sample, batch_get(batch, key)))
        step = make_eval_step(self.static, make_plan((), timestamp=self.timestamp), input_key=self.input_key)
        module = self.static.module
        training = module.training
        try:
            module.eval()
            try:
                outputs = self._forward(step, first, where)
            except ValueError:
                if unlabelled is None or not own_loss:
                    raise
                outputs = self._forward(step, unlabelled, where)
        finally:
            module.train(training)
        if own_loss:
            target, key = batch["labels"], "labels"
        else:
            target = _item(batch, self.target_key, "target_key", where, outputs)
            key = self._target_name(batch)
        logits = logits_of(outputs)
        if isinstance(target, Tensor) and not target.is_floating_point() and isinstance(logits, Tensor):
            logits, target = causal_shift(logits, target, self._causal)
            check_class_targets(logits, target, key, where)

    def _target_name(self, batch: Any) -> int | str:
        # Where ``batch`` holds its targets (target_key, or the default item for this kind of batch).
        if self.target_key is not None:
            return self.target_key
        return "labels" if isinstance(batch, Mapping) else 1

    def _keywords(self, batch: Any) -> bool:
        # Whether the model takes ``batch`` as keyword arguments.
        return self.input_key is None and isinstance(batch, Mapping)

    def _check_keywords(self, batch: Any, where: str) -> None:
        # A mapping batch given as keyword arguments must give the model's forward an input (labels alone are none).
        if not self._keywords(batch):
            return
        accepted = keyword_names(self.static.module)
        if accepted is None or (accepted & set(batch)) - {"labels"}:
            return
        some = next((k for k in batch if isinstance(batch[k], Tensor)), None)
        raise ValueError(
            f"input_key=None: {where} is a mapping with keys {list(batch)}, given to the model as "
            f"keyword arguments, but {type(self.static.module).__name__}.forward takes no input among them (it takes "
            f"{sorted(accepted)}): rename the batch's keys, or pass input_key"
            + (f"={some!r}" if some is not None else "")
            + " to call the model with one item"
        )

    def _forward(self, step: Callable[[State, Any], Any], batch: Any, where: str) -> Any:
        # The model's outputs on a batch taken to check the run's set-up; a model that cannot take it is refused
        # naming the batch, its shape and what the model takes.
        try:
            return step(self.state, batch)
        except (RuntimeError, ValueError, TypeError, IndexError) as error:
            if distributed.is_out_of_memory(error):
                raise
            inputs = batch_input(batch, self.input_key)
            shape = f"inputs of {_described(inputs)}"
            expected = input_expectation(self.static.module, self._trained_input)
            raise ValueError(
                f"the model fails on {where} ({shape}): {first_line(error)}" + (f"; {expected}" if expected else "")
            ) from error

    def _check_evaluators(self) -> None:
        # Once, before the first step or evaluation: each evaluator's first batch goes through the model (eval
        # mode, no gradient, the evaluation step without hooks) and through clones of its metrics, or through the
        # default accuracy and loss, so that outputs a metric cannot take or labels the model has no class for are
        # refused before training, not at its first evaluation. Nothing of the run changes: the metrics measured
        # are clones, and torch's random state is put back after the loader's first batch is drawn.
        if self._evaluators_checked or not self.evaluators:
            return
        step = make_eval_step(self.static, make_plan((), timestamp=self.timestamp), input_key=self.input_key)
        module = self.static.module
        training = module.training
        try:
            module.eval()
            for evaluator in self.evaluators:
                self._check_evaluator(evaluator, step)
        finally:
            module.train(training)
        self._evaluators_checked = True

    def _check_evaluator(self, evaluator: Evaluator, step: Callable[[State, Any], Any]) -> None:
        argument = "eval_dataloader" if evaluator.dataloader is self.eval_dataloader else f"Evaluator({evaluator.label!r})"
        with torch.random.fork_rng(devices=[]):
            raw = next(iter(evaluator.dataloader), None)
        if raw is None:
            raise ValueError(f"{argument} yields no batch: an evaluation needs at least one")
        if not isinstance(raw, tuple | list | Mapping):
            raise TypeError(
                f"{argument} yields {type(raw).__name__} batches; expected tuples or lists (inputs, targets) or "
                "mappings, read at input_key and target_key"
            )
        batch = self._to_device(raw)
        where = f"{argument}'s first batch"
        self._check_keywords(batch, where)
        inputs = _item(batch, self.input_key, "input_key", where)
        target = _item(batch, self.target_key, "target_key", where)
        if not isinstance(target, Tensor):
            raise TypeError(f"{where} has targets (batch[{self.target_key!r}]) of type {type(target).__name__}: expected a tensor")
        if isinstance(inputs, Tensor) and inputs.dim() and not inputs.shape[0]:
            return  # a process's empty share of a short batch
        outputs = self._forward(step, batch, where)
        logits, shifted = causal_shift(logits_of(outputs), target, self._causal)
        measured = f"the model's outputs of {_described(logits)} against targets of {_described(shifted)}"
        if evaluator.metrics is None:
            if self._default_loss and isinstance(logits, Tensor):
                check_class_targets(logits, shifted, self._target_name(batch), where)
            try:
                evaluate(
                    lambda state, batch: outputs,
                    self.state,
                    [batch],
                    loss_fn=self.loss_fn,
                    target_key=self.target_key,
                    input_key=self.input_key,
                    device=self.static.device,
                    on_event=lambda event: None,
                    causal=self._causal,
                )
            except (RuntimeError, ValueError, TypeError, IndexError, AttributeError) as error:
                raise ValueError(
                    f"{argument}: the default evaluation (classification accuracy and loss_fn) fails on {measured}: "
                    f"{first_line(error)}; pass an Evaluator with metrics that fit the model's outputs (e.g. "
                    "torchmetrics.MeanSquaredError() for a regression)"
                ) from error
            return
        for name, metric in evaluator.metrics.items():
            probe = metric.clone()
            if hasattr(probe, "sync_on_compute"):
                probe.sync_on_compute = False  # the probe is this process's alone
            try:
                probe.to(logits.device).update(logits, shifted)
                value = probe.compute()
            except Exception as error:  # noqa: BLE001 -- torchmetrics refuses unfit inputs with any kind of error
                raise ValueError(
                    f"Evaluator({evaluator.label!r}): metrics[{name!r}] ({type(metric).__name__}) cannot measure "
                    f"{measured}: {first_line(error)}"
                ) from error
            if not isinstance(value, Tensor) or value.numel() != 1:
                raise ValueError(
                    f"Evaluator({evaluator.label!r}): metrics[{name!r}] ({type(metric).__name__}) computes "
                    f"{_described(value)}: expected one number (a per-class metric needs average='macro' or 'micro')"
                )

    def _counting_backend(self) -> Callable[..., Any]:
        from torch._dynamo import lookup_backend

        assert self.compile is not None
        inner = lookup_backend(self.compile)

        def backend(graph: Any, example_inputs: Any) -> Any:
            self.compiles += 1
            return inner(graph, example_inputs)

        return backend

    def _notify(self, event: Event) -> None:
        handlers = self._handlers.get(event)
        if handlers:
            view = self._view(event)
            for handler in handlers:
                handler(view)

    def _view(self, event: Event) -> RunView:
        metrics = dict(self.metrics)
        return RunView(event, self.static, self.state, self.timestamp, self.max_steps, metrics, self.tx.learning_rate)

    def _host_event(self, event: Event, meta: BatchMeta | None = None) -> None:
        # Most events of most runs have neither a host hook nor a callback: nothing to plan or call.
        if event in self._observed:
            with torch.profiler.record_function(f"event/{event.name}") if self._profile else contextlib.nullcontext():
                plan = self._plan(self.timestamp, meta)
                if event in plan.host:
                    self.static, self.state = run_host_event(event, plan, self.static, self.state, self.timestamp, meta)
                self._notify(event)

    def _log(self, record: dict[str, Any]) -> None:
        # Training records wait and reach the loggers together, once a second at most, and before any other
        # record: a logger that takes many records in a row runs warm, at a fraction of their cost one by one.
        self._queued.append(record)
        if record["kind"] != "train" or time.perf_counter() - self._handed >= 1.0:
            self._hand_over()

    def _hand_over(self) -> None:
        records, self._queued, self._handed = self._queued, [], time.perf_counter()
        for logger in self.loggers:
            for record in records:
                logger.log(record)

    def _to_device(self, batch: Any) -> Any:
        if self.static.device.type == "cpu":
            return batch
        device = self.static.device
        return pytree.tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, Tensor) else t, batch)

    def _train_inputs(self) -> Iterator[Any]:
        # A separate pass over the loader as it stands (this epoch's order), for algorithms that require it.
        for batch in self.train_dataloader:
            yield batch_input(self._to_device(batch), self.input_key)

    def fit(self) -> dict[str, float]:
        """Returns the final metrics after training to ``max_duration`` (resuming where a checkpoint left off).

        The run is the side effects of each tick of ``run_schedule``: host hooks and callbacks at events, and
        the trainer's own actions (the step, logging, evaluation, checkpoints) where the schedule puts them.
        """
        self.static.module.train()
        self._check_evaluators()
        for logger in self.loggers:
            logger.fit_start(self.timestamp.batch)  # 0: a fresh run; a resumed one starts at its checkpoint's batch
        self._log({"kind": "hparams", **hparams_of(self)})
        if self.loggers and self.algorithms:
            self._log({"kind": "schedule", "table": self._schedule()})
        actions: dict[Event | Action, Callable[[], Progress | Action | None]] = {
            Event.BEFORE_DATALOADER: self._next_batch,
            Event.BATCH_START: lambda: self._host_event(Event.BATCH_START, self._meta),
            Action.STEP: self._step,
            Action.LOG: self._log_train,
            Event.EPOCH_END: self._end_epoch,
            Action.EVALUATE: self._evaluate_in_run,
            Action.SAVE: self._save,
        }
        ticks = run_schedule(
            self.max_steps,
            self.steps_per_epoch,
            start=self.timestamp,
            eval_interval=self.eval_interval,
            save_interval=self.save_interval,
            log_interval=self.log_interval,
            final_eval=bool(self.evaluators),
            final_save=self.save_folder is not None,
        )
        self._bar = tqdm(
            total=self.max_steps,
            initial=self.timestamp.batch,
            disable=not self.progress_bar,
            unit="ba",
            dynamic_ncols=True,
            file=sys.stderr,
            leave=True,
        )
        start = self._fit_start = time.perf_counter()
        self._window = (start, 0)
        self._unchecked = True
        reply: Progress | Action | None = None
        if self.profiler is not None:
            self._profile = ProfileSession(self.profiler, self.world.rank)
            self._profile.start(self.max_steps - self.timestamp.batch)
        # Warnings up to the end of the first step (host hooks that look at the first batch) say which algorithms
        # change nothing in this run.
        first_step, noted = contextlib.ExitStack(), list[str]()
        if self.algorithms:
            first_step.enter_context(_passed_on(noted))
        try:
            while True:
                what, self.timestamp = ticks.send(reply)
                action = actions.get(what)
                if action is not None:
                    reply = action()
                    if what is Action.STEP:
                        first_step.close()
                else:
                    # Every Action has an entry above: what is left are events.
                    reply = None
                    if what in self._observed:
                        self._host_event(what)  # type: ignore[arg-type]
        except StopIteration:
            pass
        finally:
            first_step.close()
            self.no_effect = tuple(dict.fromkeys((*self.no_effect, *_no_effect(self.algorithms, noted))))
            self._bar.close()
            self._hand_over()  # what was logged before an error too
            self._batches = self._batch = None
            if self._profile is not None:
                self._profile.stop()
                self.profile_traces = list(self._profile.traces)
                self._profile = None
        self.metrics["wall_time"] = time.perf_counter() - start
        # An algorithm that stopped acting in the last steps switched off for this run.
        for at, switch, names in self._switches.due(self.timestamp.batch + _Switches.GAP):
            self._log({"kind": "plan", "step": at, switch: names})
        self._log({"kind": "fit", "step": self.timestamp.batch, "wall_time": self.metrics["wall_time"]})
        for callback in self.callbacks:
            callback.close()
        for logger in self.loggers:
            logger.close()
        return dict(self.metrics)

    def _schedule(self) -> str:
        # The plan of the run's start as `composer-fn plan` prints it, logged once; after SCHEDULE_STEPS, plan
        # records say as the run goes where algorithms switch on and off.
        from composer_fn.dry_run import dry_run

        steps = min(self.max_steps, SCHEDULE_STEPS)
        table = dry_run(self.algorithms, Time(steps, TimeUnit.BATCH), self.steps_per_epoch, passes=self.passes).format()
        if steps < self.max_steps:
            table += f"\n(the first {steps} of {self.max_steps} steps)"
        return table

    def _next_batch(self) -> None:
        # BEFORE_DATALOADER, then the loader: a loader that runs out early ends the epoch early.
        self._host_event(Event.BEFORE_DATALOADER)
        if self._batches is None:
            self._batches = self._epoch_batches()
        raw = next(self._batches, None)
        if raw is None:
            given = self.timestamp.batch_in_epoch
            raise ValueError(
                f"train_dataloader yielded {f'only {given} batches' if given else 'no batch'} in epoch "
                f"{self.timestamp.epoch} although its length is {self.steps_per_epoch}: its __len__ must count the "
                "batches it yields in an epoch (the run's length in epochs is counted with it)"
            )
        if not isinstance(raw, tuple | list | Mapping):
            raise TypeError(
                f"train_dataloader yields {type(raw).__name__} batches; expected tuples or lists (inputs, targets) "
                "or mappings, read at input_key and target_key"
            )
        if self._unchecked:
            self._check_keywords(raw, "train_dataloader's first batch")
            _item(raw, self.input_key, "input_key", "train_dataloader's first batch")
            _check_algorithm_keys(self.algorithms, raw)
        meta = batch_meta(raw, self.input_key)
        self._meta = self._global_meta(meta) if self.world.size > 1 else meta
        self._batch = self._to_device(raw)
        if self._unchecked:
            # A loader without a batch_size: its first batch's size is a process's batch (for microbatch places).
            self._rank_batch = self._rank_batch or meta.batch_size
            self._check_input_range(self._batch)
            self._check_targets(self._batch)
            if self._loss_units is not None and self._units_scale is None:
                # A power of two, so that runs whose first batches differ (a resumed run) weigh alike, exactly.
                per_sample = positions_per_sample(raw, self.target_key, self._causal)
                self._units_scale = float(self.world.broadcast(2.0 ** round(math.log2(per_sample))))
            given = batch_input(raw, self.input_key)
            if isinstance(given, Tensor):
                self._trained_input = (tuple(given.shape), given.dtype)
            self._unchecked = False
        return None

    def _global_meta(self, meta: BatchMeta) -> BatchMeta:
        # Under several processes, host hooks and the run's clock see the global batch, as one process would.
        counted = getattr(self.train_dataloader, "global_samples", None)
        total = counted(self.timestamp.batch_in_epoch) if counted else meta.batch_size * self.world.size
        tokens = meta.tokens * total // meta.batch_size if meta.batch_size else 0
        return BatchMeta(total, (total, *meta.input_shape[1:]) if meta.input_shape else (), tokens)

    def _epoch_batches(self) -> Iterator[Any]:
        loader: Any = self.train_dataloader
        epoch, start = self.timestamp.epoch, self.timestamp.batch_in_epoch
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        if start and hasattr(loader, "iter_from"):
            return iter(loader.iter_from(epoch, start))
        return itertools.islice(iter(loader), start, None)

    def _step(self) -> Progress:
        plan = self._plan(self.timestamp, self._meta)
        frozen = (
            frozen_parameters(self.algorithms, self.timestamp, self.static.module) if self._freezing else frozenset()
        )
        last_plan, last_static, last_frozen, step = self._last_step
        if plan is not last_plan or self.static is not last_static or frozen != last_frozen:
            step = self._train_step(plan, frozen)
            self._last_step = (plan, self.static, frozen, step)
            if self.loggers and plan.order != self._logged_order:
                self._logged_order = plan.order
                acting = {
                    name
                    for event, names in plan.order
                    if event in _BATCH_EVENTS
                    for name in names
                    if event not in self._checks_at[name]
                }
                self._switches.seen(acting, self.timestamp.batch)
        if self.loggers and (self._switches.pending or self._switches.absent):
            for at, switch, names in self._switches.due(self.timestamp.batch):
                self._log({"kind": "plan", "step": at, switch: names})
        began = time.perf_counter()
        if self._auto_microbatch:
            step = self._fitting_step(step, plan, frozen)
        else:
            try:
                with self._draws.around(self.timestamp.batch, self._first_sample()):
                    self.state, outputs = step(self.state, self._batch)
            except RuntimeError as error:
                raise distributed.explained(error, self.world, self.timestamp.batch) from error
            self._loss = outputs["loss"]
            if self._step_norms:
                self._norms = {name: value for name, value in outputs.items() if name.startswith("l2_norm/")}
        self._batch = None
        if self._draws.drew and not self._draws_told:
            self._draws_told = True
            self._tell_draws()
        if self.progress_bar:
            self._bar.update(1)
        samples, tokens = self._meta.batch_size, self._meta.tokens
        window_start, seen = self._window
        self._window = (window_start, seen + samples)
        if self._profile is not None:
            self._profile.step()
        return Progress(samples, tokens, time.perf_counter() - began)

    def _first_sample(self) -> int:
        # This process's first sample's place in the global batch (ranks before it hold B samples each).
        return self.world.rank * max(self._rank_batch or 1, 1)

    def _tell_draws(self) -> None:
        # Once, after the first step: a model with random layers of its own draws a mask per tensor, so where
        # batches are cut into microbatches or processes, its draws are those of that cut.
        if not (self.world.size > 1 or self._auto_microbatch or self.device_train_microbatch_size is not None):
            return
        processes = f" over {self.world.size} processes" if self.world.size > 1 else ""
        warnings.warn(
            f"{type(self.static.module).__name__} draws random numbers of its own in training (dropout), and this "
            f"run cuts its batches into microbatches{processes}: a mask is drawn per tensor, so its draws are those "
            "of runs with the same microbatch size (on any number of processes), not those of a run that cuts its "
            "batches otherwise; everything else is the same, and the run is reproducible from its seed",
            stacklevel=4,
        )

    def _fitting_step(self, step: StepFn, plan: Plan, frozen: frozenset[str]) -> StepFn:
        # device_train_microbatch_size='auto': a step that runs out of memory on any process is retried by every
        # process from the state before it, with half the microbatch.
        while True:
            failed, state, outputs = False, self.state, None
            try:
                with self._draws.around(self.timestamp.batch, self._first_sample()):
                    state, outputs = step(self.state, self._batch)
            except Exception as error:  # noqa: BLE001 -- only out-of-memory errors are caught; others re-raise
                if not distributed.is_out_of_memory(error):
                    if isinstance(error, RuntimeError):
                        raise distributed.explained(error, self.world, self.timestamp.batch) from error
                    raise
                failed = True
                if self.world.size > 1:
                    statistics = norm_statistics(self.static.module)
                    failed_contribution(self.state, frozen, statistics, distributed.all_reduce_sum)
            if outputs is not None and self.world.size > 1:
                failed = not math.isfinite(float(outputs["samples"]))
            if not failed and outputs is not None:
                self.state, self._loss = state, outputs["loss"]
                if self._step_norms:
                    self._norms = {name: value for name, value in outputs.items() if name.startswith("l2_norm/")}
                return step
            current = self.device_train_microbatch_size or self._rank_batch or 1
            if current <= 1:
                raise RuntimeError(
                    f"out of device memory at step {self.timestamp.batch} with device_train_microbatch_size=1 (on "
                    "some process): the model does not fit one sample at a time; use a smaller model or precision"
                )
            del state, outputs
            gc.collect()
            if self.static.device.type == "cuda":
                torch.cuda.empty_cache()
            self.device_train_microbatch_size = math.ceil(current / 2)
            self.metrics["device_train_microbatch_size"] = self.device_train_microbatch_size
            self._log(
                {
                    "kind": "microbatch",
                    "step": self.timestamp.batch,
                    "device_train_microbatch_size": self.device_train_microbatch_size,
                }
            )
            step = self._train_step(plan, frozen)
            self._last_step = (plan, self.static, frozen, step)

    def _end_epoch(self) -> None:
        if self._batches is not None and next(self._batches, None) is not None:
            raise ValueError(
                f"train_dataloader yielded more than its length, {self.steps_per_epoch} batches, in epoch "
                f"{self.timestamp.epoch}: its __len__ must count the batches it yields in an epoch"
            )
        self._batches = None
        self._host_event(Event.EPOCH_END)

    def _log_train(self) -> Action | None:
        step = self.timestamp.batch
        now = time.perf_counter()
        window_start, samples = self._window
        samples_per_second = samples / max(now - window_start, 1e-9)
        self._window = (now, 0)
        learning_rate = float(self.lr_multiplier(max(step - 1, 0)))
        value = float(self._loss) if self._loss is not None else float("nan")
        self.metrics.update(loss=value, samples_per_second=samples_per_second, lr_multiplier=learning_rate)
        record = {
            "kind": "train",
            "step": step,
            "epoch": self.timestamp.epoch,
            "loss": value,
            "lr_multiplier": learning_rate,
            "samples_per_second": samples_per_second,
            "wall_time": now - self._fit_start,
        }
        if self._norms:
            self.metrics.update({name: float(value) for name, value in self._norms.items()})
        if self._log_handlers:
            view = self._view(Event.BATCH_END)
            for handler in self._log_handlers:
                values = handler(view)
                record.update(values)
                self.metrics.update(values)
        self._log(record)
        self._bar.set_postfix(loss=f"{value:.4f}", samples_s=f"{samples_per_second:,.0f}", refresh=False)
        return self._stop("train")

    def _evaluate_in_run(self) -> Action | None:
        # Stoppers check each evaluator that measured something at this evaluation (not those that were off).
        self._evaluate()
        stop = None
        for label in self._measured:
            stop = self._stop(label) or stop
        return stop

    def _stop(self, where: str) -> Action | None:
        # Stopping algorithms read this check's metrics (and their memory in the state); one that says so ends
        # the run at this batch.
        stopped_by = None
        for name, rule in self._stoppers:
            entry, stop = rule(self.state.algos[name], self.metrics, where, self.timestamp)
            self.state = self.state.with_algo(name, entry)
            stopped_by = stopped_by or (name if stop else None)
        if stopped_by is None:
            return None
        self._log({"kind": "stop", "step": self.timestamp.batch, "by": stopped_by})
        return Action.STOP

    def _evaluate(self, standalone: bool = False) -> dict[str, float]:
        if not self.evaluators:
            return {}
        module = self.static.module
        module.eval()
        plan = self._plan(self.timestamp)
        opening = Event.EVAL_STANDALONE_START if standalone else Event.EVAL_BEFORE_ALL
        self._host_event(opening)
        results: dict[str, float] = {}
        self._measured = []
        try:
            for evaluator in self.evaluators:
                if not (standalone or self._due(evaluator)):
                    continue
                self._host_event(Event.EVAL_START)
                results.update(self._evaluate_one(evaluator, self._eval_step(plan)))
                self._measured.append(evaluator.label)
                self._host_event(Event.EVAL_END)
        finally:
            module.train()
        if not results:
            return results
        self.metrics.update(results, eval_step=self.timestamp.batch)
        wall_time = time.perf_counter() - self._fit_start
        self._log({"kind": "eval", "step": self.timestamp.batch, "epoch": self.timestamp.epoch, "wall_time": wall_time, **results})
        closing = Event.EVAL_STANDALONE_END if standalone else Event.EVAL_AFTER_ALL
        self._host_event(closing)
        return results

    def _due(self, evaluator: Evaluator) -> bool:
        # An evaluator with an interval of its own runs at every that many of the trainer's evaluations, and last.
        every = self._every[evaluator.label]
        if every == 1 or self.timestamp.batch >= self.max_steps or self.eval_interval is None:
            return True
        unit = self.eval_interval.unit
        # Epoch evaluations come at an epoch's end, before the timestamp moves to the next one.
        count = self.timestamp.batch if unit is TimeUnit.BATCH else self.timestamp.epoch + 1
        return (count // int(self.eval_interval.value)) % every == 0

    def _evaluate_one(self, evaluator: Evaluator, step: Callable[[State, Any], Tensor]) -> dict[str, float]:
        batches = map(self._to_device, itertools.islice(evaluator.dataloader, evaluator.subset_num_batches))
        if evaluator.metrics is not None:
            return measure(
                step,
                self.state,
                batches,
                evaluator,
                target_key=self.target_key,
                on_event=self._host_event,
                causal=self._causal,
            )
        results = evaluate(
            step,
            self.state,
            batches,
            loss_fn=self.loss_fn,
            target_key=self.target_key,
            input_key=self.input_key,
            device=self.static.device,
            on_event=self._host_event,
            causal=self._causal,
            reduce=distributed.all_reduce_sum if self.world.size > 1 else None,
            gather=self.world.gather if self.world.size > 1 else None,
            per_position=self._default_loss,
        )
        return {f"eval/{evaluator.label}/{name}": value for name, value in results.items()}

    def eval(self) -> dict[str, float]:
        """Returns the evaluation metrics of the current state on every evaluator (``eval_dataloader``)."""
        if not self.evaluators:
            raise ValueError("eval() needs an eval_dataloader; none was given to the Trainer")
        self._check_evaluators()
        return self._evaluate(standalone=True)

    def predict(self, dataloader: Iterable[Any]) -> list[Any]:
        """Returns the model's outputs on each batch of ``dataloader``, in order (eval mode, no gradient, the
        run's precision; on the host's CPU when the model is on another device), running the PREDICT events.
        Batches are as in training (the input at ``input_key``), or input tensors alone.

        Under several processes each returns the outputs of the batches its own loader gives it.

        Inputs that cannot be the model's are refused naming the batch: not a tensor, or another number of dims,
        channels or features than the batches it trained on (after ``fit``); a batch the model fails on is
        refused with what its first layer takes.
        """
        if isinstance(dataloader, str | bytes) or not isinstance(dataloader, Iterable):
            raise TypeError(
                f"dataloader of type {type(dataloader).__name__}: expected an iterable of batches (a loader, a list of "
                "batches, or a list of input tensors)"
            )
        if isinstance(dataloader, Tensor):
            raise TypeError(
                f"dataloader is a tensor of shape {tuple(dataloader.shape)}, whose rows would be taken as batches: "
                "pass a list of batches, e.g. [inputs]"
            )
        module = self.static.module
        module.eval()
        outputs: list[Any] = []
        try:
            self._host_event(Event.PREDICT_START)
            step = self._eval_step(self._plan(self.timestamp), predict=True)
            for index, batch in enumerate(map(self._to_device, dataloader)):
                # A batch of inputs alone is the loader's whole batch, not a tuple to index.
                batch = self._holding(batch) if isinstance(batch, Tensor) else batch
                if not isinstance(batch, tuple | list | Mapping):
                    raise TypeError(
                        f"predict: dataloader's batch {index} is a {type(batch).__name__}: expected a tensor of inputs, "
                        f"or a tuple, list or mapping holding them at input_key={self.input_key!r}"
                    )
                check_predict_input(
                    batch_input(batch, self.input_key), index, self.input_key, self._trained_input, module
                )
                self._host_event(Event.PREDICT_BATCH_START)
                result = self._forward(step, batch, f"predict's dataloader batch {index}")
                outputs.append(pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, Tensor) else t, result))
                self._host_event(Event.PREDICT_BATCH_END)
            self._host_event(Event.PREDICT_END)
        finally:
            module.train()
        return outputs

    def _holding(self, inputs: Tensor) -> Any:
        # A batch holding ``inputs`` alone at input_key.
        key = self.input_key if self.input_key is not None else 0
        if isinstance(key, str):
            return {key: inputs}
        return (inputs,) if key in (0, -1) else (*([None] * key), inputs) if key > 0 else (inputs, *([None] * (-key - 1)))

    def _save(self) -> None:
        assert self.save_folder is not None
        if self.world.main:
            self._write_checkpoint()
        self.world.barrier()

    def _write_checkpoint(self) -> None:
        assert self.save_folder is not None
        options = self._checkpoints
        path = save_checkpoint(
            self.save_folder / checkpoint_name(self.timestamp),
            self.state,
            self.timestamp,
            algorithms_to_json(self.algorithms),
            weights_only=options.weights_only,
            metadata=self.save_metadata,
        )
        latest = self.save_folder / "latest.pt"
        link = self.save_folder / ".latest.pt.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(path.name)
        link.replace(latest)
        prune_checkpoints(self.save_folder, options.keep)
        self._log({"kind": "checkpoint", "step": self.timestamp.batch, "path": str(path)})

    def _load(self, load_path: str | Path) -> None:
        self._host_event(Event.BEFORE_LOAD)
        options = self._resume_options
        if options.weights_only and not self._resuming:
            self.state = load_weights(
                load_path,
                self.state,
                device=self.static.device,
                strict=options.strict,
                ignore_keys=options.ignore_keys,
                argument=self._load_argument,
            )
            self._host_event(Event.AFTER_LOAD)
            return
        checkpoint = load_checkpoint(
            load_path,
            self.state,
            device=self.static.device,
            algorithms=algorithms_to_json(self.algorithms),
            argument=self._load_argument,
        )
        length = self.timestamp.max_duration
        if checkpoint.max_duration is not None and length is not None and checkpoint.max_duration != str(length):
            warnings.warn(
                f"{self._load_argument}={str(load_path)!r} was saved by a run of {checkpoint.max_duration}; this run has "
                f"max_duration={self.max_duration} ({length}): the schedule's length changed, so schedules and "
                "warm-ups measured in fractions of the run continue on the new length",
                stacklevel=3,
            )
        self.state = checkpoint.state
        self.timestamp = checkpoint.timestamp.with_max_duration(self.timestamp.max_duration)
        if self.timestamp.batch >= self.max_steps:
            warnings.warn(
                f"{self._load_argument}={str(load_path)!r} holds a run at batch {self.timestamp.batch}, which max_duration="
                f"{self.max_duration} ({self.max_steps} batches) has already reached: fit() will train nothing",
                stacklevel=3,
            )
        self._host_event(Event.AFTER_LOAD)

    def save_checkpoint(self, path: str | Path) -> Path:
        """Returns the path written: the current state and timestamp, saved atomically (by rank 0, while the
        other processes wait; every process calls it)."""
        if self.world.main:
            save_checkpoint(
                path, self.state, self.timestamp, algorithms_to_json(self.algorithms), metadata=self.save_metadata
            )
        self.world.barrier()
        return Path(path)

    @property
    def model(self) -> nn.Module:
        """Returns the trained model: a new ``nn.Module`` with the run's surgeries, holding the weights evaluation
        uses (EMA's average where the run has EMA, swapped in as at an evaluation), in eval mode on the run's device.

        Its outputs are the evaluation's (``eval()``) on the same inputs; it runs in its weights' precision, so
        under ``bf16-mixed`` or ``fp16-mixed`` call it inside ``torch.autocast`` to match an evaluation exactly. Each
        call builds a new module from the current state; the trainer and the ``model`` it was given are left as
        they are.
        """
        state = evaluation_state(self.algorithms, self.static, self.state, self.timestamp, self.passes)
        return module_with(self.static.module, state.params, state.buffers)


def _algorithms(algorithms: object) -> tuple[Algorithm, ...]:
    if isinstance(algorithms, Algorithm):
        raise TypeError(f"algorithms={algorithms!r} is one algorithm; pass a sequence of them: [{algorithms!r}]")
    if not isinstance(algorithms, Iterable) or isinstance(algorithms, str):
        raise TypeError(f"algorithms={algorithms!r}: expected a list or tuple of algorithm records")
    algorithms = tuple(algorithms)
    for index, algorithm in enumerate(algorithms):
        if isinstance(algorithm, type) and issubclass(algorithm, Algorithm):
            raise TypeError(
                f"algorithms[{index}] is the class {algorithm.__name__}; pass an instance: {algorithm.__name__}()"
            )
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"algorithms[{index}]={algorithm!r}: expected an algorithm record such as MixUp()")
    return algorithms


_NO_EFFECT = re.compile(r"changes nothing|has no effect|does nothing")


def _no_effect(algorithms: Sequence[Algorithm], messages: Iterable[str]) -> tuple[str, ...]:
    # The algorithms (by class or registered name) that one of the warnings says change nothing.
    said = [m for m in messages if _NO_EFFECT.search(m)]
    return tuple(a.name for a in algorithms if any(type(a).__name__ in m or a.name in m for m in said))


@contextlib.contextmanager
def _passed_on(messages: list[str]) -> Iterator[None]:
    # Warnings raised meanwhile reach the user as they would have; their messages are added to ``messages``.
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # type: ignore[assignment]
            yield
    finally:
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno, source=warning.source)
        messages.extend(str(warning.message) for warning in caught)


def _construction_warnings(algorithms: Sequence[Algorithm]) -> list[str]:
    # A record says at construction when its settings make it change nothing (MixUp(alpha=0)); rebuilding it with
    # warnings recorded hears that again without showing it to the user a second time.
    messages = []
    for algorithm in algorithms:
        if not dataclasses.is_dataclass(algorithm):
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                dataclasses.replace(algorithm)
            except Exception:  # noqa: BLE001 -- a record that cannot be rebuilt says nothing more
                continue
        messages += [str(warning.message) for warning in caught]
    return messages


def _scalar_loss(loss_fn: LossFn) -> LossFn:
    # A loss that is not one number fails deep inside autograd ("grad can be implicitly created only for scalar
    # outputs"); the check reads the shape only, so it costs nothing a compiled step would notice.
    @functools.wraps(loss_fn)
    def checked(outputs: Any, batch: Any) -> Tensor:
        loss = loss_fn(outputs, batch)
        if not isinstance(loss, Tensor) or loss.dim():
            raise TypeError(
                f"loss_fn returned {_described(loss)}: expected a 0-dim tensor, one number for the batch (e.g. the "
                "mean of per-sample losses)"
            )
        return loss

    return checked


def _item(batch: Any, key: int | str | None, argument: str, where: str, outputs: Any = None) -> Any:
    # The batch's item at ``key`` (None: the default item, see batch_input and batch_target); a key the batch lacks
    # is refused naming the argument it came from. ``outputs``: the model's, said to hold no loss of its own.
    try:
        return (batch_input if argument == "input_key" else batch_target)(batch, key)
    except KeyError:
        held = f"keys {list(batch)}" if isinstance(batch, Mapping) else f"{len(batch)} items" if isinstance(batch, tuple | list) else type(batch).__name__
        item = key if key is not None else ("labels" if isinstance(batch, Mapping) else 0 if argument == "input_key" else 1)
        hint = (
            f"; the model's output ({type(outputs).__name__}) holds no loss of its own, so the default loss reads the "
            "targets there (a Hugging Face model computes its loss when the batch holds 'labels')"
            if outputs is not None and not isinstance(outputs, Tensor)
            else ""
        )
        raise ValueError(f"{argument}={key!r}: {where} has no item {item!r} (it holds {held}){hint}") from None


def _check_algorithm_keys(algorithms: Sequence[Algorithm], batch: Any) -> None:
    # Once, on the first batch: an algorithm's input_key or target_key that the batch lacks would fail inside the
    # traced step; refused naming the algorithm, its argument and what the batch holds.
    for algorithm in algorithms:
        for argument in ("input_key", "target_key"):
            key = getattr(algorithm, argument, None)
            if key is None:
                continue
            read = target_key_of(batch, key) if argument == "target_key" else key
            present = read in batch if isinstance(batch, Mapping) else isinstance(read, int) and -len(batch) <= read < len(batch)
            if present:
                continue
            held = f"a mapping of {', '.join(map(repr, batch))}" if isinstance(batch, Mapping) else f"{len(batch)} items"
            what = "the inputs it changes" if argument == "input_key" else "the targets"
            tokens = isinstance(batch, Mapping) and "input_ids" in batch
            hint = (
                f"; {type(algorithm).__name__} changes images or features, not token sequences: leave it out of a run on "
                "a language model's batches"
                if tokens and argument == "input_key"
                else f"; name the item that holds {what}"
            )
            raise ValueError(
                f"{type(algorithm).__name__}({argument}={key!r}) reads {what} at {key!r}, but train_dataloader's first "
                f"batch holds {held}{hint}"
            )


def _first_sample(item: Any) -> Any:
    return item[:1] if isinstance(item, Tensor) and item.dim() else item


def _described(value: object) -> str:
    if isinstance(value, Tensor):
        return f"shape {tuple(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    return f"type {type(value).__name__}"


def _passes(passes: object) -> tuple[Pass, ...]:
    if isinstance(passes, str) or not isinstance(passes, Iterable) or callable(passes):
        raise TypeError(f"passes={passes!r}: expected a sequence of passes, e.g. composer_fn.core.passes.DEFAULT_PASSES")
    given = tuple(passes)
    for index, item in enumerate(given):
        if not callable(item):
            raise TypeError(f"passes[{index}]={item!r}: expected a pass, a function (algorithms, event) -> algorithms")
    return given


def _check_optimizer(optimizer: object) -> None:
    torch_optimizer = isinstance(optimizer, torch.optim.Optimizer) or (
        isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)
    )
    if torch_optimizer:
        name = optimizer.__name__ if isinstance(optimizer, type) else type(optimizer).__name__
        raise TypeError(
            f"optimizer={name} is a torch.optim optimizer, which holds the model's tensors; the Trainer takes a "
            "gradient transformation that holds none: composer_fn.optim.sgd, sgdw, adam, adamw or decoupled_adamw, "
            "e.g. optimizer=composer_fn.optim.sgd(0.1, momentum=0.9)"
        )
    if callable(optimizer) and getattr(optimizer, "__module__", "").startswith("composer_fn.optim"):
        name = getattr(optimizer, "__name__", "optimizer")
        raise TypeError(
            f"optimizer=composer_fn.optim.{name} is the function that makes a gradient transformation; call it: "
            f"optimizer=composer_fn.optim.{name}(0.1)"
        )
    if not isinstance(optimizer, GradientTransformation):
        raise TypeError(
            f"optimizer={optimizer!r}: expected a gradient transformation such as composer_fn.optim.sgd(0.1)"
        )


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return available_device(device)


def _evaluators(eval_dataloader: Any) -> tuple[Evaluator, ...]:
    # A plain loader is the evaluator labelled 'eval' (Composer's default label): eval/eval/accuracy, eval/eval/loss.
    if eval_dataloader is None:
        return ()
    if isinstance(eval_dataloader, Mapping):
        raise TypeError(
            f"eval_dataloader is a mapping of {len(eval_dataloader)} entries: to evaluate on several sets, pass a list "
            "of Evaluators, e.g. [Evaluator('val', val_loader), Evaluator('test', test_loader)]"
        )
    if isinstance(eval_dataloader, Evaluator):
        return (eval_dataloader,)
    if isinstance(eval_dataloader, list | tuple) and eval_dataloader and all(isinstance(e, Evaluator) for e in eval_dataloader):
        labels = [e.label for e in eval_dataloader]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"eval_dataloader names the evaluator label {repeated[0]!r} twice: expected one label each")
        return tuple(eval_dataloader)
    if isinstance(eval_dataloader, list | tuple) and any(isinstance(e, Evaluator) for e in eval_dataloader):
        raise TypeError("eval_dataloader mixes Evaluators with other items: expected a loader, or Evaluators only")
    return (_unnamed(eval_dataloader),)


def _every(evaluator: Evaluator, interval: Time | None) -> int:
    # How many of the trainer's evaluations one of this evaluator's spans.
    if evaluator.eval_interval is None or interval is None:
        return 1
    own = epochs_or_batches(evaluator.eval_interval, f"Evaluator({evaluator.label!r}).eval_interval", "2ep")
    if own.unit is not interval.unit or own.value % interval.value:
        raise ValueError(
            f"Evaluator({evaluator.label!r}).eval_interval={evaluator.eval_interval!r}: expected a multiple of the "
            f"trainer's eval_interval={interval} in the same unit"
        )
    return int(own.value // interval.value)


def _check_watched(algorithms: Sequence[Algorithm], evaluators: Sequence[Evaluator]) -> None:
    # A stopper that watches an evaluator the run does not have would never check anything.
    labels = [e.label for e in evaluators]
    for algorithm in algorithms:
        watched = algorithm.capabilities().watches
        if watched == "train" and "train" in labels:
            raise ValueError(
                f"{type(algorithm).__name__}(dataloader_label='train') reads the training record, but an evaluator "
                "is labelled 'train' too: expected another label for that Evaluator (e.g. 'train_eval')"
            )
        if watched is None or watched == "train" or watched in labels:
            continue
        raise ValueError(
            f"{type(algorithm).__name__}(dataloader_label={watched!r}) checks the evaluator labelled {watched!r}, "
            + (
                f"but the run's evaluators are labelled {', '.join(map(repr, labels))}"
                if labels
                else "but the Trainer has no eval_dataloader"
            )
            + ": expected one of those labels or 'train' (the training record at each log step)"
        )


def _unnamed(loader: Any) -> Evaluator:
    evaluator = object.__new__(Evaluator)
    fields = (("label", "eval"), ("dataloader", loader), ("metrics", None), ("subset_num_batches", None), ("eval_interval", None))
    for name, value in fields:
        object.__setattr__(evaluator, name, value)
    return evaluator


SCHEDULE_STEPS = 2000
"""How many steps of the run the schedule logged at its start covers (a dry run plans each of them)."""


class _Switches:
    """When algorithms switch on and off, for ``plan`` records: an algorithm is on from the first step it acts
    at until it has not acted for more than ``GAP`` steps, so one that acts every other batch
    (SelectiveBackprop) is on throughout, not switched at every step. An off switch is known ``GAP`` steps late
    and carries the step it happened at."""

    GAP = 8

    def __init__(self) -> None:
        self.on: set[str] = set()
        self.absent: dict[str, int] = {}  # an algorithm that is on, by the step it stopped acting at
        self.pending: list[tuple[int, str, list[str]]] = []

    def seen(self, acting: set[str], step: int) -> None:
        """Takes note of the algorithms acting from ``step`` on (called whenever they may have changed)."""
        for name in self.on - acting:
            self.absent.setdefault(name, step)
        for name in acting & self.absent.keys():
            del self.absent[name]
        if acting - self.on:
            self.pending.append((step, "on", sorted(acting - self.on)))
            self.on |= acting

    def due(self, step: int) -> list[tuple[int, str, list[str]]]:
        """Returns the switches known by ``step``, as ``(step, 'on' | 'off', names)``."""
        gone: dict[int, list[str]] = {}
        for name, since in list(self.absent.items()):
            if step - since >= self.GAP:
                del self.absent[name]
                self.on.discard(name)
                gone.setdefault(since, []).append(name)
        self.pending.extend((since, "off", sorted(names)) for since, names in sorted(gone.items()))
        due, self.pending = self.pending, []
        return due


def hparams_of(trainer: Trainer) -> Mapping[str, Any]:
    """Returns the run's settings as plain values, for loggers."""
    return {
        "max_duration": str(trainer.max_duration),
        "scale_schedule_ratio": trainer.scale_schedule_ratio,
        "algorithms": [a.to_config() for a in trainer.algorithms],
        "precision": trainer.static.precision,
        "seed": trainer.static.seed,
        "compile": trainer.compile,
    }

