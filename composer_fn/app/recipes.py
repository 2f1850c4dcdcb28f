"""Recipe files: a run of ``composer-fn train`` (or its ``plan``) written as TOML.

A recipe's top-level fields are the command's flags, spelled with underscores (``max_duration = "12ep"``,
``batch_size = 64``, ``precision = "bf16-mixed"``, ``save_folder``, ``load_path``, ``log_file``, ...); a flag
given on the command line overrides the field. Four tables say what flags cannot:

- ``[algorithms.<name>]``, one per algorithm, in order, with its hyperparameters (``[algorithms.mixup]
  alpha = 0.2``); ``--algorithms`` replaces the whole list, with default hyperparameters.
- ``[optimizer]``: ``name`` (``sgd``, ``sgdw``, ``adam``, ``adamw``, ``decoupled_adamw``) and its arguments;
  ``--lr`` overrides ``learning_rate``.
- ``[schedule]``: ``name`` (``cosine_warmup``, ``linear_warmup``, ``constant``, ...) and its arguments.
- ``[loggers]``: ``tensorboard = "<folder>"`` and ``console = true``; the experiment trackers as tables of
  their logger's arguments: ``wandb = {project = "digits", mode = "offline"}`` (``WandBLogger``: ``project``,
  ``name``, ``entity``, ``group``, ``tags``, ``mode``, ``dir``, ``run_id_file``, ``log_artifacts``) and
  ``mlflow = {tracking_uri = "sqlite:///runs/mlflow.db", experiment_name = "digits"}`` (``MLFlowLogger``:
  ``experiment_name``, ``run_name``, ``tracking_uri``, ``tags``, ``artifact_location``, ``run_id_file``,
  ``log_artifacts``); a tracker given no ``run_id_file`` keeps its run's id in the save folder
  (``<save_folder>/wandb-run-id``, ``<save_folder>/mlflow-run-id``), so that ``--autoresume`` continues the
  tracker's run. And ``callbacks``, a list among ``speed``, ``lr``, ``memory``, ``runtime``, ``system``, ``nan``
  and ``optimizer``.
- ``[execution]``, ``[checkpointing]``, ``[resume]`` and ``[reporting]``: the Trainer's option records
  (``composer_fn.trainer.Execution``, ...), whose fields are the flags they stand for: ``[execution]``
  ``precision``, ``compile``, ``microbatch_size``, ``dist_timeout``; ``[checkpointing]`` ``folder``,
  ``interval``; ``[resume]`` ``path``, ``autoresume``; ``[reporting]`` ``log_interval``, ``progress_bar``.
  A setting given both in a table and as a top-level field is an error.
- ``[evaluators.<label>]``, evaluators of the task's held-out set: ``metrics`` (a list among ``accuracy``,
  ``f1``, ``precision``, ``recall``, macro-averaged; none: the exact accuracy and loss), ``subset_num_batches``,
  ``eval_interval``. Without the table, the held-out set is the evaluator ``eval``: ``eval/eval/accuracy`` and
  ``eval/eval/loss``.

A recipe may build on another: ``base = "baseline.toml"`` (a path relative to the recipe's own file) reads that
recipe first, then this one over it: a field given here replaces the base's, and tables merge key by key
(``[algorithms.ema]`` adds EMA after the base's algorithms, ``[optimizer] learning_rate = 0.2`` changes only the
learning rate). Bases may have bases; a loop is an error.

``deepspeed = "ds_config.json"`` (a path relative to the recipe's own file, as ``base``) is ``--deepspeed``: a
DeepSpeed JSON config whose ZeRO stage, precision, gradient clipping and batch keys set the run's
(``composer_fn.trainer.deepspeed``).

An unknown field or a bad value is an error that names the file, the field and what is accepted.

On the command line, ``--set FIELD=VALUE`` sets any field of the recipe, a table's by its dotted path
(``--set algorithms.ema.half_life=50ba``, ``--set optimizer.name=adamw``, ``--set schedule.t_warmup=0.1dur``,
``--set loggers.tensorboard=runs/tb``, ``--set callbacks='["speed", "lr"]'``); the value is read as a TOML value,
and as text where it is not one (``50ba``). ``--set algorithms.ema={}`` adds an algorithm with its defaults.
``--algorithms 'ema(half_life=50ba),mixup(alpha=0.2)'`` names the whole list with hyperparameters the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composer_fn.app._toml import read_toml

if TYPE_CHECKING:
    from composer_fn.callbacks import Callback
    from composer_fn.core.algorithm import Algorithm
    from composer_fn.loggers import Logger
    from composer_fn.optim import GradientTransformation

__all__ = [
    "Recipe",
    "load_recipe",
    "recipe_fields",
    "parse_setting",
    "parse_algorithm_list",
    "setting_value",
    "OPTIMIZERS",
    "SCHEDULES",
    "CALLBACKS",
    "TRACKERS",
]

OPTIMIZERS = ("sgd", "sgdw", "adam", "adamw", "decoupled_adamw")
SCHEDULES = {
    "constant": "ConstantScheduler",
    "linear": "LinearScheduler",
    "cosine": "CosineAnnealingScheduler",
    "constant_warmup": "ConstantWithWarmupScheduler",
    "linear_warmup": "LinearWithWarmupScheduler",
    "cosine_warmup": "CosineAnnealingWithWarmupScheduler",
    "step": "StepScheduler",
    "multistep": "MultiStepScheduler",
    "exponential": "ExponentialScheduler",
    "polynomial": "PolynomialScheduler",
}
CALLBACKS = ("speed", "lr", "memory", "runtime", "system", "nan", "optimizer")
TRACKERS = {
    "wandb": ("WandBLogger", '{project = "digits", mode = "offline"}'),
    "mlflow": ("MLFlowLogger", '{tracking_uri = "sqlite:///runs/mlflow.db", experiment_name = "digits"}'),
}
"""The experiment trackers a ``[loggers]`` table may name, with the logger each builds and an example table."""
_TABLES = ("algorithms", "optimizer", "schedule", "loggers", "evaluators")
RECORD_TABLES: Mapping[str, Mapping[str, str]] = {
    "execution": {"precision": "precision", "compile": "compile", "microbatch_size": "microbatch_size", "dist_timeout": "dist_timeout"},
    "checkpointing": {"folder": "save_folder", "interval": "save_interval"},
    "resume": {"path": "load_path", "autoresume": "autoresume"},
    "reporting": {"log_interval": "log_interval", "progress_bar": "no_progress"},
}
"""Each record table's fields to the flag each stands for (``progress_bar`` is the negation of ``no_progress``)."""
METRICS = ("accuracy", "f1", "precision", "recall")


