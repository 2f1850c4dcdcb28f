"""SeqLengthWarmup: Composer's length schedule, token-aligned truncation and reshaping, purity, one step per length."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from composer_fn.algorithms.seq_length_warmup import (
    SeqLengthWarmup,
    set_batch_sequence_length,
    warmup_sequence_length,
)
from composer_fn.core import random as R
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.core.dry_run import dry_run
from composer_fn.core.engine import make_plan, run_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.testing import CHECKS, check_compiled_matches_eager
from composer_fn.testing.settings import settings_for

seeds = st.integers(0, 2**31 - 1)


def _composer_length(batch: int, total_batches: int, duration: float, low: int, high: int, step: int) -> int:
    # Composer's arithmetic, line for line, where it does not divide by zero.
    num_warmup_steps = int(total_batches * duration)
    num_update_steps = (high - low) // step
    update_every_n_steps = num_warmup_steps // num_update_steps
    length = step * (batch // update_every_n_steps) + low
    return min(max(length, low), high)


def _at(
    batch: int, max_duration: str = "1000ba", tokens_per_batch: int = 0, batches_per_epoch: int = 0
) -> Timestamp:
    timestamp = Timestamp().with_max_duration(max_duration)
    for _ in range(batch):
        timestamp = timestamp.advance(1, tokens_per_batch)
        if batches_per_epoch and timestamp.batch_in_epoch == batches_per_epoch:
            timestamp = timestamp.next_epoch()
    return timestamp


# Composer's defaults over a 1000-batch run: 300 warm-up batches, 127 increments of 8, one every 2 batches.
COMPOSER_DEFAULTS_TABLE = [(0, 8), (1, 8), (2, 16), (3, 16), (100, 408), (253, 1016), (254, 1024)]
COMPOSER_DEFAULTS_TABLE += [(299, 1024), (999, 1024)]


@pytest.mark.parametrize(("batch", "length"), COMPOSER_DEFAULTS_TABLE)
def test_the_default_schedule_over_1000_batches_matches_the_tabulated_composer_lengths(
    batch: int, length: int
) -> None:
    assert SeqLengthWarmup().sequence_length(_at(batch)) == length
    assert _composer_length(batch, 1000, 0.3, 8, 1024, 8) == length


@given(
    st.integers(0, 5000),
    st.integers(1, 5000),
    st.floats(0.0, 1.0),
    st.integers(1, 64),
    st.integers(0, 600),
    st.integers(1, 64),
)
def test_a_fractional_duration_gives_composers_length_at_every_batch(
    batch: int, total: int, duration: float, low: int, span: int, step: int
) -> None:
    high = low + span
    increments = span // step
    if increments == 0 or int(total * duration) // increments == 0:
        return  # Composer divides by zero here; the cases below pin what we do instead.
    algorithm = SeqLengthWarmup(duration=duration, min_seq_length=low, max_seq_length=high, step_size=step)
    expected = _composer_length(batch, total, duration, low, high, step)
    assert algorithm.sequence_length(Timestamp(batch=batch).with_max_duration(f"{total}ba")) == expected


@given(
    st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 64), st.integers(0, 600), st.integers(1, 64)
)
def test_the_length_rises_monotonically_in_steps_from_min_to_max(
    progress: int, warmup: int, low: int, span: int, step: int
) -> None:
    if 0 < span < step:
        return
    high = low + span
    lengths = [
        warmup_sequence_length(p, warmup, min_seq_length=low, max_seq_length=high, step_size=step)
        for p in (progress, progress + 1, progress + warmup + 1)
    ]
    assert all(low <= length <= high for length in lengths)
    assert lengths[0] <= lengths[1] <= lengths[2]
    assert all((length - low) % step == 0 or length == high for length in lengths)
    # Where Composer's formula has no step left to take, the warm-up is over: the length is the maximum.
    increments = span // step
    if increments and warmup:
        every = warmup // increments
        done = (increments + 1) * every if every else warmup
        assert (
            warmup_sequence_length(done, warmup, min_seq_length=low, max_seq_length=high, step_size=step)
            == high
        )


def test_a_warmup_of_no_time_starts_at_the_maximum() -> None:
    assert SeqLengthWarmup(duration=0.0, max_seq_length=64).sequence_length(_at(0)) == 64
    assert SeqLengthWarmup(duration="0ba", max_seq_length=64).sequence_length(_at(0)) == 64


def test_a_warmup_shorter_than_its_increments_rises_in_proportion_and_ends_on_time() -> None:
    # 127 increments over 10 batches: 12.7 increments per batch, where Composer divides by zero.
    algorithm = SeqLengthWarmup(duration="10ba")
    lengths = [algorithm.sequence_length(_at(b)) for b in (0, 1, 5, 9, 10)]
    assert lengths == [8, 8 + 8 * 12, 8 + 8 * 63, 8 + 8 * 114, 1024]


def test_a_warmup_in_batches_follows_the_batch_counter_whatever_the_run_length() -> None:
    algorithm = SeqLengthWarmup(duration="70ba", min_seq_length=8, max_seq_length=64, step_size=8)
    # 7 increments, one every 10 batches.
    for max_duration in ("100ba", "5000ba"):
        lengths = [algorithm.sequence_length(_at(b, max_duration)) for b in (0, 9, 10, 35, 69, 70, 80)]
        assert lengths == [8, 8, 16, 32, 56, 64, 64]


def test_a_warmup_in_tokens_follows_the_token_counter() -> None:
    algorithm = SeqLengthWarmup(duration="700tok", min_seq_length=8, max_seq_length=64, step_size=8)
    # 7 increments, one every 100 tokens; 30 tokens per batch.
    lengths = [algorithm.sequence_length(_at(b, tokens_per_batch=30)) for b in (0, 3, 4, 10, 23, 24)]
    assert lengths == [8, 8, 16, 32, 56, 64]


def test_a_warmup_in_samples_follows_the_sample_counter() -> None:
    algorithm = SeqLengthWarmup(duration="14sp", min_seq_length=8, max_seq_length=64, step_size=8)
    assert [algorithm.sequence_length(_at(b)) for b in (0, 1, 2, 13, 14)] == [8, 8, 16, 56, 64]


def test_a_warmup_in_epochs_changes_the_length_only_at_epoch_boundaries() -> None:
    algorithm = SeqLengthWarmup(duration="2ep", min_seq_length=8, max_seq_length=64, step_size=8)
    lengths = [algorithm.sequence_length(_at(b, batches_per_epoch=5)) for b in range(12)]
    # 7 increments over 2 epochs: 3 (7 * 1 // 2) at the end of the first epoch, all 7 after the second.
    assert lengths == [8] * 5 + [32] * 5 + [64] * 2


def test_a_fraction_of_the_run_is_measured_in_the_run_length_unit() -> None:
    algorithm = SeqLengthWarmup(duration=0.5, min_seq_length=8, max_seq_length=64, step_size=8)
    # A 20-epoch run: a 10-epoch warm-up, 7 increments, one every epoch.
    lengths = [algorithm.sequence_length(_at(b, "20ep", batches_per_epoch=3)) for b in (0, 2, 3, 9, 21, 24)]
    assert lengths == [8, 8, 16, 32, 64, 64]
    assert SeqLengthWarmup(duration="0.5dur", min_seq_length=8, max_seq_length=64) == SeqLengthWarmup(
        duration="0.5dur", min_seq_length=8, max_seq_length=64
    )
    assert SeqLengthWarmup(duration="0.5dur", max_seq_length=64).sequence_length(
        _at(40, "100ba")
    ) == algorithm.sequence_length(_at(40, "100ba"))


def test_a_fraction_without_a_run_length_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="max_duration"):
        SeqLengthWarmup().sequence_length(Timestamp())


def test_durations_are_stored_in_one_json_friendly_form() -> None:
    assert SeqLengthWarmup(duration=Time(2, TimeUnit.EPOCH)) == SeqLengthWarmup(duration="2ep")
    assert SeqLengthWarmup(duration=Time(2, TimeUnit.EPOCH)).duration == "2ep"
    assert SeqLengthWarmup(duration=1).duration == 1.0
    for algorithm in (SeqLengthWarmup(), SeqLengthWarmup(duration="3e3tok", truncate=False)):
        assert algorithm_from_config(algorithm.to_config()) == algorithm
        assert eval(repr(algorithm), {"SeqLengthWarmup": SeqLengthWarmup}) == algorithm


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({"duration": 1.5}, "duration=1.5"),
        ({"duration": -0.1}, "-0.1"),
        ({"duration": "2dur"}, "duration='2dur'"),
        ({"duration": "10sec"}, "duration='10sec'"),
        ({"duration": "soon"}, "soon"),
        ({"duration": [0.3]}, "duration"),
        ({"min_seq_length": 0}, "min_seq_length"),
        ({"max_seq_length": 4}, "max_seq_length=4"),
        ({"step_size": 0}, "step_size"),
        ({"min_seq_length": 8, "max_seq_length": 12, "step_size": 8}, "step_size=8"),
    ],
)
def test_invalid_hyperparameters_raise_naming_the_argument(arguments: dict[str, object], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        SeqLengthWarmup(**arguments)  # type: ignore[arg-type]


def test_a_fixed_length_is_allowed() -> None:
    algorithm = SeqLengthWarmup(min_seq_length=16, max_seq_length=16)
    assert {algorithm.sequence_length(_at(b)) for b in (0, 10, 900)} == {16}


# -- set_batch_sequence_length ------------------------------------------------------------------------------


def _text_batch(seed: int, rows: int, length: int) -> tuple[Tensor, Tensor]:
    stream = R.randint(R.key(seed), 0, 50, (rows, length + 1))
    return stream[:, :-1].clone(), stream[:, 1:].clone()


@given(seeds, st.integers(1, 6), st.integers(2, 40), st.data())
def test_truncation_keeps_each_row_prefix_and_labels_aligned_with_inputs(
    seed: int, rows: int, length: int, data: st.DataObject
) -> None:
    inputs, labels = _text_batch(seed, rows, length)
    target = data.draw(st.integers(1, length - 1))
    cut_inputs, cut_labels = set_batch_sequence_length((inputs, labels), target)
    assert cut_inputs.shape == cut_labels.shape == (rows, target)
    for row in range(rows):
        assert cut_inputs[row].tolist() == inputs[row].tolist()[:target]
    # Labels are the next tokens of the inputs before, and still are after.
    assert torch.equal(cut_labels[:, :-1], cut_inputs[:, 1:])


@given(seeds, st.integers(1, 6), st.integers(2, 40), st.data())
def test_reshaping_keeps_the_token_stream_minus_the_remainder_and_keeps_pairs_together(
    seed: int, rows: int, length: int, data: st.DataObject
) -> None:
    inputs, labels = _text_batch(seed, rows, length)
    paired = inputs * 1000 + torch.arange(rows * length).view(rows, length)
    target = data.draw(st.integers(1, length - 1))
    new_inputs, new_paired = set_batch_sequence_length((inputs, paired), target, truncate=False)
    kept = rows * length // target * target
    assert new_inputs.shape == (kept // target, target) and new_paired.shape == new_inputs.shape
    assert torch.equal(new_inputs.flatten(), inputs.flatten()[:kept])
    # Every token keeps its partner: the paired tensor still holds 1000 * input + original position.
    assert torch.equal(new_paired // 1000, new_inputs)
    assert torch.equal(new_paired.flatten() % 1000, torch.arange(kept))
    assert new_inputs.numel() == inputs.numel() - inputs.numel() % target


@given(seeds, st.integers(1, 5), st.integers(1, 20), st.integers(0, 30), st.booleans(), st.booleans())
def test_a_length_at_or_beyond_the_batch_returns_the_batch_itself(
    seed: int, rows: int, length: int, extra: int, truncate: bool, preserve: bool
) -> None:
    batch = _text_batch(seed, rows, length)
    assert set_batch_sequence_length(batch, length + extra, truncate, preserve) is batch


@given(seeds, st.integers(1, 5), st.integers(2, 20), st.data(), st.booleans(), st.booleans())
def test_setting_the_length_twice_equals_setting_it_once_and_leaves_the_input_unchanged(
    seed: int, rows: int, length: int, data: st.DataObject, truncate: bool, preserve: bool
) -> None:
    batch = _text_batch(seed, rows, length)
    copies = tuple(t.clone() for t in batch)
    versions = tuple(t._version for t in batch)
    target = data.draw(st.integers(1, length - 1))
    once = set_batch_sequence_length(batch, target, truncate, preserve)
    twice = set_batch_sequence_length(once, target, truncate, preserve)
    assert all(torch.equal(a, b) for a, b in zip(once, twice, strict=True))
    assert all(torch.equal(t, c) for t, c in zip(batch, copies, strict=True))
    assert tuple(t._version for t in batch) == versions


class _Pair(NamedTuple):
    input_ids: Tensor
    labels: Tensor


@pytest.mark.parametrize("truncate", [True, False])
def test_mapping_tuple_list_and_namedtuple_batches_keep_their_kind_and_agree(truncate: bool) -> None:
    inputs, labels = _text_batch(3, 4, 12)
    expected = set_batch_sequence_length((inputs, labels), 5, truncate)
    assert isinstance(expected, tuple)
    mapping = set_batch_sequence_length({"input_ids": inputs, "labels": labels}, 5, truncate)
    listed = set_batch_sequence_length([inputs, labels], 5, truncate)
    named = set_batch_sequence_length(_Pair(inputs, labels), 5, truncate)
    assert isinstance(mapping, dict) and list(mapping) == ["input_ids", "labels"]
    assert isinstance(listed, list) and isinstance(named, _Pair)
    for result in ((mapping["input_ids"], mapping["labels"]), listed, named):
        assert all(torch.equal(a, b) for a, b in zip(result, expected, strict=True))


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.float32]
)
@pytest.mark.parametrize("truncate", [True, False])
def test_dtypes_are_preserved(dtype: torch.dtype, truncate: bool) -> None:
    inputs, labels = _text_batch(5, 3, 10)
    batch = (inputs.to(dtype), labels.to(dtype))
    result = set_batch_sequence_length(batch, 4, truncate)
    assert all(t.dtype == dtype for t in result)


def test_preserving_the_end_of_sequence_follows_composers_example() -> None:
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15]])
    (kept,) = set_batch_sequence_length((tokens,), 3, preserve_end_of_sequence=True)
    assert kept.tolist() == [[10, 11, 15]]
    (cut,) = set_batch_sequence_length((tokens,), 3)
    assert cut.tolist() == [[10, 11, 12]]


def test_preserving_the_end_of_sequence_in_a_mapping_uses_the_attention_mask() -> None:
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0], [11, 12, 0, 0, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]]),
    }
    result = set_batch_sequence_length(batch, 3, preserve_end_of_sequence=True)
    assert result["input_ids"].tolist() == [[1, 2, 6], [7, 8, 10], [11, 12, 0]]
    assert result["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length({"input_ids": batch["input_ids"]}, 3, preserve_end_of_sequence=True)


def test_reshaping_ignores_preserve_end_of_sequence() -> None:
    batch = _text_batch(7, 3, 10)
    plain = set_batch_sequence_length(batch, 4, truncate=False)
    preserved = set_batch_sequence_length(batch, 4, truncate=False, preserve_end_of_sequence=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, preserved, strict=True))


def test_malformed_batches_are_refused_with_what_was_expected() -> None:
    inputs, labels = _text_batch(8, 3, 10)
    with pytest.raises(ValueError, match=r"expected a sequence \[3, 10, \.\.\.\] \(cut with the tokens\)"):
        set_batch_sequence_length((inputs, labels[:2, 0]), 4)
    with pytest.raises(ValueError, match="shape"):
        set_batch_sequence_length((inputs, labels[:, :6]), 4, truncate=False)
    with pytest.raises(ValueError, match="curr_seq_len=0"):
        set_batch_sequence_length((inputs, labels), 0)
    with pytest.raises(TypeError, match="str"):
        set_batch_sequence_length((inputs, "labels"), 4)
    with pytest.raises(TypeError, match="Tensor"):
        set_batch_sequence_length(inputs, 4)


# -- the record in the engine -----------------------------------------------------------------------------


def test_the_plan_key_is_the_length_capped_at_the_batch_length() -> None:
    algorithm = SeqLengthWarmup(duration="70ba", max_seq_length=64)
    assert algorithm.plan_key(_at(0), BatchMeta(4, (4, 32))) == 8
    assert algorithm.plan_key(_at(69), BatchMeta(4, (4, 32))) == 32
    assert algorithm.plan_key(_at(69)) == algorithm.sequence_length(_at(69))
    assert algorithm.plan_key(_at(69), BatchMeta(4)) == algorithm.sequence_length(_at(69))


def test_the_traced_hook_sets_the_length_of_its_plan_key() -> None:
    algorithm = SeqLengthWarmup(duration="70ba", max_seq_length=64, truncate=False)
    batch = _text_batch(9, 4, 32)
    meta = BatchMeta(4, (4, 32))
    plan = make_plan([algorithm], timestamp=_at(25), meta=meta)
    state = State(
        params={},
        buffers={},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64),
        key=R.key(0),
    )
    ctx = StepCtx(batch=batch, key=R.key(0), loss_fn=lambda outputs, batch: outputs)
    _, ctx = run_event(Event.AFTER_DATALOADER, plan, state, ctx)
    expected = set_batch_sequence_length(batch, 24, truncate=False)
    assert all(torch.equal(a, b) for a, b in zip(ctx.batch, expected, strict=True))
    with pytest.raises(TypeError, match="plan_key"):
        algorithm.traced_hooks("24")


def test_a_run_compiles_one_step_per_distinct_length() -> None:
    algorithm = SeqLengthWarmup(duration=0.5, min_seq_length=8, max_seq_length=64, step_size=8)
    run = dry_run([algorithm], "40ba", steps_per_epoch=10, batch_size=4, input_shape=(4, 32))
    # Eight lengths (8 to 64) over the run, but every one from 32 on leaves the 32-token batches as they are.
    assert {algorithm.sequence_length(_at(b, "40ba")) for b in range(40)} == set(range(8, 65, 8))
    assert run.compiled_steps == len({8, 16, 24, 32})


def test_the_record_declares_its_name_modality_and_event() -> None:
    algorithm = SeqLengthWarmup()
    assert algorithm.name == "seq_length_warmup" and settings_for(algorithm).modality == "tokens"
    assert set(algorithm.traced_hooks()) == {Event.AFTER_DATALOADER}
    # The one host hook checks the data's length at the run's first batch, and only there.
    assert set(algorithm.host_hooks()) == {Event.BATCH_START}
    assert algorithm.match(Event.BATCH_START, _at(0, "40ba")) and not algorithm.match(Event.BATCH_START, _at(1, "40ba"))
    assert not settings_for(algorithm).stochastic(algorithm)


# -- the contract suite, with warm-ups that change the length within its three steps ----------------------

CHANGING = [
    SeqLengthWarmup(duration="3ba", max_seq_length=32),
    SeqLengthWarmup(duration=1.0, max_seq_length=32, truncate=False),
    SeqLengthWarmup(
        duration="96tok", min_seq_length=4, max_seq_length=32, step_size=4, preserve_end_of_sequence=True
    ),
]


@pytest.mark.parametrize(
    "check", [c for c in CHECKS if c is not check_compiled_matches_eager], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("algorithm", CHANGING, ids=repr)
def test_a_changing_length_honours_the_contract(algorithm: SeqLengthWarmup, check) -> None:
    check(algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", CHANGING[:2], ids=repr)
def test_a_changing_length_compiles_to_the_eager_result(algorithm: SeqLengthWarmup) -> None:
    check_compiled_matches_eager(algorithm)


@pytest.mark.parametrize("as_mapping", [False, True])
def test_an_image_batch_is_refused_rather_than_passed_through(as_mapping) -> None:
    images, labels = R.uniform(R.key(0), (4, 3, 32, 32)), torch.zeros(4, dtype=torch.int64)
    batch = {"input": images, "labels": labels} if as_mapping else (images, labels)
    name = "'input'" if as_mapping else "0"
    with pytest.raises(ValueError, match=rf"batch item {name} is a floating-point tensor of shape \(4, 3, 32, 32\)"):
        set_batch_sequence_length(batch, 8)
    hook = SeqLengthWarmup(duration="2ba", min_seq_length=8, max_seq_length=16).traced_hooks(8)
    with pytest.raises(ValueError, match="an image batch"):
        next(iter(hook.values()))(None, StepCtx(batch, R.key(0), lambda o, b: o.sum()))
