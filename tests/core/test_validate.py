"""Argument checks: a value in range comes back as given; anything else is refused naming argument, value, range."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core import validate
from composer_fn.core.time import Time, TimeUnit

bounds = st.tuples(st.integers(-100, 100), st.integers(0, 100)).map(lambda pair: (pair[0], pair[0] + pair[1]))


@given(bounds, st.data())
def test_an_int_in_range_comes_back_and_one_outside_is_refused_with_its_range(
    limits: tuple[int, int], data: st.DataObject
) -> None:
    low, high = limits
    inside = data.draw(st.integers(low, high))
    assert validate.integer("count", inside, minimum=low, maximum=high) == inside
    outside = data.draw(st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1)))
    with pytest.raises(ValueError, match=rf"count={outside} must be an int in \[{low}, {high}\]"):
        validate.integer("count", outside, minimum=low, maximum=high)


@given(st.sampled_from([True, False, 1.0, "1", None]))
def test_an_int_check_refuses_bools_floats_and_strings(value: object) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        validate.integer("count", value)


@given(st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.booleans())
def test_a_real_number_is_checked_against_open_or_closed_bounds(value: float, open_below: bool, open_above: bool) -> None:
    inside = (value > -1 or (value == -1 and not open_below)) and (value < 1 or (value == 1 and not open_above))
    if inside:
        assert validate.real("rate", value, minimum=-1, maximum=1, open_below=open_below, open_above=open_above) == value
    else:
        with pytest.raises(ValueError, match=r"rate=.* must be a finite number in [\[(]-1, 1[\])]"):
            validate.real("rate", value, minimum=-1, maximum=1, open_below=open_below, open_above=open_above)


@given(st.sampled_from([math.nan, math.inf, -math.inf, True, "0.5", None]))
def test_a_real_check_refuses_non_finite_numbers_bools_and_strings(value: object) -> None:
    with pytest.raises(ValueError, match="must be a finite number"):
        validate.real("rate", value)


def test_an_int_is_accepted_as_a_real_number_and_comes_back_as_a_float() -> None:
    result = validate.real("rate", 3, minimum=0)
    assert result == 3.0 and isinstance(result, float)


def test_bounds_of_large_integers_print_whole() -> None:
    with pytest.raises(ValueError, match=r"\[1, 16777216\]"):
        validate.integer("classes", 0, minimum=1, maximum=2**24)


@given(st.floats(0, 1))
def test_a_probability_is_a_number_in_the_unit_interval(value: float) -> None:
    assert validate.probability("p", value) == value
    with pytest.raises(ValueError, match=r"p=1.5 must be a finite number in \[0, 1\] \(a probability\)"):
        validate.probability("p", 1.5)


def test_flags_are_bools_only() -> None:
    assert validate.flag("enabled", True) is True
    with pytest.raises(TypeError, match="enabled=1 must be True or False"):
        validate.flag("enabled", 1)


def test_a_choice_names_what_is_accepted_and_refuses_bools() -> None:
    assert validate.choice("mode", "crop", ("crop", "resize")) == "crop"
    with pytest.raises(ValueError, match="mode='pad' must be one of 'crop', 'resize'"):
        validate.choice("mode", "pad", ("crop", "resize"))
    with pytest.raises(ValueError, match="must be one of"):
        validate.choice("flag", True, (1, 0))


@given(st.floats(0, 10), st.sampled_from(list(TimeUnit)))
def test_a_time_is_parsed_in_the_accepted_units_only(value: float, unit: TimeUnit) -> None:
    text = Time(value if unit is TimeUnit.DURATION else int(value), unit).to_timestring()
    accepted = (TimeUnit.DURATION, TimeUnit.BATCH)
    if unit in accepted:
        assert validate.time("start", text, accepted, "0.5dur") == Time.from_timestring(text)
    else:
        with pytest.raises(ValueError, match=r"start=.* must be a time string in dur, ba, e\.g\. '0\.5dur'"):
            validate.time("start", text, accepted, "0.5dur")


def test_a_bare_number_is_a_time_only_when_a_unit_is_given_for_it() -> None:
    assert validate.time("warmup", 0.25, (TimeUnit.DURATION,), "0.1dur", number_unit=TimeUnit.DURATION) == Time(
        0.25, TimeUnit.DURATION
    )
    with pytest.raises(ValueError, match=r"or a number of dur"):
        validate.time("warmup", -0.25, (TimeUnit.DURATION,), "0.1dur", number_unit=TimeUnit.DURATION)
    with pytest.raises(ValueError, match="warmup=0.25 must be a time string in dur, e.g."):
        validate.time("warmup", 0.25, (TimeUnit.DURATION,), "0.1dur")


@given(st.integers(-(2**31), 2**31 - 1), st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint64"]))
def test_a_numpy_integer_is_an_int_and_comes_back_as_a_python_int(value: int, dtype: str) -> None:
    import numpy as np

    info = np.iinfo(dtype)
    scalar = np.dtype(dtype).type(min(max(value, info.min), info.max))
    result = validate.integer("count", scalar)
    assert result == int(scalar) and type(result) is int
    assert validate.batch_key("target_key", scalar) == int(scalar) and type(validate.batch_key("k", scalar)) is int


@given(st.floats(-6e4, 6e4, allow_nan=False), st.sampled_from(["float16", "float32", "float64"]))
def test_a_numpy_float_is_a_real_number_and_comes_back_as_a_python_float(value: float, dtype: str) -> None:
    import numpy as np

    scalar = np.dtype(dtype).type(value)
    result = validate.real("rate", scalar)
    assert result == float(scalar) and type(result) is float
    assert Time(np.int64(3), TimeUnit.EPOCH).value == 3 and type(Time(np.int64(3), TimeUnit.EPOCH).value) is int


def test_a_numpy_bool_or_a_numpy_nan_is_refused_like_python_s() -> None:
    import numpy as np

    for value in (np.bool_(True), np.bool_(False)):
        with pytest.raises(ValueError, match="must be an int"):
            validate.integer("count", value)
        with pytest.raises(ValueError, match="must be a finite number"):
            validate.real("rate", value)
    with pytest.raises(ValueError, match="must be a finite number"):
        validate.real("rate", np.float32("nan"))


def test_a_numpy_bool_is_a_flag_and_comes_back_as_a_python_bool() -> None:
    import numpy as np

    assert validate.flag("shuffle", np.bool_(True)) is True and validate.flag("shuffle", np.False_) is False
    with pytest.raises(TypeError, match="shuffle=1 must be True or False"):
        validate.flag("shuffle", 1)