class RecipeError(ValueError):
    """A recipe file that cannot be read: the message names the file, the field and what is accepted."""


@dataclass(frozen=True)
class Recipe:
    """A recipe file's fields: ``flags`` (by flag name, as the command line would give them) and its tables."""

    path: Path
    flags: Mapping[str, Any]
    algorithms: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    optimizer: Mapping[str, Any] = field(default_factory=dict)
    schedule: Mapping[str, Any] = field(default_factory=dict)
    loggers: Mapping[str, Any] = field(default_factory=dict)
    callbacks: tuple[str, ...] = ()
    evaluators: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    def error(self, name: str, message: str) -> RecipeError:
        """Returns the error for field ``name`` of this file."""
        return RecipeError(f"{self.path}: field {name}: {message}")

    def build_algorithms(self) -> tuple[Algorithm, ...]:
        """Returns the ``[algorithms.*]`` tables as algorithms, in the file's order."""
        import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
        from composer_fn.app.catalog import options_of
        from composer_fn.core.algorithm import REGISTRY

        built = []
        for name, arguments in self.algorithms:
            if name not in REGISTRY:
                raise self.error(f"algorithms.{name}", f"unknown algorithm; accepted: {', '.join(sorted(REGISTRY))}")
            options = options_of(REGISTRY[name])
            unknown = [key for key in arguments if key not in {option.name for option in options}]
            if unknown:
                accepted = ", ".join(f"{o.name} (default {o.default_text()})" for o in options) or "none"
                raise self.error(f"algorithms.{name}", f"unknown hyperparameter {unknown[0]!r}; accepted: {accepted}")
            built.append(self._call(f"algorithms.{name}", REGISTRY[name], arguments))
        return tuple(built)

    def build_optimizer(self, defaults: Mapping[str, Any], learning_rate: float | None) -> GradientTransformation:
        """Returns the ``[optimizer]`` table's optimizer; without one, ``defaults`` (``name`` and arguments). A table
        without ``name`` changes the defaults' arguments (``--set optimizer.momentum=0.8``); one naming an optimizer
        stands alone, taking the defaults' learning rate when it gives none. ``learning_rate`` (``--lr``), when
        given, overrides the table's."""
        from composer_fn import optim

        table = _over_defaults(self.optimizer, defaults, ("learning_rate",))
        name = table.pop("name", "sgd")
        if name not in OPTIMIZERS:
            raise self.error("optimizer.name", f"{name!r} is not an optimizer; accepted: {', '.join(OPTIMIZERS)}")
        if learning_rate is not None:
            table["learning_rate"] = learning_rate
        return self._call("optimizer", getattr(optim, name), table)

    def build_schedule(self, defaults: Mapping[str, Any]) -> Any:
        """Returns the ``[schedule]`` table's schedule; without one, ``defaults`` (``name`` and arguments). A table
        without ``name`` changes the defaults' arguments (``--set schedule.t_warmup=0.2dur``)."""
        from composer_fn.optim import schedules

        table = _over_defaults(self.schedule, defaults, ())
        name = table.pop("name", "constant")
        if name not in SCHEDULES:
            raise self.error("schedule.name", f"{name!r} is not a schedule; accepted: {', '.join(SCHEDULES)}")
        return self._call("schedule", getattr(schedules, SCHEDULES[name]), table)

    def build_loggers(self, save_folder: str | os.PathLike[str] | None = None) -> list[Logger]:
        """Returns the ``[loggers]`` table's loggers (the log file is a flag, ``log_file``); a tracker's table
        without ``run_id_file`` keeps its run's id in ``save_folder`` (``wandb-run-id``, ``mlflow-run-id``), when
        given, so that a resumed run continues the tracker's run."""
        from composer_fn.loggers import ConsoleLogger, TensorBoardLogger

        unknown = sorted(set(self.loggers) - {"tensorboard", "console", *TRACKERS})
        if unknown:
            raise self.error(
                f"loggers.{unknown[0]}",
                "unknown logger; accepted: tensorboard (a folder), console (true), wandb and mlflow (tables of the "
                "logger's arguments)",
            )
        loggers: list[Logger] = []
        folder = self.loggers.get("tensorboard")
        if folder is not None:
            if not isinstance(folder, str) or not folder:
                raise self.error("loggers.tensorboard", f"{folder!r}: expected a folder, e.g. \"runs/tb/digits\"")
            loggers.append(self._call("loggers.tensorboard", TensorBoardLogger, {"log_dir": folder}))
        console = self.loggers.get("console", False)
        if not isinstance(console, bool):
            raise self.error("loggers.console", f"{console!r}: expected true or false")
        if console:
            loggers.append(ConsoleLogger())
        for name, (class_name, example) in TRACKERS.items():
            if name in self.loggers:
                loggers.append(self._tracker(name, class_name, example, save_folder))
        return loggers

    def _tracker(self, name: str, class_name: str, example: str, save_folder: str | os.PathLike[str] | None) -> Logger:
        import composer_fn.loggers

        table = self.loggers[name]
        if not isinstance(table, dict):
            raise self.error(f"loggers.{name}", f"{table!r}: expected a table of {class_name}'s arguments, e.g. {example}")
        arguments = dict(table)
        if "run_id_file" not in arguments and save_folder is not None:
            from composer_fn.trainer.object_store import is_url

            if is_url(save_folder):  # beside the checkpoints in their bucket
                arguments["run_id_file"] = f"{str(save_folder).rstrip('/')}/{name}-run-id"
            else:
                arguments["run_id_file"] = str(Path(save_folder) / f"{name}-run-id")
        try:
            return self._call(f"loggers.{name}", getattr(composer_fn.loggers, class_name), arguments)
        except ImportError as error:
            raise self.error(f"loggers.{name}", str(error)) from None

    def build_callbacks(self) -> list[Callback]:
        """Returns the ``callbacks`` list as callbacks."""
        from composer_fn import callbacks

        made: dict[str, Callable[[], Callback]] = {
            "speed": callbacks.SpeedMonitor,
            "lr": callbacks.LRMonitor,
            "memory": callbacks.MemoryMonitor,
            "runtime": callbacks.RuntimeEstimator,
            "system": callbacks.SystemMetricsMonitor,
            "nan": callbacks.NaNMonitor,
            "optimizer": callbacks.OptimizerMonitor,
        }
        return [made[name]() for name in self.callbacks]

    def build_evaluators(self, loader: Any, num_classes: int) -> list[Any]:
        """Returns the ``[evaluators.*]`` tables as evaluators of ``loader`` (the task's held-out batches)."""
        from composer_fn.trainer import Evaluator

        built = []
        for label, table in self.evaluators:
            arguments = dict(table)
            names = arguments.pop("metrics", None)
            if names is not None:
                if not isinstance(names, list) or not names or not all(n in METRICS for n in names):
                    raise self.error(f"evaluators.{label}.metrics", f"{names!r}: expected a list among {', '.join(METRICS)}")
                arguments["metrics"] = {name: _metric(name, num_classes) for name in names}
            built.append(self._call(f"evaluators.{label}", Evaluator, {"label": label, "dataloader": loader, **arguments}))
        return built

    def _call(self, name: str, build: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
        import inspect

        try:
            parameters = inspect.signature(build).parameters
        except (TypeError, ValueError):
            parameters = None
        if parameters is not None and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            unknown = [key for key in arguments if key not in parameters]
            if unknown:
                accepted = ", ".join(
                    p.name if p.default is inspect.Parameter.empty else f"{p.name} (default {p.default!r})"
                    for p in parameters.values()
                    if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                    and p.name not in ("label", "dataloader")
                )
                raise self.error(name, f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; accepted: {accepted}")
        try:
            return build(**arguments)
        except TypeError as error:
            raise self.error(name, f"{error}") from None
        except ValueError as error:
            raise self.error(name, f"{error}") from None


def _over_defaults(table: Mapping[str, Any], defaults: Mapping[str, Any], kept: tuple[str, ...]) -> dict[str, Any]:
    # No table: the defaults. A table without a name: the defaults' arguments changed. A named one: itself, with the
    # defaults' ``kept`` fields it does not give (the learning rate every optimizer takes).
    if not table:
        return dict(defaults)
    if "name" not in table:
        return {**defaults, **table}
    return {**{name: defaults[name] for name in kept if name in defaults}, **table}


def load_recipe(
    path: str | os.PathLike[str] | None, flags: Mapping[str, Callable[[str], Any]], settings: Sequence[str] = ()
) -> Recipe:
    """Returns the recipe in the TOML file at ``path`` (none: an empty one), with ``settings`` (``--set``'s
    ``FIELD=VALUE`` texts, see ``parse_setting``) over its fields, in order.

    ``flags`` maps each accepted top-level field to the converter of its command-line flag (a string in, the
    value out, ``argparse.ArgumentTypeError`` for a bad one); a field that is not a string is converted from
    its text, so a recipe accepts exactly what the flag accepts.
    """
    file = Path(path) if path is not None else Path("--set")
    data = recipe_fields(file) if path is not None else {}
    for text in settings:
        # Checked here too, so that an error names the setting rather than the file it would go over.
        setting = Recipe(Path(f"--set {text}"), {})
        fields = _record_tables_as_fields(setting, parse_setting(text))
        _check_fields(setting, {name: value for name, value in fields.items() if name not in _TABLES}, flags)
        data = _merge(data, fields)
    recipe = Recipe(file, {})
    values = _check_fields(recipe, data, flags)
    algorithms = data.get("algorithms", {})
    if not isinstance(algorithms, dict) or not all(isinstance(v, dict) for v in algorithms.values()):
        raise recipe.error("algorithms", "expected tables [algorithms.<name>] of hyperparameters")
    tables = {name: data.get(name, {}) for name in ("optimizer", "schedule", "loggers", "evaluators")}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise recipe.error(name, f"expected a table [{name}]")
    if not all(isinstance(table, dict) for table in tables["evaluators"].values()):
        raise recipe.error("evaluators", "expected tables [evaluators.<label>] of an evaluator's settings")
    callbacks = data.get("callbacks", [])
    if not isinstance(callbacks, list) or not all(isinstance(c, str) and c in CALLBACKS for c in callbacks):
        raise recipe.error("callbacks", f"{callbacks!r}: expected a list among {', '.join(CALLBACKS)}")
    return Recipe(
        file,
        values,
        tuple(algorithms.items()),
        tables["optimizer"],
        tables["schedule"],
        tables["loggers"],
        tuple(callbacks),
        tuple(tables["evaluators"].items()),
    )


def _check_fields(recipe: Recipe, data: Mapping[str, Any], flags: Mapping[str, Callable[[str], Any]]) -> dict[str, Any]:
    """Returns the top-level fields of ``data`` (not its tables) converted by their flags' converters; raises
    RecipeError naming an unknown field or a bad value."""
    import argparse

    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in _TABLES or name == "callbacks":
            continue
        if name not in flags:
            accepted = ", ".join(sorted(set([*flags, *_TABLES, "callbacks"])))
            raise recipe.error(name, f"unknown field; accepted: {accepted}")
        convert = flags[name]
        if isinstance(value, bool) or convert is bool:
            values[name] = _flag_switch(recipe, name, value, convert)
            continue
        if isinstance(value, dict) and all(isinstance(v, str | int | float) for v in value.values()):
            # A table of plain values ({width = 16, norm = "group"}) is the flag's name=value pairs.
            value = ",".join(f"{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in value.items())
        try:
            values[name] = convert(str(value)) if not isinstance(value, str) or convert is not str else value
        except (argparse.ArgumentTypeError, ValueError) as error:
            raise recipe.error(name, str(error)) from None
    return values


def parse_setting(text: str) -> dict[str, Any]:
    """Returns ``--set``'s ``FIELD=VALUE`` as the nested tables a recipe file would hold: ``algorithms.ema.half_life=50ba``
    is ``{"algorithms": {"ema": {"half_life": "50ba"}}}`` (the value read by ``setting_value``).

    Raises RecipeError naming the text and what is expected.
    """
    path, equals, value = text.partition("=")
    names = path.strip().split(".")
    if not equals or not all(name.strip() for name in names):
        raise RecipeError(
            f"--set {text!r}: expected FIELD=VALUE, a recipe field or a table's dotted path "
            "(max_duration=3ep, algorithms.ema.half_life=50ba, optimizer.learning_rate=0.1)"
        )
    table: dict[str, Any] = {names[-1].strip(): setting_value(value.strip())}
    for name in reversed(names[:-1]):
        table = {name.strip(): table}
    return table


def setting_value(text: str) -> Any:
    """Returns a value as ``--set`` and ``--algorithms`` read it: a TOML value (``0.2``, ``true``, ``"a b"``,
    ``[1, 2]``, ``{}``), ``None`` for ``none``/``None``, else the text itself (``50ba``, ``cosine_warmup``)."""
    if text in ("none", "None"):
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: numbers and true/false, the rest as text
        import json

        try:
            return json.loads(text)
        except ValueError:
            return text
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def parse_algorithm_list(text: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Returns the algorithms of ``--algorithms`` by name, each with its hyperparameters: a comma-separated list
    of names, each bare (its defaults) or with ``(name=value, ...)`` (``ema(half_life=50ba),mixup(alpha=0.2)``;
    values as ``setting_value`` reads them).

    Raises ValueError naming the item and what is expected.
    """
    items: list[tuple[str, dict[str, Any]]] = []
    for item in _split_top_level(text, ","):
        name, opening, rest = item.partition("(")
        name = name.strip()
        if not name:
            raise ValueError(f"{item!r}: expected an algorithm's name, optionally with (name=value, ...)")
        arguments: dict[str, Any] = {}
        if opening:
            if not rest.rstrip().endswith(")"):
                raise ValueError(f"{item.strip()!r}: expected name(name=value, ...) with its closing parenthesis")
            for argument in _split_top_level(rest.rstrip()[:-1], ","):
                key, equals, value = argument.partition("=")
                if not equals or not key.strip().isidentifier():
                    raise ValueError(f"{name}({argument.strip()}): expected name=value, e.g. {name}(alpha=0.2)")
                if key.strip() in arguments:
                    raise ValueError(f"{name}: {key.strip()!r} is given twice; expected each hyperparameter once")
                arguments[key.strip()] = setting_value(value.strip())
        items.append((name, arguments))
    return tuple(items)


def _split_top_level(text: str, separator: str) -> list[str]:
    """Returns the non-empty parts of ``text`` between ``separator``s outside brackets and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for character in text:
        if quote:
            quote = "" if character == quote else quote
        elif character in "\"'":
            quote = character
        elif character in "([{":
            depth += 1
        elif character in ")]}":
            depth -= 1
        elif character == separator and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(character)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _record_tables_as_fields(recipe: Recipe, data: Mapping[str, Any]) -> dict[str, Any]:
    # ``[execution] precision = "bf16-mixed"`` is the field ``precision``; a setting given twice is refused.
    fields = {name: value for name, value in data.items() if name not in RECORD_TABLES}
    for table, names in RECORD_TABLES.items():
        given = data.get(table, {})
        if not isinstance(given, dict):
            raise recipe.error(table, f"expected a table [{table}] with fields among {', '.join(names)}")
        for name, value in given.items():
            if name not in names:
                raise recipe.error(f"{table}.{name}", f"unknown field; accepted: {', '.join(names)}")
            flag = names[name]
            if flag in fields:
                raise recipe.error(
                    f"{table}.{name}", f"the top-level field {flag!r} sets it too: keep one of them"
                )
            if name == "progress_bar":
                if not isinstance(value, bool):
                    raise recipe.error(f"{table}.{name}", f"{value!r}: expected true or false")
                value = not value
            fields[flag] = value
    return fields


def recipe_fields(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Returns the fields of the recipe file at ``path`` as TOML gives them (the record tables' fields as the
    flags they stand for), its ``base`` chain merged in, before any check of their values (``load_recipe`` checks
    them)."""
    return _read(Path(path), f"--config={str(path)!r}", ())


def _read(file: Path, named: str, chain: tuple[Path, ...]) -> dict[str, Any]:
    """Returns the TOML table in ``file`` with its ``base`` chain merged under it; ``named`` says how errors
    name the file (the flag for the recipe given, ``<recipe>: field base`` for a base)."""
    data = read_toml(file, named, RecipeError, "recipes/digits-baseline.toml")
    data = _record_tables_as_fields(Recipe(file, {}), data)
    if isinstance(data.get("deepspeed"), str) and data["deepspeed"]:
        # Relative to the file that names it, as ``base`` is (a base's config stays its own).
        data["deepspeed"] = str(file.parent / data["deepspeed"])
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise RecipeError(f"{file}: field base: {base!r}: expected the path of another recipe file, relative to this one")
    parent = (file.parent / base).resolve()
    chain = (*chain, file.resolve())
    if parent in chain:
        loop = " -> ".join(str(p) for p in (*chain, parent))
        raise RecipeError(f"{file}: field base: {base!r} leads back to a recipe already read ({loop}); expected no loop")
    return _merge(_read(parent, f"{file}: field base: {base!r} ({parent})", chain), data)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Returns ``base`` with ``over`` on top: tables merge key by key (new keys after the base's), anything else
    in ``over`` replaces the base's value."""
    merged = dict(base)
    for name, value in over.items():
        below = merged.get(name)
        merged[name] = _merge(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return merged


def _flag_switch(recipe: Recipe, name: str, value: Any, convert: Callable[[str], Any]) -> bool:
    # A switch (--compile) takes true or false; true or false is no value for any other flag.
    if convert is not bool:
        raise recipe.error(name, f"{value!r}: expected what the flag --{name.replace('_', '-')} takes, not true/false")
    if not isinstance(value, bool):
        raise recipe.error(name, f"{value!r}: expected true or false")
    return value


def _metric(name: str, num_classes: int) -> Any:
    from torchmetrics import classification as C

    kind = {"accuracy": C.MulticlassAccuracy, "f1": C.MulticlassF1Score, "precision": C.MulticlassPrecision}
    kind["recall"] = C.MulticlassRecall
    return kind[name](num_classes=num_classes, average="macro")
