"""TensorLoader: keyed epoch orders, batching, resumption and purity."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.data import TensorLoader


def _dataset(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    indices = torch.arange(size)
    return indices, torch.stack([indices.float(), -indices.float()], dim=1)


def _visited(loader: TensorLoader, epoch: int) -> list[torch.Tensor]:
    loader.set_epoch(epoch)
    return [indices for indices, _ in loader]


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 70),
    batch_size=st.integers(1, 80),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**40),
)
def test_every_epoch_visits_each_sample_once_in_len_batches(
    size: int, batch_size: int, shuffle: bool, seed: int, epoch: int
) -> None:
    loader = TensorLoader(_dataset(size), batch_size, shuffle=shuffle, seed=seed)
    loader.set_epoch(epoch)
    batches = list(loader)
    assert len(batches) == len(loader) == math.ceil(size / batch_size)
    assert all(len(indices) == batch_size for indices, _ in batches[:-1])
    visited = torch.cat([indices for indices, _ in batches])
    assert torch.equal(visited.sort().values, torch.arange(size))
    if not shuffle:
        assert torch.equal(visited, torch.arange(size))
    for indices, features in batches:
        # Rows of every tensor are gathered with the same indices.
        assert torch.equal(features[:, 0], indices.float())


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 70), batch_size=st.integers(1, 80), seed=st.integers(0, 1000))
def test_drop_last_yields_only_full_batches_of_distinct_samples(
    size: int, batch_size: int, seed: int
) -> None:
    loader = TensorLoader(_dataset(size), batch_size, drop_last=True, seed=seed)
    batches = _visited(loader, 3)
    assert len(batches) == len(loader) == size // batch_size
    assert all(len(indices) == batch_size for indices in batches)
    if batches:
        visited = torch.cat(batches)
        assert len(visited.unique()) == len(visited)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 70),
    batch_size=st.integers(1, 30),
    drop_last=st.booleans(),
    epoch=st.integers(0, 50),
    data=st.data(),
)
def test_iter_from_equals_the_tail_of_the_full_epoch(
    size: int, batch_size: int, drop_last: bool, epoch: int, data: st.DataObject
) -> None:
    loader = TensorLoader(_dataset(size), batch_size, drop_last=drop_last, seed=11)
    full = _visited(loader, epoch)
    start = data.draw(st.integers(0, len(loader)), label="batch_in_epoch")
    loader.set_epoch(epoch + 1)  # iter_from ignores the selected epoch
    resumed = [indices for indices, _ in loader.iter_from(epoch, start)]
    assert len(resumed) == len(full) - start
    assert all(torch.equal(a, b) for a, b in zip(resumed, full[start:], strict=True))


def test_same_seed_gives_the_same_order_and_other_epochs_or_seeds_differ() -> None:
    first = TensorLoader(_dataset(100), 10, seed=5)
    second = TensorLoader(_dataset(100), 10, seed=5)
    other_seed = TensorLoader(_dataset(100), 10, seed=6)
    epoch0 = torch.cat(_visited(first, 0))
    assert torch.equal(epoch0, torch.cat(_visited(second, 0)))
    assert not torch.equal(epoch0, torch.cat(_visited(first, 1)))
    assert not torch.equal(epoch0, torch.cat(_visited(other_seed, 0)))
    assert not torch.equal(epoch0, torch.arange(100))


def test_order_matches_the_batches() -> None:
    loader = TensorLoader(_dataset(23), 4, seed=2)
    assert torch.equal(torch.cat(_visited(loader, 9)), loader.order(9))


def test_iterating_leaves_the_tensors_unchanged_and_batches_are_copies() -> None:
    tensors = _dataset(37)
    snapshot = tuple(t.clone() for t in tensors)
    loader = TensorLoader(tensors, 8, shuffle=False)
    for indices, features in loader:
        indices.zero_()
        features.fill_(-1.0)
    list(loader.iter_from(2, 1))
    assert all(torch.equal(t, s) for t, s in zip(tensors, snapshot, strict=True))
    assert loader.tensors[0] is tensors[0]


def test_iterating_does_not_touch_the_global_random_state() -> None:
    before = torch.random.get_rng_state()
    list(TensorLoader(_dataset(20), 3, seed=1))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_attributes_describe_the_loader() -> None:
    loader = TensorLoader(_dataset(10), 4)
    assert loader.dataset_size == 10 and loader.batch_size == 4 and len(loader) == 3
    assert "batch_size=4" in repr(loader)


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True])
def test_invalid_batch_size_raises(batch_size: object) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TensorLoader(_dataset(4), batch_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("tensors", [[torch.zeros(3), "labels"], (), (torch.zeros(3), "labels"), torch.zeros(3)])
def test_tensors_that_are_not_a_tuple_of_tensors_raise_type_error(tensors: object) -> None:
    with pytest.raises(TypeError, match="tensors"):
        TensorLoader(tensors, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tensors", [(torch.zeros(3), torch.zeros(4)), (torch.zeros(0),), (torch.tensor(1.0), torch.zeros(1))]
)
def test_tensors_of_unequal_or_zero_length_raise_value_error(tensors: tuple) -> None:
    with pytest.raises(ValueError, match="lengths"):
        TensorLoader(tensors, 2)


def test_invalid_epoch_or_batch_in_epoch_raise() -> None:
    loader = TensorLoader(_dataset(10), 4)
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)
    with pytest.raises(ValueError, match="batch_in_epoch"):
        loader.iter_from(0, 4)
    with pytest.raises(ValueError, match="seed"):
        TensorLoader(_dataset(10), 4, seed=-1)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 70),
    batch_size=st.integers(1, 12),
    world_size=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    start=st.integers(0, 20),
)
def test_ranks_batches_concatenated_are_the_one_process_batches_of_the_global_size(
    size: int, batch_size: int, world_size: int, drop_last: bool, seed: int, epoch: int, start: int
) -> None:
    whole = TensorLoader(_dataset(size), batch_size * world_size, drop_last=drop_last, seed=seed, rank=0, world_size=1)
    ranks = [
        TensorLoader(_dataset(size), batch_size, drop_last=drop_last, seed=seed, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    assert {len(loader) for loader in ranks} == {len(whole)}
    start = min(start, len(whole))
    expected = [indices for indices, _ in whole.iter_from(epoch, start)]
    per_rank = [[indices for indices, _ in loader.iter_from(epoch, start)] for loader in ranks]
    for step, batch in enumerate(expected):
        parts = [per_rank[r][step] for r in range(world_size)]
        assert all(len(part) <= batch_size for part in parts)
        assert torch.equal(torch.cat(parts), batch)
    # Disjoint and covering: each sample of the epoch's visited part exactly once.
    if start == 0:
        visited = torch.cat([batch for batches in per_rank for batch in batches]) if expected else torch.empty(0)
        assert visited.numel() == len(set(visited.tolist()))
        assert visited.numel() == (size // (batch_size * world_size)) * batch_size * world_size if drop_last else size


def test_rank_and_world_size_default_to_torchruns_environment(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = TensorLoader(_dataset(10), 2, shuffle=False)
    assert (loader.rank, loader.world_size, loader.global_batch_size, len(loader)) == (1, 2, 4, 3)
    assert [indices.tolist() for indices, _ in loader] == [[2, 3], [6, 7], []]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (TensorLoader(_dataset(10), 2).rank, TensorLoader(_dataset(10), 2).world_size) == (0, 1)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"rank": 2, "world_size": 2}, ValueError, r"rank=2 must be an int in \[0, 1\] \(a rank of world_size=2\)"),
        ({"rank": 0, "world_size": 0}, ValueError, "world_size=0 must be an int >= 1"),
        ({"rank": 1}, ValueError, "rank=1, world_size=None: give both or neither"),
    ],
)
def test_a_bad_rank_or_world_size_is_refused_naming_it(options, error, message) -> None:
    with pytest.raises(error, match=message):
        TensorLoader(_dataset(10), 2, **options)


def test_a_malformed_torchrun_environment_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="environment variable RANK='one': expected a whole number"):
        TensorLoader(_dataset(10), 2)
