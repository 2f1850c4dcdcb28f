"""Specification of training time: parsing, arithmetic, timestamps, elapsed fraction and step conversion."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core.time import Time, Timestamp, TimeUnit, elapsed, to_steps

COUNTED_UNITS = [unit for unit in TimeUnit if unit is not TimeUnit.DURATION]

times = st.one_of(
    st.builds(Time, st.integers(min_value=0, max_value=10**30), st.sampled_from(COUNTED_UNITS)),
    st.builds(
        Time,
        st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False),
        st.just(TimeUnit.DURATION),
    ),
)


@given(times)
def test_a_time_string_parses_back_to_the_same_time(time: Time) -> None:
    assert Time.from_timestring(time.to_timestring()) == time
    assert Time.from_timestring(str(time)) == time


@given(times)
def test_repr_evaluates_back_to_the_same_time(time: Time) -> None:
    assert eval(repr(time), {"Time": Time, "TimeUnit": TimeUnit}) == time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90ep", Time(90, TimeUnit.EPOCH)),
        ("0.5dur", Time(0.5, TimeUnit.DURATION)),
        ("3e4tok", Time(30_000, TimeUnit.TOKEN)),
        ("1h30m", Time(5400, TimeUnit.SECOND)),
        ("1h30m5s", Time(5405, TimeUnit.SECOND)),
        ("45s", Time(45, TimeUnit.SECOND)),
        ("12BA", Time(12, TimeUnit.BATCH)),
        ("7iter", Time(7, TimeUnit.ITERATION)),
        ("256sp", Time(256, TimeUnit.SAMPLE)),
        ("30sec", Time(30, TimeUnit.SECOND)),
        ("1dur", Time(1.0, TimeUnit.DURATION)),
    ],
)
def test_documented_time_strings(text: str, expected: Time) -> None:
    parsed = Time.from_timestring(text)
    assert parsed == expected
    assert parsed.unit is expected.unit
    assert type(parsed.value) is type(expected.value)


def test_counts_are_ints_and_durations_are_floats() -> None:
    assert isinstance(Time.from_timestring("3e4tok").value, int)
    assert isinstance(Time.from_timestring("1dur").value, float)
    assert isinstance(Time(2.0, TimeUnit.EPOCH).value, int)


@pytest.mark.parametrize(
    "text",
    ["90 epochs", "", "ep", "abcba", "1.5ep", "-1ep", "-0.5dur", "nandur", "infba", "1.2.3ba", "5 days"],
)
def test_bad_time_strings_raise_a_value_error_naming_the_string(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text).replace(".", r"\.")):
        Time.from_timestring(text)


def test_the_bad_string_message_lists_the_accepted_forms() -> None:
    with pytest.raises(ValueError) as error:
        Time.from_timestring("90 epochs")
    for form in ["iter", "ep", "ba", "sp", "tok", "dur", "sec", "'90ep'", "'1h30m'"]:
        assert form in str(error.value)


def test_a_time_string_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="timestring"):
        Time.from_timestring(90)  # type: ignore[arg-type]


def test_negative_and_non_finite_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="-3"):
        Time(-3, TimeUnit.BATCH)
    with pytest.raises(ValueError, match="inf"):
        Time(float("inf"), TimeUnit.DURATION)
    with pytest.raises(TypeError, match="value"):
        Time("3", TimeUnit.BATCH)  # type: ignore[arg-type]


def test_unit_strings_are_accepted_and_bad_units_named() -> None:
    assert Time(3, "ep") == Time.from_epoch(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'epochs'"):
        Time(3, "epochs")  # type: ignore[arg-type]


def test_constructors_build_their_unit() -> None:
    assert Time.from_epoch(2).unit is TimeUnit.EPOCH
    assert Time.from_batch(2).unit is TimeUnit.BATCH
    assert Time.from_sample(2).unit is TimeUnit.SAMPLE
    assert Time.from_token(2).unit is TimeUnit.TOKEN
    assert Time.from_iteration(2).unit is TimeUnit.ITERATION
    assert Time.from_duration(0.2).unit is TimeUnit.DURATION
    assert Time.from_second(2).unit is TimeUnit.SECOND


def test_from_input_accepts_time_string_and_int() -> None:
    assert Time.from_input(Time.from_batch(3), TimeUnit.EPOCH) == Time.from_batch(3)
    assert Time.from_input("3ba", TimeUnit.EPOCH) == Time.from_batch(3)
    assert Time.from_input(3, TimeUnit.EPOCH) == Time.from_epoch(3)
    assert Time.from_input(3, "sp") == Time.from_sample(3)
    with pytest.raises(TypeError, match="3.5"):
        Time.from_input(3.5, TimeUnit.EPOCH)  # type: ignore[arg-type]


def test_comparison_with_a_number_assumes_the_same_unit() -> None:
    assert Time.from_epoch(3) < 4
    assert Time.from_epoch(3) >= 3
    assert Time.from_epoch(3) == 3
    assert Time.from_epoch(3) < "4ep"


def test_different_units_cannot_be_ordered_or_added() -> None:
    with pytest.raises(RuntimeError, match="'ep' and 'ba'"):
        _ = Time.from_epoch(1) < Time.from_batch(5)
    with pytest.raises(RuntimeError, match="'ep' and 'ba'"):
        Time.from_epoch(1) + Time.from_batch(5)
    with pytest.raises(RuntimeError, match="'ep' and 'ba'"):
        Time.from_epoch(1) - "1ba"
    with pytest.raises(RuntimeError, match="'ep' and 'sp'"):
        _ = Time.from_epoch(1) >= "1sp"


def test_times_in_different_units_are_unequal() -> None:
    assert Time.from_epoch(1) != Time.from_batch(1)
    assert len({Time.from_epoch(1), Time.from_batch(1), Time.from_epoch(1)}) == 2


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_addition_and_subtraction_in_one_unit(a: int, b: int) -> None:
    total = Time.from_batch(a) + Time.from_batch(b)
    assert total == Time.from_batch(a + b)
    assert total - Time.from_batch(b) == Time.from_batch(a)
    assert a + Time.from_batch(b) == Time.from_batch(a + b)


@given(st.integers(0, 10**6), st.integers(1, 10**6))
def test_dividing_times_of_one_unit_gives_a_duration_ratio(a: int, b: int) -> None:
    ratio = Time.from_sample(a) / Time.from_sample(b)
    assert ratio.unit is TimeUnit.DURATION
    assert ratio.value == a / b


def test_multiplication_needs_a_scalar_or_a_duration() -> None:
    assert Time.from_epoch(2) * 3 == Time.from_epoch(6)
    assert Time.from_duration(0.3) * Time.from_epoch(10) == Time.from_epoch(3)
    assert Time.from_epoch(10) * Time.from_duration(0.5) == Time.from_epoch(5)
    assert (Time.from_epoch(10) * "0.5dur").unit is TimeUnit.EPOCH
    with pytest.raises(RuntimeError, match="'dur'"):
        Time.from_epoch(2) * Time.from_batch(3)
    with pytest.raises(ValueError, match="whole number"):
        Time.from_epoch(3) * 0.5


def test_modulo_int_float_and_scaling_by_division() -> None:
    assert Time.from_batch(10) % Time.from_batch(4) == Time.from_batch(2)
    assert Time.from_batch(10) % 3 == Time.from_batch(1)
    assert int(Time.from_batch(10)) == 10
    assert float(Time.from_duration(0.25)) == 0.25
    assert Time.from_epoch(4) / 2 == Time.from_epoch(2)


@given(times, times)
def test_ordering_within_a_unit_follows_the_values(a: Time, b: Time) -> None:
    b = Time(b.value, a.unit) if a.unit is TimeUnit.DURATION else Time(int(b.value), a.unit)
    assert (a < b) == (a.value < b.value)
    assert (a <= b) == (a.value <= b.value)
    assert (a > b) == (a.value > b.value)
    assert (a >= b) == (a.value >= b.value)
    assert (a == b) == (a.value == b.value)
    if a == b:
        assert hash(a) == hash(b)


@given(st.lists(st.tuples(st.integers(0, 512), st.integers(0, 10**5)), max_size=40))
def test_advance_adds_one_batch_and_its_samples_and_tokens(batches: list[tuple[int, int]]) -> None:
    timestamp = Timestamp()
    for samples, tokens in batches:
        before = timestamp
        timestamp = timestamp.advance(samples, tokens, duration=0.5)
        assert before == Timestamp.from_dict(before.to_dict())
        assert timestamp.batch == before.batch + 1
    assert timestamp.batch == timestamp.batch_in_epoch == len(batches)
    assert timestamp.sample == timestamp.sample_in_epoch == sum(s for s, _ in batches)
    assert timestamp.token == timestamp.token_in_epoch == sum(t for _, t in batches)
    assert timestamp.total_wct == timestamp.epoch_wct == pytest.approx(0.5 * len(batches))
    assert timestamp.batch_wct == (0.5 if batches else 0.0)
    assert timestamp.epoch == 0


@given(st.integers(0, 200), st.integers(0, 1024))
def test_n_advances_of_b_samples_count_n_times_b_and_leave_the_input_unchanged(n: int, b: int) -> None:
    start = Timestamp()
    timestamp = start
    for _ in range(n):
        timestamp = timestamp.advance(b)
    assert timestamp.sample == n * b
    assert timestamp.batch == n
    assert start == Timestamp()


def test_next_epoch_counts_the_epoch_and_resets_the_in_epoch_counters() -> None:
    timestamp = Timestamp().advance(8, 100, 1.0).advance(8, 100, 2.0)
    after = timestamp.next_epoch(duration=0.5)
    assert (after.epoch, after.epoch_in_iteration) == (1, 1)
    assert (after.batch, after.sample, after.token) == (2, 16, 200)
    assert (after.batch_in_epoch, after.sample_in_epoch, after.token_in_epoch) == (0, 0, 0)
    assert (after.epoch_wct, after.batch_wct) == (0.0, 0.0)
    assert after.total_wct == 3.5
    assert timestamp.epoch == 0 and timestamp.batch_in_epoch == 2
    later = after.advance(4)
    assert (later.batch_in_epoch, later.sample_in_epoch, later.batch) == (1, 4, 3)


def test_advance_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="samples=-1"):
        Timestamp().advance(-1)


def test_get_reads_the_counter_of_a_unit() -> None:
    timestamp = Timestamp(iteration=1, epoch=2, batch=3, sample=4, token=5)
    assert [timestamp.get(unit) for unit in ["iter", "ep", "ba", "sp", "tok"]] == [1, 2, 3, 4, 5]
    assert timestamp.get(TimeUnit.BATCH) == 3
    for unit in (TimeUnit.DURATION, TimeUnit.SECOND):
        with pytest.raises(ValueError, match=f"'{unit.value}'"):
            timestamp.get(unit)


def test_comparing_a_timestamp_with_a_time_uses_the_counter_of_its_unit() -> None:
    timestamp = Timestamp(epoch=2, batch=50, sample=1600)
    assert timestamp >= "2ep" and timestamp > "1ep" and timestamp < "3ep" and timestamp <= "2ep"
    assert timestamp >= Time.from_batch(50) and not timestamp > Time.from_batch(50)
    assert timestamp < Time.from_sample(1601)
    with pytest.raises(ValueError, match="max_duration"):
        _ = timestamp >= "0.5dur"


counters = st.integers(0, 10**12)
timestamps = st.builds(
    Timestamp,
    counters,
    counters,
    counters,
    counters,
    counters,
    counters,
    counters,
    counters,
    counters,
    st.floats(0, 1e9),
    st.floats(0, 1e9),
    st.floats(0, 1e9),
)


@given(timestamps)
def test_to_dict_and_from_dict_round_trip_through_plain_values(timestamp: Timestamp) -> None:
    data = timestamp.to_dict()
    assert all(type(value) in (int, float) for value in data.values())
    assert Timestamp.from_dict(data) == timestamp


def test_from_dict_rejects_unknown_missing_and_bad_values() -> None:
    data = Timestamp().to_dict()
    with pytest.raises(ValueError, match="unknown keys \\['batches'\\]"):
        Timestamp.from_dict({**data, "batches": 3})
    without_epoch = {key: value for key, value in data.items() if key != "epoch"}
    with pytest.raises(ValueError, match="missing keys \\['epoch'\\]"):
        Timestamp.from_dict(without_epoch)
    with pytest.raises(ValueError, match="data\\['batch'\\]=-1"):
        Timestamp.from_dict({**data, "batch": -1})
    with pytest.raises(ValueError, match="data\\['batch'\\]=1.5"):
        Timestamp.from_dict({**data, "batch": 1.5})
    assert Timestamp.from_dict({**data, "total_wct": 3}).total_wct == 3.0


@given(st.integers(1, 50), st.sampled_from(["ep", "ba", "sp", "tok"]), st.integers(1, 8))
def test_elapsed_is_in_zero_one_and_never_decreases(length: int, unit: str, per_batch: int) -> None:
    max_duration = Time(length, unit)  # type: ignore[arg-type]
    timestamp = Timestamp()
    previous = elapsed(timestamp, max_duration)
    assert previous == 0.0
    for batch in range(4 * length):
        timestamp = timestamp.advance(per_batch, per_batch * 7)
        if batch % 4 == 3:
            timestamp = timestamp.next_epoch()
        fraction = elapsed(timestamp, max_duration)
        assert 0.0 <= fraction <= 1.0
        assert fraction >= previous
        previous = fraction
    assert previous == 1.0


def test_elapsed_reads_the_unit_of_max_duration() -> None:
    timestamp = Timestamp(epoch=1, batch=30)
    assert elapsed(timestamp, "4ep") == 0.25
    assert elapsed(timestamp, "120ba") == 0.25
    assert elapsed(timestamp, "0ba") == 1.0
    with pytest.raises(ValueError, match="'dur'"):
        elapsed(timestamp, "1dur")


@pytest.mark.parametrize(
    ("time", "expected"),
    [("7ba", 7), ("3ep", 300), ("0.5dur", 500), ("1dur", 1000), ("0.0004dur", 0), ("0.57dur", 570)],
)
def test_to_steps_converts_batches_epochs_and_durations(time: str, expected: int) -> None:
    assert to_steps(time, steps_per_epoch=100, max_steps=1000) == expected
    assert to_steps(Time.from_timestring(time), steps_per_epoch=100, max_steps=1000) == expected


@pytest.mark.parametrize("time", ["5sp", "5tok", "5sec", "2iter", "1h"])
def test_to_steps_rejects_units_without_a_step_count(time: str) -> None:
    with pytest.raises(ValueError, match="expected ba, ep or dur"):
        to_steps(time, steps_per_epoch=10, max_steps=100)


def test_to_steps_validates_the_counts() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch=-1"):
        to_steps("1ep", steps_per_epoch=-1, max_steps=100)
    with pytest.raises(ValueError, match="max_steps=1.5"):
        to_steps("1dur", steps_per_epoch=10, max_steps=1.5)  # type: ignore[arg-type]


@given(st.integers(1, 1000), st.integers(0, 1200))
def test_elapsed_is_the_fraction_of_max_duration_done_and_drives_dur_comparisons(total: int, done: int) -> None:
    timestamp = Timestamp().with_max_duration(f"{total}ba")
    for _ in range(min(done, 50)):
        timestamp = timestamp.advance(1)
    fraction = min(1.0, min(done, 50) / total)
    assert timestamp.elapsed == fraction
    assert (timestamp >= "0.5dur") == (fraction >= 0.5)
    assert timestamp.next_epoch().max_duration == Time(total, TimeUnit.BATCH)
    assert "max_duration" not in timestamp.to_dict()


def test_a_dur_comparison_without_max_duration_names_the_fix() -> None:
    with pytest.raises(ValueError, match="with_max_duration"):
        Timestamp() >= "0.5dur"  # noqa: B015
    with pytest.raises(ValueError, match="'sec'"):
        Timestamp().with_max_duration("10sec")
