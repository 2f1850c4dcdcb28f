"""The registered algorithms as the command line shows them: ``composer-fn algorithms`` lists them, ``composer-fn
algorithms NAME`` prints one's hyperparameters with their defaults and meanings, and ``--algorithms`` builds them
from ``name(hyperparameter=value, ...)``."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["Option", "REQUIRED", "options_of", "build_algorithms", "algorithm_table", "algorithm_page"]

_NO_DEFAULT = object()


REQUIRED: Any = _NO_DEFAULT
"""The default of a hyperparameter that has none."""


class Option(NamedTuple):
    """One hyperparameter of an algorithm: its name, default (``REQUIRED`` when it has none) and meaning (the class
    docstring's ``Args:`` entry, in one line)."""

    name: str
    default: Any
    meaning: str

    def default_text(self) -> str:
        """Returns the default as a recipe would write it (``'1000ba'``, ``0.2``, ``none``), or ``required``."""
        if self.default is _NO_DEFAULT:
            return "required"
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return repr(self.default)


def _registry() -> Mapping[str, type]:
    import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
    from composer_fn.core.algorithm import REGISTRY

    return REGISTRY


def _arguments_section(doc: str) -> dict[str, str]:
    # Google-style ``Args:``: ``name: text`` lines, continued by deeper-indented lines, until a blank or a dedent.
    meanings: dict[str, str] = {}
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return meanings
    indent, name = None, None
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break
        text = line.strip()
        if depth == indent and ":" in text:
            name, _, rest = text.partition(":")
            meanings[name.strip()] = rest.strip()
        elif name is not None:
            meanings[name] += " " + text
    return {name: meaning.replace("``", "") for name, meaning in meanings.items()}


def options_of(cls: type) -> tuple[Option, ...]:
    """Returns the hyperparameters of the algorithm class ``cls`` (its dataclass fields given to its constructor), in
    order."""
    meanings: dict[str, str] = {}
    for owner in reversed(cls.__mro__):  # a field a base class declares (a surgery's target_modules) has its doc there
        meanings.update(_arguments_section(owner.__doc__ or "") if "__doc__" in vars(owner) else {})
    options = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        default: Any = _NO_DEFAULT
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        options.append(Option(field.name, default, meanings.get(field.name, "")))
    return tuple(options)


def build_algorithms(items: tuple[tuple[str, dict[str, Any]], ...]) -> tuple[Any, ...]:
    """Returns the algorithms named in ``items`` (``recipes.parse_algorithm_list``'s), each built with its
    hyperparameters.

    Raises ValueError naming an unknown or repeated algorithm, an unknown hyperparameter (with the accepted ones and
    their defaults) or a bad value (with the algorithm's own message).
    """
    registry = _registry()
    names = [name for name, _ in items]
    built = []
    for index, (name, arguments) in enumerate(items):
        if name not in registry:
            raise ValueError(f"unknown algorithm {name!r}; accepted: comma-separated names among {', '.join(sorted(registry))}")
        if name in names[:index]:
            raise ValueError(f"algorithm {name!r} is named twice; accepted: each name once")
        options = options_of(registry[name])
        known = {option.name for option in options}
        for key in arguments:
            if key not in known:
                accepted = ", ".join(f"{o.name} (default {o.default_text()})" for o in options) or "none"
                raise ValueError(f"{name}: unknown hyperparameter {key!r}; accepted: {accepted}")
        try:
            built.append(registry[name](**arguments))
        except (TypeError, ValueError) as error:
            given = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
            raise ValueError(f"{name}({given}): {error}") from None
    return tuple(built)


def _summary(cls: type) -> str:
    doc = inspect.cleandoc(cls.__doc__ or "")
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "")


def algorithm_table() -> str:
    """Returns every registered algorithm, one line each: its name and what it does."""
    registry = _registry()
    width = max(len(name) for name in registry)
    lines = [f"{name:<{width}}  {_summary(cls)}" for name, cls in sorted(registry.items())]
    lines.append("")
    lines.append("composer-fn algorithms NAME prints one's hyperparameters; set them with --algorithms 'NAME(KEY=VALUE, ...)',")
    lines.append("--set algorithms.NAME.KEY=VALUE or a recipe's [algorithms.NAME] table.")
    return "\n".join(lines)


def algorithm_page(name: str) -> str:
    """Returns what ``composer-fn algorithms NAME`` prints: the algorithm's summary and each hyperparameter with its
    default and meaning, and how to set them.

    Raises ValueError for an unknown name, naming the accepted ones.
    """
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown algorithm {name!r}; accepted: {', '.join(sorted(registry))}")
    cls = registry[name]
    options = options_of(cls)
    lines = [f"{name} ({cls.__module__.rsplit('.', 1)[0]}.{cls.__name__}): {_summary(cls)}", ""]
    if options:
        width = max(len(option.name) for option in options)
        default_width = max(len("default"), *(len(option.default_text()) for option in options))
        lines.append(f"{'hyperparameter':<{width}}  {'default':<{default_width}}  meaning")
        for option in options:
            lines.append(f"{option.name:<{width}}  {option.default_text():<{default_width}}  {option.meaning}".rstrip())
        example = options[0]
        unset = example.default is _NO_DEFAULT or example.default is None
        value = "VALUE" if unset else example.default_text().strip("'")
        lines += [
            "",
            f"--algorithms '{name}({example.name}={value})'   --set algorithms.{name}.{example.name}={value}",
            f"recipe: [algorithms.{name}] {example.name} = {'VALUE' if unset else example.default_text()}",
        ]
    else:
        lines.append("no hyperparameters")
    return "\n".join(lines)
