"""The Algorithm contract: a frozen record of hyperparameters plus pure hooks keyed by event.

An algorithm keeps no state on itself: what it carries between steps lives in ``State.algos[name]`` (created by
``init``), what it carries between the events of one step in ``StepCtx.scratch[name]``. Traced hooks are pure
tensor code (no ``.item()``, no Python branching on tensor values, randomness only from ``ctx.key``); host hooks
run between steps on Python values. ``requires`` and ``capabilities()`` declare, as data, what the trainer
must provide and what the algorithm does besides its hooks; ``changes_nothing()`` and ``changes_nothing_in()``
declare when its settings, or its settings in a run of a given length, make it change nothing, and a host hook
that finds so on the run (at INIT, at the first batch) warns with ``ChangesNothing``. How the contract suite
checks an algorithm is not part of the record: see ``composer_fn.testing.settings``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from composer_fn.core._user_line import warn_at_user
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp

__all__ = [
    "no_change",
    "Algorithm",
    "Capabilities",
    "ChangesNothing",
    "UnfitForTheRun",
    "Hook",
    "HostHook",
    "REGISTRY",
    "REQUIREMENTS",
    "register",
    "algorithm_from_config",
    "algorithms_from_json",
    "algorithms_to_json",
]

Hook = Callable[[State, StepCtx], tuple[State, StepCtx]]
HostHook = Callable[[Static, State, Timestamp, BatchMeta | None], tuple[Static, State]]

REQUIREMENTS: frozenset[str] = frozenset({"per_sample_loss", "extra_forward", "loss_closure", "train_data"})
"""What an algorithm may ask of the trainer in ``requires``."""

REGISTRY: dict[str, type[Algorithm]] = {}
"""Every registered algorithm class by its name; the contract suite walks it."""

_A = TypeVar("_A", bound="type[Algorithm]")


_NAMES: dict[type, str] = {}


def _registered_name(cls: type[Algorithm]) -> str:
    # Read on every make_plan call; the regular expression runs once per class.
    name = _NAMES.get(cls)
    if name is None:
        name = cls.algorithm_name or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", cls.__name__).lower()
        _NAMES[cls] = name
    return name


@dataclass(frozen=True)
class Capabilities:
    """What an algorithm does besides its hooks; every field off by default."""

    input_range: tuple[float, float] | None = None
    """The range floating-point inputs must lie in (``(0.0, 1.0)``: pixels before normalisation), or None."""

    interpolates_loss: bool = False
    """Whether it replaces the loss by an interpolation of two losses (two such algorithms get a warning)."""

    rewrites: Callable[[Any], frozenset[str]] | None = None
    """Model surgery: ``rewrites(module)`` names the submodules it replaces at INIT. Two algorithms claiming one
    submodule are refused before training (unless one names the other in ``rewrites_after``); a checkpoint
    re-applies the surgery before loading."""

    rewrites_after: frozenset[str] = frozenset()
    """Surgery that composes: the names of surgeries that may claim the same submodules, whose results this one
    rewrites (SqueezeExcite wraps the convolution of BlurPool's blurred layer). The default passes run it after
    them at INIT, whichever order they were given in, so the model comes out the same."""

    freezes: Callable[[Any, Timestamp], frozenset[str]] | None = None
    """Layer freezing: ``freezes(module, timestamp)`` names the parameters that get neither gradient nor update
    in the step starting at ``timestamp`` (host-only; each distinct set builds its own step)."""

    lr_multiplier: Callable[..., Any] | None = None
    """``lr_multiplier(schedule, steps_per_epoch=, max_steps=)`` returns the learning-rate multiplier to train
    with instead of the run's ``schedule`` (a function of the step count); folded once, when training starts."""

    stops: Callable[[Any, Mapping[str, float], str, Timestamp], tuple[Any, bool]] | None = None
    """Stopping: ``stops(entry, metrics, where, timestamp)`` reads the run's metrics at a log step (``where='train'``)
    or after an evaluator measured (``where`` its label) and its ``State.algos`` entry; returns the new entry and
    whether the run ends there. ``watches``: the evaluator label the rule reads (checked against the run's)."""
    watches: str | None = None
    checks_logged: Callable[[Mapping[str, tuple[float, float]]], None] | None = None
    """With ``stops``: ``checks_logged(logged)`` is called when the trainer is built, with the names of the metrics
    the run logs where the rule reads (``watches``; ``fnmatch`` patterns allowed), each with the range its values
    can take; it raises ValueError when the rule's metric is not among them or no value in its range can stop."""
    checks_length: Callable[[int, int], None] | None = None
    """``checks_length(max_steps, steps_per_epoch)`` is called when the trainer is built, with the run's length in
    steps; it warns when the algorithm can never act in a run that long (a stopping rule that can never end it,
    a weight average that never takes in two sets of weights)."""

    unshardable: Callable[[Any], str | None] | None = None
    """``unshardable(module)`` says why a sharded run (``FSDP``) of ``module`` cannot run the algorithm as it is
    set, or None when it can; a sharded run is refused before its first step, with that reason, otherwise."""


_NONE = Capabilities()


class ChangesNothing(UserWarning):
    """The warning of an algorithm that finds on the run (at INIT, at the first batch, at the run's length) that it
    changes nothing there: a surgery that finds no layer to rewrite, a check that the first batch is too small.

    ``algorithm`` is the class name of the algorithm it is about (``"GhostBatchNorm"``); the trainer names the
    algorithms these warnings are about in ``Trainer.no_effect``, whatever the message says.
    """

    def __init__(self, message: str, algorithm: str) -> None:
        super().__init__(message)
        self.algorithm = algorithm


class UnfitForTheRun(UserWarning):
    """The warning of an algorithm whose setting outlasts the run it is in, so that it acts against it or not at
    all (an average whose half-life is longer than the run, a stopping threshold that only a perfect score
    reaches, a warm-up longer than the run); the message names the value that would act.

    ``name`` is the class name of the algorithm or learning-rate schedule it is about (``"EMA"``).
    """

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class _Record(type):
    """The class of algorithm records: a record whose settings make it change nothing warns when it is built (by a
    call, ``dataclasses.replace`` or ``algorithm_from_config``), once its fields are checked, at the user's line."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        record = super().__call__(*args, **kwargs)
        reason = record.changes_nothing()
        if reason is not None:
            warn_at_user(reason)
        return record


@dataclass(frozen=True)
class Algorithm(metaclass=_Record):
    """Base record of every algorithm. Subclasses are frozen dataclasses whose fields are hyperparameters."""

    algorithm_name: ClassVar[str | None] = None
    """The registered name; the snake-case class name when not given (``MixUp`` sets ``"mixup"``)."""

    placement: ClassVar[Literal["any", "first", "last"]] = "any"
    """Where the default passes put it among the algorithms of an event."""

    requires: ClassVar[frozenset[str]] = frozenset()
    """What the trainer must provide, a subset of ``REQUIREMENTS``."""

    checks_at: ClassVar[frozenset[Event]] = frozenset()
    """Events whose host hook only checks the run (and may refuse it), changing nothing: the algorithm does not act
    there, so the run's records of when algorithms switch on and off leave those events out."""

    @property
    def name(self) -> str:
        """Returns the key of this algorithm's entry in ``State.algos``, in ``StepCtx.scratch`` and in traces."""
        return _registered_name(type(self))

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        """Returns whether the hook for ``event`` runs at ``timestamp`` (only asked for events it hooks)."""
        return True

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        """Returns any shape-affecting choice for the batch starting at ``timestamp``; a new value compiles anew."""
        return ()

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        """Returns the pure tensor hooks by traced event, specialised to ``plan_key`` (what ``plan_key`` gave)."""
        return {}

    def host_hooks(self) -> Mapping[Event, HostHook]:
        """Returns the host hooks by host event."""
        return {}

    def init(self, static: Static, state: State) -> Any:
        """Returns the initial entry of ``State.algos[self.name]`` (None when the algorithm needs none)."""
        return None

    def changes_nothing(self) -> str | None:
        """Returns why this record's settings make it change nothing in any run (``MixUp(alpha=0)``), or None.

        The reason is a sentence naming the setting and what to use instead; the record warns with it when it is
        built, and the trainer names the algorithm in ``no_effect``.
        """
        return None

    def changes_nothing_in(self, max_steps: int, steps_per_epoch: int) -> str | None:
        """Returns why it changes nothing in a run of ``max_steps`` steps of ``steps_per_epoch`` each although its
        settings alone would not (a stopping rule that can never end a run that short), or None."""
        return None

    def capabilities(self) -> Capabilities:
        """Returns what it does besides its hooks (surgery, freezing, a learning-rate multiplier, input range)."""
        return _NONE

    def to_config(self) -> dict[str, Any]:
        """Returns a JSON-serializable description that ``algorithm_from_config`` turns back into ``self``."""
        values = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {"algorithm": self.name, "hparams": values}


def no_change(name: str, settings: str, why: str, instead: str) -> str:
    """Returns the sentence ``changes_nothing`` gives for the record of class ``name`` whose ``settings`` make it change
    nothing: ``"{name}({settings}) changes nothing: {why}; use {instead} or leave {name} out"``."""
    return f"{name}({settings}) changes nothing: {why}; use {instead} or leave {name} out"


def _jsonable(value: Any) -> Any:
    if isinstance(value, Event):
        return value.value
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return _python_number(value)


def _python_number(value: Any) -> Any:
    """Returns a NumPy scalar as the Python number of the same value (tuples element-wise); anything else as is."""
    if isinstance(value, numbers.Number) and type(value).__module__ == "numpy":
        return value.item()  # type: ignore[attr-defined]
    if type(value) is tuple and any(isinstance(v, numbers.Number) and type(v).__module__ == "numpy" for v in value):
        return tuple(_python_number(v) for v in value)
    return value


def _with_python_numbers(init: Callable[..., None]) -> Callable[..., None]:
    """Wraps a registered algorithm's ``__init__`` so that its fields hold Python numbers where NumPy scalars were
    given (``MixUp(alpha=np.float32(0.2))`` holds ``float`` 0.2000000029802322): records compare, hash and serialize
    the same whichever kind of number the user passed."""

    @functools.wraps(init)
    def __init__(self: Algorithm, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            converted = _python_number(value)
            if converted is not value:
                object.__setattr__(self, field.name, converted)

    return __init__


def register(cls: _A) -> _A:
    """Returns ``cls`` after adding it to ``REGISTRY`` under its name (a class decorator)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} must be a frozen dataclass to be registered as an algorithm")
    unknown = cls.requires - REQUIREMENTS
    if unknown:
        raise ValueError(f"{cls.__name__}.requires holds {sorted(unknown)}; accepted: {sorted(REQUIREMENTS)}")
    name = _registered_name(cls)
    if name in REGISTRY and REGISTRY[name] is not cls:
        raise ValueError(f"an algorithm named {name!r} is already registered ({REGISTRY[name].__qualname__})")
    if not getattr(cls.__init__, "_python_numbers", False):
        init = _with_python_numbers(cls.__init__)
        init._python_numbers = True  # type: ignore[attr-defined]
        cls.__init__ = init  # type: ignore[method-assign]
    REGISTRY[name] = cls
    return cls


def algorithm_from_config(config: Mapping[str, Any]) -> Algorithm:
    """Returns the algorithm described by ``config`` (the output of ``Algorithm.to_config``)."""
    name = config.get("algorithm")
    if name not in REGISTRY:
        registered = ", ".join(sorted(REGISTRY)) or "none yet (import composer_fn.algorithms to register the built-in ones)"
        raise ValueError(f"unknown algorithm {name!r}; registered: {registered}")
    cls = REGISTRY[name]
    hparams = dict(config.get("hparams", {}))
    field_types = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in hparams.items():
        if key in field_types and isinstance(value, list):
            hparams[key] = tuple(value)
    return cls(**hparams)


def algorithms_to_json(algorithms: tuple[Algorithm, ...] | list[Algorithm]) -> str:
    """Returns the algorithms' configs as one JSON string (stored in checkpoints)."""
    return json.dumps([a.to_config() for a in algorithms], sort_keys=True)


def algorithms_from_json(text: str) -> tuple[Algorithm, ...]:
    """Returns the algorithms that ``algorithms_to_json`` wrote."""
    return tuple(algorithm_from_config(c) for c in json.loads(text))
