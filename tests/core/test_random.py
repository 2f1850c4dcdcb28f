"""Specification of explicit random keys: determinism, the host mirror, independence, distributions, compile."""

from __future__ import annotations

import math
import random as python_random
from collections.abc import Callable
from statistics import NormalDist

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.core import random as rng

SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
SHAPES = st.lists(st.integers(min_value=0, max_value=4), max_size=3).map(tuple)
FOLD_DATA = st.integers(min_value=-(2**63), max_value=2**64 - 1)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Edge seeds: zero, the top of each 32-bit word, and the largest seed.
STATISTICAL_SEEDS = (0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1)
P_VALUE = 1e-6

Sampler = Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor]

SAMPLERS: dict[str, Sampler] = {
    "bits": lambda k, shape: rng.bits(k, shape),
    "uniform_float16": lambda k, shape: rng.uniform(k, shape, dtype=torch.float16),
    "uniform_bfloat16": lambda k, shape: rng.uniform(k, shape, dtype=torch.bfloat16),
    "uniform_float32": lambda k, shape: rng.uniform(k, shape, dtype=torch.float32),
    "uniform_float64": lambda k, shape: rng.uniform(k, shape, dtype=torch.float64),
    "uniform_low_high": lambda k, shape: rng.uniform(k, shape, low=-2.0, high=3.0),
    "normal": lambda k, shape: rng.normal(k, shape),
    "bernoulli": lambda k, shape: rng.bernoulli(k, 0.3, shape),
    "randint": lambda k, shape: rng.randint(k, -5, 17, shape),
    "permutation": lambda k, shape: rng.permutation(k, sum(shape) + 1),
    "split": lambda k, shape: rng.split(k, len(shape) + 1),
    "fold_in": lambda k, shape: rng.fold_in(k, math.prod(shape) * 7919),
}

_SAME_SIZE_INT = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if actual.dtype in _SAME_SIZE_INT:
        # Compare the bit patterns, so that -0.0 and 0.0 (or two NaNs) count as different.
        actual, expected = (
            actual.view(_SAME_SIZE_INT[actual.dtype]),
            expected.view(_SAME_SIZE_INT[expected.dtype]),
        )
    assert torch.equal(actual, expected)


def pearson_r(x: torch.Tensor, y: torch.Tensor) -> float:
    x = x.to(torch.float64).flatten()
    y = y.to(torch.float64).flatten()
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / torch.sqrt((x * x).sum() * (y * y).sum()))


def chi_square_quantile(degrees_of_freedom: int, p_value: float) -> float:
    """Returns the upper ``p_value`` quantile of chi-square (Wilson-Hilferty cube-root normal approximation)."""
    z = NormalDist().inv_cdf(1.0 - p_value)
    h = 2.0 / (9.0 * degrees_of_freedom)
    return degrees_of_freedom * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: torch.Tensor) -> float:
    counts = counts.to(torch.float64)
    expected = counts.sum() / counts.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def standard_normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


# ----------------------------------------------------------------------------------------------- determinism


@given(seed=SEEDS, shape=SHAPES, sampler=st.sampled_from(sorted(SAMPLERS)))
def test_the_same_key_gives_bitwise_equal_draws(seed: int, shape: tuple[int, ...], sampler: str) -> None:
    draw = SAMPLERS[sampler]
    assert_bitwise_equal(draw(rng.key(seed), shape), draw(rng.key(seed), shape))


@given(seed=SEEDS, data=FOLD_DATA)
def test_fold_in_is_a_function_of_the_key_and_the_data(seed: int, data: int) -> None:
    assert_bitwise_equal(rng.fold_in(rng.key(seed), data), rng.fold_in(rng.key(seed), data))


@given(first=SEEDS, second=SEEDS)
def test_distinct_seeds_give_distinct_keys(first: int, second: int) -> None:
    # The seed-to-key map is a bijection on 64 bits, so no two seeds share a stream.
    assert (rng.host_key(first) == rng.host_key(second)) == (first == second)


@given(seed=SEEDS, shape=SHAPES)
def test_bits_are_32_bit_words_shaped_like_the_request(seed: int, shape: tuple[int, ...]) -> None:
    words = rng.bits(rng.key(seed), shape)
    assert words.dtype == torch.int64
    assert words.shape == shape
    assert bool(((words >= 0) & (words < 2**32)).all())


