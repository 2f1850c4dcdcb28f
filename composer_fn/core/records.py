"""Immutable records that are pytrees: ``@record`` makes a class a frozen dataclass with a fast ``replace`` and
registers it with ``torch.utils._pytree``, so it crosses ``torch.compile`` and ``torch.func`` and flattens for
checkpoints.

A field is a child of the record's node (a tensor, or a pytree of tensors) unless it is declared ``static()``:
its value then travels in the flatten context, which torch.func and torch.compile treat as a constant (the
functions and integers a record carries). None is never a leaf: a None field goes into the context, and so do
the None entries of a mapping field declared ``optional_entries()`` (the per-algorithm mappings, where an
algorithm without state has None). torch.func's auxiliary outputs accept tensor leaves only.

A record's leaves come in the order its fields are declared, each field's under ``GetAttrKey(field)``: the leaves
of a dictionary of the same fields in the same order, which is how a checkpoint stores them. A record that was
stored in another layout before (EarlyStopper's five values packed in one tensor) declares how to read it
(``@record(earlier_layout=...)``, see ``from_earlier_layout``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, TypeVar, cast, overload

import torch
import torch.utils._pytree as pytree
from typing_extensions import Self, dataclass_transform  # Python 3.10 (torch depends on typing_extensions)

__all__ = ["Record", "record", "static", "optional_entries", "EarlierLayout", "from_earlier_layout"]

_STATIC = "static"
_OPTIONAL_ENTRIES = "optional_entries"

_C = TypeVar("_C", bound=type)

EarlierLayout = Callable[[Sequence[Any]], tuple[Any, int] | None]
"""``read(leaves) -> (record, taken) | None``: the record that checkpoint ``leaves`` begin with in a layout its class
had before, and how many leaves it took; None when they do not begin with one."""
_EARLIER_LAYOUTS: dict[type, EarlierLayout] = {}


def static(default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """Returns a field declaration whose value is not a leaf but part of the flatten context (a constant of a
    trace): a function, a number, a setting."""
    return field(default=default, default_factory=default_factory, metadata={_STATIC: True})


def optional_entries(default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """Returns a field declaration for a mapping whose None entries go into the flatten context instead of its
    leaves (an algorithm without state has None)."""
    return field(default=default, default_factory=default_factory, metadata={_OPTIONAL_ENTRIES: True})


def _is_static(declared: dataclasses.Field[Any]) -> bool:
    """Returns whether a record's field was declared ``static()`` (its value travels in the flatten context)."""
    return bool(declared.metadata.get(_STATIC, False))


class Record:
    """What ``@record`` gives a class: ``replace``, which costs well under a microsecond."""

    _fields: ClassVar[frozenset[str]] = frozenset()

    def replace(self, **changes: Any) -> Self:
        """Returns a copy of the record with the given fields changed; the record itself is unchanged."""
        for name in changes:
            if name not in self._fields:
                unknown = sorted(n for n in changes if n not in self._fields)
                raise TypeError(
                    f"{type(self).__name__}.replace got unknown field(s) {unknown}; "
                    f"fields are {sorted(self._fields)}"
                )
        if torch.compiler.is_compiling():
            # Some dynamo versions (2.11 among them) cannot copy an instance's __dict__; reading each field is
            # traceable everywhere and costs nothing once traced.
            return type(self)(**{name: changes.get(name, getattr(self, name)) for name in self._fields})
        values = self.__dict__.copy()
        values.update(changes)
        return _build(type(self), values)


_R = TypeVar("_R", bound=Record)


def _build(cls: type[_R], fields: dict[str, Any]) -> _R:
    """Returns a record of ``cls`` holding ``fields`` (every field, by name), without running ``__init__``."""
    if torch.compiler.is_compiling():
        # Some dynamo versions (2.11 among them) lose the fields of an object whose ``__dict__`` is assigned
        # whole; every version traces the dataclass constructor, whose cost does not matter in a trace.
        return cls(**fields)
    new = object.__new__(cls)
    object.__setattr__(new, "__dict__", fields)
    return new


@overload
def record(cls: _C, /) -> _C: ...


@overload
def record(
    *, serialized_type_name: str | None = None, earlier_layout: EarlierLayout | None = None
) -> Callable[[_C], _C]: ...


@dataclass_transform(frozen_default=True, eq_default=False, field_specifiers=(field, static, optional_entries))
def record(
    cls: _C | None = None,
    /,
    *,
    serialized_type_name: str | None = None,
    earlier_layout: EarlierLayout | None = None,
) -> _C | Callable[[_C], _C]:
    """Returns ``cls`` (a subclass of ``Record``) as a frozen dataclass registered as a pytree node.

    Its leaves are those of its fields, in their order, except the fields declared ``static()``, whose values go
    into the flatten context with the None markers (see the module's docstring). Instances compare by identity.
    ``serialized_type_name`` names the node in torch's serialized tree specs: the class's module and qualified
    name by default. ``earlier_layout`` reads the class's entries of checkpoints written before it was laid out
    as it is (see ``EarlierLayout``). ``@record`` and ``@record(...)`` both decorate.
    """
    if cls is None:
        return lambda given: _recorded(given, serialized_type_name, earlier_layout)
    return _recorded(cls, serialized_type_name, earlier_layout)


