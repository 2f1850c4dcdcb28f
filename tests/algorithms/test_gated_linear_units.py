"""GatedLinearUnits: the gated feed-forward's formula, its exact parameter count, keyed new layers, a pure idempotent rewrite."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn import optim
from composer_fn.algorithms.gated_linear_units import (
    ACTIVATIONS,
    GatedFeedForward,
    GatedLinearUnits,
    apply_gated_linear_units,
    feed_forward_parameter_change,
)
from composer_fn.core import random as R
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.data import TensorLoader
from composer_fn.models.bert import MaskedLM
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.nn import init_parameters
from composer_fn.testing.settings import settings_for
from composer_fn.trainer import Trainer

seeds = st.integers(0, 2**31 - 1)


def _model(seed: int = 0, *, d_model: int = 8, d_ff: int | None = None, layers: int = 2) -> CausalLM:
    model = CausalLM(17, d_model=d_model, n_heads=2, n_layers=layers, d_ff=d_ff, max_seq_len=16)
    model.load_state_dict(init_parameters(model, R.key(seed)), strict=False)
    return model


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _structure(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(module).__name__) for name, module in model.named_modules()]


@settings(max_examples=10, deadline=None)
@given(
    st.integers(1, 6).map(lambda half: 2 * half),
    st.integers(1, 40),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_the_parameter_count_changes_by_the_documented_formula(
    d_model: int, d_ff: int, layers: int, gated_bias: bool, non_gated_bias: bool, masked: bool
) -> None:
    model: nn.Module = (
        MaskedLM(11, d_model, 2, layers, 8, d_ff=d_ff)
        if masked
        else CausalLM(11, d_model=d_model, n_heads=2, n_layers=layers, d_ff=d_ff, max_seq_len=8)
    )
    rewritten = apply_gated_linear_units(
        model, gated_layer_bias=gated_bias, non_gated_layer_bias=non_gated_bias, key=R.key(0)
    )
    d, f, g, u = d_model, d_ff, int(gated_bias), int(non_gated_bias)
    # Per block: before d*f + f + f*d + d; after d*f + g*f + d*f + u*f + f*d + d.
    assert _count(rewritten) - _count(model) == layers * (d * f + (g + u - 1) * f)
    assert (
        feed_forward_parameter_change(d, f, gated_layer_bias=gated_bias, non_gated_layer_bias=non_gated_bias)
        == d * f + (g + u - 1) * f
    )
    for block in rewritten.blocks:
        ff = block.feed_forward
        assert (ff.gate.bias is not None, ff.up.bias is not None, ff.down.bias is not None) == (
            gated_bias,
            non_gated_bias,
            True,
        )
        assert (ff.gate.in_features, ff.gate.out_features, ff.down.out_features) == (d, f, d)


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from(sorted(ACTIVATIONS)), st.booleans())
def test_the_feed_forward_computes_down_of_act_gate_times_up(seed: int, name: str, biases: bool) -> None:
    rewritten = apply_gated_linear_units(
        _model(seed), name, gated_layer_bias=biases, non_gated_layer_bias=biases, key=R.key(seed)
    )
    ff = rewritten.blocks[0].feed_forward
    x = R.normal(R.fold_in(R.key(seed), 1), (3, 5, 8))
    activation = {
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "relu": F.relu,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
    }[name]
    gate = F.linear(x, ff.gate.weight, ff.gate.bias)
    up = F.linear(x, ff.up.weight, ff.up.bias)
    expected = F.linear(activation(gate) * up, ff.down.weight, ff.down.bias)
    with torch.no_grad():
        torch.testing.assert_close(ff(x), expected, rtol=1e-5, atol=1e-6)


def test_without_act_fn_each_block_keeps_its_own_activation_and_callables_are_accepted() -> None:
    model = _model()
    model.blocks[1].feed_forward.activation = nn.ReLU()
    kept = apply_gated_linear_units(model, key=R.key(0))
    assert isinstance(kept.blocks[0].feed_forward.activation, nn.GELU)
    assert isinstance(kept.blocks[1].feed_forward.activation, nn.ReLU)
    assert kept.blocks[1].feed_forward.activation is not model.blocks[1].feed_forward.activation
    squared = apply_gated_linear_units(_model(), lambda t: t * t, key=R.key(0))
    x = torch.full((1, 1, 8), 0.5)
    ff = squared.blocks[0].feed_forward
    with torch.no_grad():
        expected = ff.down((ff.gate(x) ** 2) * ff.up(x))
        torch.testing.assert_close(ff(x), expected)


@settings(max_examples=10, deadline=None)
@given(seeds)
def test_the_rewrite_leaves_its_input_untouched_and_keeps_the_other_tensors(seed: int) -> None:
    model = _model(seed)
    structure = _structure(model)
    before = {n: (p.clone(), p._version, id(p)) for n, p in model.named_parameters()}
    rewritten = apply_gated_linear_units(model, key=R.key(seed))
    assert _structure(model) == structure
    for name, tensor in model.named_parameters():
        value, version, identity = before[name]
        assert torch.equal(tensor, value) and tensor._version == version and id(tensor) == identity
    new = dict(rewritten.named_parameters())
    for name, tensor in model.named_parameters():
        if ".feed_forward." not in name:
            assert torch.equal(new[name], tensor) and new[name] is not tensor


@settings(max_examples=10, deadline=None)
@given(seeds, seeds)
def test_applying_twice_equals_applying_once_whatever_the_second_key(seed: int, second: int) -> None:
    once = apply_gated_linear_units(_model(seed), key=R.key(seed))
    twice = apply_gated_linear_units(once, "relu", key=R.key(second))
    assert GatedLinearUnits().targets(once) == frozenset()
    assert _structure(twice) == _structure(once)
    assert all(torch.equal(p, dict(once.named_parameters())[n]) for n, p in twice.named_parameters())
    tokens = R.randint(R.key(seed), 0, 17, (2, 10))
    with torch.no_grad():
        assert torch.equal(twice(tokens), once(tokens))


@settings(max_examples=10, deadline=None)
@given(seeds)
def test_the_new_layers_are_a_function_of_the_key_and_not_of_the_global_generator(seed: int) -> None:
    model = _model(0)
    state = torch.random.get_rng_state()
    first = dict(apply_gated_linear_units(model, key=R.key(seed)).named_parameters())
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(seed)
    again = dict(apply_gated_linear_units(model, key=R.key(seed)).named_parameters())
    other = dict(apply_gated_linear_units(model, key=R.fold_in(R.key(seed), 1)).named_parameters())
    assert all(torch.equal(first[n], again[n]) for n in first)
    new = [n for n in first if ".feed_forward." in n]
    assert new and all(not torch.equal(first[n], other[n]) for n in new)
    # Two blocks draw different values from one key.
    assert not torch.equal(
        first["blocks.0.feed_forward.gate.weight"], first["blocks.1.feed_forward.gate.weight"]
    )


def test_the_new_layers_follow_the_models_dtype_and_the_default_initialisation_bounds() -> None:
    model = _model(0, d_model=8, d_ff=64).double()
    ff = apply_gated_linear_units(model, key=R.key(3)).blocks[0].feed_forward
    assert all(p.dtype == torch.float64 for p in ff.parameters())
    # PyTorch's default Linear bound is 1 / sqrt(fan_in).
    assert float(ff.gate.weight.detach().abs().max()) <= 1 / math.sqrt(8)
    assert float(ff.down.weight.detach().abs().max()) <= 1 / math.sqrt(64)


def test_a_model_without_blocks_is_returned_unchanged_with_a_warning() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.warns(UserWarning, match="GatedLinearUnits found no transformer blocks"):
        rewritten = apply_gated_linear_units(model, key=R.key(0))
    assert rewritten is not model and repr(rewritten) == repr(model)


def test_blocks_off_the_protocol_are_refused_naming_the_missing_attribute() -> None:
    model = _model()
    model.blocks[0].feed_forward = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(TypeError, match=r"model\.blocks\.0\.feed_forward .*'up'"):
        apply_gated_linear_units(model, key=R.key(0))
    model = _model()
    del model.blocks[1].feed_forward
    with pytest.raises(TypeError, match=r"model\.blocks\.1 .*'feed_forward'"):
        GatedLinearUnits().targets(model)


def test_invalid_arguments_raise_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="act_fn='swish'"):
        GatedLinearUnits(act_fn="swish")
    with pytest.raises(TypeError, match="act_fn"):
        GatedLinearUnits(act_fn=torch.relu)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="gated_layer_bias"):
        GatedLinearUnits(gated_layer_bias=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        apply_gated_linear_units(_model(), key=torch.zeros(2))


def test_the_record_round_trips_and_declares_its_keyed_draws() -> None:
    algorithm = GatedLinearUnits(act_fn="silu", gated_layer_bias=True)
    assert algorithm_from_config(algorithm.to_config()) == algorithm
    assert settings_for("gated_linear_units").stochastic(GatedLinearUnits())
    assert GatedLinearUnits().capabilities().rewrites is not None


def test_the_rewritten_model_trains_in_the_trainer_with_a_finite_falling_loss() -> None:
    rows = (torch.arange(17) % 5 + torch.arange(16)[:, None]).remainder(17)
    loader = TensorLoader((rows[:, :-1].clone(), rows[:, 1:].clone()), 8, seed=0)
    losses = []
    for steps in (1, 8):
        trainer = Trainer(
            _model(0),
            loader,
            max_duration=f"{steps}ba",
            optimizer=optim.adamw(1e-2),
            algorithms=[GatedLinearUnits()],
            loss_fn=causal_lm_loss(),
            progress_bar=False,
        )
        losses.append(trainer.fit()["loss"])
        assert isinstance(trainer.static.module.blocks[0].feed_forward, GatedFeedForward)
    assert all(math.isfinite(loss) for loss in losses) and losses[1] < losses[0]
