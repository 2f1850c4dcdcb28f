"""The run as the Trainer's arguments build it, before its first step.

``build_run`` checks the arguments (each error names the one at fault) and settles what they leave open: the
device and the process group, the run's length in steps, the losses, the optimizer with its learning-rate
schedule, the checkpoint the run starts from and the surgeries it records. ``start_state`` builds the model's
static part and the state after the INIT event. Both return values; neither holds the Trainer.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import REQUIREMENTS, Algorithm, ChangesNothing
from composer_fn.core.engine import check_surgery_conflicts, make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.passes import Pass
from composer_fn.core.state import LossFn, State, Static, batch_input, initial_state
from composer_fn.core.time import Time, Timestamp, TimeUnit, to_steps
from composer_fn.optim.base import GradientTransformation
from composer_fn.optim.optimizers import sgdw
from composer_fn.trainer import distributed
from composer_fn.trainer.checkpoint import (
    SaveFolder,
    autoresume_path,
    save_folder_of,
    with_recorded_surgeries,
)
from composer_fn.trainer.checks import available_device
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.first_batch import described
from composer_fn.trainer.learning_rate import learning_rate
from composer_fn.trainer.loaders import declared_batch_size
from composer_fn.trainer.object_store import is_url, resolved
from composer_fn.trainer.options import Options, epochs_or_batches
from composer_fn.trainer.outputs import (
    default_loss,
    default_per_sample_loss,
    is_causal_lm,
    labelled_positions,
    settle_loss_function,
)
from composer_fn.trainer.precision import Precision
from composer_fn.trainer.sharding import (
    check_sharded_run,
    device_mesh,
    local_shards,
    materialise,
    on_meta_device,
    shard_module,
)

__all__ = ["Run", "Losses", "build_run", "start_state", "to_device", "SUPPORTED_REQUIREMENTS"]

SUPPORTED_REQUIREMENTS: frozenset[str] = frozenset({"per_sample_loss", "extra_forward", "loss_closure", "train_data"})
"""What the Trainer can provide to algorithms (see ``Algorithm.requires``)."""


@dataclass(frozen=True)
class Losses:
    """The run's losses as settled: ``loss_fn(outputs, batch)`` (the given one, checked to return one number, or the
    default), the per-sample loss for algorithms that need one, whether the loss is the default one, whether the
    model is a causal language model, and, with the default loss, the weight of a batch's piece (its labelled
    positions: ``labelled_positions``); ``ours`` when neither loss is the user's."""

    loss_fn: LossFn
    per_sample_loss_fn: LossFn | None
    default: bool
    causal: bool
    units: Callable[[Any], Tensor] | None
    ours: bool = False


@dataclass(frozen=True)
class Run:
    """A run as built from the Trainer's arguments: what stays fixed while it trains.

    ``rank_batch`` is a process's batch as the loader declares it (None: known at the first batch); ``every``
    gives, by evaluator label, how many of the run's evaluations one of its own spans; ``load_path`` is the
    checkpoint the run starts from (its save folder's newest with ``autoresume``), ``resuming`` whether that is the
    run's own, and ``load_argument`` how errors name it.
    """

    options: Options
    algorithms: tuple[Algorithm, ...]
    passes: tuple[Pass, ...]
    world: distributed.World
    device: torch.device
    train_dataloader: Any
    eval_dataloader: Any
    evaluators: tuple[Evaluator, ...]
    steps_per_epoch: int
    max_duration: Time
    scale_schedule_ratio: float
    max_steps: int
    eval_interval: Time | None
    every: Mapping[str, int]
    losses: Losses
    tx: GradientTransformation
    lr_multiplier: Callable[[int], Any]
    save_folder: SaveFolder | None
    load_path: str | Path | None
    resuming: bool
    load_argument: str
    rank_batch: int | None
    input_ranges: tuple[tuple[str, tuple[float, float]], ...]
    checks_at: Mapping[str, frozenset[Event]]
    freezing: bool
    stoppers: tuple[tuple[str, Callable[..., Any]], ...]


