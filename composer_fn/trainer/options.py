"""The Trainer's options as records: frozen, checked when built, each field documented where it is declared.

``Trainer(model, loader, max_duration=..., execution=Execution(precision="bf16-mixed"), checkpointing=
Checkpointing("runs/a"))``. Composer's flat argument names (``precision=``, ``save_folder=``,
``device_train_microbatch_size=``, ``load_path=``, ...) keep working: ``COMPOSER_NAMES`` maps each onto its
record's field, and ``options_from`` builds the records from them. An error names the argument as it was
written: ``save_num_checkpoints_to_keep=0`` when given flat, ``Checkpointing.keep=0`` in a record.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import os
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from composer_fn.callbacks.base import Callback
from composer_fn.core import validate
from composer_fn.core.state import PRECISIONS, LossFn, Precision
from composer_fn.core.time import Time, TimeUnit
from composer_fn.loggers.base import Logger
from composer_fn.profiler import Profiler
from composer_fn.trainer.checks import check_loss_signature, plain_metadata
from composer_fn.trainer.object_store import is_url, local_path
from composer_fn.trainer.step import GRAD_MODES, GradMode

__all__ = [
    "FSDP",
    "Execution",
    "BatchLayout",
    "Checkpointing",
    "Resume",
    "Reporting",
    "COMPOSER_NAMES",
    "options_from",
    "epochs_or_batches",
]

_T = TypeVar("_T")

_SPELLED: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "spelled", default=types.MappingProxyType({})
)
"""While records are built from flat arguments: ``'Record.field'`` to the argument name the caller wrote."""


def _name(record: str, field_name: str) -> str:
    # The name an error gives a field: the caller's flat argument, else ``Record.field``.
    qualified = f"{record}.{field_name}"
    return _SPELLED.get().get(qualified, qualified)


@contextlib.contextmanager
def _spelled(names: Mapping[str, str]) -> Iterator[None]:
    token = _SPELLED.set(names)
    try:
        yield
    finally:
        _SPELLED.reset(token)


def epochs_or_batches(value: object, argument: str, example: str) -> Time:
    """Returns ``value`` (``'2ep'``, ``'100ba'``, an int number of epochs or a ``Time``) as a positive ``Time`` in
    epochs or batches; raises naming ``argument`` otherwise."""
    time = validate.time(argument, value, (TimeUnit.EPOCH, TimeUnit.BATCH), example, number_unit=TimeUnit.EPOCH)
    if time.value <= 0:
        raise ValueError(f"{argument}={value!r} must be a positive amount of epochs or batches, e.g. {example!r}")
    return time


def _instances(argument: str, given: object, kind: type[_T]) -> tuple[_T, ...]:
    if isinstance(given, kind) or isinstance(given, str) or not isinstance(given, Iterable):
        raise TypeError(f"{argument}={given!r}: expected a list of {kind.__name__} instances")
    items = tuple(given)
    for index, item in enumerate(items):
        if isinstance(item, type) and issubclass(item, kind):
            raise TypeError(f"{argument}[{index}] is the class {item.__name__}; pass an instance: {item.__name__}(...)")
        if not isinstance(item, kind):
            raise TypeError(f"{argument}[{index}]={item!r}: expected a {kind.__name__} instance")
    return items


def _check_backend(argument: str, backend: object) -> None:
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if not isinstance(backend, str) or backend not in known:
        raise ValueError(f"{argument}={backend!r} is not a torch.compile backend; expected True, False or one of {known}")


def _set(record: object, **values: Any) -> None:
    # A frozen record normalises its own fields once, while it is built.
    for name, value in values.items():
        object.__setattr__(record, name, value)


DTypeName = Literal["fp32", "bf16", "fp16"]
_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class FSDP:
    """Shards the parameters, gradients and optimizer state over the processes (ZeRO-3), with torch's ``fully_shard``.

    Args:
        reshard_after_forward: free each unit's gathered parameters after its forward (they are gathered again for
            its backward): less memory for one more all-gather a step. False keeps them to the backward.
        units: the class names of the submodules sharded as one unit (gathered together); None takes the model's
            own hint (a Hugging Face model's ``_no_split_modules``), else each block of a repeated stack (see
            ``shard_units``). A unit nested in another is its own unit.
        param_dtype: the dtype units compute in (their parameters are cast when gathered): ``'bf16'`` or
            ``'fp16'`` for mixed precision; None computes in the parameters' own dtype. The parameters, and so
            the optimizer's arithmetic, keep theirs (fp32 master weights).
        reduce_dtype: the dtype gradients are summed across processes in (``'fp32'`` by default); None reduces in
            ``param_dtype``.
        activation_checkpointing: recompute each unit's activations in the backward instead of keeping them.
        replicate: HSDP: the processes form ``replicate`` groups; each shards the model over its members and the
            groups' gradients are summed (a 2-D mesh, replicate × shard). 1 shards over every process.
    """

    reshard_after_forward: bool = True
    units: tuple[str, ...] | None = None
    param_dtype: DTypeName | None = None
    reduce_dtype: DTypeName | None = "fp32"
    activation_checkpointing: bool = False
    replicate: int = 1

    def __post_init__(self) -> None:
        validate.flag(_name("FSDP", "reshard_after_forward"), self.reshard_after_forward)
        validate.flag(_name("FSDP", "activation_checkpointing"), self.activation_checkpointing)
        for dtype_field in ("param_dtype", "reduce_dtype"):
            value = getattr(self, dtype_field)
            if value is not None:
                validate.choice(_name("FSDP", dtype_field), value, tuple(_DTYPES))
        units = self.units
        if units is not None:
            if isinstance(units, str) or not all(isinstance(name, str) and name for name in units) or not units:
                raise TypeError(
                    f"{_name('FSDP', 'units')}={units!r}: expected a non-empty tuple of module class names, e.g. ('GPT2Block',), "
                    "or None"
                )
            object.__setattr__(self, "units", tuple(units))
        validate.integer(_name("FSDP", "replicate"), self.replicate, minimum=1)

    def mixed_precision(self) -> Any:
        """Returns torch's ``MixedPrecisionPolicy`` of these options."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        param = _DTYPES[self.param_dtype] if self.param_dtype is not None else None
        reduce = _DTYPES[self.reduce_dtype] if self.reduce_dtype is not None else None
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


