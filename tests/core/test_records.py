"""Specification of ``@record``: a frozen dataclass with ``replace`` whose pytree leaves are its tensors, in the
order of its fields, with static fields and None markers in the flatten context."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core.records import Record, from_earlier_layout, optional_entries, record, static


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _negate(x: torch.Tensor) -> torch.Tensor:
    return -x


@record
class Entry(Record):
    """Every kind of field a record may declare."""

    weights: Mapping[str, torch.Tensor]
    count: torch.Tensor | None
    extras: Mapping[str, Any] = optional_entries(default_factory=dict)
    marker: torch.Tensor | None = static(default=None)
    transform: Callable[[torch.Tensor], torch.Tensor] = static(default=_double)
    offset: int = dataclasses.field(default=0, metadata={"static": True})


CHILDREN = ("weights", "count", "extras")
STATICS = ("marker", "transform", "offset")

names = st.text(alphabet="abcdef_", min_size=1, max_size=4)
tensors = st.builds(
    lambda start, n, dtype: torch.arange(start, start + n).to(dtype),
    st.integers(-8, 8),
    st.integers(0, 4),
    st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]),
)
entries = st.builds(
    Entry,
    weights=st.dictionaries(names, tensors, max_size=3),
    count=st.one_of(st.none(), tensors),
    extras=st.dictionaries(names, st.one_of(st.none(), tensors, st.dictionaries(names, tensors, max_size=2)), max_size=4),
    marker=tensors,
    transform=st.sampled_from([_double, _negate]),
    offset=st.integers(-3, 3),
)


def _same(actual: Any, expected: Any) -> None:
    """Same structure (types, key order, Nones where Nones were), equal tensors of the same dtype."""
    assert type(actual) is type(expected)
    if isinstance(expected, Entry):
        for name in CHILDREN:
            _same(getattr(actual, name), getattr(expected, name))
        for name in STATICS:
            assert getattr(actual, name) is getattr(expected, name)
    elif isinstance(expected, Mapping):
        assert list(actual) == list(expected)
        for key in expected:
            _same(actual[key], expected[key])
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    else:
        assert actual is expected


def _tensors_of(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Mapping):
        return [t for value in tree.values() for t in _tensors_of(value)]
    return []


@given(entry=entries)
def test_flatten_then_unflatten_gives_back_the_record(entry: Entry) -> None:
    leaves, spec = pytree.tree_flatten(entry)
    _same(pytree.tree_unflatten(leaves, spec), entry)


@given(entry=entries)
def test_the_leaves_are_the_child_fields_tensors_in_field_order_and_never_none(entry: Entry) -> None:
    leaves = pytree.tree_leaves(entry)
    expected = [t for name in CHILDREN for t in _tensors_of(getattr(entry, name))]
    assert len(leaves) == len(expected)
    assert all(leaf is want for leaf, want in zip(leaves, expected, strict=True))


@given(entry=entries)
def test_static_fields_travel_in_the_context_not_the_leaves(entry: Entry) -> None:
    leaves, spec = pytree.tree_flatten(entry)
    assert all(leaf is not entry.marker for leaf in leaves)
    doubled = pytree.tree_map(lambda t: t.to(torch.float64) * 2, entry)
    assert doubled.marker is entry.marker and doubled.transform is entry.transform and doubled.offset == entry.offset
    assert pytree.tree_structure(entry.replace(offset=entry.offset + 1)) != spec


@given(entry=entries)
def test_none_entries_of_a_mapping_declared_so_are_kept_in_place(entry: Entry) -> None:
    rebuilt = pytree.tree_unflatten(*pytree.tree_flatten(entry))
    assert list(rebuilt.extras) == list(entry.extras)
    assert [k for k, v in rebuilt.extras.items() if v is None] == [k for k, v in entry.extras.items() if v is None]
    assert (rebuilt.count is None) == (entry.count is None)


@given(entry=entries)
def test_key_paths_name_the_fields_and_lead_to_their_leaves(entry: Entry) -> None:
    for path, leaf in pytree.tree_leaves_with_path(entry):
        assert isinstance(path[0], pytree.GetAttrKey) and path[0].name in CHILDREN
        node: Any = entry
        for key in path:
            node = key.get(node)
        assert node is leaf


@given(entry=entries)
def test_a_record_without_nones_has_the_leaves_of_a_dictionary_of_its_fields(entry: Entry) -> None:
    # A checkpoint saves leaves in this order: a record's and the dictionary it replaced are the same on disk.
    if entry.count is None or any(v is None for v in entry.extras.values()):
        entry = entry.replace(count=torch.zeros(()), extras={k: v for k, v in entry.extras.items() if v is not None})
    as_dictionary = {name: getattr(entry, name) for name in CHILDREN}
    leaves = pytree.tree_leaves(entry)
    assert len(leaves) == len(pytree.tree_leaves(as_dictionary))
    assert all(a is b for a, b in zip(leaves, pytree.tree_leaves(as_dictionary), strict=True))


@given(entry=entries, unknown=st.lists(st.sampled_from(["learning_rate", "params", "zeta", "count_"]), min_size=1, unique=True))
def test_replace_refuses_unknown_fields_naming_each(entry: Entry, unknown: list[str]) -> None:
    with pytest.raises(TypeError, match=r"Entry\.replace got unknown field\(s\)") as raised:
        entry.replace(count=torch.ones(()), **{name: torch.zeros(()) for name in unknown})
    assert str(sorted(unknown)) in str(raised.value)
    assert "fields are ['count', 'extras', 'marker', 'offset', 'transform', 'weights']" in str(raised.value)


@given(entry=entries, data=st.data())
def test_replace_changes_the_named_field_only_and_leaves_the_record_alone(entry: Entry, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(CHILDREN + STATICS))
    value = object()
    before = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}
    new = entry.replace(**{name: value})
    assert type(new) is Entry and new is not entry
    assert getattr(new, name) is value
    for other, kept in before.items():
        assert getattr(entry, other) is kept
        if other != name:
            assert getattr(new, other) is kept


@given(entry=entries)
def test_records_are_frozen_and_compare_by_identity(entry: Entry) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.count = None  # type: ignore[misc]
    assert entry == entry and entry != entry.replace()


def test_the_decorator_refuses_a_class_that_is_not_a_record_naming_it() -> None:
    class Plain:
        x: int

    with pytest.raises(TypeError, match=r"subclass of Record.*Plain"):
        record(Plain)


def test_the_serialized_name_is_the_module_and_class_unless_given() -> None:
    from composer_fn.core.state import State, StepCtx

    names = {cls: pytree.SUPPORTED_SERIALIZED_TYPES[cls].serialized_type_name for cls in (Entry, State, StepCtx)}
    assert names == {Entry: f"{__name__}.Entry", State: "composer_fn.State", StepCtx: "composer_fn.StepCtx"}


def test_a_record_declares_an_earlier_layout_that_checkpoints_may_hold() -> None:
    def unpacked(leaves: Any) -> tuple[Any, int] | None:
        first = leaves[0] if leaves else None
        if not isinstance(first, torch.Tensor) or first.shape != (2,):
            return None
        return Pair(first[0], first[1]), 1

    @record(earlier_layout=unpacked)
    class Pair(Record):
        low: torch.Tensor
        high: torch.Tensor

    found = from_earlier_layout(Pair, [torch.tensor([1.0, 2.0]), torch.zeros(3)])
    assert found is not None and isinstance(found[0], Pair) and found[1] == 1
    assert float(found[0].low) == 1.0 and float(found[0].high) == 2.0
    assert from_earlier_layout(Pair, [torch.zeros(())]) is None
    assert from_earlier_layout(Entry, [torch.tensor([1.0, 2.0])]) is None


def _roundtrip(entry: Entry) -> Entry:
    leaves, spec = pytree.tree_flatten(entry)
    rebuilt = pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec)
    return rebuilt.replace(count=rebuilt.transform(rebuilt.weights["w"]) + rebuilt.offset)


def test_a_record_is_flattened_and_rebuilt_inside_a_compiled_function() -> None:
    entry = Entry(
        weights={"w": torch.arange(3.0)},
        count=None,
        extras={"none": None, "t": torch.ones(2)},
        marker=torch.zeros(1),
        transform=_negate,
        offset=2,
    )
    compiled = torch.compile(_roundtrip, fullgraph=True, backend="aot_eager")
    _same(compiled(entry), _roundtrip(entry))
