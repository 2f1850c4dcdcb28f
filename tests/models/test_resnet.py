"""ResNets: shapes, parameter counts from the architecture's formula, the block's documented structure, and
construction from a key without the global random generator."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchvision.models import resnet as torchvision_resnets

from composer_fn.core import random as R
from composer_fn.models.resnet import (
    BasicBlock,
    CIFARResNet,
    cifar_resnet20,
    cifar_resnet56,
    torchvision_resnet,
)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _option_b_count(depth: int, width: int, in_channels: int, num_classes: int) -> int:
    """The parameter count of He et al.'s CIFAR ResNet with projection shortcuts, from its layer list."""
    n = (depth - 2) // 6

    def block(c_in: int, c_out: int) -> int:
        convs = 9 * c_in * c_out + 9 * c_out * c_out
        projection = c_in * c_out + 2 * c_out if c_in != c_out else 0
        return convs + 2 * (2 * c_out) + projection

    w = width
    stem = 9 * in_channels * w + 2 * w
    stages = sum(
        block(c_in, c_out) + (n - 1) * block(c_out, c_out)
        for c_in, c_out in ((w, w), (w, 2 * w), (2 * w, 4 * w))
    )
    return stem + stages + 4 * w * num_classes + num_classes


def _projection_count(model: nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if ".shortcut." in name)


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(1, 2),
    width=st.sampled_from([2, 4, 8]),
    in_channels=st.integers(1, 3),
    num_classes=st.integers(1, 12),
    side=st.sampled_from([4, 8, 12]),
)
def test_cifar_resnet_gives_logits_and_has_the_formula_parameter_count(
    n: int, width: int, in_channels: int, num_classes: int, side: int
) -> None:
    depth = 6 * n + 2
    model = CIFARResNet(depth, num_classes=num_classes, in_channels=in_channels, width=width)
    images = R.normal(R.key(n), (2, in_channels, side, side))
    assert model(images).shape == (2, num_classes)
    assert _count(model) == _option_b_count(depth, width, in_channels, num_classes)


def test_resnet20_and_resnet56_have_the_published_counts_plus_their_projection_shortcuts() -> None:
    # Option A (zero-padding shortcuts) has 269,722 and 853,018 parameters: "0.27M" and "0.85M" in the paper.
    # Ours projects (option B): two 1x1 convolutions with their BatchNorms add 16*32 + 64 + 32*64 + 128.
    for model, option_a in ((cifar_resnet20(), 269_722), (cifar_resnet56(), 853_018)):
        assert _projection_count(model) == 2_752
        assert _count(model) - _projection_count(model) == option_a
    assert _count(cifar_resnet20()) == _option_b_count(20, 16, 3, 10) == 272_474
    assert _count(cifar_resnet56()) == _option_b_count(56, 16, 3, 10) == 855_770


def test_the_block_is_relu_of_residual_plus_shortcut_with_a_projection_only_when_the_shape_changes() -> None:
    images = R.normal(R.key(3), (2, 4, 8, 8))
    for in_channels, out_channels, stride, projects in ((4, 4, 1, False), (4, 8, 1, True), (4, 8, 2, True)):
        block = BasicBlock(in_channels, out_channels, stride, key=R.key(in_channels + out_channels + stride))
        x = images
        expected = F.relu(block.residual(x) + block.shortcut(x))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=0)
        assert isinstance(block.shortcut, nn.Sequential) == projects
        assert isinstance(block.shortcut, nn.Identity) != projects
        residual = block.bn2(block.conv2(F.relu(block.bn1(block.conv1(x)))))
        torch.testing.assert_close(block.residual(x), residual, rtol=0, atol=0)
        assert block(x).shape == (2, out_channels, 8 // stride, 8 // stride)


def test_the_stages_hold_basic_blocks_and_downsample_twice() -> None:
    model = CIFARResNet(14, width=4)
    assert [len(stage) for stage in (model.layer1, model.layer2, model.layer3)] == [2, 2, 2]
    assert all(
        isinstance(b, BasicBlock) for stage in (model.layer1, model.layer2, model.layer3) for b in stage
    )
    assert model.layer2[0].conv1.stride == (2, 2) and model.layer3[0].conv1.stride == (2, 2)
    assert isinstance(model.layer1[0].shortcut, nn.Identity)


def test_construction_is_keyed_and_leaves_the_global_generator_alone() -> None:
    before = torch.random.get_rng_state()
    first = CIFARResNet(8, width=4, key=R.key(7))
    second = CIFARResNet(8, width=4, key=R.key(7))
    other = CIFARResNet(8, width=4, key=R.key(8))
    block = BasicBlock(4, 8, 2, key=R.key(7))
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(first.conv1.weight, other.conv1.weight)
    assert not torch.equal(block.conv1.weight, BasicBlock(4, 8, 2, key=R.key(8)).conv1.weight)
    assert all(p.device.type == "cpu" for p in first.parameters())


def test_torchvision_resnets_are_torchvisions_own_modules_built_from_a_key() -> None:
    before = torch.random.get_rng_state()
    resnet18 = torchvision_resnet("resnet18", num_classes=10)
    resnet50 = torchvision_resnet("resnet50", num_classes=10, in_channels=1, key=R.key(1))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert isinstance(resnet18, torchvision_resnets.ResNet)
    assert any(isinstance(m, torchvision_resnets.BasicBlock) for m in resnet18.modules())
    assert any(isinstance(m, torchvision_resnets.Bottleneck) for m in resnet50.modules())
    # torchvision's counts for 1000 classes are 11,689,512 and 25,557,032; the head shrinks to 10 classes and
    # a one-channel stem has 64 * 49 weights instead of 64 * 3 * 49.
    assert _count(resnet18) == 11_689_512 - 513_000 + 5_130
    assert _count(resnet50) == 25_557_032 - 2_049_000 + 20_490 - 2 * 64 * 49
    assert resnet50.eval()(torch.zeros(1, 1, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: CIFARResNet(21), "depth=21"),
        (lambda: CIFARResNet(2), "depth=2"),
        (lambda: CIFARResNet(20, width=0), "width=0"),
        (lambda: CIFARResNet(20, num_classes=True), "num_classes=True"),
        (lambda: BasicBlock(4, 4, stride=0), "stride=0"),
        (lambda: CIFARResNet(8, key=torch.zeros(3)), "key="),
        (lambda: torchvision_resnet("resnet19"), "resnet19"),
    ],
)
def test_bad_arguments_are_refused_by_name(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
