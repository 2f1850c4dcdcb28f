"""MLP's optional dropout: off by default; keyed, so it never reads the global random state."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.core import random as R
from composer_fn.models.mlp import MLP
from composer_fn.nn import KeyedDropout


def test_by_default_there_is_no_dropout() -> None:
    model = MLP(64, 10, (32, 16))
    assert [type(m) for m in model] == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]


def test_dropout_follows_each_hidden_activation_and_keeps_the_layers_values() -> None:
    plain = MLP(64, 10, (32, 16))
    dropped = MLP(64, 10, (32, 16), dropout=0.25)
    assert [type(m) for m in dropped][2:4] == [nn.ReLU, KeyedDropout] and dropped[3].p == 0.25
    x = R.normal(R.key(0), (4, 64))
    plain_linears = [m for m in plain if isinstance(m, nn.Linear)]
    dropped_linears = [m for m in dropped if isinstance(m, nn.Linear)]
    assert [m.weight.shape for m in plain_linears] == [m.weight.shape for m in dropped_linears]
    assert dropped.eval()(x).shape == (4, 10)


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.2, 0.5, 0.9]))
@settings(max_examples=10, deadline=None)
def test_keyed_dropout_keeps_one_minus_p_scaled_and_follows_its_key(seed, p) -> None:
    layer = KeyedDropout(p)
    layer.forward_key = R.key(seed)
    x = torch.ones(64, 256)
    output = layer(x)
    kept = output != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(output[kept], torch.full_like(output[kept], 1 / (1 - p)))
    assert torch.equal(layer(x), output)
    layer.forward_key = R.key(seed + 1)
    assert not torch.equal(layer(x), output)
    assert torch.equal(layer.eval()(x), x)


def test_training_with_dropout_does_not_touch_the_global_random_state() -> None:
    before = torch.random.get_rng_state()
    MLP(64, 10, (32,), dropout=0.5).train()(torch.ones(2, 64))
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize("value", [-0.1, 1.0, True])
def test_a_bad_dropout_is_refused_naming_it(value) -> None:
    with pytest.raises(ValueError, match="dropout"):
        MLP(64, 10, dropout=value)
