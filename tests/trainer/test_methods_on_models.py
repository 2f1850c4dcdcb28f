"""Methods meet the batches and models users bring: each acts, or says why it cannot, before the first step.

The matrix of every method on every model is ``benchmarks/method_matrix.py``; these are its findings, kept.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from composer_fn import optim
from composer_fn.algorithms import SWA, ChannelsLast, CutOut, LayerFreezing, MixUp, SelectiveBackprop
from composer_fn.testing.models import tiny_gpt2, token_batches
from composer_fn.trainer import Trainer

pytest.importorskip("transformers")


def _trainer(model: nn.Module, batches: list[Any], algorithms: list[Any], **options: Any) -> Trainer:
    return Trainer(
        model, batches, algorithms=algorithms, optimizer=optim.sgd(learning_rate=0.01), seed=0, progress_bar=False,
        **{"max_duration": "2ba", **options},
    )  # fmt: skip


@pytest.mark.parametrize("method", [MixUp(), CutOut()], ids=["mixup", "cutout"])
def test_an_image_method_on_token_batches_is_refused_naming_it_and_the_batch(method: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"{type(method).__name__}\(input_key=0\).*'input_ids', 'attention_mask'"
    ):
        _trainer(tiny_gpt2(), token_batches(2), [method]).fit()


class _Pixels(nn.Module):
    # A model that takes its images by keyword, as Hugging Face vision models do.
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(3))
        self.net(torch.zeros(1, 3, 8, 8))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values)  # type: ignore[no-any-return]


def test_mixup_on_a_mapping_of_pixel_values_mixes_them_and_reads_labels() -> None:
    generator = torch.Generator().manual_seed(0)
    batches = [
        {"pixel_values": torch.rand(4, 3, 8, 8, generator=generator), "labels": torch.randint(0, 3, (4,), generator=generator)}
        for _ in range(2)
    ]  # fmt: skip
    torch.manual_seed(0)
    plain = _trainer(_Pixels(), batches, []).fit()["loss"]
    torch.manual_seed(0)
    mixed = _trainer(_Pixels(), batches, [MixUp(alpha=1.0, input_key="pixel_values")]).fit()["loss"]
    assert torch.isfinite(torch.tensor(mixed)) and mixed != plain


MASKED: list[bool] = []
"""For each call of ``_Recording`` (whichever copy of it the trainer runs), whether it was given the mask."""


class _Recording(nn.Module):
    # GPT-2 that records, for each call, whether it was given the attention mask.
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_gpt2()

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None, labels: Any = None) -> Any:
        MASKED.append(attention_mask is not None)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False)


def test_selective_backprop_scores_a_language_models_batch_with_everything_the_step_gives_it() -> None:
    algorithm = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    trainer = _trainer(_Recording(), token_batches(2), [algorithm])
    MASKED.clear()
    metrics = trainer.fit()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    # The scoring forward and the training forward of each step both reached the model with the mask.
    assert len(MASKED) >= 4 and all(MASKED)


def test_selective_backprop_refuses_downscaling_a_mapping_batch() -> None:
    algorithm = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, scale_factor=0.5)
    with pytest.raises(ValueError, match=r"scale_factor=0.5.*mapping of input_ids, attention_mask, labels"):
        _trainer(tiny_gpt2(), token_batches(2), [algorithm]).fit()


def test_channels_last_warns_that_a_model_without_convolutions_changes_nothing() -> None:
    with pytest.warns(UserWarning, match="ChannelsLast found no 4-d parameter.*GPT2LMHeadModel"):
        _trainer(tiny_gpt2(), token_batches(2), [ChannelsLast()], max_duration="1ba").fit()


def test_swa_and_layer_freezing_warn_when_the_run_is_too_short_for_them_and_not_otherwise() -> None:
    batches = [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(2)]
    with pytest.warns(UserWarning, match="SWA.*takes in one set of weights only"):
        _trainer(nn.Linear(8, 3), batches, [SWA()], max_duration="2ep")
    with pytest.warns(
        UserWarning, match=r"LayerFreezing\(freeze_start=0.5\) in a run of 2 epoch\(s\) freezes no layer"
    ):
        _trainer(nn.Linear(8, 3), batches, [LayerFreezing()], max_duration="2ep")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(nn.Linear(8, 3), batches, [SWA(swa_start="0.5dur")], max_duration="4ep")
        _trainer(nn.Linear(8, 3), batches, [LayerFreezing()], max_duration="4ep")


def test_colout_on_a_vision_transformer_of_one_input_size_is_refused_before_the_first_step() -> None:
    from torchvision.models import VisionTransformer

    from composer_fn.algorithms import ColOut

    model = VisionTransformer(16, 4, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3)
    batches = [(torch.rand(4, 3, 16, 16), torch.randint(0, 3, (4,))) for _ in range(2)]
    with pytest.raises(
        ValueError, match=r"ColOut drops rows and columns.*VisionTransformer accepts only 16x16"
    ):
        _trainer(model, batches, [ColOut()]).fit()
