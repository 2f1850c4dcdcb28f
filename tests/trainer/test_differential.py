"""The Trainer trains third-party models as a hand-written torch.optim loop does, on every training path.

Each torchvision architecture (at a small size) trains three steps of SGD with momentum and of AdamW, eager,
compiled (aot_eager), microbatched and with ChannelsLast, next to torch.optim on the same batches (two of them
also in bf16 autocast, and resnet18 with BlurPool in bf16); every
parameter must end within its allowance (``composer_fn.testing.differential``). timm's architectures do the
same uncompiled; Hugging Face models are ``test_huggingface.py``'s.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms.blurpool import BlurMaxPool2d, BlurPool, apply_blurpool
from composer_fn.optim import fused
from composer_fn.testing.differential import (
    ADAMW,
    SGD_MOMENTUM,
    Comparison,
    ModelCase,
    OptimizerPair,
    compare,
    image_batches,
    timm_models,
    torch_reference,
    torchvision_models,
    trainer_result,
    unused_layer_model,
    update_errors,
)
from composer_fn.trainer import eager_step, microbatch, step
from composer_fn.trainer.trainer import Trainer

MODELS = torchvision_models()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [SGD_MOMENTUM, ADAMW], ids=["sgd", "adamw"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_trainer_trains_a_torchvision_model_as_a_torch_optim_loop_does(name: str, optimizer: OptimizerPair) -> None:
    # Both optimizers eagerly; the other paths (compiled, microbatched, channels-last) with AdamW, the one with the
    # more state: how a path runs the model does not depend on the optimizer's rule.
    paths = ["eager", "compiled", "microbatched", "channels_last"] if optimizer is ADAMW else ["eager"]
    comparisons = compare(MODELS[name], optimizer, paths)
    failed = [comparison.describe() for comparison in comparisons if comparison.failures]
    assert not failed, "\n".join(failed)


@pytest.mark.slow
def test_a_head_the_forward_never_calls_stays_put_under_adamws_weight_decay_as_torch_optim_leaves_it() -> None:
    # torch.optim skips a parameter whose .grad is None: no decay, no moments, no step count, on every path.
    comparisons = compare(unused_layer_model(), ADAMW, ["eager", "compiled", "microbatched", "bf16"])
    failed = [comparison.describe() for comparison in comparisons if comparison.failures]
    assert not failed, "\n".join(failed)
    assert all(comparison.errors["old_head.weight"] == 0.0 for comparison in comparisons)


def _grayscale_resnet() -> nn.Module:
    # torchvision's ResNet with a one-channel stem, as users adapt it to grayscale images: the stem's weight is
    # channels-last only by its strides.
    from torchvision.models import resnet

    model = resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [SGD_MOMENTUM, ADAMW], ids=["sgd", "adamw"])
def test_the_trainer_trains_a_grayscale_torchvision_resnet_channels_last_as_a_torch_optim_loop_does(
    optimizer: OptimizerPair,
) -> None:
    case = ModelCase("resnet18 (one channel)", _grayscale_resnet, 32, channels=1)
    comparisons = compare(case, optimizer, ["eager", "compiled", "channels_last"])
    failed = [comparison.describe() for comparison in comparisons if comparison.failures]
    assert not failed, "\n".join(failed)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [SGD_MOMENTUM, ADAMW], ids=["sgd", "adamw"])
@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0", "convnext_atto", "vit_tiny"])
def test_the_trainer_trains_a_timm_model_as_a_torch_optim_loop_does(name: str, optimizer: OptimizerPair) -> None:
    pytest.importorskip("timm")
    # Uncompiled paths: compiling is what the torchvision cases check, on the same kinds of layers.
    comparisons = compare(timm_models()[name], optimizer, ["eager", "microbatched", "channels_last"])
    failed = [comparison.describe() for comparison in comparisons if comparison.failures]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_bf16_autocast_trains_a_torchvision_model_as_a_torch_optim_loop_under_autocast_does(name: str) -> None:
    [comparison] = compare(MODELS[name], SGD_MOMENTUM, ["bf16"])
    assert not comparison.failures, comparison.describe()


def test_the_bf16_comparison_catches_a_step_without_autocast() -> None:
    # The Trainer's bf16 run held against the fp32 loop: bf16's rounding moves the updates far past the allowance.
    case = MODELS["resnet18"]
    model = case.build_seeded()
    batches = image_batches(case, 3, 8)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    fp32 = torch_reference(model, batches, SGD_MOMENTUM)
    rounding = update_errors(initial, fp32, torch_reference(model, batches, SGD_MOMENTUM, float64=True))
    errors = update_errors(initial, trainer_result(model, batches, SGD_MOMENTUM, "bf16"), fp32)
    assert Comparison(case.name, SGD_MOMENTUM.name, "bf16", errors, rounding).failures


class _TorchBlurMaxPool(nn.Module):
    """A ``BlurMaxPool2d`` written with torch's ops only: the stride-1 max, then the depthwise ``F.conv2d`` blur;
    under autocast, of its bf16 values in fp32, rounded once to bf16. On a CPU with AVX512-BF16 that is what
    torch's bf16 kernel gives; on others that kernel rounds its gradient more than once
    (``tests/algorithms/test_blurpool.py``)."""

    def __init__(self, pool: BlurMaxPool2d) -> None:
        super().__init__()
        self.pool = pool

    def forward(self, input: Tensor) -> Tensor:
        pool = self.pool
        maxima = F.max_pool2d(input, pool.kernel_size, stride=1, padding=pool.padding, dilation=pool.dilation)
        channels = maxima.shape[1]
        filter = pool.filt2d.expand(channels, 1, *pool.filt2d.shape[-2:])
        if not torch.is_autocast_enabled("cpu"):
            return F.conv2d(maxima, filter.to(maxima.dtype), stride=pool.stride, padding=1, groups=channels)
        with torch.autocast("cpu", enabled=False):
            blurred = F.conv2d(
                maxima.bfloat16().float(), filter.float(), stride=pool.stride, padding=1, groups=channels
            )
        return blurred.bfloat16()


def test_blurpool_in_bf16_trains_resnet18_as_a_torch_optim_loop_with_torchs_own_blur_does() -> None:
    # BlurPool's strided blur takes its own CPU path in bf16: the Trainer's run against a torch.optim loop under
    # autocast whose blurred max pool is written in torch's ops.
    case = MODELS["resnet18"]
    model = case.build_seeded()
    batches = image_batches(case, 2, 8)
    blurred = apply_blurpool(model)
    by_torch = copy.deepcopy(blurred)
    pools = [name for name, module in by_torch.named_modules() if isinstance(module, BlurMaxPool2d)]
    assert pools, "resnet18 has a max pool for BlurPool to blur"
    for name in pools:
        parent, _, child = name.rpartition(".")
        owner = by_torch.get_submodule(parent)
        setattr(owner, child, _TorchBlurMaxPool(getattr(owner, child)))
    initial = {name: p.detach().clone() for name, p in blurred.named_parameters()}
    rounding = update_errors(
        initial, torch_reference(by_torch, batches, SGD_MOMENTUM),
        torch_reference(by_torch, batches, SGD_MOMENTUM, float64=True),
    )  # fmt: skip
    trainer = Trainer(
        copy.deepcopy(model),
        list(batches),
        max_duration=f"{len(batches)}ba",
        optimizer=SGD_MOMENTUM.ours(),
        algorithms=[BlurPool()],
        precision="bf16-mixed",
        progress_bar=False,
    )
    trainer.fit()
    ours = {name: p.detach().clone() for name, p in trainer.state.params.items()}
    errors = update_errors(initial, ours, torch_reference(by_torch, batches, SGD_MOMENTUM, bf16=True))
    comparison = Comparison(case.name, SGD_MOMENTUM.name, "bf16 + BlurPool", errors, rounding)
    assert not comparison.failures, comparison.describe()


def test_the_comparison_catches_gradients_applied_in_another_memory_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the gradient handed to the fused update in the layout the backward gave it, as before the fix,
    # ConvNeXt's downsampling convolutions (after LayerNorm2d's permute) are updated in the wrong order: after
    # one step, exactly those are off, by about their whole update.
    for module in (eager_step, step, microbatch):
        monkeypatch.setattr(module, "in_layout_of", lambda tensors, like: dict(tensors))
    monkeypatch.setattr(fused, "_one_layout", lambda group: True)
    [comparison] = compare(MODELS["convnext_tiny"], SGD_MOMENTUM, ["eager"], steps=1)
    assert set(comparison.failures) == {"features.2.1.weight", "features.4.1.weight"}
    assert min(error for error, _ in comparison.failures.values()) > 0.1