@dataclass(frozen=True)
class Execution:
    """Where and how the step runs.

    Args:
        device: where the run trains (``'cpu'``, ``'cuda'``, ``'cuda:1'`` or a ``torch.device``); None takes the first
            GPU when there is one (under torchrun, the ``LOCAL_RANK``-th), else the CPU.
        precision: ``'fp32'``, ``'bf16-mixed'`` or ``'fp16-mixed'`` (autocast inside the step; fp16 with dynamic
            loss scaling, ``composer_fn.trainer.loss_scale``, whose scale is checkpointed with the run).
        compile: False, True (inductor) or the name of a ``torch.compile`` backend; held as the backend's name or
            None.
        grad_mode: ``'autograd'`` (default eager) or ``'func'`` (default when compiling); None picks by ``compile``.
        microbatch_size: cut each of this process's batches into microbatches of this many samples and accumulate
            their gradients (each weighted by its share of the global batch: of its samples, or, with the default
            loss, of its labelled positions) into one step; the step equals the unaccumulated one up to rounding,
            and so does a run on several processes. ``'auto'`` starts from the whole batch and, when a step runs out
            of device memory, halves the microbatch and retries the same batch (every process agrees); the size it
            settles on is logged. None: one microbatch. Composer's ``device_train_microbatch_size``.
        dist_timeout: seconds a collective waits for the other processes (torchrun runs) before failing.
        parallelism: ``FSDP(...)`` shards the parameters, gradients and optimizer state over the processes
            (``composer_fn.trainer.sharding``); None: each process holds the whole model.
    """

    device: str | torch.device | None = None
    precision: Precision = "fp32"
    compile: bool | str | None = False
    grad_mode: GradMode | None = None
    microbatch_size: int | Literal["auto"] | None = None
    dist_timeout: float = 300.0
    parallelism: FSDP | None = None

    def __post_init__(self) -> None:
        precision = self.precision
        if not isinstance(precision, str) or precision not in PRECISIONS:
            meant = [p for p in PRECISIONS if isinstance(precision, str) and precision and p.startswith(precision.lower())]
            raise ValueError(
                f"{_name('Execution', 'precision')}={precision!r} must be one of {', '.join(PRECISIONS)}"
                + (f" (did you mean {meant[0]!r}?)" if len(meant) == 1 else "")
            )
        if self.device is not None and not isinstance(self.device, str | torch.device):
            raise TypeError(
                f"{_name('Execution', 'device')}={self.device!r}: expected 'cpu', 'cuda', 'cuda:1', a torch.device or None"
            )
        backend = "inductor" if self.compile is True else (self.compile or None)
        if backend is not None:
            _check_backend(_name("Execution", "compile"), backend)
        if self.grad_mode is not None:
            validate.choice(_name("Execution", "grad_mode"), str(self.grad_mode), GRAD_MODES)
        size = self.microbatch_size
        if size is not None and size != "auto":
            size = validate.integer(_name("Execution", "microbatch_size"), size, minimum=1, hint="or 'auto' or None")
        timeout = validate.real(_name("Execution", "dist_timeout"), self.dist_timeout, minimum=0.0, open_below=True)
        if self.parallelism is not None and not isinstance(self.parallelism, FSDP):
            raise TypeError(
                f"{_name('Execution', 'parallelism')}={self.parallelism!r}: expected composer_fn.trainer.FSDP(...) or None"
            )
        _set(self, compile=backend, microbatch_size=size, dist_timeout=float(timeout))

    @property
    def step_grad_mode(self) -> GradMode:
        """Returns the gradient mode the step uses: ``grad_mode``, else ``'func'`` when compiling, else ``'autograd'``."""
        return self.grad_mode or ("func" if self.compile else "autograd")


