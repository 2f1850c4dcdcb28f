"""SqueezeExcite: each replaced convolution gains exactly 2·C·L parameters, the block computes channel
attention as written in the paper, new layers come from the key alone, and the surgery is pure and idempotent."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn.algorithms.squeeze_excite import (
    SqueezeExcite,
    SqueezeExcite2d,
    SqueezeExciteConv2d,
    apply_squeeze_excite,
    latent_width,
)
from composer_fn.core import random as R
from composer_fn.models.resnet import CIFARResNet
from composer_fn.testing import check_compiled_matches_eager, make_setup

# The convolutions of CIFARResNet(8, width=4, in_channels=2) as (name, in_channels, out_channels).
CONVS = (
    ("conv1", 2, 4),
    ("layer1.0.conv1", 4, 4),
    ("layer1.0.conv2", 4, 4),
    ("layer2.0.conv1", 4, 8),
    ("layer2.0.conv2", 8, 8),
    ("layer2.0.shortcut.0", 4, 8),
    ("layer3.0.conv1", 8, 16),
    ("layer3.0.conv2", 16, 16),
    ("layer3.0.shortcut.0", 8, 16),
)


def _model(seed: int = 0) -> nn.Module:
    return CIFARResNet(8, width=4, in_channels=2, num_classes=3, key=R.key(seed))


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@settings(max_examples=10, deadline=None)
@given(
    min_channels=st.integers(0, 17),
    latent_channels=st.one_of(st.integers(1, 6), st.sampled_from([0.25, 0.5, 0.75])),
)
def test_each_replaced_convolution_adds_two_bias_free_linear_layers_of_c_by_l(
    min_channels: int, latent_channels: float
) -> None:
    model = _model()
    chosen = [(name, c_out) for name, c_in, c_out in CONVS if min(c_in, c_out) >= min_channels]
    assert SqueezeExcite(latent_channels, min_channels).targets(model) == frozenset(n for n, _ in chosen)
    rewritten = apply_squeeze_excite(model, latent_channels, min_channels, key=R.key(1))
    growth = 0
    for name, c_out in chosen:
        latent = int(latent_channels) if latent_channels >= 1 else int(latent_channels * c_out)
        layer = rewritten.get_submodule(name)
        assert isinstance(layer, SqueezeExciteConv2d) and layer.se.latent_channels == latent
        growth += 2 * c_out * latent
    assert _count(rewritten) - _count(model) == growth


def _reference(conv: nn.Conv2d, block: SqueezeExcite2d, images: Tensor) -> Tensor:
    """Hu et al.'s block on the convolution's output: y · sigmoid(W2 relu(W1 mean_hw(y)))."""
    y = conv(images)
    first, second = block.pool_and_mlp[2].weight, block.pool_and_mlp[4].weight
    squeezed = y.mean(dim=(2, 3))
    attention = torch.sigmoid(torch.relu(squeezed @ first.T) @ second.T)
    return y * attention[:, :, None, None]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), latent=st.integers(1, 5), side=st.integers(1, 6))
def test_the_block_scales_each_channel_by_its_attention_coefficient(
    seed: int, latent: int, side: int
) -> None:
    with torch.device("meta"):
        conv = nn.Conv2d(3, 6, 3, padding=1)
    conv.to_empty(device="cpu")
    conv.load_state_dict(
        {"weight": R.normal(R.key(seed), (6, 3, 3, 3)), "bias": R.normal(R.key(seed + 1), (6,))}
    )
    layer = SqueezeExciteConv2d(conv, latent, key=R.key(seed))
    images = R.normal(R.fold_in(R.key(seed), 2), (2, 3, side, side))
    torch.testing.assert_close(layer(images), _reference(conv, layer.se, images), rtol=1e-5, atol=1e-6)


def test_new_layers_are_drawn_from_the_key_per_layer_without_the_global_generator() -> None:
    model = _model()
    before = torch.random.get_rng_state()
    first = apply_squeeze_excite(model, 2, 8, key=R.key(5))
    second = apply_squeeze_excite(model, 2, 8, key=R.key(5))
    other = apply_squeeze_excite(model, 2, 8, key=R.key(6))
    assert torch.equal(torch.random.get_rng_state(), before)
    new = [n for n in first.state_dict() if ".se." in n]
    assert new
    assert all(torch.equal(first.state_dict()[n], second.state_dict()[n]) for n in new)
    assert all(not torch.equal(first.state_dict()[n], other.state_dict()[n]) for n in new)
    # Each layer has its own draw, within PyTorch's default Linear bound 1 / sqrt(fan_in).
    w1 = first.get_submodule("layer3.0.conv2.se.pool_and_mlp.2").weight
    w2 = first.get_submodule("layer3.0.conv1.se.pool_and_mlp.2").weight
    assert not torch.equal(w1, w2)
    assert w1.abs().max() <= 16**-0.5
    assert torch.equal(
        SqueezeExcite2d(16, 2, key=R.key(3)).pool_and_mlp[2].weight,
        SqueezeExcite2d(16, 2, key=R.key(3)).pool_and_mlp[2].weight,
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), min_channels=st.sampled_from([4, 8, 16]))
def test_apply_squeeze_excite_is_pure_and_idempotent(seed: int, min_channels: int) -> None:
    model = _model(seed % 5).eval()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    names = [n for n, _ in model.named_modules()]
    images = R.normal(R.key(seed), (2, 2, 8, 8))
    original = model(images)
    once = apply_squeeze_excite(model, 0.5, min_channels, key=R.key(seed))
    twice = apply_squeeze_excite(once, 0.5, min_channels, key=R.key(seed + 1))
    assert [n for n, _ in model.named_modules()] == names
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
    torch.testing.assert_close(model(images), original, rtol=0, atol=0)
    assert SqueezeExcite(0.5, min_channels).targets(once) == frozenset()
    assert [(n, type(m)) for n, m in twice.named_modules()] == [(n, type(m)) for n, m in once.named_modules()]
    torch.testing.assert_close(twice(images), once(images), rtol=0, atol=0)
    assert not once.training
    assert not {t.data_ptr() for t in model.state_dict().values()} & {
        t.data_ptr() for t in once.state_dict().values()
    }


def test_the_algorithm_rewrites_the_model_at_init_from_the_runs_key() -> None:
    algorithm = SqueezeExcite(latent_channels=4, min_channels=8)
    setup = make_setup([algorithm])
    assert "features.1.0.se.pool_and_mlp.2.weight" in setup.state.params
    assert setup.state.params["features.1.0.se.pool_and_mlp.2.weight"].shape == (4, 16)
    assert torch.equal(
        setup.state.params["features.1.0.conv.weight"], make_setup([]).state.params["features.1.0.weight"]
    )
    again = make_setup([algorithm])
    other = make_setup([algorithm], key_seed=1)
    name = "features.2.0.se.pool_and_mlp.4.weight"
    assert torch.equal(setup.state.params[name], again.state.params[name])
    assert not torch.equal(setup.state.params[name], other.state.params[name])


@pytest.mark.slow
def test_training_steps_with_blocks_compile_to_the_eager_result(fresh_compiler: None) -> None:
    check_compiled_matches_eager(SqueezeExcite(latent_channels=0.25, min_channels=8))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: SqueezeExcite(latent_channels=0), ValueError, "latent_channels=0"),
        (lambda: SqueezeExcite(latent_channels=True), ValueError, "latent_channels=True"),
        (lambda: SqueezeExcite(min_channels=-3), ValueError, "min_channels=-3"),
        (lambda: latent_width(3, 0.25), ValueError, "hidden width of 0"),
        (lambda: apply_squeeze_excite(_model(), 0.1, 4, key=R.key(0)), ValueError, "latent_channels=0.1"),
        (lambda: apply_squeeze_excite(_model(), 4, 4, key=0), ValueError, "key=0"),
        (lambda: SqueezeExciteConv2d(nn.Linear(2, 2)), TypeError, "conv of type Linear"),
        (lambda: SqueezeExcite2d(0), ValueError, "num_features=0"),
    ],
)
def test_bad_arguments_are_refused_by_name(build, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()
