"""The standard-library text task: labels are the next characters, the split is fixed and disjoint."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.data.text import MAX_CHARS, TextTask, load_stdlib_text_task, stdlib_text


def _rows(loader) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = loader.tensors
    return inputs, labels


@pytest.fixture(scope="module")
def task() -> TextTask:
    return load_stdlib_text_task(seq_len=32, batch_size=16, max_chars=20_000)


def test_labels_are_the_inputs_shifted_by_one_character(task: TextTask) -> None:
    text = stdlib_text()[: task.num_chars]
    for loader in (task.train, task.eval):
        inputs, labels = _rows(loader)
        assert inputs.dtype == labels.dtype == torch.int64
        assert inputs.shape == labels.shape and inputs.shape[1] == 32
        torch.testing.assert_close(labels[:, :-1], inputs[:, 1:], rtol=0, atol=0)
        for row in range(0, inputs.shape[0], 37):
            decoded = task.decode(inputs[row]) + task.decode(labels[row, -1:])
            assert decoded in text


def _windows(task: TextTask, seq_len: int) -> torch.Tensor:
    window = seq_len + 1
    ids = task.encode(stdlib_text()[: task.num_chars])
    return ids[: task.num_chars // window * window].view(-1, window)


def test_every_tenth_window_of_the_text_is_held_out_and_the_rest_train_in_order(task: TextTask) -> None:
    windows = _windows(task, 32)
    held_out = torch.arange(windows.shape[0]) % 10 == 9
    for loader, rows in ((task.train, windows[~held_out]), (task.eval, windows[held_out])):
        inputs, labels = _rows(loader)
        assert torch.equal(inputs, rows[:, :-1]) and torch.equal(labels, rows[:, 1:])


@settings(max_examples=10)
@given(st.integers(1, 40), st.floats(0.05, 0.5))
def test_the_windows_are_split_between_train_and_eval_by_the_documented_rule(
    seq_len: int, eval_fraction: float
) -> None:
    task = load_stdlib_text_task(seq_len=seq_len, batch_size=1, max_chars=5_000, eval_fraction=eval_fraction)
    windows = _windows(task, seq_len)
    index = torch.arange(windows.shape[0], dtype=torch.float64)
    held_out = torch.floor((index + 1) * eval_fraction) > torch.floor(index * eval_fraction)
    # Each window (a span of character positions) goes to exactly one part, so no position is in both.
    for loader, rows in ((task.train, windows[~held_out]), (task.eval, windows[held_out])):
        inputs, labels = _rows(loader)
        assert torch.equal(inputs, rows[:, :-1]) and torch.equal(labels, rows[:, 1:])
    assert task.eval.dataset_size == math.floor(windows.shape[0] * eval_fraction)
    assert task.train.dataset_size + task.eval.dataset_size == windows.shape[0]


def test_building_twice_gives_equal_tensors_and_vocabulary() -> None:
    first = load_stdlib_text_task(seq_len=16, max_chars=10_000, seed=3)
    second = load_stdlib_text_task(seq_len=16, max_chars=10_000, seed=3)
    assert first.vocab == second.vocab
    for a, b in ((first.train, second.train), (first.eval, second.eval)):
        assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    assert torch.equal(first.train.order(2), second.train.order(2))


def test_the_seed_changes_only_the_training_order() -> None:
    first = load_stdlib_text_task(seq_len=16, max_chars=10_000, seed=0)
    other = load_stdlib_text_task(seq_len=16, max_chars=10_000, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(first.train.tensors, other.train.tensors, strict=True))
    assert not torch.equal(first.train.order(0), other.train.order(0))
    assert not first.eval.shuffle


def test_the_vocabulary_is_the_sorted_characters_of_the_text(task: TextTask) -> None:
    text = stdlib_text()[: task.num_chars]
    assert task.vocab == "".join(sorted(set(text)))
    assert task.vocab_size == len(task.vocab)
    assert task.decode(task.encode(text)) == text
    for inputs, labels in (_rows(task.train), _rows(task.eval)):
        assert int(inputs.min()) >= 0 and int(labels.max()) < task.vocab_size


def test_training_batches_all_have_one_shape_and_eval_batches_cover_every_row(task: TextTask) -> None:
    shapes = {tuple(inputs.shape) for inputs, _ in task.train}
    assert shapes == {(16, 32)}
    assert sum(inputs.shape[0] for inputs, _ in task.eval) == task.eval.dataset_size


def test_the_corpus_is_cut_at_max_chars() -> None:
    task = load_stdlib_text_task(max_chars=MAX_CHARS)
    assert task.num_chars == min(MAX_CHARS, len(stdlib_text()))
    assert load_stdlib_text_task(max_chars=3_000).num_chars == 3_000


def test_encode_rejects_characters_outside_the_vocabulary(task: TextTask) -> None:
    with pytest.raises(ValueError, match="not in the vocabulary"):
        task.encode("\u2603")


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"batch_size": 1.5}, "batch_size"),
        ({"max_chars": MAX_CHARS + 1}, "max_chars"),
        ({"max_chars": True}, "max_chars"),
        ({"eval_fraction": 0.0}, "eval_fraction"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"max_chars": 100, "seq_len": 64}, "max_chars=100"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(arguments: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        load_stdlib_text_task(**arguments)  # type: ignore[arg-type]