@dataclass(frozen=True)
class BatchLayout:
    """Where a batch holds what the model and the loss read, and the losses.

    Args:
        input_key: where a batch holds the model's input: an index into a tuple or list batch, or a key of a dict
            batch. None (the default): a mapping batch goes to the model whole, as keyword arguments (those its
            ``forward`` names, as Composer's ``HuggingFaceModel`` passes them: ``attention_mask`` and ``labels``
            reach it), and a tuple or list batch gives its item 0.
        target_key: where a batch holds the targets the default loss and evaluation read, as ``input_key``; None
            (the default): a mapping batch's ``'labels'``, a tuple or list batch's item 1.
        loss_fn: ``loss_fn(outputs, batch)`` (any callable of two positional arguments); default: the model's own
            loss where its output holds one, else cross-entropy against the targets (``target_key``).
        per_sample_loss_fn: ``fn(outputs, batch) -> [B]`` for algorithms that need per-sample losses; default with
            the default loss: each sample's cross-entropy of the logits, averaged over its labelled positions
            (``-100`` ignored; a causal language model's logits at ``t`` against the labels at ``t + 1``); with a
            given ``loss_fn``, that vectorized over samples (vmap).
    """

    input_key: int | str | None = None
    target_key: int | str | None = None
    loss_fn: LossFn | None = None
    per_sample_loss_fn: LossFn | None = None

    def __post_init__(self) -> None:
        for key in ("input_key", "target_key"):
            value = getattr(self, key)
            if value is not None:
                _set(self, **{key: validate.batch_key(_name("BatchLayout", key), value)})
        check_loss_signature(_name("BatchLayout", "loss_fn"), self.loss_fn)
        check_loss_signature(_name("BatchLayout", "per_sample_loss_fn"), self.per_sample_loss_fn)


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often the run writes checkpoints.

    Args:
        folder: where checkpoints go (``ep{epoch}-ba{batch}.pt`` and ``latest.pt``), a local path or a bucket's URL
            (``s3://bucket/run``: ``trainer.object_store``); None saves nothing. Temporary
            files an interrupted write left there are removed when the trainer is built.
        interval: how often to checkpoint (default ``'1ep'``); needs ``folder``.
        keep: how many of the newest checkpoints stay in ``folder``; -1 keeps all. Needs ``folder``.
        weights_only: checkpoints hold the parameters and buffers only (to start other runs from, not to resume
            this one). Needs ``folder``.
        metadata: plain values (strings, numbers, booleans, lists, dicts) stored in every checkpoint, read back by
            ``composer_fn.trainer.checkpoint.checkpoint_metadata``: how to rebuild the model, the data it took.
    """

    folder: str | os.PathLike[str] | None = None
    interval: str | int | Time | None = None
    keep: int = -1
    weights_only: bool = False
    metadata: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        folder = self.folder
        if folder is not None and not (isinstance(folder, str | os.PathLike) and str(folder)):
            raise ValueError(
                f"{_name('Checkpointing', 'folder')}={folder!r}: expected a folder path (or None to save nothing)"
            )
        keep = self.keep
        if not (validate.is_integer(keep) and (keep == -1 or keep >= 1)):
            raise ValueError(
                f"{_name('Checkpointing', 'keep')}={keep!r} must be an int >= 1, or -1 to keep every checkpoint"
            )
        weights_only = validate.flag(_name("Checkpointing", "weights_only"), self.weights_only)
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise TypeError(
                f"{_name('Checkpointing', 'metadata')}={self.metadata!r}: expected a mapping of plain values, e.g. "
                "{'model': 'resnet18'}"
            )
        metadata = plain_metadata(dict(self.metadata or {}), _name("Checkpointing", "metadata"))
        if folder is None:
            needing: tuple[tuple[str, object, bool], ...] = (
                ("interval", self.interval, self.interval is not None),
                ("keep", keep, keep != -1),
                ("weights_only", weights_only, weights_only),
            )
            for name, value, given in needing:
                if given:
                    shown = repr(str(value)) if isinstance(value, Time) else repr(value)
                    folder_name = _name("Checkpointing", "folder")
                    raise ValueError(
                        f"{_name('Checkpointing', name)}={shown} needs {folder_name}, which was not given (no checkpoint "
                        f"is written without it): pass {folder_name} or drop {_name('Checkpointing', name)}"
                    )
        interval = (
            epochs_or_batches(
                "1ep" if self.interval is None else self.interval, _name("Checkpointing", "interval"), "1ep"
            )
            if folder is not None
            else None
        )
        _set(
            self,
            folder=None if folder is None else folder if is_url(folder) else Path(local_path(folder)),
            interval=interval,
            keep=int(keep),
            weights_only=weights_only,
            metadata=metadata,
        )


@dataclass(frozen=True)
class Resume:
    """What the run starts from.

    Args:
        path: a checkpoint to resume from. Surgery algorithms (``Capabilities.rewrites``) the checkpoint records but
            the trainer was not given are re-applied, in the recorded order, before its tensors load. A checkpoint
            of a run with another ``max_duration`` resumes with a warning: the schedule's length changed.
        autoresume: resume from the newest checkpoint in the checkpointing folder when there is one (it takes
            precedence over ``path``, and loads the whole run even with ``weights_only``), else start from ``path``
            or fresh: rerunning an interrupted job continues it. Needs ``Checkpointing.folder``.
        weights_only: take only the parameters and buffers from ``path`` and start a new run (another optimizer or
            other algorithms allowed). Needs ``path``.
        strict: with ``weights_only``, whether every name must be in both the checkpoint and the model (False skips
            names in one only; shapes must always match). A load that would take no parameter at all is refused.
        ignore_keys: with ``weights_only``, ``fnmatch`` patterns of names not to load (``['head.*']``); each must
            match a name of the checkpoint or the model.
    """

    path: str | os.PathLike[str] | None = None
    autoresume: bool = False
    weights_only: bool = False
    strict: bool = True
    ignore_keys: Sequence[str] = ()

    def __post_init__(self) -> None:
        autoresume = validate.flag(_name("Resume", "autoresume"), self.autoresume)
        weights_only = validate.flag(_name("Resume", "weights_only"), self.weights_only)
        strict = validate.flag(_name("Resume", "strict"), self.strict)
        ignore = self.ignore_keys
        argument = _name("Resume", "ignore_keys")
        if isinstance(ignore, str) or not isinstance(ignore, Iterable):
            raise TypeError(f"{argument}={ignore!r}: expected a list of name patterns, e.g. ['head.*']")
        patterns = tuple(ignore)
        if not all(isinstance(pattern, str) for pattern in patterns):
            raise TypeError(f"{argument}={ignore!r}: expected a list of name patterns (strings)")
        path_name, weights_name = _name("Resume", "path"), _name("Resume", "weights_only")
        if weights_only and self.path is None:
            raise ValueError(
                f"{weights_name}=True needs {path_name}, the checkpoint to take the weights from, which was not given"
            )
        for option, setting, changed in ((argument, list(patterns), bool(patterns)), (_name("Resume", "strict"), strict, not strict)):
            if changed and not weights_only:
                raise ValueError(
                    f"{option}={setting!r} applies only with {weights_name}=True (a full resume from {path_name} "
                    f"loads every tensor strictly): pass {weights_name}=True or drop {option}"
                    if self.path is not None
                    else f"{option}={setting!r} applies only with {path_name} and {weights_name}=True, neither of "
                    f"which was given: pass both, or drop {option}"
                )
        _set(self, autoresume=autoresume, weights_only=weights_only, strict=strict, ignore_keys=patterns)


@dataclass(frozen=True)
class Reporting:
    """What the run tells and to whom.

    Args:
        callbacks: observers (``composer_fn.callbacks``), called at the run's events with read-only state. An eager
            run updates the state's tensors in place (the trainer owns them), so a callback that keeps a tensor past
            its call keeps a clone.
        loggers: metric destinations (``composer_fn.loggers``): each receives the training records every
            ``log_interval`` and every evaluation's metrics.
        log_interval: how often loggers and monitors receive a training record (default every 50 batches, as
            Lightning's and timm's: a record costs some 100-300 µs with TensorBoard, console and monitors on, so a
            much shorter interval shows on a fast step).
        progress_bar: show a progress bar of the run's steps on stderr (rank 0 only).
        profiler: a ``composer_fn.profiler.Profiler``: record steps with ``torch.profiler`` on its schedule, with the
            run's own markers, into a Chrome trace per process (``profile_traces`` lists them after ``fit``).
    """

    callbacks: Sequence[Callback] = ()
    loggers: Sequence[Logger] = ()
    log_interval: str | int | Time = "50ba"
    progress_bar: bool = True
    profiler: Profiler | None = None

    def __post_init__(self) -> None:
        if self.profiler is not None and not isinstance(self.profiler, Profiler):
            raise TypeError(
                f"{_name('Reporting', 'profiler')} of type {type(self.profiler).__name__}: expected a "
                "composer_fn.profiler.Profiler"
            )
        _set(
            self,
            callbacks=_instances(_name("Reporting", "callbacks"), self.callbacks, Callback),
            loggers=_instances(_name("Reporting", "loggers"), self.loggers, Logger),
            log_interval=epochs_or_batches(self.log_interval, _name("Reporting", "log_interval"), "1ep"),
            progress_bar=validate.flag(_name("Reporting", "progress_bar"), self.progress_bar),
        )


_RECORDS: dict[str, type[Any]] = {
    "execution": Execution,
    "layout": BatchLayout,
    "checkpointing": Checkpointing,
    "resume": Resume,
    "reporting": Reporting,
}
"""The Trainer's record arguments by name."""

COMPOSER_NAMES: Mapping[str, tuple[str, str]] = {
    "device": ("execution", "device"),
    "precision": ("execution", "precision"),
    "compile": ("execution", "compile"),
    "grad_mode": ("execution", "grad_mode"),
    "device_train_microbatch_size": ("execution", "microbatch_size"),
    "dist_timeout": ("execution", "dist_timeout"),
    "parallelism": ("execution", "parallelism"),
    "input_key": ("layout", "input_key"),
    "target_key": ("layout", "target_key"),
    "loss_fn": ("layout", "loss_fn"),
    "per_sample_loss_fn": ("layout", "per_sample_loss_fn"),
    "save_folder": ("checkpointing", "folder"),
    "save_interval": ("checkpointing", "interval"),
    "save_num_checkpoints_to_keep": ("checkpointing", "keep"),
    "save_weights_only": ("checkpointing", "weights_only"),
    "save_metadata": ("checkpointing", "metadata"),
    "load_path": ("resume", "path"),
    "autoresume": ("resume", "autoresume"),
    "load_weights_only": ("resume", "weights_only"),
    "load_strict_model_weights": ("resume", "strict"),
    "load_ignore_keys": ("resume", "ignore_keys"),
    "callbacks": ("reporting", "callbacks"),
    "loggers": ("reporting", "loggers"),
    "log_interval": ("reporting", "log_interval"),
    "progress_bar": ("reporting", "progress_bar"),
    "profiler": ("reporting", "profiler"),
}
"""Each flat Trainer argument (Composer's names) to the record argument and field it sets."""


@dataclass(frozen=True)
class Options:
    """The Trainer's five records, built and checked together (``options_from``)."""

    execution: Execution = field(default_factory=Execution)
    layout: BatchLayout = field(default_factory=BatchLayout)
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    resume: Resume = field(default_factory=Resume)
    reporting: Reporting = field(default_factory=Reporting)
    given_as_records: frozenset[str] = frozenset()
    """The records the caller passed as records (``'checkpointing'``, ...), not as flat names or defaults."""

    def spelled(self, flat_name: str) -> str:
        """Returns how errors name the setting of the flat argument ``flat_name``: that name, or ``Record.field``
        where the caller passed its record."""
        record, fld = COMPOSER_NAMES[flat_name]
        return f"{_RECORDS[record].__name__}.{fld}" if record in self.given_as_records else flat_name


def options_from(records: Mapping[str, Any], flat: Mapping[str, Any]) -> Options:
    """Returns the records given (``records``: the Trainer's ``execution=``, ``layout=``, ... , None where not
    given), with the flat arguments in ``flat`` (``COMPOSER_NAMES``) set on them, checked together.

    A flat name outside the table is refused as Python refuses an unknown keyword, with the nearest names; a flat
    argument and a record that both set one field are refused naming both.
    """
    for name, value in records.items():
        kind = _RECORDS[name]
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name}={value!r}: expected a composer_fn.trainer.{kind.__name__} record or None")
    for name in flat:
        if name not in COMPOSER_NAMES:
            near = difflib.get_close_matches(name, [*COMPOSER_NAMES, *_RECORDS], n=1)
            raise TypeError(
                f"Trainer() got an unexpected keyword argument {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
            )
    built = {}
    for record_name, kind in _RECORDS.items():
        given = {COMPOSER_NAMES[name][1]: value for name, value in flat.items() if COMPOSER_NAMES[name][0] == record_name}
        record = records.get(record_name)
        if not given:
            built[record_name] = record if record is not None else kind()
            continue
        if record is not None:
            flat_names = sorted(name for name in flat if COMPOSER_NAMES[name][0] == record_name)
            raise TypeError(
                f"{record_name}={kind.__name__}(...) and {', '.join(flat_names)} both set the run's {record_name}: "
                f"pass the record alone (e.g. {kind.__name__}({COMPOSER_NAMES[flat_names[0]][1]}=...)) or the flat "
                "arguments alone"
            )
        # The record's whole check runs under the caller's flat names (its defaults never fail it).
        with _spelled(_defaults_spelled(record_name)):
            built[record_name] = kind(**given)
    options = Options(**built, given_as_records=frozenset(name for name, value in records.items() if value is not None))
    flat_records = {COMPOSER_NAMES[name][0] for name in flat}
    _check_together(options, {name for name, value in records.items() if value is not None}, flat_records)
    return options


