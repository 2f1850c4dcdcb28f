"""The Algorithm contract: a frozen record of hyperparameters plus pure hooks keyed by event.

An algorithm keeps no state on itself. Whatever it must carry between steps lives in ``State.algos[name]``
(created by ``init``); whatever it carries between the events of one step lives in ``StepCtx.scratch[name]``.

- ``traced_hooks()`` maps traced events to ``(State, StepCtx) -> (State, StepCtx)``: pure tensor code, no
  ``.item()``, no Python branching on tensor values, randomness only from ``ctx.key``.
- ``host_hooks()`` maps host events to ``(Static, State, Timestamp, BatchMeta | None) -> (Static, State)``:
  surgery, schedules written into ``hparams``, parameters sampled on the host.
- ``match(event, timestamp)`` decides from Python values *whether* a hook runs at that time.
- ``plan_key(timestamp, meta)`` names any shape-affecting choice (an image size, a sequence length); the engine
  resolves the traced hooks for it with ``traced_hooks_at(plan_key)``, so a hook can bind it as a Python value,
  and each distinct value compiles one step.
- ``requires`` declares what the trainer must provide (e.g. ``"per_sample_loss"``), as data.
- ``rewrites_model`` and ``surgery_targets(module)`` describe model surgery: which submodules a rewrite at INIT
  replaces, so conflicting surgeries are refused before training, and checkpoints re-apply surgeries first.
- ``modality`` says what batches the algorithm transforms (``"image"`` or ``"tokens"``), so the contract
  suite builds a matching set-up; ``input_range`` says what values it expects of floating-point inputs, so
  the trainer can refuse a batch it would silently mangle.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp

__all__ = [
    "Algorithm",
    "Hook",
    "HostHook",
    "REGISTRY",
    "REQUIREMENTS",
    "MODALITIES",
    "register",
    "algorithm_from_config",
    "algorithms_from_json",
    "algorithms_to_json",
]

Hook = Callable[[State, StepCtx], tuple[State, StepCtx]]
HostHook = Callable[[Static, State, Timestamp, BatchMeta | None], tuple[Static, State]]

REQUIREMENTS: frozenset[str] = frozenset({"per_sample_loss", "extra_forward", "loss_closure", "train_data"})
"""What an algorithm may ask of the trainer in ``requires``."""

MODALITIES: tuple[str, ...] = ("image", "tokens")
"""The kinds of batch an algorithm may declare in ``modality``."""

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
class Algorithm:
    """Base record of every algorithm. Subclasses are frozen dataclasses whose fields are hyperparameters."""

    placement: ClassVar[Literal["any", "first", "last"]] = "any"
    """Where the default passes put it among the algorithms of an event."""

    requires: ClassVar[frozenset[str]] = frozenset()
    """What the trainer must provide, a subset of ``REQUIREMENTS``."""

    algorithm_name: ClassVar[str | None] = None
    """The registered name; the snake-case class name when not given (``MixUp`` sets ``"mixup"``)."""

    modality: ClassVar[str] = "image"
    """What batches it works on: ``"image"`` (``[B, C, H, W]`` inputs, class targets) or ``"tokens"``."""

    input_range: ClassVar[tuple[float, float] | None] = None
    """The range floating-point inputs must lie in (``(0.0, 1.0)``: pixels before normalisation), or None."""

    rewrites_model: ClassVar[bool] = False
    """Whether it rewrites the model's structure (model surgery): a checkpoint re-applies it before loading."""

    @classmethod
    def for_checks(cls) -> Algorithm:
        """Returns an instance whose hooks all act within a three-batch run, for the contract suite.

        The defaults where they do (most algorithms); an algorithm whose defaults wait for a later time, or
        need larger layers than the suite's small models, returns hyperparameters that make it act.
        """
        return cls()

    @classmethod
    def check_model(cls) -> Any:
        """Returns the model the contract suite checks it on (images ``[B, 3, 8, 8]``, 4 classes), or None.

        None (most algorithms) means the suite's model for its modality; a surgery on layers that model lacks
        (GroupNorm, dropout) returns one that has them.
        """
        return None

    @property
    def name(self) -> str:
        """Returns the key of this algorithm's entry in ``State.algos`` and in traces."""
        return _registered_name(type(self))

    @property
    def stochastic(self) -> bool:
        """Returns whether its effect depends on the random key (the contract suite checks either way)."""
        return False

    @property
    def interpolates_loss(self) -> bool:
        """Returns whether the algorithm replaces the loss by an interpolation of two losses."""
        return bool(getattr(self, "interpolate_loss", False))

    def traced_hooks(self) -> Mapping[Event, Hook]:
        """Returns the pure tensor hooks by traced event."""
        return {}

    def host_hooks(self) -> Mapping[Event, HostHook]:
        """Returns the host hooks by host event."""
        return {}

    def events(self) -> frozenset[Event]:
        """Returns every event this algorithm has a hook for."""
        return frozenset(self.traced_hooks()) | frozenset(self.host_hooks())

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        """Returns whether the hook for ``event`` runs at ``timestamp`` (only asked for events it hooks)."""
        return True

    def plan_key(self, timestamp: Timestamp, meta: BatchMeta | None = None) -> Hashable:
        """Returns any shape-affecting choice at ``timestamp`` for the coming batch; a new value compiles a new step.

        ``meta`` describes the coming batch when the caller knows it (the trainer always does).
        """
        return ()

    def traced_hooks_at(self, plan_key: Hashable) -> Mapping[Event, Hook]:
        """Returns the traced hooks specialised to ``plan_key`` (the value ``plan_key()`` returned)."""
        return self.traced_hooks()

    def surgery_targets(self, module: Any) -> frozenset[str]:
        """Returns the qualified names of the submodules of ``module`` this algorithm replaces (model surgery).

        Two algorithms that claim the same submodule are refused when the trainer is built.
        """
        return frozenset()

    def frozen_parameters(self, module: Any, timestamp: Timestamp) -> frozenset[str]:
        """Returns the names of ``module``'s parameters that get neither gradient nor update in the coming step.

        Layer freezing: the step computes no gradient for them and leaves them and their optimizer state as
        they are. Host-only, from the structure and the timestamp before the batch; each distinct set builds
        (and compiles) its own step.
        """
        return frozenset()

    def lr_multiplier(self, schedule: Any, *, steps_per_epoch: int, max_steps: int) -> Any:
        """Returns the learning-rate multiplier to train with, given the run's (a function of the step count).

        The trainer folds every algorithm's ``lr_multiplier`` over its schedule once, when it is built; most
        algorithms return ``schedule`` itself.
        """
        return schedule

    def init(self, static: Static, state: State) -> Any:
        """Returns the initial entry of ``State.algos[self.name]`` (None when the algorithm needs none)."""
        return None

    def to_config(self) -> dict[str, Any]:
        """Returns a JSON-serializable description that ``algorithm_from_config`` turns back into ``self``."""
        values = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {"algorithm": self.name, "hparams": values}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Event):
        return value.value
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def register(cls: _A) -> _A:
    """Returns ``cls`` after adding it to ``REGISTRY`` under its name (a class decorator)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} must be a frozen dataclass to be registered as an algorithm")
    if cls.modality not in MODALITIES:
        raise ValueError(f"{cls.__name__}.modality={cls.modality!r}; accepted: {', '.join(MODALITIES)}")
    unknown = cls.requires - REQUIREMENTS
    if unknown:
        raise ValueError(f"{cls.__name__}.requires holds {sorted(unknown)}; accepted: {sorted(REQUIREMENTS)}")
    name = _registered_name(cls)
    if name in REGISTRY and REGISTRY[name] is not cls:
        raise ValueError(f"an algorithm named {name!r} is already registered ({REGISTRY[name].__qualname__})")
    REGISTRY[name] = cls
    return cls


def algorithm_from_config(config: Mapping[str, Any]) -> Algorithm:
    """Returns the algorithm described by ``config`` (the output of ``Algorithm.to_config``)."""
    name = config.get("algorithm")
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(sorted(REGISTRY))}")
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
