"""The Trainer trains third-party models as a hand-written torch.optim loop does, on every training path.

Each torchvision architecture (at a small size) trains three steps of SGD with momentum and of AdamW, eager,
compiled (aot_eager), microbatched and with ChannelsLast, next to torch.optim on the same batches (two of them
also in bf16 autocast); every
parameter must end within its allowance (``composer_fn.testing.differential``). timm's architectures do the
same uncompiled; Hugging Face models are ``test_huggingface.py``'s.
"""

from __future__ import annotations

import pytest
import torch

from composer_fn.optim import fused
from composer_fn.testing.differential import (
    ADAMW,
    SGD_MOMENTUM,
    Comparison,
    OptimizerPair,
    compare,
    image_batches,
    timm_models,
    torch_reference,
    torchvision_models,
    trainer_result,
    update_errors,
)
from composer_fn.trainer import eager_step, microbatch, step

MODELS = torchvision_models()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", [SGD_MOMENTUM, ADAMW], ids=["sgd", "adamw"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_trainer_trains_a_torchvision_model_as_a_torch_optim_loop_does(name: str, optimizer: OptimizerPair) -> None:
    comparisons = compare(MODELS[name], optimizer, ["eager", "compiled", "microbatched", "channels_last"])
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = case.build()
    batches = image_batches(case, 3, 8)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    fp32 = torch_reference(model, batches, SGD_MOMENTUM)
    rounding = update_errors(initial, fp32, torch_reference(model, batches, SGD_MOMENTUM, float64=True))
    errors = update_errors(initial, trainer_result(model, batches, SGD_MOMENTUM, "bf16"), fp32)
    assert Comparison(case.name, SGD_MOMENTUM.name, "bf16", errors, rounding).failures


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