def _defaults_spelled(record_name: str) -> dict[str, str]:
    # The flat spelling of every field of a record built from flat names, so that an error about a field the caller
    # left at its default (``save_folder`` when ``save_interval`` needs it) names it as they would write it.
    kind = _RECORDS[record_name]
    return {f"{kind.__name__}.{fld}": flat for flat, (record, fld) in COMPOSER_NAMES.items() if record == record_name}


def _check_together(options: Options, as_records: set[str], as_flat: set[str]) -> None:
    # What one record needs of another: autoresume reads the checkpointing folder, which must hold full checkpoints.
    # A setting is named as its record was given (flat or as a record); one left at its default, as the resume was.
    def spelled(flat_name: str) -> str:
        record, fld = COMPOSER_NAMES[flat_name]
        as_record = record in as_records or (record not in as_flat and "resume" in as_records)
        return f"{_RECORDS[record].__name__}.{fld}" if as_record else flat_name

    autoresume, folder, weights_only = spelled("autoresume"), spelled("save_folder"), spelled("save_weights_only")
    if options.resume.autoresume and options.checkpointing.folder is None:
        raise ValueError(f"{autoresume}=True needs a {folder} to resume from; pass {folder}=...")
    if options.resume.autoresume and options.checkpointing.weights_only:
        raise ValueError(
            f"{autoresume}=True resumes from full checkpoints, but {weights_only}=True saves weights only; drop one of them"
        )
