"""The Trainer: the imperative shell around the pure core.

It owns every side effect: the device, the data loaders, compilation, the clock, the progress bar, loggers,
callbacks and checkpoint files. Everything that decides what training does (which algorithm runs when, the
step itself, the learning rate) is a pure function it calls. ``fit`` is the side effects of each tick of the
run schedule (``composer_fn.core.schedule``).

The Trainer is built from parts that never call back into it: the option records (``options``), the run its
arguments build (``build``), the first-batch and evaluator checks (``first_batch``), the steps by their
specification (``steps``), what the run reports (``reporting``) and checkpoint files and folders (``checkpoint``).
What is left here is the loop: ``fit``, ``eval``, ``predict``, ``model`` and saving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.callbacks.base import RunView, bind_callbacks, logging_callbacks
from composer_fn.core.algorithm import Algorithm, algorithms_to_json
from composer_fn.core.engine import (
    Plan,
    frozen_parameters,
    make_plan,
    run_host_event,
)
from composer_fn.core.event import Event
from composer_fn.core.passes import DEFAULT_PASSES, Pass
from composer_fn.core.schedule import Action, Progress, Steps, run_schedule
from composer_fn.core.state import BatchMeta, State, batch_input
from composer_fn.core.time import Time, Timestamp, TimeUnit, to_steps
from composer_fn.optim.base import GradientTransformation
from composer_fn.optim.optimizers import sgdw
from composer_fn.profiler import ProfileSession, marked
from composer_fn.trainer import distributed
from composer_fn.trainer.attributes import RunAttributes
from composer_fn.trainer.batch_faults import BatchForm, batch_fault, batch_form, output_fault
from composer_fn.trainer.build import (
    build_run,
    changing_nothing,
    passed_on,
    start_state,
    to_device,
    train_inputs,
)
from composer_fn.trainer.checkpoint import SaveFolder, prepare_folder, resume_run, save_run
from composer_fn.trainer.checks import check_algorithms_read
from composer_fn.trainer.evaluation import due, evaluate_on, stopping
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.feed import Feed
from composer_fn.trainer.finite import LossWatch
from composer_fn.trainer.first_batch import (
    SetUp,
    check_evaluators,
    check_input_range,
    check_targets,
    check_train_keys,
    units_scale,
)
from composer_fn.trainer.learning_rate import learning_rate
from composer_fn.trainer.microbatch import Cut, failed_contribution, norm_statistics
from composer_fn.trainer.model import evaluation_state, module_with
from composer_fn.trainer.object_store import ObjectFolder, is_url, local_path, split_url
from composer_fn.trainer.options import (
    BatchLayout,
    Checkpointing,
    Execution,
    Reporting,
    Resume,
    epochs_or_batches,
    options_from,
)
from composer_fn.trainer.prediction import check_predict_loader, predictions
from composer_fn.trainer.randomness import ModelDraws, cut_draws_warning, draws_nothing
from composer_fn.trainer.reporting import Reporter, hparams_record, schedule_table
from composer_fn.trainer.sharding import RunShards, gathered_module, is_sharded, shards_tree
from composer_fn.trainer.step import StepFn, make_eval_step
from composer_fn.trainer.steps import StepBuilder, StepCache, StepSpec

__all__ = ["Trainer"]

# What a step raises on a batch it cannot take (an output without logits meets ``.dim()``: AttributeError).
_STEP_FAULTS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError)


class Trainer(RunAttributes):
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
        composer_arguments: Composer's flat names for the records' fields (``save_folder``, ``load_path``,
            ``device_train_microbatch_size``, ...), each mapped onto its record by
            ``composer_fn.trainer.options.COMPOSER_NAMES``, which lists them all. A record and a flat name for the
            same record are refused together.

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
        records = {"execution": execution, "layout": layout, "checkpointing": checkpointing, "resume": resume}
        self.options = options = options_from({**records, "reporting": reporting}, composer_arguments)
        """The run's option records, flat arguments included (``Execution``, ``BatchLayout``, ...)."""
        self.run = run = build_run(
            model,
            train_dataloader,
            eval_dataloader,
            options,
            max_duration=max_duration,
            optimizer=optimizer,
            schedule=schedule,
            scale_schedule_ratio=scale_schedule_ratio,
            algorithms=algorithms,
            eval_interval=eval_interval,
            passes=passes,
        )
        """What stays fixed while the run trains: its algorithms, length, losses, optimizer, loaders (``Run``)."""
        self._rate = (optimizer, schedule)  # rebuilt with a longer run by fit(duration=...)
        if run.save_folder is not None:
            prepare_folder(run.save_folder, options.spelled("save_folder"), run.world.main)
        self._handlers = bind_callbacks(self.callbacks)
        self._log_handlers = logging_callbacks(self.callbacks)
        self._step_norms = any(c.step_norms for c in self.callbacks)
        check_algorithms_read(
            run.algorithms, run.evaluators, self.callbacks, run.losses.default, run.max_steps, run.steps_per_epoch
        )
        self._observed = frozenset(self._handlers) | {e for a in run.algorithms for e in a.host_hooks()}
        self._reporter = Reporter(self.loggers, self.progress_bar, run.checks_at)
        self.metrics: dict[str, float] = {}
        self.profile_traces: list[Path] = []
        self._profile: ProfileSession | None = None
        # A process's batch (the loader's batch_size, else its first batch's size) and its microbatch, which 'auto'
        # halves when a step runs out of memory.
        size = options.execution.microbatch_size
        microbatch = size if isinstance(size, int) else None
        self._cut = Cut(run.world.rank, run.world.size, run.rank_batch, microbatch, auto=size == "auto")
        # What the loop keeps between ticks.
        self._feed = Feed(train_dataloader, run.steps_per_epoch, self.input_key, run.device, run.world.size)
        self._batch: Any = None
        self._meta = BatchMeta(0)
        self._loss: Tensor | None = None
        self._watch = LossWatch()
        self._first_form: BatchForm | None = None
        self._norms: dict[str, Tensor] = {}
        self._measured: list[str] = []
        self._last_plan: tuple[Timestamp | None, BatchMeta | None, Plan | None] = (None, None, None)
        self._last_step: tuple[Any, ...] = (None, None, None, None)
        self._fixed_step: StepFn | None = None
        self._unchecked = False
        self._evaluators_checked = False
        self._draws_told = False
        self._trained_input: tuple[tuple[int, ...], torch.dtype] | None = None
        self._units_scale: float | None = None
        inputs = functools.partial(train_inputs, train_dataloader, run.device, self.input_key)
        self.static, self.state, self.no_effect = start_state(model, run, seed, inputs)
        """The model's structure with the run's surgeries, and the run's state (see ``State``)."""
        self.timestamp = Timestamp().with_max_duration(Time(run.max_steps, TimeUnit.BATCH))
        self._move = functools.partial(to_device, device=run.device)
        self._draws = ModelDraws(self.static.seed, run.device)
        # The step runs unseeded when nothing in it can draw: the losses and methods are the run's own, and the model
        # (checked each time its structure changes) is built of layers that cannot.
        self._own_step = run.losses.ours and all(type(a).__module__.startswith("composer_fn.") for a in run.algorithms)
        self._steps = StepCache(
            StepBuilder(
                self.loss_fn,
                run.tx,
                input_key=self.input_key,
                per_sample_loss_fn=self.per_sample_loss_fn,
                loss_units=run.losses.units,
                reseed=self._draws.reseed,
            )
        )
        self._notify(Event.INIT)
        if run.load_path is not None:
            self._load(run.load_path)

    def _plan(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Plan:
        # Several ticks in a row share a timestamp: plan once for them.
        last_timestamp, last_meta, plan = self._last_plan
        if plan is not None and not self.run.algorithms:
            return plan  # nothing to match: one plan for the run
        if timestamp is not last_timestamp or meta is not last_meta or plan is None:
            plan = make_plan(self.algorithms, self.passes, timestamp, meta=meta)
            if self.profiler is not None:
                plan = marked(plan)
            self._last_plan = (timestamp, meta, plan)
        return plan

    def _spec(self, plan: Plan, frozen: frozenset[str] = frozenset()) -> StepSpec:
        execution, scale = self.options.execution, self._units_scale or 1.0
        return StepSpec.of(self.static, plan.step_key, frozen, execution, self._cut, units_scale=scale, norms=self._step_norms)

    def _train_step(self, plan: Plan, frozen: frozenset[str] = frozenset()) -> StepFn:
        spec, unused = self._spec(plan, frozen), frozenset[str]()
        if spec.grad_mode == "func" and spec not in self._steps:  # the parameters its loss does not reach, by autograd
            with self._draws.around(self.timestamp.batch, self._cut.first_sample):
                unused = self._steps.builder.unused(spec, plan, self.state, self._batch, self._cut.process_batch)
        return self._steps.train_step(spec, plan, unused)

    def _eval_step(self, plan: Plan, predict: bool = False) -> Callable[[State, Any], Tensor]:
        return self._steps.eval_step(self.static, plan, predict, self.compile)

    def _setup(self) -> SetUp:
        return SetUp(
            self.static, self.input_key, self.target_key, self.loss_fn, self.run.losses.default, self.run.losses.causal, self._trained_input
        )

    def _check_evaluators(self) -> None:
        # Once, before the first step or evaluation (see check_evaluators).
        if not self._evaluators_checked:
            check_evaluators(
                self._setup(),
                self.state,
                self.timestamp,
                self.evaluators,
                self.eval_dataloader,
                self._move,
            )
            self._evaluators_checked = True

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

    def fit(self, duration: str | int | Time | None = None) -> dict[str, float]:
        """Returns the final metrics after training to ``max_duration`` (resuming where a checkpoint left off).

        The run is the side effects of each tick of ``run_schedule``: host hooks and callbacks at events, and
        the trainer's own actions (the step, logging, evaluation, checkpoints) where the schedule puts them.

        ``duration`` (``'2ep'``, ``'100ba'``) trains that much further than where the run stands, as Composer's
        ``fit(duration=...)`` does: the run's length becomes the steps taken plus ``duration``, and a schedule's
        times in fractions of the run (``'0.1dur'``) are of that new length. Called again without it on a run that
        has reached its length, ``fit`` trains nothing and warns, returning the metrics it has.
        """
        if duration is not None:
            self._lengthen(duration)
        elif self.timestamp.batch >= self.max_steps and self.metrics:
            warnings.warn(
                f"fit(): the run has trained its whole length ({self.max_steps} steps), so nothing more was trained; "
                "fit(duration='2ep') trains further",
                UserWarning,
                stacklevel=2,
            )
            return dict(self.metrics)
        self.static.module.train()
        self._check_evaluators()
        for logger in self.loggers:
            logger.fit_start(self.timestamp.batch)  # 0: a fresh run; a resumed one starts at its checkpoint's batch
        self._reporter.log(hparams_record(self.run, self.static))
        if self.loggers and self.algorithms:
            self._reporter.log({"kind": "schedule", "table": schedule_table(self.run)})
        # The batch is read at BEFORE_DATALOADER when something looks at it or at BATCH_START, else by the step.
        apart = bool(self._observed & {Event.BEFORE_DATALOADER, Event.BATCH_START})
        actions: dict[Event | Action, Callable[[], Progress | Action | None]] = {
            Event.BEFORE_DATALOADER: self._next_batch,
            Event.BATCH_START: lambda: self._host_event(Event.BATCH_START, self._meta),
            Action.STEP: self._step if apart else self._read_and_step,
            Action.LOG: self._log_train,
            Event.EPOCH_END: self._end_epoch,
            Action.EVALUATE: self._evaluate_in_run,
            Action.SAVE: self._save,
        }
        for event in self._observed - actions.keys():
            actions[event] = functools.partial(self._host_event, event)  # the host hooks and callbacks at it
        ticks = run_schedule(
            self.max_steps,
            self.steps_per_epoch,
            start=self.timestamp,
            eval_interval=self.eval_interval,
            save_interval=self.save_interval,
            log_interval=self.log_interval,
            final_eval=bool(self.evaluators),
            final_save=self.save_folder is not None,
            # Events nothing looks at are left out, except those the loop itself acts at.
            events=self._observed | {Event.EPOCH_END} | ({Event.BEFORE_DATALOADER} if apart else set()),
            # Steps in a row where nothing happens between them: a run without algorithms, profiler or 'auto'.
            runs=not (self.algorithms or self._cut.auto or self.profiler),
        )
        self._reporter.start(self.max_steps, self.timestamp.batch)
        self._watch = LossWatch()
        self._unchecked = True
        reply: Progress | Action | None = None
        if self.profiler is not None:
            self._profile = ProfileSession(self.profiler, self.world.rank)
            self._profile.start(self.max_steps - self.timestamp.batch)
        # Warnings up to the end of the first step (host hooks that look at the first batch) say which algorithms
        # change nothing in this run.
        first_step, noted = contextlib.ExitStack(), list[str]()
        if self.algorithms:
            first_step.enter_context(passed_on(noted))
        step = actions[Action.STEP]

        def first() -> Progress | Action | None:
            try:
                progress = step()
            finally:
                first_step.close()
                actions[Action.STEP] = step
            self._tell_draws()
            return progress

        actions[Action.STEP] = first

        def run_of(count: int) -> Progress:  # the first step of a fit is taken as above, then the run's others
            taken = actions[Action.STEP]() if self._fixed_step is None else None
            return self._run_of_steps(count, taken if isinstance(taken, Progress) else None)

        try:
            while True:
                what, self.timestamp = ticks.send(reply)
                reply = run_of(what.count) if isinstance(what, Steps) else actions[what]()
        except StopIteration as end:
            self.timestamp = end.value  # where the schedule ended, past ticks it did not show
            self._watch.check(f"the end of the run at step {self.timestamp.batch}")
        finally:
            first_step.close()
            self.no_effect = tuple(dict.fromkeys((*self.no_effect, *changing_nothing(self.algorithms, noted))))
            self._reporter.finish(self.timestamp.batch)
            self._reporter.hand_over()  # what was logged before an error too
            self._feed.close()
            self._batch = None
            if self._profile is not None:
                self._profile.stop()
                self.profile_traces = list(self._profile.traces)
                self._profile = None
        self.metrics["wall_time"] = self._reporter.wall_time()
        self._reporter.log({"kind": "fit", "step": self.timestamp.batch, "wall_time": self.metrics["wall_time"]})
        for callback in self.callbacks:
            callback.close()
        for logger in self.loggers:
            logger.close()
        return dict(self.metrics)

    def _lengthen(self, duration: str | int | Time) -> None:
        # The run's length becomes the steps taken plus ``duration``; the learning rate and the steps are rebuilt
        # for it (the optimizer's state is kept: its transformation is the same).
        extra = epochs_or_batches(duration, "duration", "2ep")
        steps = to_steps(extra, steps_per_epoch=self.run.steps_per_epoch, max_steps=0)
        if steps < 1:
            raise ValueError(f"duration={duration!r} is {steps} steps (steps_per_epoch={self.run.steps_per_epoch}); expected at least one")
        length = self.timestamp.batch + steps
        optimizer, schedule = self._rate
        tx, multiplier = learning_rate(
            optimizer if optimizer is not None else sgdw(0.1),  # build_run's default
            schedule,
            self.run.algorithms,
            steps_per_epoch=self.run.steps_per_epoch,
            max_steps=length,
            scale_schedule_ratio=self.run.scale_schedule_ratio,
        )
        self.run = dataclasses.replace(
            self.run, max_duration=Time(length, TimeUnit.BATCH), max_steps=length, tx=tx, lr_multiplier=multiplier
        )
        check_algorithms_read(
            self.run.algorithms, self.run.evaluators, self.callbacks, self.run.losses.default, length, self.run.steps_per_epoch
        )
        self.timestamp = self.timestamp.with_max_duration(Time(length, TimeUnit.BATCH))
        self._steps = StepCache(dataclasses.replace(self._steps.builder, tx=tx))
        self._fixed_step = None
        self._last_step = (None, None, None, None)
        self._last_plan = (None, None, None)

    def _next_batch(self) -> None:
        # BEFORE_DATALOADER, then the loader (see Feed); the first batch is checked against the run.
        if Event.BEFORE_DATALOADER in self._observed:
            self._host_event(Event.BEFORE_DATALOADER)
        if not self._unchecked:
            _, self._batch, _, self._meta = self._feed.next(self.timestamp)
            return
        setup = self._setup()
        raw, self._batch, local, self._meta = self._feed.next(
            self.timestamp, functools.partial(check_train_keys, setup, self.algorithms)
        )
        # A loader without a batch_size: its first batch's size is a process's batch (for microbatch places).
        if self._cut.rank_batch is None:
            self._cut = dataclasses.replace(self._cut, rank_batch=local.batch_size)
        check_input_range(self.run.input_ranges, self._batch, self.input_key)
        check_targets(setup, self.state, self.timestamp, self._batch)
        if self.run.losses.units is not None and self._units_scale is None:
            self._units_scale = units_scale(setup, raw, self.world.broadcast)
        given = batch_input(raw, self.input_key)
        if isinstance(given, Tensor):
            self._trained_input = (tuple(given.shape), given.dtype)
        self._first_form = batch_form(self._batch)
        self._unchecked = False

    def _read_and_step(self) -> Progress:
        self._next_batch()
        return self._step()

    def _step(self) -> Progress:
        timestamp = self.timestamp
        step = self._fixed_step or self._planned_step(timestamp)
        began = time.perf_counter()
        if self._cut.auto:
            self._fitting_step()
        else:
            draws = self._draws
            saved, completed = draws.enter(timestamp.batch, self._cut.first_sample), False
            try:
                self.state, outputs = step(self.state, self._batch)
                completed = True
            except _STEP_FAULTS as error:
                raise self._explained(error, self._batch, timestamp) from error
            finally:
                draws.leave(saved, completed)
            self._took(outputs)
        self._batch = None
        meta = self._meta
        self._reporter.stepped(meta.batch_size)
        if self._profile is not None:
            self._profile.step()
        return Progress(meta.batch_size, meta.tokens, time.perf_counter() - began)

    def _run_of_steps(self, count: int, taken: Progress | None) -> Progress:
        # A Steps tick: batches read and stepped in a row by the run's fixed step (the first already ``taken``);
        # stopped by an error, the clock still counts the steps taken.
        start, step, ran, bar = self.timestamp, self._fixed_step, taken or Progress(0, batches=0), self._reporter.progress_bar
        samples, tokens, done, began = ran.samples, ran.tokens, ran.batches, time.perf_counter()
        assert step is not None
        try:
            while done < count:
                _, batch, _, meta = self._feed.next(start)
                saved = self._draws.enter(start.batch + done, self._cut.first_sample)
                try:
                    self.state, outputs = step(self.state, batch)
                except _STEP_FAULTS as error:
                    raise self._explained(error, batch, start.advance(0, 0, 0.0, done) if done else start) from error
                finally:
                    self._draws.leave(saved)
                self._watch.add(start.batch + done + 1, outputs["loss"])
                if bar:  # else the throughput is counted once, below
                    self._reporter.stepped(meta.batch_size)
                done, samples, tokens = done + 1, samples + meta.batch_size, tokens + meta.tokens
        finally:
            seconds = ran.seconds + time.perf_counter() - began
            if 0 < done < count:
                self.timestamp = start.advance(samples, tokens, seconds, done)
        if done > ran.batches:
            self._took(outputs, watched=True)
            if not bar:
                self._reporter.stepped(samples - ran.samples)
        return Progress(samples, tokens, seconds, count)

    def _planned_step(self, timestamp: Timestamp) -> StepFn:
        # The step of this batch's plan and frozen layers; a run without algorithms (whose plan cannot change) and
        # without 'auto' microbatches keeps its first step.
        run, reporter = self.run, self._reporter
        plan = self._plan(timestamp, self._meta)
        frozen = frozen_parameters(run.algorithms, timestamp, self.static.module) if run.freezing else frozenset()
        last_plan, last_static, last_frozen, step = self._last_step
        if plan is not last_plan or self.static is not last_static or frozen != last_frozen:
            if self.static is not last_static:
                self._draws.set_quiet(self._own_step and draws_nothing(self.static.module))
            step = self._train_step(plan, frozen)
            self._last_step = (plan, self.static, frozen, step)
            reporter.planned(plan, timestamp.batch)
        if reporter.loggers:
            reporter.switched(timestamp.batch)
        if not run.algorithms and not self._cut.auto:
            self._fixed_step = step
        return step

    @property
    def device_train_microbatch_size(self) -> int | None:
        """Returns the microbatch size steps cut a process's batch into (None: uncut; ``'auto'`` starts uncut and
        halves it each time a step runs out of memory)."""
        return self._cut.microbatch

    @property
    def compiles(self) -> int:
        """Returns how many graphs the run's compiled steps compiled so far (a recompile counts)."""
        return self._steps.compiles

    def _tell_draws(self) -> None:
        # After the first step of a fit (see cut_draws_warning).
        if self._draws.drew and self._cut.microbatch_size is not None and not self._draws_told:
            self._draws_told = True
            warnings.warn(cut_draws_warning(type(self.static.module).__name__, self.world.size), stacklevel=4)

    def _fitting_step(self) -> None:
        # device_train_microbatch_size='auto': a step that runs out of memory on any process is retried by every
        # process from the state before it, with half the microbatch.
        plan, _, frozen, step = self._last_step

        def joined() -> None:
            statistics = norm_statistics(self.static.module)
            failed_contribution(self.state, frozen, statistics, distributed.all_reduce_sum)

        def run() -> tuple[State, dict[str, Tensor]]:  # the step, with the model's own draws seeded for it
            with self._draws.around(self.timestamp.batch, self._cut.first_sample):
                return step(self.state, self._batch)

        while (result := distributed.attempt_step(run, self.world, self.timestamp.batch, joined)) is None:
            self._cut = cut = self._cut.halved(self.timestamp.batch, self.static.device)
            assert cut.microbatch is not None
            self.metrics["device_train_microbatch_size"] = cut.microbatch
            record = {"kind": "microbatch", "step": self.timestamp.batch}
            self._reporter.log({**record, "device_train_microbatch_size": cut.microbatch})
            step = self._train_step(plan, frozen)
            self._last_step = (plan, self.static, frozen, step)
        self.state, outputs = result
        self._took(outputs)

    def _explained(self, error: Exception, batch: Any, timestamp: Timestamp) -> Exception:
        # Read only after a step failed: a batch unlike the first or unlike what the loss takes is named, with the
        # item and what was expected; a failed collective says so; anything else is the error as raised.
        if isinstance(error, RuntimeError) and (explained := distributed.explained(error, self.world, timestamp.batch)) is not error:
            return explained

        def check_classes() -> None:
            check_targets(self._setup(), self.state, timestamp, batch, where="the batch")

        try:
            fault = batch_fault(batch, self._first_form, self.target_key, self.run.losses.default, check_classes)
            if fault is None and not is_sharded(self.static.module):  # a sharded forward gathers from every process
                # The model's own draws (its dropout) leave torch's generator as the failed step left it.
                with torch.random.fork_rng(devices=[]):
                    outputs = make_eval_step(self.static, make_plan((), timestamp=timestamp), input_key=self.input_key)(self.state, batch)
                fault = output_fault(outputs, batch, self.target_key, self.run.losses.default, self.run.losses.causal)
        except Exception:  # noqa: BLE001 -- the diagnosis must never hide the step's own error
            fault = None
        if fault is None:
            return error
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return ValueError(
            f"the train batch of step {timestamp.batch + 1} (epoch {timestamp.epoch}): {fault} "
            f"({type(error).__name__}: {first_line})"
        )

    def _took(self, outputs: dict[str, Tensor], watched: bool = False) -> None:
        # What the loop keeps of a step's outputs: the loss (watched for NaN), and the gradients' norms for the
        # callbacks that read them.
        self._loss = outputs["loss"]
        if not watched:
            self._watch.add(self.timestamp.batch + 1, outputs["loss"])
        if self._step_norms:
            self._norms = {name: value for name, value in outputs.items() if name.startswith("l2_norm/")}

    def _end_epoch(self) -> None:
        self._feed.end_epoch(self.timestamp.epoch)
        self._host_event(Event.EPOCH_END)

    def _log_train(self) -> Action | None:
        step = self.timestamp.batch
        self._watch.check(f"the log at step {step}")
        loss = float(self._loss) if self._loss is not None else float("nan")
        learning_rate = float(self.lr_multiplier(max(step - 1, 0)))
        record = self._reporter.train_record(step, self.timestamp.epoch, loss, learning_rate)
        self.metrics.update({name: record[name] for name in ("loss", "samples_per_second", "lr_multiplier")})
        self.metrics.update({name: float(value) for name, value in self._norms.items()})
        if self._log_handlers:
            view = self._view(Event.BATCH_END)
            for handler in self._log_handlers:
                values = handler(view)
                record.update(values)
                self.metrics.update(values)
        self._reporter.log(record)
        self._reporter.show(loss, record["samples_per_second"])
        return self._stop("train")

    def _evaluate_in_run(self) -> Action | None:
        # Stoppers check each evaluator that measured something at this evaluation (not those that were off).
        self._watch.check(f"the evaluation at step {self.timestamp.batch}")
        self._evaluate()
        stop = None
        for label in self._measured:
            stop = self._stop(label) or stop
        return stop

    def _stop(self, where: str) -> Action | None:
        # Stopping algorithms read this check's metrics (and their memory in the state); one that says so ends
        # the run at this batch.
        self.state, stopped_by = stopping(self.run.stoppers, self.state, self.metrics, where, self.timestamp)
        if stopped_by is None:
            return None
        self._reporter.log({"kind": "stop", "step": self.timestamp.batch, "by": stopped_by})
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
                if not (standalone or due(self.run.every[evaluator.label], self.timestamp, self.eval_interval, self.max_steps)):
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
        wall_time = self._reporter.wall_time()
        self._reporter.log({"kind": "eval", "step": self.timestamp.batch, "epoch": self.timestamp.epoch, "wall_time": wall_time, **results})
        closing = Event.EVAL_STANDALONE_END if standalone else Event.EVAL_AFTER_ALL
        self._host_event(closing)
        return results

    def _evaluate_one(self, evaluator: Evaluator, step: Callable[[State, Any], Tensor]) -> dict[str, float]:
        summed = self.world.size > 1
        return evaluate_on(
            evaluator,
            step,
            self.state,
            self._move,
            loss_fn=self.loss_fn,
            layout=self.options.layout,
            device=self.static.device,
            on_event=self._host_event,
            causal=self.run.losses.causal,
            default_loss=self.run.losses.default,
            reduce=distributed.all_reduce_sum if summed else None,
            gather=self.world.gather if summed else None,
            collective=is_sharded(self.static.module),
        )

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

        Under several processes each returns the outputs of the batches its own loader gives it; a sharded run's
        forward is every process's, so each calls it with as many batches.

        Inputs that cannot be the model's are refused naming the batch: not a tensor, or another number of dims,
        channels or features than the batches it trained on (after ``fit``); a batch the model fails on is
        refused with what its first layer takes.
        """
        check_predict_loader(dataloader)
        module = self.static.module
        module.eval()
        try:
            self._host_event(Event.PREDICT_START)
            step = self._eval_step(self._plan(self.timestamp), predict=True)
            outputs = predictions(self._setup(), step, lambda: self.state, dataloader, self._move, self._host_event)
            self._host_event(Event.PREDICT_END)
        finally:
            module.train()
        return outputs

    def _save(self) -> None:
        assert self.save_folder is not None
        self._watch.check(f"the checkpoint at step {self.timestamp.batch}")
        options = self.options.checkpointing
        path = self._write(self.save_folder, None, options.weights_only, options.keep)
        if self.world.main:
            self._reporter.log({"kind": "checkpoint", "step": self.timestamp.batch, "path": str(path)})

    def _load(self, load_path: str | Path) -> None:
        self._host_event(Event.BEFORE_LOAD)
        options = self.options.resume
        self.state, self.timestamp = resume_run(
            load_path,
            self.state,
            self.timestamp,
            device=self.static.device,
            algorithms=algorithms_to_json(self.algorithms),
            weights_only=options.weights_only and not self.run.resuming,
            strict=options.strict,
            ignore_keys=options.ignore_keys,
            argument=self.run.load_argument,
            max_duration=str(self.max_duration),
            max_steps=self.max_steps,
            shards=RunShards(self.static.module, distributed.grouped()) if is_sharded(self.static.module) else None,
        )
        self._host_event(Event.AFTER_LOAD)

    def save_checkpoint(self, path: str | Path) -> Path | str:
        """Returns the path written: the current state and timestamp, saved atomically (by rank 0, while the
        other processes wait; every process calls it). A sharded run writes a sharded checkpoint, the folder ``path``,
        each process its shards. A URL (``s3://bucket/run/final.pt``) is written into that bucket, and returned."""
        if is_url(path):
            folder, name = split_url(str(path))
            return self._write(ObjectFolder(folder, argument="path"), name)
        return self._write(Path(local_path(path)).parent, Path(local_path(path)).name)

    def _write(self, folder: SaveFolder, name: str | None, weights_only: bool = False, keep: int = -1) -> Path | str:
        module, metadata = self.static.module, dict(self.options.checkpointing.metadata or {})
        shards = functools.partial(shards_tree, self.state, module) if is_sharded(module) else None
        return save_run(
            folder, self.state, self.timestamp, algorithms_to_json(self.algorithms), main=self.world.main,
            barrier=self.world.barrier, shards=(lambda only: shards(weights_only=only)) if shards else None, name=name,
            weights_only=weights_only, metadata=metadata, keep=keep,
        )  # fmt: skip

    @property
    def model(self) -> nn.Module:
        """Returns the trained model: a new ``nn.Module`` with the run's surgeries, holding the weights evaluation
        uses (EMA's average where the run has EMA, swapped in as at an evaluation), in eval mode on the run's device.

        Its outputs are the evaluation's (``eval()``) on the same inputs; it runs in its weights' precision, so
        under ``bf16-mixed`` or ``fp16-mixed`` call it inside ``torch.autocast`` to match an evaluation exactly. Each
        call builds a new module from the current state; the trainer and the ``model`` it was given are left as
        they are. A sharded run (``FSDP``) gathers the whole weights from every process: each must call it.
        """
        state = evaluation_state(self.algorithms, self.static, self.state, self.timestamp, self.passes)
        if is_sharded(self.static.module):  # gathered from every process: each calls it
            return gathered_module(self.static.module, state)
        return module_with(self.static.module, state.params, state.buffers)
