"""Surgeries find the layers of the models users bring: subclasses, timm's and torchvision's classes, by name."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from composer_fn import optim
from composer_fn.algorithms import (
    BlurPool,
    GhostBatchNorm,
    LowPrecisionLayerNorm,
    SqueezeExcite,
    StochasticDepth,
)
from composer_fn.algorithms._surgery import Withheld
from composer_fn.algorithms.ghost_batchnorm import GhostBatchNormAct2d
from composer_fn.algorithms.low_precision_layernorm import LPLayerNorm, LPLayerNorm2d
from composer_fn.algorithms.stochastic_depth import StochasticBlock
from composer_fn.core.engine import check_surgery_conflicts, make_plan
from composer_fn.core.event import Event
from composer_fn.data import TensorLoader
from composer_fn.trainer import Trainer

torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def tv_resnet18() -> nn.Module:
    return torchvision.models.resnet18(weights=None, num_classes=4)


@pytest.fixture(scope="module")
def timm_resnet18() -> nn.Module:
    return timm.create_model("resnet18", pretrained=False, num_classes=4)


@pytest.fixture(scope="module")
def efficientnet_b0() -> nn.Module:
    return timm.create_model("efficientnet_b0", pretrained=False, num_classes=4)


@pytest.fixture(scope="module")
def convnext_atto() -> nn.Module:
    return timm.create_model("convnext_atto", pretrained=False, num_classes=4)


def _rewritten(surgery, model: nn.Module) -> nn.Module:
    with torch.no_grad():
        return surgery._restricted_rewrite(model, torch.zeros(2, dtype=torch.int64), None)


def test_ghost_batchnorm_finds_timms_batchnormact_and_keeps_its_activation(
    efficientnet_b0: nn.Module,
) -> None:
    surgery = GhostBatchNorm(ghost_batch_size=1)
    assert len(surgery.surgery_targets(efficientnet_b0)) == 49
    rewritten = _rewritten(surgery, efficientnet_b0)
    ghosts = [m for m in rewritten.modules() if isinstance(m, GhostBatchNormAct2d)]
    assert len(ghosts) == 49 and all(isinstance(g.act, nn.Module) for g in ghosts)
    # One chunk is plain BatchNorm: the ghost layer then computes what timm's layer does, activation included.
    layer = efficientnet_b0.bn1
    ghost = rewritten.bn1
    ghost.ghost_batch_size = 2
    features = torch.randn(2, layer.num_features, 4, 4)
    with torch.no_grad():
        expected = torch.nn.functional.silu(
            torch.nn.functional.batch_norm(
                features, None, None, layer.weight, layer.bias, True, 0.0, layer.eps
            )
        )
        assert torch.allclose(ghost.train()(features), expected, atol=1e-6)


def test_low_precision_layernorm_finds_timms_layernorm_and_layernorm2d(convnext_atto: nn.Module) -> None:
    surgery = LowPrecisionLayerNorm()
    assert len(surgery.surgery_targets(convnext_atto)) == 17
    rewritten = _rewritten(surgery, convnext_atto)
    channels_first = sum(type(m).__name__ == "LayerNorm2d" for m in convnext_atto.modules())
    assert channels_first > 0
    assert sum(isinstance(m, LPLayerNorm2d) for m in rewritten.modules()) == channels_first
    assert sum(isinstance(m, LPLayerNorm) for m in rewritten.modules()) == 17
    assert not surgery.surgery_targets(rewritten)
    with torch.no_grad():
        assert torch.allclose(rewritten.eval()(IMAGES), convnext_atto.eval()(IMAGES), atol=1e-5)


def test_stochastic_depth_finds_timms_and_torchvisions_blocks(
    timm_resnet18: nn.Module, tv_resnet18: nn.Module
) -> None:
    surgery = StochasticDepth(target_layer_name="BasicBlock", drop_rate=0.5)
    assert len(surgery.surgery_targets(timm_resnet18)) == 8
    assert len(surgery.surgery_targets(tv_resnet18)) == 8
    rewritten = _rewritten(surgery, timm_resnet18)
    assert sum(isinstance(m, StochasticBlock) for m in rewritten.modules()) == 8
    assert not surgery.surgery_targets(rewritten)
    # In evaluation each branch is scaled by its keep probability; the model still runs end to end.
    with torch.no_grad():
        assert rewritten.eval()(IMAGES).shape == (2, 4)
        assert rewritten.train()(IMAGES).shape == (2, 4)


def test_a_subclass_that_changes_forward_is_not_taken_for_its_base() -> None:
    class Scaled(nn.BatchNorm2d):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(input)

    class Renamed(nn.BatchNorm2d):
        pass

    layers = GhostBatchNorm.layers
    assert layers.kind(Renamed(3)) is not None
    assert layers.kind(Scaled(3)) is None


def _blur_and_excite(order: str) -> list:
    blur, excite = BlurPool(), SqueezeExcite(latent_channels=8, min_channels=64)
    return [blur, excite] if order == "blur first" else [excite, blur]


def test_blurpool_and_squeeze_excite_are_accepted_together_and_ordered(tv_resnet18: nn.Module) -> None:
    for order in ("blur first", "excite first"):
        algorithms = _blur_and_excite(order)
        check_surgery_conflicts(algorithms, tv_resnet18)
        assert make_plan(algorithms).names(Event.INIT) == ("blurpool", "squeeze_excite")


def test_ghost_batchnorm_and_stochastic_depth_share_the_branch_end_in_one_order(
    tv_resnet18: nn.Module,
) -> None:
    ghost, stochastic = GhostBatchNorm(ghost_batch_size=1), StochasticDepth(target_layer_name="BasicBlock")
    for algorithms in ([ghost, stochastic], [stochastic, ghost]):
        check_surgery_conflicts(algorithms, tv_resnet18)
        assert make_plan(algorithms).names(Event.INIT) == ("ghost_batchnorm", "stochastic_depth")


def test_stochastic_depth_names_the_block_kind_the_model_holds(tv_resnet18: nn.Module) -> None:
    with pytest.warns(UserWarning, match="holds 8 BasicBlock blocks: use target_layer_name='BasicBlock'"):
        _rewritten(StochasticDepth(), tv_resnet18)


def _trainer(model: nn.Module, algorithms, **kwargs) -> Trainer:
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 3])
    return Trainer(
        model,
        TensorLoader((images, labels), 2, seed=0),
        optimizer=optim.sgd(0.01),
        algorithms=algorithms,
        seed=0,
        progress_bar=False,
        **kwargs,
    )


@pytest.mark.filterwarnings("ignore:load_path=.*was saved by a run of 2ba")
def test_blurpool_and_squeeze_excite_build_one_model_in_either_order_train_and_resume(
    tv_resnet18: nn.Module, tmp_path: Path
) -> None:
    trainers = {}
    for order in ("blur first", "excite first"):
        folder = tmp_path / order.replace(" ", "_")
        trainer = _trainer(tv_resnet18, _blur_and_excite(order), max_duration="2ba", save_folder=folder)
        trainer.fit()
        trainers[order] = trainer
    first, second = (t.static.module for t in trainers.values())
    assert repr(first) == repr(second)
    conv = first.get_submodule("layer3.0.conv1")
    assert type(conv).__name__ == "BlurConv2d" and type(conv.conv).__name__ == "SqueezeExciteConv2d"
    resumed = _trainer(tv_resnet18, [], max_duration="3ba", load_path=tmp_path / "blur_first" / "latest.pt")
    assert repr(resumed.static.module) == repr(first)
    resumed.fit()


def test_target_modules_restricts_a_surgery_by_name(tv_resnet18: nn.Module) -> None:
    everywhere = BlurPool().surgery_targets(tv_resnet18)
    restricted = BlurPool(target_modules=("layer3",))
    assert restricted.surgery_targets(tv_resnet18) == {"layer3.0.conv1", "layer3.0.downsample.0"}
    assert len(everywhere) == 7
    rewritten = _rewritten(restricted, tv_resnet18)
    blurred = {name for name, m in rewritten.named_modules() if type(m).__name__ == "BlurConv2d"}
    assert blurred == {"layer3.0.conv1", "layer3.0.downsample.0"}
    assert not any(isinstance(m, Withheld) for m in rewritten.modules())
    assert type(rewritten.maxpool) is nn.MaxPool2d


def test_target_modules_restricts_stochastic_depth_to_named_blocks(tv_resnet18: nn.Module) -> None:
    surgery = StochasticDepth(target_layer_name="BasicBlock", target_modules=("layer4.*",))
    assert surgery.surgery_targets(tv_resnet18) == {"layer4.0.bn2", "layer4.1.bn2"}
    rewritten = _rewritten(surgery, tv_resnet18)
    stochastic = {name for name, m in rewritten.named_modules() if isinstance(m, StochasticBlock)}
    assert stochastic == {"layer4.0", "layer4.1"}


def test_a_pattern_that_matches_no_module_is_refused_by_name(tv_resnet18: nn.Module) -> None:
    with pytest.raises(ValueError, match="'layer9'"):
        BlurPool(target_modules=("layer3", "layer9")).surgery_targets(tv_resnet18)
    with pytest.raises(TypeError, match="target_modules"):
        BlurPool(target_modules="layer3")  # type: ignore[arg-type]


def test_target_modules_survives_the_record_round_trip() -> None:
    record = SqueezeExcite(min_channels=64, target_modules=["layer4.*"])  # type: ignore[arg-type]
    assert record.target_modules == ("layer4.*",)
    assert hash(record) == hash(SqueezeExcite(min_channels=64, target_modules=("layer4.*",)))
    from composer_fn.core.algorithm import algorithm_from_config

    assert algorithm_from_config(record.to_config()) == record
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert eval(repr(record), {"SqueezeExcite": SqueezeExcite}) == record
