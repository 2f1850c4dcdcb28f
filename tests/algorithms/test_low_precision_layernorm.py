"""LowPrecisionLayerNorm: nn.LayerNorm's bits outside autocast, the autocast dtype inside it, a pure idempotent rewrite."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn import optim
from composer_fn.algorithms.gated_linear_units import GatedLinearUnits
from composer_fn.algorithms.low_precision_layernorm import (
    LowPrecisionLayerNorm,
    LPLayerNorm,
    apply_low_precision_layernorm,
)
from composer_fn.core import random as R
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.data import TensorLoader
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.nn import init_parameters
from composer_fn.testing.settings import settings_for
from composer_fn.trainer import Trainer

seeds = st.integers(0, 2**31 - 1)


def _norm(seed: int, width: int, affine: bool, bias: bool, eps: float) -> nn.Sequential:
    layer = nn.LayerNorm(width, eps=eps, elementwise_affine=affine, bias=bias)
    if affine:
        with torch.no_grad():
            layer.weight.copy_(R.normal(R.fold_in(R.key(seed), 1), (width,)))
            if bias:
                layer.bias.copy_(R.normal(R.fold_in(R.key(seed), 2), (width,)))
    return nn.Sequential(layer)


def _model(seed: int = 0) -> CausalLM:
    model = CausalLM(17, d_model=8, n_heads=2, n_layers=2, max_seq_len=16)
    model.load_state_dict(init_parameters(model, R.key(seed)), strict=False)
    return model


def _structure(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(module).__name__) for name, module in model.named_modules()]


norm_settings = (seeds, st.integers(1, 33), st.booleans(), st.booleans(), st.sampled_from([1e-5, 1e-3, 0.1]))


@settings(max_examples=10, deadline=None)
@given(*norm_settings)
def test_outside_autocast_the_layer_is_bitwise_nn_layer_norm(
    seed: int, width: int, affine: bool, bias: bool, eps: float
) -> None:
    original = _norm(seed, width, affine, bias, eps)
    converted = apply_low_precision_layernorm(original)
    assert type(converted[0]) is LPLayerNorm
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = (R.normal(R.key(seed), (3, 4, width)) * 3 + 1).to(dtype)
        reference = original.to(dtype)(x)
        assert torch.equal(converted.to(dtype)(x), reference)


@settings(max_examples=10, deadline=None)
@given(*norm_settings)
def test_under_cpu_bf16_autocast_the_layer_computes_in_bf16_close_to_fp32(
    seed: int, width: int, affine: bool, bias: bool, eps: float
) -> None:
    original = _norm(seed, width, affine, bias, eps)
    converted = apply_low_precision_layernorm(original, "bf16-mixed")
    x = R.normal(R.key(seed), (3, 4, width)) * 3 + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = converted(x)
        plain = original(x)
    assert low.dtype == torch.bfloat16 and plain.dtype == torch.float32
    # The exact low-precision computation: bf16 input, weight and bias, normalised with autocast off.
    layer = original[0]
    weight = None if layer.weight is None else layer.weight.bfloat16()
    shift = None if layer.bias is None else layer.bias.bfloat16()
    expected = torch.nn.functional.layer_norm(x.bfloat16(), (width,), weight, shift, eps)
    assert torch.equal(low, expected)
    # Within bf16 rounding of the input and of the result (relative 2^-8 each) of the fp32 layer.
    scale = 1.0 if layer.weight is None else float(layer.weight.detach().abs().max()) + 1.0
    torch.testing.assert_close(low.float(), plain.detach(), rtol=2**-6, atol=2**-6 * scale * math.sqrt(width))


@pytest.mark.usefixtures("fresh_compiler")
def test_the_layer_compiles_in_one_graph_and_agrees_with_eager_under_autocast() -> None:
    layer = apply_low_precision_layernorm(_norm(0, 16, True, True, 1e-5))[0]
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = R.normal(R.key(1), (4, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(compiled(x), layer(x)) and compiled(x).dtype == torch.bfloat16
    assert torch.equal(compiled(x), layer(x)) and compiled(x).dtype == torch.float32


@settings(max_examples=10, deadline=None)
@given(seeds)
def test_the_rewrite_of_a_whole_model_is_pure_idempotent_and_keeps_its_fp32_outputs(seed: int) -> None:
    model = _model(seed)
    structure = _structure(model)
    before = {n: (p.clone(), p._version, id(p)) for n, p in model.named_parameters()}
    once = apply_low_precision_layernorm(model)
    assert _structure(model) == structure
    for name, tensor in model.named_parameters():
        value, version, identity = before[name]
        assert torch.equal(tensor, value) and tensor._version == version and id(tensor) == identity
    assert LowPrecisionLayerNorm().targets(model) == {
        "blocks.0.norm_attention",
        "blocks.0.norm_feed_forward",
        "blocks.1.norm_attention",
        "blocks.1.norm_feed_forward",
        "final_norm",
    }
    assert LowPrecisionLayerNorm().targets(once) == frozenset()
    twice = LowPrecisionLayerNorm().rewrite(once, R.key(0))
    assert _structure(twice) == _structure(once)
    tokens = R.randint(R.key(seed), 0, 17, (2, 12))
    with torch.no_grad():
        assert torch.equal(once(tokens), model(tokens)) and torch.equal(twice(tokens), once(tokens))
    assert not {id(p) for p in once.parameters()} & {id(p) for p in model.parameters()}


def test_fp32_has_no_effect_with_a_warning_and_other_precisions_are_refused() -> None:
    model = _model()
    with pytest.warns(UserWarning, match="no effect"):
        unchanged = apply_low_precision_layernorm(model, "fp32")
    assert _structure(unchanged) == _structure(model) and unchanged is not model
    with pytest.raises(ValueError, match="precision='fp16'"):
        apply_low_precision_layernorm(model, "fp16")
    with pytest.warns(UserWarning, match="found no torch.nn.LayerNorm"):
        apply_low_precision_layernorm(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="model"):
        apply_low_precision_layernorm("model")  # type: ignore[arg-type]


def test_it_runs_after_the_other_surgeries_so_it_converts_what_they_add() -> None:
    plan = make_plan([LowPrecisionLayerNorm(), GatedLinearUnits()])
    assert dict(plan.order)[Event.INIT] == ("gated_linear_units", "low_precision_layernorm")
    assert algorithm_from_config(LowPrecisionLayerNorm().to_config()) == LowPrecisionLayerNorm()
    assert not settings_for("low_precision_layernorm").stochastic(LowPrecisionLayerNorm())


def test_the_model_trains_in_bf16_mixed_precision_with_a_finite_loss() -> None:
    rows = R.randint(R.key(0), 0, 17, (16, 17))
    loader = TensorLoader((rows[:, :-1].clone(), rows[:, 1:].clone()), 8, seed=0)
    seen: list[torch.dtype] = []

    def loss_fn(outputs: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        seen.append(outputs.dtype)
        return causal_lm_loss()(outputs, batch)

    trainer = Trainer(
        _model(),
        loader,
        max_duration="2ba",
        optimizer=optim.adamw(3e-3),
        algorithms=[LowPrecisionLayerNorm()],
        loss_fn=loss_fn,
        precision="bf16-mixed",
        progress_bar=False,
    )
    assert math.isfinite(trainer.fit()["loss"])
    assert type(trainer.static.module.final_norm) is LPLayerNorm
    assert seen == [torch.bfloat16, torch.bfloat16]