@given(seed=SEEDS, data=st.integers(0, 2**32 - 1), start=st.integers(0, 300), count=st.integers(0, 40))
def test_host_bits_equal_the_device_words_of_the_same_key(seed: int, data: int, start: int, count: int) -> None:
    key = rng.fold_in(rng.key(seed), data)
    assert rng.host_bits(rng.to_host(key), count, start=start) == rng.bits(key, (start + count,))[start:].tolist()


def test_name_to_int_is_32_bit_fnv1a() -> None:
    # Published FNV-1a test vectors: a key derived from a name is the same in every process.
    assert rng.name_to_int("") == 0x811C9DC5
    assert rng.name_to_int("a") == 0xE40C292C
    assert rng.name_to_int("foobar") == 0xBF9CF968


# ----------------------------------------------------------------------------------------------- host mirror


@given(seed=SEEDS)
def test_key_holds_the_host_key(seed: int) -> None:
    device_key = rng.key(seed)
    assert device_key.dtype == torch.int64 and device_key.shape == (2,)
    assert rng.to_host(device_key) == rng.host_key(seed)
    assert torch.equal(rng.from_host(rng.host_key(seed)), device_key)


@given(seed=SEEDS, data=st.lists(FOLD_DATA, min_size=1, max_size=4))
def test_host_fold_in_mirrors_fold_in(seed: int, data: list[int]) -> None:
    device_key, host_key = rng.key(seed), rng.host_key(seed)
    for item in data:
        device_key, host_key = rng.fold_in(device_key, item), rng.host_fold_in(host_key, item)
        assert rng.to_host(device_key) == host_key


@given(seed=SEEDS, n=st.integers(min_value=1, max_value=6))
def test_host_split_mirrors_split(seed: int, n: int) -> None:
    keys = rng.split(rng.key(seed), n)
    assert keys.shape == (n, 2)
    assert [rng.to_host(k) for k in keys] == rng.host_split(rng.host_key(seed), n)


@given(seed=SEEDS, data=st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_fold_in_takes_tensor_data_like_python_ints(seed: int, data: int) -> None:
    k = rng.key(seed)
    assert torch.equal(rng.fold_in(k, torch.tensor(data)), rng.fold_in(k, data))


@given(seed=SEEDS, data=st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=1, max_size=5))
def test_fold_in_broadcasts_over_batched_data(seed: int, data: list[int]) -> None:
    k = rng.key(seed)
    folded = rng.fold_in(k, torch.tensor(data))
    assert folded.shape == (len(data), 2)
    for row, item in zip(folded, data, strict=True):
        assert torch.equal(row, rng.fold_in(k, item))


# ----------------------------------------------------------------------------------------------- batched keys


BATCHED_SAMPLERS: dict[str, Sampler] = {
    name: SAMPLERS[name]
    for name in (
        "bits",
        "uniform_float16",
        "uniform_float64",
        "normal",
        "bernoulli",
        "randint",
        "permutation",
    )
}


@given(
    seed=SEEDS,
    n=st.integers(min_value=1, max_value=4),
    shape=SHAPES,
    sampler=st.sampled_from(sorted(BATCHED_SAMPLERS)),
)
def test_a_batch_of_keys_draws_row_by_row(seed: int, n: int, shape: tuple[int, ...], sampler: str) -> None:
    draw = BATCHED_SAMPLERS[sampler]
    keys = rng.split(rng.key(seed), n)
    batched = draw(keys, shape)
    for i in range(n):
        assert_bitwise_equal(batched[i], draw(keys[i], shape))


def test_bits_of_three_split_keys_are_the_bits_of_each_key() -> None:
    keys = rng.split(rng.key(7), 3)
    rows = rng.bits(keys, (4,))
    assert rows.shape == (3, 4)
    for i in range(3):
        assert torch.equal(rows[i], rng.bits(keys[i], (4,)))


@given(seed=SEEDS, batch=st.integers(min_value=1, max_value=3), n=st.integers(min_value=1, max_value=3))
def test_split_of_a_batch_of_keys_splits_each_key(seed: int, batch: int, n: int) -> None:
    keys = rng.split(rng.key(seed), batch)
    children = rng.split(keys, n)
    assert children.shape == (n, batch, 2)
    for j in range(batch):
        assert torch.equal(children[:, j], rng.split(keys[j], n))


# ----------------------------------------------------------------------------------------------- independence


N_CORRELATION = 20_000
CORRELATION_BOUND = 4.0 / math.sqrt(N_CORRELATION)  # four standard deviations of r for independent streams