def from_earlier_layout(cls: type, leaves: Sequence[Any]) -> tuple[Any, int] | None:
    """Returns the record of ``cls`` that checkpoint ``leaves`` begin with in a layout the class had before, and
    how many leaves it took; None when the class declared no earlier layout or the leaves are not in it."""
    read = _EARLIER_LAYOUTS.get(cls)
    return None if read is None else read(leaves)


def _recorded(cls: _C, serialized_type_name: str | None, earlier_layout: EarlierLayout | None) -> _C:
    if not (isinstance(cls, type) and issubclass(cls, Record)):
        raise TypeError(f"@record decorates a subclass of Record (which gives it replace); got {cls!r}")
    if earlier_layout is not None and not callable(earlier_layout):
        raise TypeError(
            f"earlier_layout={earlier_layout!r}: expected a function from checkpoint leaves to (record, taken) or None"
        )
    made: Any = dataclass(frozen=True, eq=False)(cls)
    if earlier_layout is not None:
        _EARLIER_LAYOUTS[made] = earlier_layout
    declared = dataclasses.fields(made)
    made._fields = frozenset(f.name for f in declared)
    _register(
        made,
        tuple(f.name for f in declared if not _is_static(f)),
        tuple(f.name for f in declared if _is_static(f)),
        frozenset(f.name for f in declared if f.metadata.get(_OPTIONAL_ENTRIES, False)),
        serialized_type_name or f"{made.__module__}.{made.__qualname__}",
    )
    return cast(_C, made)


def _register(
    cls: type[Record], children: tuple[str, ...], constants: tuple[str, ...], optional: frozenset[str], serialized: str
) -> None:
    # The context is (the static fields' values, the layout): per child field, its name and () where the field is a
    # child as it is, None where it is None, or (keys, absent keys) for a mapping without its None entries.
    whole = tuple((name, ()) for name in children)
    keys = {name: pytree.GetAttrKey(name) for name in children}
    optional_children = tuple(name for name in children if name in optional)
    declared = tuple((name, name in optional, (name, ()), (name, None)) for name in children)

    children_of, constants_of = _getter(children), _getter(constants)
    names = children + constants

    def split(values: Mapping[str, Any], captured: tuple[Any, ...]) -> tuple[list[Any], tuple[tuple[Any, ...], Any]]:
        kept: list[Any] = []
        layout: list[Any] = []
        for name, entries_may_be_none, as_it_is, absent_field in declared:
            value = values[name]
            if value is None:
                layout.append(absent_field)
                continue
            if entries_may_be_none:
                absent = tuple([k for k, v in value.items() if v is None])
                if absent:
                    kept.append({k: v for k, v in value.items() if v is not None})
                    layout.append((name, (tuple(value), absent)))
                    continue
            kept.append(value)
            layout.append(as_it_is)
        return kept, (captured, tuple(layout))

    def flatten(node: Record) -> tuple[list[Any], tuple[tuple[Any, ...], Any]]:
        values = node.__dict__
        if torch.compiler.is_compiling():
            # Dynamo cannot call an itemgetter; reading each field costs nothing once traced.
            captured = tuple([values[name] for name in constants])
            fields = tuple([values[name] for name in children])
        else:
            captured = constants_of(values)
            fields = children_of(values)
        # A record seldom holds a None: look for one, and build a layout only where there is one.
        for value in fields:
            if value is None:
                return split(values, captured)
        for name in optional_children:
            for entry in values[name].values():
                if entry is None:
                    return split(values, captured)
        return list(fields), (captured, whole)

    def unflatten(kept: Any, context: tuple[tuple[Any, ...], Any]) -> Record:
        captured, layout = context
        # The lengths match by construction (tree_unflatten counts the leaves); a strict zip costs a third more.
        if layout is whole:
            return _build(cls, dict(zip(names, (*kept, *captured), strict=False)))
        fields = _joined(kept, layout)
        if constants:
            fields.update(zip(constants, captured, strict=False))
        return _build(cls, fields)

    def flatten_with_keys(node: Record) -> tuple[list[tuple[Any, Any]], tuple[tuple[Any, ...], Any]]:
        kept, context = flatten(node)
        present = [keys[name] for name, shape in context[1] if shape is not None]
        return list(zip(present, kept, strict=True)), context

    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=serialized,
        flatten_with_keys_fn=flatten_with_keys,
    )


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    # itemgetter reads the fields in one call, but gives a single value (not a tuple) for one name.
    if len(names) > 1:
        return operator.itemgetter(*names)
    if names:
        name = names[0]
        return lambda values: (values[name],)
    return lambda values: ()


def _joined(kept: Any, layout: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    remaining = iter(kept)
    fields: dict[str, Any] = {}
    for name, shape in layout:
        if shape is None:
            fields[name] = None
        elif shape:
            order, absent = shape
            present = next(remaining)
            fields[name] = {k: None if k in absent else present[k] for k in order}
        else:
            fields[name] = next(remaining)
    return fields
