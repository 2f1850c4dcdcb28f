"""WeightStandardization: a convolution over the explicitly standardized weight, on all but the last called convs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.algorithms.ghost_batchnorm import GhostBatchNorm2d
from composer_fn.algorithms.weight_standardization import (
    WeightStandardization,
    WSConv1d,
    WSConv2d,
    WSConv3d,
    apply_weight_standardization,
    convolutions_in_order,
    standardize_weight,
    standardized_conv,
)
from composer_fn.core import random as R
from composer_fn.models import SmallCNN, init_parameters
from composer_fn.testing import make_setup

seeds = st.integers(0, 2**32 - 1)


def _reference_standardized(weight: torch.Tensor) -> torch.Tensor:
    # Composer's formula, written out per output channel in float64.
    rows = weight.detach().double().reshape(weight.shape[0], -1)
    mean = rows.mean(dim=1, keepdim=True)
    variance = ((rows - mean) ** 2).mean(dim=1, keepdim=True)
    return ((rows - mean) / torch.sqrt(variance + 1e-10)).reshape(weight.shape).to(weight.dtype)


def _model(seed: int) -> SmallCNN:
    model = SmallCNN(in_channels=3, num_classes=4, width=4)
    values = init_parameters(model, R.key(seed))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(values[name])
    return model


class _CalledOutOfOrder(nn.Module):
    """Registers ``late`` before ``early`` but calls ``early`` first."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Conv2d(4, 4, 1)
        self.early = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.late(self.early(images))


@given(seeds, st.integers(1, 6), st.integers(1, 6), st.sampled_from([1, 3]), st.integers(1, 2), st.booleans())
@settings(max_examples=10, deadline=None)
def test_a_ws_conv_is_a_plain_conv_over_the_standardized_weight(
    seed, in_channels, out_channels, kernel, stride, bias
):
    conv = nn.Conv2d(
        in_channels, out_channels, kernel, stride=stride, padding=kernel // 2, bias=bias, device="meta"
    )
    conv.to_empty(device="cpu")
    with torch.no_grad():
        for name, value in init_parameters(conv, R.key(seed)).items():
            getattr(conv, name).copy_(value)
    standardized = standardized_conv(conv)
    x = R.normal(R.fold_in(R.key(seed), 1), (2, in_channels, 6, 6))
    expected = F.conv2d(
        x, _reference_standardized(conv.weight), conv.bias, stride=stride, padding=kernel // 2
    )
    torch.testing.assert_close(standardized(x), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(standardized, WSConv2d) and torch.equal(standardized.weight, conv.weight)


@given(seeds, st.sampled_from([(3, 2, 5), (4, 3, 3, 3), (2, 2, 2, 2, 2)]))
@settings(max_examples=10, deadline=None)
def test_standardized_filters_have_mean_zero_and_variance_one(seed, shape) -> None:
    weight = R.normal(R.key(seed), shape) * 3 + 1
    standardized = standardize_weight(weight).double().reshape(shape[0], -1)
    torch.testing.assert_close(
        standardized.mean(dim=1), torch.zeros(shape[0], dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        standardized.var(dim=1, correction=0), torch.ones(shape[0], dtype=torch.float64), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize(("conv", "cls"), [(nn.Conv1d(2, 3, 3), WSConv1d), (nn.Conv3d(2, 3, 3), WSConv3d)])
def test_1d_and_3d_convolutions_are_standardized_too(conv: nn.Module, cls: type) -> None:
    model = nn.Sequential(conv)
    assert isinstance(apply_weight_standardization(model)[0], cls)


@given(seeds, st.integers(0, 4))
@settings(max_examples=10, deadline=None)
def test_the_last_n_convolutions_stay_plain(seed, ignored) -> None:
    model = _model(seed)
    rewritten = apply_weight_standardization(model, n_last_layers_ignore=ignored)
    kinds = [type(m) for _, m in rewritten.named_modules() if isinstance(m, nn.Conv2d)]
    kept = max(3 - ignored, 0)
    assert kinds == [WSConv2d] * kept + [nn.Conv2d] * (3 - kept)


def test_the_last_convolutions_are_the_last_called_not_the_last_registered() -> None:
    model = _CalledOutOfOrder()
    assert convolutions_in_order(model) == ["early", "late"]
    rewritten = apply_weight_standardization(model, n_last_layers_ignore=1)
    assert isinstance(rewritten.early, WSConv2d) and type(rewritten.late) is nn.Conv2d


def test_layers_fx_cannot_trace_through_do_not_hide_the_calling_order() -> None:
    # Ghost batch norms read the batch size in Python: fx traces around them, as around any layer without children.
    model = _CalledOutOfOrder()
    model.late = nn.Sequential(GhostBatchNorm2d(4, ghost_batch_size=2), model.late)
    assert convolutions_in_order(model) == ["early", "late.1"]


@given(seeds, st.integers(0, 2))
@settings(max_examples=10, deadline=None)
def test_the_rewrite_leaves_the_input_model_alone(seed, ignored) -> None:
    model = _model(seed)
    before = {name: (id(t), t.clone(), t._version) for name, t in model.state_dict(keep_vars=True).items()}
    rewritten = WeightStandardization(ignored).rewrite(model, R.key(seed))
    assert rewritten is not model and not any(isinstance(m, WSConv2d) for m in model.modules())
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity, value, version = before[name]
        assert id(tensor) == identity and tensor._version == version and torch.equal(tensor, value)
    assert not {id(t) for t in model.parameters()} & {id(t) for t in rewritten.parameters()}


@given(seeds, st.integers(0, 2))
@settings(max_examples=5, deadline=None)
def test_standardizing_twice_equals_standardizing_once(seed, ignored) -> None:
    algorithm = WeightStandardization(ignored)
    once = algorithm.rewrite(_model(seed), R.key(0))
    twice = algorithm.rewrite(once, R.key(0))
    assert algorithm.targets(once) == frozenset() and repr(twice) == repr(once)
    x = R.normal(R.fold_in(R.key(seed), 1), (2, 3, 8, 8))
    assert torch.equal(twice.eval()(x), once.eval()(x))


def test_the_algorithm_keeps_the_parameter_names_and_values() -> None:
    plain = make_setup([])
    standardized = make_setup([WeightStandardization()])
    assert standardized.state.params.keys() == plain.state.params.keys()
    assert all(torch.equal(standardized.state.params[n], t) for n, t in plain.state.params.items())
    assert sum(isinstance(m, WSConv2d) for m in standardized.static.module.modules()) == 3


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_a_bad_n_last_layers_ignore_is_refused_naming_it(value) -> None:
    with pytest.raises(ValueError, match="n_last_layers_ignore"):
        WeightStandardization(value)
    with pytest.raises(ValueError, match="n_last_layers_ignore"):
        apply_weight_standardization(nn.Conv2d(1, 1, 1), value)
