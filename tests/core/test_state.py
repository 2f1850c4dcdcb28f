"""Specification of the immutable records: replace, pytree round trips, compile, and batch access."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from composer_fn.core import random as rng
from composer_fn.core.state import State, Static, StepCtx, batch_get, batch_set, tree_map

names = st.text(alphabet="abcdefgh_", min_size=1, max_size=5)
tensors = st.builds(
    lambda start, n: torch.arange(start, start + n, dtype=torch.float32),
    st.integers(min_value=-8, max_value=8),
    st.integers(min_value=0, max_value=4),
)
scalars = st.integers(min_value=-5, max_value=5).map(lambda v: torch.tensor(float(v)))
tensor_maps = st.dictionaries(names, tensors, max_size=3)
# Per-algorithm entries: no state (None), a tensor, or a small mapping of tensors.
entries = st.one_of(st.none(), tensors, tensor_maps)
keys = st.integers(min_value=0, max_value=2**64 - 1).map(rng.key)


def _loss_fn(outputs: Any, batch: Any) -> torch.Tensor:
    return (outputs - batch[1]).square().mean()


states = st.builds(
    State,
    params=tensor_maps,
    buffers=tensor_maps,
    opt=st.one_of(st.none(), tensor_maps),
    algos=st.dictionaries(names, entries, max_size=4),
    hparams=st.dictionaries(names, scalars, max_size=3),
    step=st.integers(min_value=0, max_value=10**6).map(lambda v: torch.tensor(v, dtype=torch.int64)),
    key=keys,
)
batches = st.one_of(
    st.tuples(tensors, tensors),
    st.lists(tensors, min_size=1, max_size=3),
    st.dictionaries(names, tensors, min_size=1, max_size=3),
)
contexts = st.builds(
    StepCtx,
    batch=batches,
    key=keys,
    loss_fn=st.just(_loss_fn),
    outputs=st.one_of(st.none(), tensors),
    loss=st.one_of(st.none(), scalars),
    per_sample_loss=st.one_of(st.none(), tensors),
    grads=st.one_of(st.none(), tensor_maps),
    scratch=st.dictionaries(names, entries, max_size=3),
)
records = st.one_of(states, contexts)


def field_names(record: State | StepCtx) -> list[str]:
    return [f.name for f in dataclasses.fields(record)]


def assert_same_tree(actual: Any, expected: Any) -> None:
    """Same structure (types, field and key order, Nones where Nones were) and equal tensors."""
    assert type(actual) is type(expected)
    if isinstance(expected, State | StepCtx):
        for name in field_names(expected):
            assert_same_tree(getattr(actual, name), getattr(expected, name))
    elif isinstance(expected, Mapping):
        assert list(actual) == list(expected)
        for k in expected:
            assert_same_tree(actual[k], expected[k])
    elif isinstance(expected, tuple | list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same_tree(a, e)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    else:
        assert actual is expected


def replacement_for(name: str) -> Any:
    if name == "loss_fn":
        return lambda outputs, batch: outputs.sum()
    if name in ("step", "loss"):
        return torch.tensor(123)
    if name == "key":
        return rng.key(99)
    if name == "batch":
        return (torch.arange(3.0),)
    return {"replaced": torch.arange(2.0)}


# ----------------------------------------------------------------------------------------------- replace


@given(record=records, data=st.data())
def test_replace_returns_a_new_record_and_leaves_the_old_one_unchanged(
    record: State | StepCtx, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(field_names(record)))
    before = {n: getattr(record, n) for n in field_names(record)}
    snapshot = pytree.tree_map(lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, record)
    value = replacement_for(name)

    new = record.replace(**{name: value})

    assert new is not record and type(new) is type(record)
    assert getattr(new, name) is value
    for other in field_names(record):
        assert getattr(record, other) is before[other]
        if other != name:
            assert getattr(new, other) is before[other]
    assert_same_tree(record, snapshot)


@given(record=records)
def test_replace_with_no_changes_is_an_equal_copy(record: State | StepCtx) -> None:
    copy = record.replace()
    assert copy is not record
    for name in field_names(record):
        assert getattr(copy, name) is getattr(record, name)


@given(record=records)
def test_replace_with_an_unknown_field_raises_type_error_naming_it(record: State | StepCtx) -> None:
    with pytest.raises(TypeError, match="learning_rate"):
        record.replace(learning_rate=torch.tensor(0.1))


@given(record=records)
def test_records_are_frozen(record: State | StepCtx) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.key = rng.key(1)  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------- pytrees


@given(record=records)
def test_flatten_then_unflatten_gives_back_the_record(record: State | StepCtx) -> None:
    leaves, spec = pytree.tree_flatten(record)
    assert_same_tree(pytree.tree_unflatten(leaves, spec), record)


@given(record=records)
def test_none_fields_and_none_entries_are_not_leaves(record: State | StepCtx) -> None:
    leaves = pytree.tree_leaves(record)
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)


@given(record=records)
def test_leaves_are_exactly_the_records_tensors(record: State | StepCtx) -> None:
    def count(tree: Any) -> int:
        if isinstance(tree, torch.Tensor):
            return 1
        if isinstance(tree, Mapping):
            return sum(count(v) for v in tree.values())
        if isinstance(tree, tuple | list):
            return sum(count(v) for v in tree)
        return 0

    expected = sum(count(getattr(record, name)) for name in field_names(record))
    assert len(pytree.tree_leaves(record)) == expected


@given(record=records)
def test_key_paths_lead_to_their_leaves(record: State | StepCtx) -> None:
    for path, leaf in pytree.tree_leaves_with_path(record):
        node: Any = record
        for entry in path:
            node = entry.get(node)
        assert node is leaf


@given(context=contexts)
def test_the_loss_function_travels_in_the_tree_spec(context: StepCtx) -> None:
    leaves, spec = pytree.tree_flatten(context)
    assert all(leaf is not _loss_fn for leaf in leaves)
    assert pytree.tree_unflatten(leaves, spec).loss_fn is _loss_fn


@given(state=states)
def test_tree_map_applies_to_every_tensor_and_keeps_nones(state: State) -> None:
    doubled = tree_map(lambda t: t * 2, state)
    assert isinstance(doubled, State)
    for name, entry in state.algos.items():
        if entry is None:
            assert doubled.algos[name] is None
    for (path, leaf), new_leaf in zip(
        pytree.tree_leaves_with_path(state), pytree.tree_leaves(doubled), strict=True
    ):
        assert torch.equal(new_leaf, leaf * 2), pytree.keystr(path)


def _advance(state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
    return state.replace(step=state.step + 1), ctx.replace(loss=ctx.loss_fn(ctx.batch[0], ctx.batch))


_advance_compiled = torch.compile(_advance, fullgraph=True, backend="aot_eager")


def test_state_and_context_pass_through_torch_compile() -> None:
    state = State(
        params={"w": torch.arange(4.0)},
        buffers={},
        opt=None,
        algos={"stateless": None, "ema": {"w": torch.arange(4.0)}},
        hparams={"lr": torch.tensor(0.1)},
        step=torch.tensor(4, dtype=torch.int64),
        key=rng.key(0),
    )
    ctx = StepCtx(
        batch=(torch.arange(3.0), torch.ones(3)), key=rng.key(1), loss_fn=_loss_fn, scratch={"a": None}
    )
    new_state, new_ctx = _advance_compiled(state, ctx)
    expected_state, expected_ctx = _advance(state, ctx)
    assert_same_tree(new_state, expected_state)
    assert_same_tree(new_ctx, expected_ctx)
    assert int(new_state.step) == 5 and int(state.step) == 4
    assert ctx.loss is None


# ----------------------------------------------------------------------------------------------- static


def test_static_replace_returns_a_new_record() -> None:
    static = Static(nn.Identity())
    other = static.replace(seed=3)
    assert other.seed == 3 and static.seed == 0
    assert other.module is static.module
    assert other != static and other == Static(static.module, seed=3)
    assert hash(other) == hash(Static(static.module, seed=3))


def test_static_rejects_an_unknown_precision_naming_it() -> None:
    with pytest.raises(ValueError, match="precision"):
        Static(nn.Identity(), precision="fp8-mixed")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- batches


def positions(batch: Any) -> st.SearchStrategy[int | str]:
    if isinstance(batch, Mapping):
        return st.sampled_from(list(batch))
    return st.integers(min_value=-len(batch), max_value=len(batch) - 1)


def numbered_items(batch: Any) -> list[tuple[Any, Any]]:
    return list(batch.items()) if isinstance(batch, Mapping) else list(enumerate(batch))


@given(batch=batches, data=st.data())
def test_batch_set_replaces_one_item_and_leaves_the_input_unchanged(batch: Any, data: st.DataObject) -> None:
    position = data.draw(positions(batch))
    before = numbered_items(batch)
    value = torch.tensor([-1.0])

    new = batch_set(batch, position, value)

    assert new is not batch
    assert type(new) is type(batch)
    assert batch_get(new, position) is value
    after = numbered_items(batch)
    assert [k for k, _ in after] == [k for k, _ in before]
    assert all(a is b for (_, a), (_, b) in zip(after, before, strict=True))
    replaced = position if isinstance(batch, Mapping) else position % len(batch)
    assert [k for k, _ in numbered_items(new)] == [k for k, _ in before]
    for k, item in before:
        if k != replaced:
            assert batch_get(new, k) is item


@given(batch=batches, data=st.data())
def test_batch_get_reads_by_position_or_key(batch: Any, data: st.DataObject) -> None:
    position = data.draw(positions(batch))
    assert batch_get(batch, position) is batch[position]


class Pair(NamedTuple):
    inputs: torch.Tensor
    targets: torch.Tensor


def test_batch_set_keeps_a_named_tuple_batch_a_named_tuple() -> None:
    batch = Pair(torch.arange(3.0), torch.arange(3))
    new = batch_set(batch, 1, torch.zeros(3))
    assert type(new) is Pair
    assert new.inputs is batch.inputs and torch.equal(new.targets, torch.zeros(3))


@pytest.mark.parametrize(
    ("batch", "position"),
    [
        ((torch.zeros(1), torch.ones(1)), 2),
        ((torch.zeros(1), torch.ones(1)), -3),
        ([torch.zeros(1)], 1),
        ((torch.zeros(1),), "inputs"),
        ({"inputs": torch.zeros(1)}, "labels"),
        ({"inputs": torch.zeros(1)}, 0),
    ],
)
def test_missing_items_raise_key_error_naming_them(batch: Any, position: int | str) -> None:
    with pytest.raises(KeyError, match=repr(position)):
        batch_get(batch, position)
    with pytest.raises(KeyError, match=repr(position)):
        batch_set(batch, position, torch.zeros(1))


@pytest.mark.parametrize("batch", [torch.zeros(2, 3), 7, "inputs"], ids=["tensor", "int", "str"])
def test_batch_set_on_something_that_is_not_a_container_raises_type_error(batch: Any) -> None:
    with pytest.raises(TypeError, match=type(batch).__name__):
        batch_set(batch, 0, torch.zeros(1))
