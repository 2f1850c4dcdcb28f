"""ChannelsLast: a change of memory format only; outputs are those of the original model."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms import ChannelsLast
from composer_fn.core import random as R
from composer_fn.functional import apply_channels_last, channels_last_tensors
from composer_fn.models import SmallCNN
from composer_fn.testing import make_setup


@given(st.integers(0, 2**32 - 1))
def test_channels_last_model_gives_the_original_outputs(seed) -> None:
    model = SmallCNN(in_channels=3, num_classes=5, width=8).eval()
    x = R.normal(R.key(seed), (4, 3, 8, 8))
    converted = apply_channels_last(model)
    torch.testing.assert_close(converted(x), model(x), rtol=1e-5, atol=1e-6)


def test_apply_channels_last_returns_a_new_model_and_leaves_the_input_alone() -> None:
    model = SmallCNN(in_channels=3, num_classes=5, width=8)
    before = {n: (p.clone(), p.stride()) for n, p in model.named_parameters()}
    converted = apply_channels_last(model)
    assert converted is not model
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name][0]) and parameter.stride() == before[name][1]
    conv_weights = [p for p in converted.parameters() if p.dim() == 4]
    assert conv_weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in conv_weights)


def test_the_algorithm_converts_4d_parameters_at_init_and_keeps_their_values() -> None:
    plain = make_setup([])
    converted = make_setup([ChannelsLast()])
    for name, tensor in converted.state.params.items():
        assert torch.equal(tensor, plain.state.params[name])
        if tensor.dim() == 4:
            assert tensor.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_tensors_keeps_other_ranks_as_they_are() -> None:
    tensors = {"w": torch.zeros(2, 3, 4, 5), "b": torch.zeros(3)}
    converted = channels_last_tensors(tensors)
    assert converted["b"] is tensors["b"]
    assert converted["w"].is_contiguous(memory_format=torch.channels_last)
    assert tensors["w"].is_contiguous()