def _stream_pairs(seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    k = rng.key(seed)
    halves = rng.split(k, 2)
    quarters = rng.split(k, 4)
    return {
        "split halves": (halves[0], halves[1]),
        "split neighbours 1, 2": (quarters[1], quarters[2]),
        "split ends 0, 3": (quarters[0], quarters[3]),
        "parent and split child": (k, halves[0]),
        "fold_in 0, 1": (rng.fold_in(k, 0), rng.fold_in(k, 1)),
        "fold_in 2**31, 2**31 + 1": (rng.fold_in(k, 2**31), rng.fold_in(k, 2**31 + 1)),
        "parent and fold_in child": (k, rng.fold_in(k, 0)),
        "adjacent seeds": (k, rng.key((seed + 1) % 2**64)),
        "seeds differing in the high word": (k, rng.key(seed ^ 2**32)),
    }


@pytest.mark.parametrize("seed", STATISTICAL_SEEDS)
def test_derived_streams_differ_and_are_uncorrelated(seed: int) -> None:
    for name, (first, second) in _stream_pairs(seed).items():
        assert not torch.equal(rng.bits(first, (64,)), rng.bits(second, (64,))), name
        r = pearson_r(rng.uniform(first, N_CORRELATION), rng.uniform(second, N_CORRELATION))
        assert abs(r) < CORRELATION_BOUND, f"{name}: r={r:.4f}"


@pytest.mark.parametrize("seed", STATISTICAL_SEEDS)
def test_consecutive_draws_of_one_stream_are_uncorrelated(seed: int) -> None:
    values = rng.uniform(rng.key(seed), N_CORRELATION + 1)
    r = pearson_r(values[:-1], values[1:])
    assert abs(r) < CORRELATION_BOUND, f"lag-1 r={r:.4f}"


@given(seed=SEEDS)
@settings(max_examples=10)
def test_split_keys_are_pairwise_distinct(seed: int) -> None:
    keys = rng.split(rng.key(seed), 1000)
    assert len({tuple(k) for k in keys.tolist()}) == 1000


# ----------------------------------------------------------------------------------------------- distributions


N_SAMPLES = 2**16
BINS = 32  # a power of two divides the 2**8 levels of bfloat16 evenly, so every bin holds equally many


@pytest.mark.parametrize("seed", STATISTICAL_SEEDS[:3])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_uniform_passes_a_chi_square_goodness_of_fit_test(seed: int, dtype: torch.dtype) -> None:
    values = rng.uniform(rng.key(seed), N_SAMPLES, dtype=dtype)
    assert values.dtype == dtype
    bins = torch.floor(values.to(torch.float64) * BINS).to(torch.int64)
    counts = torch.bincount(bins, minlength=BINS)
    assert counts.numel() == BINS
    statistic = chi_square(counts)
    assert statistic < chi_square_quantile(BINS - 1, P_VALUE), f"chi2={statistic:.1f}"


def _random_words(seed: int, source: str) -> tuple[torch.Tensor, int]:
    """Returns ``N_SAMPLES`` draws as integers with the number of random bits each carries."""
    k = rng.key(seed)
    if source == "bits":
        return rng.bits(k, N_SAMPLES), 32
    dtype = getattr(torch, source)
    precision = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}[dtype]
    # Exact: every value is a multiple of 2**-precision below one.
    return (rng.uniform(k, N_SAMPLES, dtype=dtype).to(torch.float64) * 2.0**precision).to(
        torch.int64
    ), precision


