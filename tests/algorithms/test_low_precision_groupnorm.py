"""LowPrecisionGroupNorm: GroupNorm bit for bit outside autocast, the autocast dtype inside it, and it runs last."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.algorithms.factorize import Factorize
from composer_fn.algorithms.low_precision_groupnorm import (
    LowPrecisionGroupNorm,
    LPGroupNorm,
    apply_low_precision_groupnorm,
    low_precision_groupnorm_from,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event

seeds = st.integers(0, 2**32 - 1)
groupings = st.sampled_from([(1, 4), (2, 4), (4, 4), (3, 6)])


def _groupnorm(seed: int, groups: int, channels: int, affine: bool = True) -> nn.GroupNorm:
    layer = nn.GroupNorm(groups, channels, affine=affine)
    if affine:
        with torch.no_grad():
            layer.weight.copy_(R.uniform(R.fold_in(R.key(seed), 1), (channels,), low=0.5, high=1.5))
            layer.bias.copy_(R.normal(R.fold_in(R.key(seed), 2), (channels,)))
    return layer


class _Model(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, device="meta").to_empty(device="cpu")
        with torch.no_grad():
            self.conv.weight.copy_(R.normal(R.fold_in(R.key(seed), 3), (4, 3, 3, 3)) * 0.3)
            self.conv.bias.zero_()
        self.norm = _groupnorm(seed, 2, 4)
        self.block = nn.Sequential(_groupnorm(seed + 1, 4, 4, affine=False))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.block(self.norm(self.conv(images)))


@given(seeds, groupings, st.booleans(), st.sampled_from([(), (5,), (3, 3)]))
@settings(max_examples=10, deadline=None)
def test_outside_autocast_it_is_groupnorm_bit_for_bit(seed, grouping, affine, spatial) -> None:
    groups, channels = grouping
    plain = _groupnorm(seed, groups, channels, affine)
    low = low_precision_groupnorm_from(plain)
    for dtype in (torch.float32, torch.bfloat16):
        x = (R.normal(R.fold_in(R.key(seed), 7), (3, channels, *spatial)) * 2 + 1).to(dtype)
        assert torch.equal(low.to(dtype)(x), plain.to(dtype)(x))


@given(seeds, groupings)
@settings(max_examples=10, deadline=None)
def test_under_cpu_bf16_autocast_it_computes_in_bf16_close_to_the_fp32_result(seed, grouping) -> None:
    groups, channels = grouping
    plain = _groupnorm(seed, groups, channels)
    low = low_precision_groupnorm_from(plain)
    x = R.normal(R.fold_in(R.key(seed), 7), (4, channels, 5, 5)) * 2 + 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = low(x)
        widened = plain(x)
    assert output.dtype == torch.bfloat16 and widened.dtype == torch.float32
    torch.testing.assert_close(output.float(), plain(x).detach(), rtol=0.02, atol=0.05)


def test_under_autocast_it_equals_groupnorm_run_on_low_precision_tensors() -> None:
    plain = _groupnorm(0, 2, 4)
    low = low_precision_groupnorm_from(plain)
    x = R.normal(R.key(3), (2, 4, 3, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = low(x)
    expected = nn.functional.group_norm(
        x.bfloat16(), 2, plain.weight.bfloat16(), plain.bias.bfloat16(), plain.eps
    )
    assert torch.equal(output, expected)


def test_compiled_it_equals_eager_inside_and_outside_autocast(fresh_compiler) -> None:
    low = low_precision_groupnorm_from(_groupnorm(0, 2, 4))
    compiled = torch.compile(low, backend="aot_eager", fullgraph=True)
    x = R.normal(R.key(4), (2, 4, 3, 3))
    assert torch.equal(compiled(x), low(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside, expected = compiled(x), low(x)
    assert inside.dtype == torch.bfloat16 and torch.equal(inside, expected)


@given(seeds)
@settings(max_examples=10, deadline=None)
def test_the_rewrite_leaves_the_input_model_alone_and_is_idempotent(seed) -> None:
    model = _Model(seed)
    before = {name: (id(t), t.clone(), t._version) for name, t in model.state_dict(keep_vars=True).items()}
    algorithm = LowPrecisionGroupNorm()
    once = algorithm.rewrite(model, R.key(seed))
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity, value, version = before[name]
        assert id(tensor) == identity and tensor._version == version and torch.equal(tensor, value)
    assert (
        type(model.norm) is nn.GroupNorm
        and type(once.norm) is LPGroupNorm
        and type(once.block[0]) is LPGroupNorm
    )
    assert not {id(t) for t in model.parameters()} & {id(t) for t in once.parameters()}
    twice = algorithm.rewrite(once, R.key(seed))
    assert algorithm.targets(once) == frozenset() and repr(twice) == repr(once)
    x = R.normal(R.fold_in(R.key(seed), 1), (2, 3, 4, 4))
    assert torch.equal(twice(x), once(x)) and torch.equal(once(x), model(x))


def test_the_functional_form_does_nothing_for_fp32_and_converts_otherwise() -> None:
    model = _Model(0)
    with pytest.warns(UserWarning, match="no effect"):
        unchanged = apply_low_precision_groupnorm(model, "fp32")
    assert unchanged is not model and type(unchanged.norm) is nn.GroupNorm
    assert type(apply_low_precision_groupnorm(model).norm) is LPGroupNorm
    assert type(apply_low_precision_groupnorm(model, "bf16-mixed").norm) is LPGroupNorm
    with pytest.warns(UserWarning, match="found no torch.nn.GroupNorm"):
        apply_low_precision_groupnorm(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="precision"):
        apply_low_precision_groupnorm(model, "amp_bf16")


def test_the_default_passes_run_it_after_the_other_surgeries() -> None:
    plan = make_plan([LowPrecisionGroupNorm(), Factorize()])
    assert plan.names(Event.INIT) == ("factorize", "low_precision_groupnorm")
