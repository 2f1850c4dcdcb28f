"""Model zoo: output shapes and argument validation."""

import pytest
import torch
from torch import nn

from composer_fn.core.random import key, normal
from composer_fn.models import MLP, SmallCNN, TwoConvBN, init_parameters


@pytest.mark.parametrize("hidden", [(), (64,), (32, 16)])
def test_mlp_flattens_and_returns_one_logit_per_class(hidden: tuple[int, ...]) -> None:
    model = MLP(64, 10, hidden)
    assert model(normal(key(0), (5, 1, 8, 8))).shape == (5, 10)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [*hidden, 10]
    assert isinstance(model[0], nn.Flatten)


@pytest.mark.parametrize(("in_channels", "size", "width"), [(1, 8, 32), (3, 32, 8), (1, 5, 4)])
def test_small_cnn_returns_one_logit_per_class(in_channels: int, size: int, width: int) -> None:
    model = SmallCNN(in_channels, num_classes=7, width=width)
    assert model(normal(key(1), (4, in_channels, size, size))).shape == (4, 7)


@pytest.mark.parametrize("size", [28, 24, 20, 12, 8])
def test_two_conv_bn_takes_other_sizes_and_pools_only_where_the_maps_differ(size: int) -> None:
    model = TwoConvBN(width=4, hidden=16, dropout=0.0).eval()
    images = normal(key(2), (3, 1, size, size))
    maps = model.features(images)
    pooled = maps if size == 28 else nn.functional.adaptive_avg_pool2d(maps, 7)
    expected = model.head(torch.relu(model.hidden(pooled.flatten(1))))
    assert torch.equal(model(images), expected)
    assert model(images).shape == (3, 10)


def test_small_cnn_stays_small() -> None:
    model = SmallCNN()
    assert sum(p.numel() for p in model.parameters()) < 100_000
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: MLP(0, 10), "in_features"),
        (lambda: MLP(64, 0), "num_classes"),
        (lambda: MLP(64, 10, (8, 0)), "hidden"),
        (lambda: SmallCNN(in_channels=0), "in_channels"),
        (lambda: SmallCNN(width=2.0), "width"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(build: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("build", [SmallCNN, lambda: MLP(64, 10, (32, 16))])
def test_building_and_running_does_not_touch_the_global_random_state(build: object) -> None:
    before = torch.random.get_rng_state()
    model = build()  # type: ignore[operator]
    model(torch.zeros(2, 1, 8, 8))
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize("build", [SmallCNN, lambda: MLP(64, 10, (32, 16))])
def test_models_start_from_the_keyed_initialisation_with_key_zero(build: object) -> None:
    model = build()  # type: ignore[operator]
    expected = init_parameters(model, key(0))
    assert all(p.device.type == "cpu" and torch.equal(p, expected[n]) for n, p in model.named_parameters())
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.equal(module.running_mean, torch.zeros_like(module.running_mean))
            assert torch.equal(module.running_var, torch.ones_like(module.running_var))
            assert module.num_batches_tracked.item() == 0