@pytest.mark.parametrize("source", ["bits", "float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("seed", STATISTICAL_SEEDS[:2])
def test_every_random_bit_is_a_fair_coin_independent_of_the_others(seed: int, source: str) -> None:
    words, width = _random_words(seed, source)
    coins = ((words.unsqueeze(-1) >> torch.arange(width)) & 1).to(torch.float64)
    n = coins.shape[0]
    # Bonferroni over the bits and over the pairs of bits.
    z_mean = NormalDist().inv_cdf(1.0 - P_VALUE / (2 * width))
    z_pair = NormalDist().inv_cdf(1.0 - P_VALUE / (width * (width - 1)))
    assert float((coins.mean(dim=0) - 0.5).abs().max()) < z_mean * 0.5 / math.sqrt(n)
    correlations = torch.corrcoef(coins.T) - torch.eye(width, dtype=torch.float64)
    assert float(correlations.abs().max()) < z_pair / math.sqrt(n)


@given(seed=SEEDS, shape=SHAPES, dtype=st.sampled_from(FLOAT_DTYPES))
def test_uniform_values_lie_in_the_unit_interval(
    seed: int, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    values = rng.uniform(rng.key(seed), shape, dtype=dtype)
    assert values.dtype == dtype and values.shape == shape
    assert bool(((values >= 0) & (values < 1)).all())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_uniform_stays_below_one_over_many_draws(dtype: torch.dtype) -> None:
    values = rng.uniform(rng.key(3), N_SAMPLES, dtype=dtype)
    assert float(values.max()) < 1.0 and float(values.min()) >= 0.0


@given(
    seed=SEEDS,
    low=st.floats(min_value=-100.0, max_value=100.0),
    width=st.floats(min_value=1e-3, max_value=100.0),
)
def test_uniform_with_bounds_stays_within_them(seed: int, low: float, width: float) -> None:
    values = rng.uniform(rng.key(seed), 64, dtype=torch.float64, low=low, high=low + width)
    assert bool(((values >= low) & (values <= low + width)).all())


@pytest.mark.parametrize("seed", STATISTICAL_SEEDS[:3])
def test_normal_passes_a_kolmogorov_smirnov_test(seed: int) -> None:
    samples = sorted(rng.normal(rng.key(seed), N_SAMPLES).tolist())
    n = len(samples)
    distance = max(
        max((i + 1) / n - standard_normal_cdf(x), standard_normal_cdf(x) - i / n)
        for i, x in enumerate(samples)
    )
    # Kolmogorov's limit: P(sqrt(n) D > t) ~ 2 exp(-2 t^2).
    bound = math.sqrt(-math.log(P_VALUE / 2.0) / 2.0) / math.sqrt(n)
    assert distance < bound, f"D={distance:.5f}"


@given(seed=SEEDS, shape=SHAPES, dtype=st.sampled_from(FLOAT_DTYPES))
def test_normal_samples_are_finite_in_the_requested_dtype(
    seed: int, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    samples = rng.normal(rng.key(seed), shape, dtype=dtype)
    assert samples.dtype == dtype and samples.shape == shape
    assert bool(torch.isfinite(samples).all())


N_BERNOULLI = 20_000


@given(seed=SEEDS, p=st.floats(min_value=0.01, max_value=0.99))
def test_bernoulli_mean_is_within_five_sigma_of_p(seed: int, p: float) -> None:
    draws = rng.bernoulli(rng.key(seed), p, N_BERNOULLI)
    assert draws.dtype == torch.bool
    sigma = math.sqrt(p * (1.0 - p) / N_BERNOULLI)
    # 2**-24: uniform's float32 grid moves the effective probability by at most one level.
    assert abs(float(draws.double().mean()) - p) <= 5.0 * sigma + 2.0**-24


@given(seed=SEEDS, p=st.floats(min_value=0.0, max_value=1.0), q=st.floats(min_value=0.0, max_value=1.0))
def test_raising_p_under_one_key_only_adds_successes(seed: int, p: float, q: float) -> None:
    low, high = sorted((p, q))
    k = rng.key(seed)
    assert not bool((rng.bernoulli(k, low, 64) & ~rng.bernoulli(k, high, 64)).any())


@given(seed=SEEDS, shape=SHAPES)
def test_bernoulli_of_zero_and_one_is_certain(seed: int, shape: tuple[int, ...]) -> None:
    k = rng.key(seed)
    assert not bool(rng.bernoulli(k, 0.0, shape).any())
    assert bool(rng.bernoulli(k, 1.0, shape).all())


@given(seed=SEEDS)
def test_bernoulli_takes_a_probability_per_element(seed: int) -> None:
    p = torch.tensor([[0.0], [1.0], [0.5]])
    draws = rng.bernoulli(rng.key(seed), p, (3, 8))
    assert draws.shape == (3, 8)
    assert not bool(draws[0].any()) and bool(draws[1].all())


@given(seed=SEEDS, n=st.integers(min_value=0, max_value=40))
def test_permutation_is_a_permutation(seed: int, n: int) -> None:
    perm = rng.permutation(rng.key(seed), n)
    assert perm.dtype == torch.int64 and perm.shape == (n,)
    assert torch.equal(torch.sort(perm).values, torch.arange(n))


def test_every_permutation_of_five_is_equally_likely() -> None:
    draws = 120 * 200
    perms = rng.permutation(rng.split(rng.key(11), draws), 5)
    assert perms.shape == (draws, 5)
    codes = (perms * torch.tensor([5**4, 5**3, 5**2, 5, 1])).sum(dim=-1)
    counts = torch.unique(codes, return_counts=True)[1]
    assert counts.numel() == 120
    assert chi_square(counts) < chi_square_quantile(119, P_VALUE)


@given(
    seed=SEEDS,
    low=st.integers(min_value=-(2**40), max_value=2**40),
    span=st.integers(min_value=1, max_value=2**24),
    shape=SHAPES,
)
def test_randint_lies_in_the_half_open_range(seed: int, low: int, span: int, shape: tuple[int, ...]) -> None:
    values = rng.randint(rng.key(seed), low, low + span, shape)
    assert values.dtype == torch.int64 and values.shape == shape
    assert bool(((values >= low) & (values < low + span)).all())


@pytest.mark.parametrize("span", [2, 7, 10, 48])
def test_randint_is_uniform_over_its_range(span: int) -> None:
    values = rng.randint(rng.key(span), -3, span - 3, N_SAMPLES)
    counts = torch.bincount(values + 3, minlength=span)
    assert counts.numel() == span
    assert chi_square(counts) < chi_square_quantile(span - 1, P_VALUE)


# ----------------------------------------------------------------------------------------------- host rng


@given(seed=SEEDS, data=FOLD_DATA)
def test_host_rng_is_determined_by_its_key(seed: int, data: int) -> None:
    host_key = rng.host_fold_in(rng.host_key(seed), data)
    first, second = rng.host_rng(host_key), rng.host_rng(host_key)
    assert np.array_equal(first.beta(0.2, 0.2, size=8), second.beta(0.2, 0.2, size=8))
    assert np.array_equal(first.integers(0, 2**62, size=8), second.integers(0, 2**62, size=8))


@given(seed=SEEDS, data=FOLD_DATA)
def test_host_rngs_of_distinct_keys_differ(seed: int, data: int) -> None:
    parent = rng.host_key(seed)
    child = rng.host_fold_in(parent, data)
    assert not np.array_equal(
        rng.host_rng(parent).integers(0, 2**62, 4), rng.host_rng(child).integers(0, 2**62, 4)
    )


# ----------------------------------------------------------------------------------------------- global state


def test_no_sampler_touches_the_global_random_state() -> None:
    torch_state = torch.random.get_rng_state()
    numpy_state = np.random.get_state()
    python_state = python_random.getstate()
    k = rng.key(5)
    for draw in SAMPLERS.values():
        draw(k, (3, 4))
    rng.host_rng(rng.host_split(rng.host_key(5), 2)[1]).beta(1.0, 1.0, size=4)
    rng.host_fold_in(rng.to_host(k), 3)
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert (
        after[0] == numpy_state[0]
        and np.array_equal(after[1], numpy_state[1])
        and after[2:] == numpy_state[2:]
    )
    assert python_random.getstate() == python_state


# ----------------------------------------------------------------------------------------------- bad arguments


BAD_ARGUMENTS: dict[str, tuple[str, Callable[[], object]]] = {
    "negative seed": ("seed", lambda: rng.key(-1)),
    "seed beyond 64 bits": ("seed", lambda: rng.host_key(2**64)),
    "non-int seed": ("seed", lambda: rng.key(1.5)),  # type: ignore[arg-type]
    "zero keys": ("n", lambda: rng.split(rng.key(0), 0)),
    "zero host keys": ("n", lambda: rng.host_split(rng.host_key(0), 0)),
    "int dtype": ("dtype", lambda: rng.uniform(rng.key(0), 3, dtype=int)),  # type: ignore[arg-type]
    "integer torch dtype": ("dtype", lambda: rng.uniform(rng.key(0), 3, dtype=torch.int64)),
    "probability above one": ("p", lambda: rng.bernoulli(rng.key(0), 1.5, 3)),
    "negative probability": ("p", lambda: rng.bernoulli(rng.key(0), -0.1, 3)),
    "empty integer range": ("high", lambda: rng.randint(rng.key(0), 3, 3, 2)),
    "integer range beyond 2**24": ("high", lambda: rng.randint(rng.key(0), 0, 2**24 + 1, 2)),
    "negative permutation length": ("n", lambda: rng.permutation(rng.key(0), -1)),
    "negative dimension": ("shape", lambda: rng.bits(rng.key(0), (2, -1))),
    "batched key to host": ("key", lambda: rng.to_host(rng.split(rng.key(0), 2))),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_raise_value_error_naming_the_argument(case: str) -> None:
    argument, call = BAD_ARGUMENTS[case]
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        call()


# ----------------------------------------------------------------------------------------------- compile


def _draw_everything(k: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, ...]:
    k = rng.fold_in(rng.fold_in(k, step), rng.name_to_int("mixup"))
    a, b, c, d = rng.split(k, 4)
    return (
        rng.bits(a, (3,)),
        rng.uniform(a, (5,)),
        rng.uniform(b, (2, 3), dtype=torch.float64),
        rng.uniform(b, (6,), dtype=torch.bfloat16),
        rng.permutation(c, 9),
        rng.normal(d, (3, 4)),
        rng.randint(d, -4, 11, (7,)),
        rng.bernoulli(c, 0.4, (8,)),
    )


_draw_aot_eager = torch.compile(_draw_everything, fullgraph=True, backend="aot_eager")


@given(seed=SEEDS, step=st.integers(min_value=0, max_value=2**40))
@settings(max_examples=10)
def test_compiled_samplers_draw_the_same_bits_as_eager(seed: int, step: int) -> None:
    k, step_tensor = rng.key(seed), torch.tensor(step)
    for compiled, eager in zip(
        _draw_aot_eager(k, step_tensor), _draw_everything(k, step_tensor), strict=True
    ):
        assert_bitwise_equal(compiled, eager)


def _draw_for_inductor(k: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, ...]:
    k = rng.fold_in(k, step)
    a, b, c = rng.split(k, 3)
    return rng.uniform(a, (64,)), rng.permutation(b, 33), rng.normal(c, (256,))


@pytest.mark.slow
def test_inductor_compiled_samplers_draw_the_same_bits_as_eager() -> None:
    compiled = torch.compile(_draw_for_inductor, fullgraph=True)
    for seed in (0, 2**64 - 1):
        k, step = rng.key(seed), torch.tensor(12)
        for name, got, expected in zip(
            ("uniform", "permutation", "normal"), compiled(k, step), _draw_for_inductor(k, step), strict=True
        ):
            assert torch.equal(got, expected), f"{name} differs under inductor (seed {seed})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@given(seed=SEEDS, data=FOLD_DATA)
@settings(max_examples=10)
def test_the_same_key_draws_the_same_bits_on_cpu_and_cuda(seed: int, data: int) -> None:
    cpu_key = rng.fold_in(rng.key(seed), data)
    cuda_key = rng.fold_in(rng.key(seed, device="cuda"), data)
    assert torch.equal(cuda_key.cpu(), cpu_key)
    assert torch.equal(rng.bits(cuda_key, (5, 3)).cpu(), rng.bits(cpu_key, (5, 3)))
    assert torch.equal(rng.uniform(cuda_key, 17).cpu(), rng.uniform(cpu_key, 17))
    assert torch.equal(rng.permutation(cuda_key, 12).cpu(), rng.permutation(cpu_key, 12))


@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.lists(st.integers(0, 6), min_size=0, max_size=3))
@settings(max_examples=30, deadline=None)
def test_the_eager_cpu_words_equal_the_tensor_arithmetic_every_backend_runs(seed: int, keys: int, shape: list[int]) -> None:
    # Eager on the CPU, bits() computes in NumPy's wrapping uint32; compiled code and GPUs run the int64 form.
    single = rng.key(seed)
    batch = rng.split(single, keys)
    for k in (single, batch):
        assert torch.equal(rng._bits_numpy(k, tuple(shape)), rng._bits_tensor(k, tuple(shape)))
        assert torch.equal(rng.bits(k, tuple(shape)), rng._bits_tensor(k, tuple(shape)))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("given", [0.5, 3, None, [1, 2], torch.zeros(2)], ids=["float", "int", "none", "list", "float-tensor"])
def test_every_sampler_refuses_what_is_not_a_key_naming_it(sampler: str, given: object) -> None:
    with pytest.raises(TypeError, match=r"^key=.* must be a key, an int64 tensor \[\.\.\., 2\] such as composer_fn.random.key\(seed\)"):
        SAMPLERS[sampler](given, (3,))
    with pytest.raises(TypeError, match=r"^key=.* must be a key"):
        rng.split(given)  # type: ignore[arg-type]
