"""Factorize: full rank reproduces the layer, lower rank is the best SVD truncation, and only layers it speeds up change."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.algorithms.factorize import (
    Factorize,
    FactorizedConv2d,
    FactorizedLinear,
    apply_factorization,
    factorize_conv2d,
    factorize_matrix,
    latent_size,
    max_rank_with_speedup,
)
from composer_fn.core import random as R
from composer_fn.models import init_parameters
from composer_fn.testing import make_setup
from composer_fn.testing.settings import example

seeds = st.integers(0, 2**32 - 1)


def _filled(module: nn.Module, seed: int) -> nn.Module:
    values = init_parameters(module, R.key(seed))
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            parameter.copy_(values[name])
    return module


def _linear(seed: int, in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    with torch.device("meta"):
        layer = nn.Linear(in_features, out_features, bias=bias)
    layer.to_empty(device="cpu")
    return _filled(layer, seed)  # type: ignore[return-value]


def _conv(seed: int, in_channels: int, out_channels: int, kernel: int, **kwargs: object) -> nn.Conv2d:
    with torch.device("meta"):
        layer = nn.Conv2d(in_channels, out_channels, kernel, **kwargs)  # type: ignore[arg-type]
    layer.to_empty(device="cpu")
    return _filled(layer, seed)  # type: ignore[return-value]


class _Wide(nn.Module):
    """Two convolutions and two linear layers of different widths."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.wide_conv = _conv(seed, 16, 16, 3, padding=1)
        self.thin_conv = _conv(seed + 1, 16, 4, 1)
        self.wide_linear = _linear(seed + 2, 64, 48)
        self.head = _linear(seed + 3, 48, 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.thin_conv(self.wide_conv(images)).flatten(1)
        return self.head(self.wide_linear(features))


def _of_rank(seed: int, rank: int, rows: int, columns: int) -> torch.Tensor:
    """A ``[rows, columns]`` matrix of rank ``rank`` (almost surely)."""
    left = R.normal(R.fold_in(R.key(seed), 7), (rows, rank))
    return left @ R.normal(R.fold_in(R.key(seed), 8), (rank, columns))


@given(seeds, st.integers(3, 12), st.integers(3, 12), st.booleans(), st.data())
@settings(max_examples=10, deadline=None)
def test_a_linear_factorization_at_the_weights_own_rank_reproduces_the_layer(
    seed, in_features, out_features, bias, data
):
    rank = data.draw(st.integers(1, max_rank_with_speedup(in_features, out_features)))
    layer = _linear(seed, in_features, out_features, bias)
    with torch.no_grad():
        layer.weight.copy_(_of_rank(seed, rank, out_features, in_features))
    factorized = FactorizedLinear.from_linear(layer, rank)
    x = R.normal(R.fold_in(R.key(seed), 1), (5, in_features))
    torch.testing.assert_close(factorized(x), layer(x), rtol=0, atol=1e-4)


@given(seeds, st.integers(2, 6), st.integers(2, 8), st.sampled_from([1, 3]), st.integers(1, 2), st.booleans())
@settings(max_examples=10, deadline=None)
def test_a_conv_factorization_at_the_weights_own_rank_reproduces_the_layer(
    seed, in_channels, out_channels, kernel, stride, bias
):
    layer = _conv(seed, in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=bias)
    rank = max_rank_with_speedup(in_channels, out_channels, (kernel, kernel))
    assume(rank >= 1)
    fan_in = in_channels * kernel * kernel
    with torch.no_grad():
        layer.weight.copy_(_of_rank(seed, rank, out_channels, fan_in).reshape(layer.weight.shape))
    factorized = FactorizedConv2d.from_conv2d(layer, rank)
    x = R.normal(R.fold_in(R.key(seed), 1), (2, in_channels, 7, 7))
    torch.testing.assert_close(factorized(x), layer(x), rtol=0, atol=1e-4)
    assert factorized.module1.kernel_size == (1, 1) and factorized.latent_channels == rank


@pytest.mark.parametrize(
    ("build", "largest"),
    [
        (lambda: FactorizedLinear.from_linear(_linear(0, 8, 8), 4), 3),
        (lambda: FactorizedLinear.from_linear(_linear(0, 7, 5), 3), 2),
        (lambda: FactorizedLinear.from_linear(_linear(0, 10, 10), 0.5), 4),
        (lambda: FactorizedConv2d.from_conv2d(_conv(0, 8, 8, 1), 4), 3),
        (lambda: FactorizedConv2d.from_conv2d(_conv(0, 4, 4, 3), 4), 3),
    ],
)
def test_a_latent_width_that_saves_no_multiply_adds_is_refused(build, largest) -> None:
    with pytest.raises(ValueError, match=f"latent_.* saves no multiply-adds.*at most {largest}"):
        build()


def test_layers_whose_latent_width_saves_nothing_are_left_alone() -> None:
    model = nn.Sequential(_linear(0, 8, 8), _linear(1, 10, 10))
    with pytest.warns(UserWarning, match="changes nothing"):
        rewritten = apply_factorization(model, min_features=8, latent_features=0.5)
    assert [type(layer) for layer in rewritten] == [nn.Linear, nn.Linear]


@given(seeds, st.integers(3, 10), st.integers(3, 10), st.data())
@settings(max_examples=10, deadline=None)
def test_a_low_rank_factorization_is_the_best_approximation_of_the_weight(
    seed, in_features, out_features, data
):
    # Eckart-Young: the best rank-r approximation misses exactly the singular values it drops.
    rank = data.draw(st.integers(1, max_rank_with_speedup(in_features, out_features)))
    layer = _linear(seed, in_features, out_features)
    factorized = FactorizedLinear.from_linear(layer, rank)
    product = (factorized.module1.weight @ factorized.module0.weight).detach()
    singular = torch.linalg.svdvals(layer.weight.detach().double())
    error = torch.linalg.matrix_norm(product.double() - layer.weight.detach().double())
    assert math.isclose(
        float(error), float(singular[rank:].square().sum().sqrt()), rel_tol=1e-4, abs_tol=1e-5
    )


@given(
    st.integers(1, 600),
    st.integers(1, 600),
    st.sampled_from([(), (1, 1), (3, 3), (5, 5)]),
    st.integers(1, 600),
)
@settings(max_examples=50, deadline=None)
def test_the_largest_rank_with_a_speedup_is_the_last_that_saves_multiply_adds(
    in_size, out_size, kernel, rank
):
    fan_in = in_size * math.prod(kernel)
    saves = rank * (fan_in + out_size) < fan_in * out_size
    assert (rank <= max_rank_with_speedup(in_size, out_size, kernel)) == saves


@given(seeds, st.integers(1, 40), st.sampled_from([0.25, 0.5, 2, 6]))
@settings(max_examples=10, deadline=None)
def test_only_wide_layers_that_the_latent_size_speeds_up_are_replaced(seed, minimum, latent):
    model = _Wide(seed)
    algorithm = Factorize(
        min_channels=minimum, latent_channels=latent, min_features=minimum, latent_features=latent
    )
    expected = set()
    for name, layer in model.named_children():
        if isinstance(layer, nn.Conv2d):
            in_size, out_size, kernel = layer.in_channels, layer.out_channels, tuple(layer.kernel_size)
        else:
            in_size, out_size, kernel = layer.in_features, layer.out_features, ()
        rank = latent_size(latent, in_size, out_size)
        fan_in = in_size * math.prod(kernel)
        if min(in_size, out_size) >= minimum and rank * (fan_in + out_size) < fan_in * out_size:
            expected.add(name)
    assert algorithm.targets(model) == expected
    rewritten = algorithm.rewrite(model, R.key(seed))
    for name, layer in rewritten.named_children():
        assert isinstance(layer, FactorizedConv2d | FactorizedLinear) == (name in expected)


@given(seeds)
@settings(max_examples=10, deadline=None)
def test_the_rewrite_leaves_the_input_model_alone(seed) -> None:
    model = _Wide(seed)
    before = {name: (id(t), t.clone(), t._version) for name, t in model.state_dict(keep_vars=True).items()}
    structure = repr(model)
    rewritten = Factorize(min_channels=4, min_features=4, latent_features=0.25).rewrite(model, R.key(seed))
    assert rewritten is not model and repr(model) == structure
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity, value, version = before[name]
        assert id(tensor) == identity and tensor._version == version and torch.equal(tensor, value)
    shared = {id(t) for t in model.parameters()} & {id(t) for t in rewritten.parameters()}
    assert not shared


@given(seeds)
@settings(max_examples=10, deadline=None)
def test_factorizing_twice_equals_factorizing_once(seed) -> None:
    algorithm = Factorize(min_channels=4, latent_channels=0.5, min_features=4, latent_features=0.25)
    once = algorithm.rewrite(_Wide(seed), R.key(seed))
    twice = algorithm.rewrite(once, R.key(seed))
    assert algorithm.targets(once) == frozenset()
    assert repr(twice) == repr(once)
    x = R.normal(R.fold_in(R.key(seed), 1), (2, 16, 4, 4))
    assert torch.equal(twice(x), once(x))


def test_layers_inside_a_factorization_are_not_factorized_again() -> None:
    # At a fractional latent size both factors of a 64-wide layer (64 -> 25 -> 64) would qualify themselves.
    model = nn.Sequential(_linear(0, 64, 64))
    algorithm = Factorize(min_features=16, latent_features=0.4)
    once = algorithm.rewrite(model, R.key(0))
    assert isinstance(once[0], FactorizedLinear) and once[0].latent_features == 25
    assert algorithm.targets(nn.Sequential(once[0].module0, once[0].module1)) == {"0", "1"}
    assert algorithm.targets(once) == frozenset()


def test_the_functional_form_and_the_record_keep_composers_defaults() -> None:
    functional = {name: p.default for name, p in inspect.signature(apply_factorization).parameters.items()}
    assert functional == {
        "model": inspect.Parameter.empty,
        "factorize_convs": True,
        "factorize_linears": True,
        "min_channels": 512,
        "latent_channels": 0.25,
        "min_features": 512,
        "latent_features": 0.25,
    }
    assert Factorize() == Factorize(True, True, 256, 0.25, 256, 128)


@given(seeds)
@settings(max_examples=5, deadline=None)
def test_the_functional_form_equals_the_records_rewrite(seed) -> None:
    model = _Wide(seed)
    hparams = {"min_channels": 8, "latent_channels": 0.5, "min_features": 8, "latent_features": 0.25}
    functional = apply_factorization(model, **hparams)
    rewritten = Factorize(**hparams).rewrite(model, R.key(seed))
    assert repr(functional) == repr(rewritten)
    assert all(torch.equal(t, rewritten.state_dict()[n]) for n, t in functional.state_dict().items())


@given(seeds, st.integers(3, 8), st.integers(3, 8), st.integers(0, 4))
@settings(max_examples=10, deadline=None)
def test_factorize_matrix_at_a_rank_that_saves_nothing_is_one_regression_reproducing_the_outputs(
    seed, inputs, outputs, above
) -> None:
    layer = _linear(seed, inputs, outputs)
    x = R.normal(R.fold_in(R.key(seed), 1), (64, inputs))
    y = layer(x).detach()
    rank = min(inputs, outputs) + above
    solution = factorize_matrix(x, y, layer.weight.detach().T, bias=layer.bias.detach(), rank=rank)
    assert solution.Wb is None and solution.rank == -1 and solution.Wa.shape == (inputs, outputs)
    torch.testing.assert_close(x @ solution.Wa + solution.bias, y, rtol=0, atol=1e-5)
    assert solution.nmse < 1e-9


@given(seeds, st.integers(1, 3), st.integers(0, 3))
@settings(max_examples=10, deadline=None)
def test_factorize_matrix_keeps_an_earlier_factorization_it_cannot_narrow(seed, latent, above) -> None:
    first = R.normal(R.fold_in(R.key(seed), 1), (8, latent))
    second = R.normal(R.fold_in(R.key(seed), 2), (latent, 6))
    x = R.normal(R.fold_in(R.key(seed), 3), (32, 8))
    y = x @ first @ second
    # Below the full width (6): from there on the result is one regression, as the test above holds.
    solution = factorize_matrix(x, y, first, second, rank=min(latent + above, 5))
    assert solution.rank == latent and solution.Wb is not None
    assert torch.equal(solution.Wa, first) and torch.equal(solution.Wb, second)
    assert solution.nmse < 1e-9


@given(seeds, st.integers(4, 10), st.integers(4, 10), st.integers(1, 3))
@settings(max_examples=10, deadline=None)
def test_fitting_on_data_is_no_worse_than_the_svd_it_starts_from(seed, inputs, outputs, rank) -> None:
    layer = _linear(seed, inputs, outputs)
    # Correlated inputs: the directions of large input variance matter more than the weight's SVD knows.
    mixing = R.normal(R.fold_in(R.key(seed), 2), (inputs, inputs))
    x = R.normal(R.fold_in(R.key(seed), 1), (128, inputs)) @ mixing
    y = layer(x).detach()
    start = factorize_matrix(x, y, layer.weight.detach().T, bias=layer.bias.detach(), rank=rank, n_iters=0)
    fitted = factorize_matrix(x, y, layer.weight.detach().T, bias=layer.bias.detach(), rank=rank, n_iters=3)
    assert fitted.rank == rank and fitted.Wa.shape == (inputs, rank) and fitted.Wb.shape == (rank, outputs)
    assert fitted.nmse <= start.nmse + 1e-6


@given(seeds, st.integers(1, 4), st.integers(1, 6))
@settings(max_examples=5, deadline=None)
def test_factorize_conv2d_at_full_rank_is_one_regressed_convolution_reproducing_the_layer(
    seed, in_channels, out_channels
) -> None:
    layer = _conv(seed, in_channels, out_channels, 3, padding=1)
    x = R.normal(R.fold_in(R.key(seed), 1), (4, in_channels, 6, 6))
    rank = min(in_channels * 9, out_channels)
    solution = factorize_conv2d(x, layer.weight, rank=rank, biasA=layer.bias, padding=1)
    assert solution.Wb is None and solution.rank == -1
    assert solution.Wa.shape == (out_channels, in_channels, 3, 3)
    rebuilt = F.conv2d(x, solution.Wa, solution.bias, padding=1)
    torch.testing.assert_close(rebuilt, layer(x).detach(), rtol=0, atol=1e-5)


@given(seeds, st.integers(2, 4), st.integers(4, 8))
@settings(max_examples=5, deadline=None)
def test_factorize_conv2d_below_full_rank_gives_a_kxk_then_a_1x1_convolution(
    seed, in_channels, out_channels
) -> None:
    layer = _conv(seed, in_channels, out_channels, 3, padding=1)
    x = R.normal(R.fold_in(R.key(seed), 1), (4, in_channels, 6, 6))
    solution = factorize_conv2d(x, layer.weight, rank=2, biasA=layer.bias, padding=1)
    assert solution.rank == 2 and solution.Wb is not None
    assert solution.Wa.shape == (2, in_channels, 3, 3) and solution.Wb.shape == (out_channels, 2, 1, 1)


def test_the_contract_form_factorizes_the_suite_model_at_init() -> None:
    setup = make_setup([example("factorize")])
    factorized = [
        n
        for n, m in setup.static.module.named_modules()
        if isinstance(m, FactorizedConv2d | FactorizedLinear)
    ]
    assert factorized == ["features.1.0", "features.2.0", "head"]
    assert (
        "features.1.0.module0.weight" in setup.state.params
        and "features.1.0.weight" not in setup.state.params
    )


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: Factorize(latent_channels=1.5), "latent_channels"),
        (lambda: Factorize(latent_features=0), "latent_features"),
        (lambda: Factorize(min_channels=0), "min_channels"),
        (lambda: Factorize(factorize_convs=1), "factorize_convs"),
        (lambda: FactorizedLinear.from_linear(_linear(0, 4, 3), 4), "latent_features"),
        (lambda: FactorizedConv2d.from_conv2d(_conv(0, 4, 4, 3, groups=2), 2), "groups"),
        (lambda: factorize_matrix(torch.zeros(4, 3), torch.zeros(5, 2), torch.zeros(3, 2)), "rows"),
    ],
)
def test_bad_arguments_are_refused_naming_them(build, name) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        build()