def build_run(
    model: nn.Module,
    train_dataloader: Any,
    eval_dataloader: Any,
    options: Options,
    *,
    max_duration: object,
    optimizer: object,
    schedule: Any,
    scale_schedule_ratio: object,
    algorithms: object,
    eval_interval: object,
    passes: object,
) -> Run:
    """Returns the run the Trainer's arguments describe; raises naming the argument at fault. Under several
    processes it sets up the process group (``distributed.setup``), and with ``autoresume`` rank 0 picks the
    checkpoint every rank starts from."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    execution, layout, saving, resuming = options.execution, options.layout, options.checkpointing, options.resume
    if not hasattr(train_dataloader, "__len__"):
        raise TypeError("train_dataloader must have a length (batches per epoch) to schedule epochs")
    evaluators = _evaluators(eval_dataloader)
    loaders = [("train_dataloader", train_dataloader)] + [
        (f"eval_dataloader ({e.label})" if e.dataloader is not eval_dataloader else "eval_dataloader", e.dataloader)
        for e in evaluators
    ]
    _check_loaders(loaders)
    if not any(True for _ in model.parameters()):
        raise ValueError(f"model={type(model).__name__} has no parameters to train")
    checked = _algorithms(algorithms)
    device = _device(execution.device if execution.device is not None else distributed.local_device(None))
    slow = Precision.of(execution.precision, device).emulated()
    if slow is not None:
        warnings.warn(slow, stacklevel=3)
    world = distributed.setup(device, execution.dist_timeout)
    if execution.parallelism is not None:
        check_sharded_run(options, checked, distributed.grouped(), model)
    distributed.check_loader(train_dataloader, "train_dataloader", world)
    for argument, loader in loaders[1:]:
        distributed.check_loader(loader, argument, world, evaluation=True)
    # A bucket that cannot be used is refused here, before anything trains.
    save_folder = save_folder_of(saving.folder, argument=options.spelled("save_folder")) if saving.folder is not None else None
    given = resuming.path
    load_path: str | Path | None = given if given is None or isinstance(given, str) else Path(given)
    if is_url(load_path):
        assert isinstance(load_path, str)
        load_path = resolved(load_path, argument="load_path")
    start = load_path
    if resuming.autoresume:
        # Rank 0 decides, so that every rank resumes from the same checkpoint.
        load_path = world.broadcast(autoresume_path(save_folder, load_path) if world.main else None)
    # A run resumed from its own save folder loads all of it: load_weights_only is for the run's first start from
    # load_path (as Composer's autoresume).
    own = load_path is not None and load_path is not start
    load_argument = "save_folder's newest checkpoint" if own else "load_path"
    if load_path is not None:
        checked = with_recorded_surgeries(checked, load_path, argument=load_argument)
    for algorithm in checked:
        missing = algorithm.requires - SUPPORTED_REQUIREMENTS
        if missing:
            raise ValueError(
                f"algorithm {algorithm.name!r} requires {sorted(missing)} from the trainer, which provides "
                f"{sorted(SUPPORTED_REQUIREMENTS) or 'none'} of {sorted(REQUIREMENTS)}"
            )
    ordered = _passes(passes)
    steps_per_epoch = len(train_dataloader)
    if steps_per_epoch < 1:
        raise ValueError(
            f"train_dataloader has length {steps_per_epoch}: it yields no batch (drop_last=True with a batch_size "
            "larger than the dataset does); expected at least one batch an epoch"
        )
    duration = epochs_or_batches(max_duration, "max_duration", "10ep")
    ratio = validate.real("scale_schedule_ratio", scale_schedule_ratio, minimum=0.0, open_below=True)
    # Composer multiplies max_duration by the ratio; counting in steps keeps a fractional epoch's batches.
    max_steps = int(to_steps(duration, steps_per_epoch=steps_per_epoch, max_steps=0) * ratio)
    if max_steps < 1:
        raise ValueError(
            f"max_duration={max_duration!r} scaled by scale_schedule_ratio={scale_schedule_ratio!r} leaves "
            f"{max_steps} steps (steps_per_epoch={steps_per_epoch}); expected at least one"
        )
    losses = _losses(model, layout.loss_fn, layout.per_sample_loss_fn, layout.target_key)
    if eval_interval is not None and not evaluators:
        shown = repr(str(eval_interval)) if isinstance(eval_interval, Time) else repr(eval_interval)
        raise ValueError(
            f"eval_interval={shown} needs eval_dataloader, which was not given: pass eval_dataloader or drop eval_interval"
        )
    interval = (
        epochs_or_batches("1ep" if eval_interval is None else eval_interval, "eval_interval", "1ep") if evaluators else None
    )
    every = {e.label: _every(e, interval) for e in evaluators}
    _check_watched(checked, evaluators)
    if optimizer is None:
        warnings.warn("no optimizer given: using sgdw(learning_rate=0.1)", stacklevel=3)
        optimizer = sgdw(0.1)
    _check_optimizer(optimizer)
    assert isinstance(optimizer, GradientTransformation)
    if schedule is not None and not callable(getattr(schedule, "resolve", None)):
        raise TypeError(
            f"schedule={schedule!r}: expected a schedule such as composer_fn.optim.CosineAnnealingScheduler() "
            "(the optimizer's learning rate is set in the optimizer)"
        )
    tx, lr_multiplier = learning_rate(
        optimizer, schedule, checked, steps_per_epoch=steps_per_epoch, max_steps=max_steps, scale_schedule_ratio=ratio
    )
    return Run(
        options=options,
        algorithms=checked,
        passes=ordered,
        world=world,
        device=device,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        evaluators=evaluators,
        steps_per_epoch=steps_per_epoch,
        max_duration=duration,
        scale_schedule_ratio=float(ratio),
        max_steps=max_steps,
        eval_interval=interval,
        every=every,
        losses=losses,
        tx=tx,
        lr_multiplier=lr_multiplier,
        save_folder=save_folder,
        load_path=load_path,
        resuming=own,
        load_argument=load_argument,
        rank_batch=declared_batch_size(train_dataloader),
        input_ranges=tuple((a.name, r) for a in checked if (r := a.capabilities().input_range) is not None),
        checks_at={a.name: a.checks_at for a in checked},
        freezing=any(a.capabilities().freezes is not None for a in checked),
        stoppers=tuple((a.name, rule) for a in checked if (rule := a.capabilities().stops) is not None),
    )


def start_state(
    model: nn.Module, run: Run, seed: int, train_inputs: Callable[[], Iterator[Any]] | None
) -> tuple[Static, State, tuple[str, ...]]:
    """Returns the static part (a copy of ``model`` on the run's device, in training mode), the state after the
    INIT event (surgeries applied, the optimizer's and algorithms' states made), and the names of the algorithms
    that change nothing in this run: those whose settings, or settings in a run this long, say so
    (``Algorithm.changes_nothing``, ``changes_nothing_in``), and those that warned ``ChangesNothing`` at INIT.
    ``train_inputs`` is given to algorithms that require the data."""
    check_surgery_conflicts(run.algorithms, model)
    # Hugging Face models resolve their loss function once, here, so that no forward of the run logs doing it.
    structure = settle_loss_function(copy.deepcopy(model)).train()
    sharding = run.options.execution.parallelism
    if on_meta_device(structure) and sharding is None:
        # One process holds the whole model anyway: it is made whole, from the run's seed.
        materialise(structure, int(seed) if validate.is_integer(seed) else 0, run.device)
    if not on_meta_device(structure):  # a sharded run's meta model is made unit by unit as it is sharded
        structure = structure.to(run.device)
    wants_data = any("train_data" in a.requires for a in run.algorithms)
    precision = Precision.of(run.options.execution.precision, run.device)
    static = Static(
        module=structure,
        precision=precision.name,
        device=run.device,
        seed=int(seed) if validate.is_integer(seed) else seed,
        train_inputs=train_inputs if wants_data else None,
    )
    state = initial_state(structure, R.key(seed, device=run.device))
    timestamp = Timestamp().with_max_duration(Time(run.max_steps, TimeUnit.BATCH))
    plan = make_plan(run.algorithms, run.passes, timestamp)
    for diagnostic in plan.diagnostics:
        warnings.warn(diagnostic, stacklevel=3)
    said: list[str] = []
    with passed_on(said) if run.algorithms else contextlib.nullcontext():
        static, state = run_host_event(Event.INIT, plan, static, state, timestamp)
    found = changing_nothing(run.algorithms, said)
    no_effect = tuple(
        a.name
        for a in run.algorithms
        if a.name in found
        or a.changes_nothing() is not None
        or a.changes_nothing_in(run.max_steps, run.steps_per_epoch) is not None
    )
    if sharding is not None:
        # The state holds each process's shards: the storage of the sharded module's own parameters.
        module = static.module
        with torch.no_grad():
            for name, tensor in (*module.named_parameters(), *module.named_buffers()):
                if not tensor.is_meta:
                    tensor.copy_(state.params[name] if name in state.params else state.buffers[name])
        mesh = device_mesh(sharding, run.world.size, run.device.type)
        shard_module(module, sharding, mesh, seed=int(seed) if validate.is_integer(seed) else 0)
        state = state.replace(params=local_shards(module), buffers=dict(module.named_buffers()))
    state = state.replace(
        opt=run.tx.init(state.params),
        algos={a.name: a.init(static, state) for a in run.algorithms},
    )
    if precision.loss_scaling:
        state = state.replace(hparams={**state.hparams, **precision.loss_scale_entries()})
    return static, state, no_effect


def to_device(batch: Any, device: torch.device) -> Any:
    """Returns ``batch`` with its tensors on ``device`` (copied without waiting; as it is on the CPU)."""
    if device.type == "cpu":
        return batch
    return pytree.tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, Tensor) else t, batch)


def train_inputs(loader: Iterable[Any], device: torch.device, input_key: int | str | None) -> Iterator[Any]:
    """Yields the input items of a pass over ``loader`` as it stands (this epoch's order), on ``device``."""
    for batch in loader:
        yield batch_input(to_device(batch, device), input_key)


def changing_nothing(algorithms: Sequence[Algorithm], said: Iterable[str]) -> tuple[str, ...]:
    """Returns the names of the algorithms that ``said`` names by class (``ChangesNothing.algorithm``; a subclass
    of a named class counts), in the order of ``algorithms``."""
    named = set(said)
    return tuple(a.name for a in algorithms if any(cls.__name__ in named for cls in type(a).__mro__))


@contextlib.contextmanager
def passed_on(said: list[str]) -> Iterator[None]:
    """Warnings raised meanwhile reach the user as they would have; the algorithms that ``ChangesNothing`` warnings
    among them are about are added to ``said`` (by class name)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # type: ignore[assignment]
            yield
    finally:
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno, source=warning.source)
        said.extend(w.message.algorithm for w in caught if isinstance(w.message, ChangesNothing))


def _losses(
    model: nn.Module, loss_fn: LossFn | None, per_sample_loss_fn: LossFn | None, target_key: int | str | None
) -> Losses:
    causal = is_causal_lm(model)
    default, ours = loss_fn is None, loss_fn is None and per_sample_loss_fn is None
    if ours:
        per_sample_loss_fn = default_per_sample_loss(target_key, causal)
    # The default loss averages over labelled positions (a language model's tokens): microbatches and processes
    # weigh their pieces by them (the unit, positions per sample, is fixed at the first batch).
    units = functools.partial(labelled_positions, target_key=target_key, causal=causal) if default else None
    settled = _scalar_loss(loss_fn) if loss_fn is not None else default_loss(target_key)
    return Losses(settled, per_sample_loss_fn, default, causal, units, ours)


def _scalar_loss(loss_fn: LossFn) -> LossFn:
    # A loss that is not one number fails deep inside autograd ("grad can be implicitly created only for scalar
    # outputs"); the check reads the shape only, so it costs nothing a compiled step would notice.
    @functools.wraps(loss_fn)
    def checked(outputs: Any, batch: Any) -> Tensor:
        loss = loss_fn(outputs, batch)
        if not isinstance(loss, Tensor) or loss.dim():
            raise TypeError(
                f"loss_fn returned {described(loss)}: expected a 0-dim tensor, one number for the batch (e.g. the "
                "mean of per-sample losses)"
            )
        return loss

    return checked


def _check_loaders(loaders: Sequence[tuple[str, Any]]) -> None:
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


def _passes(passes: object) -> tuple[Pass, ...]:
    if isinstance(passes, str) or not isinstance(passes, Iterable) or callable(passes):
        raise TypeError(f"passes={passes!r}: expected a sequence of passes, e.g. composer_fn.core.passes.DEFAULT_PASSES")
    given = tuple(passes)
    for index, entry in enumerate(given):
        if not callable(entry):
            raise TypeError(f"passes[{index}]={entry!r}: expected a pass, a function (algorithms, event) -> algorithms")
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
