"""Specifications of model surgery at the edges: aliased submodules, tied weights, models with nothing to replace."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

from composer_fn.algorithms import StochasticDepth
from composer_fn.algorithms._surgery import LayerKinds, Surgery, module_with_tensors
from composer_fn.algorithms.alibi import apply_alibi
from composer_fn.algorithms.blurpool import apply_blurpool
from composer_fn.algorithms.gated_linear_units import apply_gated_linear_units
from composer_fn.algorithms.ghost_batchnorm import apply_ghost_batchnorm
from composer_fn.algorithms.low_precision_layernorm import apply_low_precision_layernorm
from composer_fn.algorithms.squeeze_excite import apply_squeeze_excite
from composer_fn.algorithms.weight_standardization import apply_weight_standardization, standardize_weight
from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY
from composer_fn.models import SmallCNN
from composer_fn.models.lm import CausalLM
from composer_fn.testing.settings import example, settings_for


class _SharedStem(nn.Module):
    """A conv model whose first convolution is registered as both ``conv1`` and ``features.0``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.features = nn.Sequential(self.conv1, nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.MaxPool2d(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


class _ListedOnce(_SharedStem):
    """The same model with the first convolution registered once."""

    def __init__(self) -> None:
        super().__init__()
        del self.conv1


SURGERIES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "weight_standardization": apply_weight_standardization,
    "squeeze_excite": lambda m: apply_squeeze_excite(m, 4, 8, key=R.key(0)),
    "blurpool": lambda m: apply_blurpool(m, min_channels=8),
}


@pytest.mark.parametrize("surgery", SURGERIES)
def test_a_module_registered_twice_is_replaced_under_both_names_and_counted_once(surgery: str) -> None:
    rewrite = SURGERIES[surgery]
    shared = rewrite(_SharedStem())
    once = rewrite(_ListedOnce())
    assert shared.conv1 is shared.features[0]
    assert len(list(shared.parameters())) == len(list(once.parameters()))
    assert len(list(shared.buffers())) == len(list(once.buffers()))


def _tied_lm() -> CausalLM:
    model = CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    model.head.weight = model.token_embedding.weight
    return model


TOKEN_SURGERIES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "alibi": lambda m: apply_alibi(m, 8),
    "gated_linear_units": lambda m: apply_gated_linear_units(m, key=R.key(0)),
    "low_precision_layernorm": apply_low_precision_layernorm,
}


@pytest.mark.parametrize("surgery", TOKEN_SURGERIES)
def test_an_output_layer_tied_to_the_embedding_stays_tied(surgery: str) -> None:
    rewritten = TOKEN_SURGERIES[surgery](_tied_lm())
    assert rewritten.head.weight is rewritten.token_embedding.weight


@pytest.mark.parametrize("surgery", SURGERIES)
def test_two_convolutions_sharing_a_weight_keep_sharing_it(surgery: str) -> None:
    model = _ListedOnce()
    model.features[2].weight = model.features[0].weight
    rewritten = SURGERIES[surgery](model)
    weights = [p for name, p in rewritten.named_parameters(remove_duplicate=False) if name.endswith("weight")]
    assert len({id(w) for w in weights if w.shape == (16, 16, 3, 3)}) == 1


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


NOTHING_TO_REPLACE: dict[str, tuple[Callable[[nn.Module], nn.Module], str]] = {
    "blurpool": (apply_blurpool, "BlurPool found no strided torch.nn.Conv2d"),
    "squeeze_excite": (lambda m: apply_squeeze_excite(m, key=R.key(0)), "SqueezeExcite found no torch.nn.Conv2d"),
    "ghost_batchnorm": (apply_ghost_batchnorm, "GhostBatchNorm found no torch.nn.BatchNorm1d"),
    "weight_standardization": (apply_weight_standardization, "WeightStandardization found no torch.nn.Conv1d"),
    "alibi": (lambda m: apply_alibi(m, 8), "Alibi found no transformer blocks"),
    "gated_linear_units": (lambda m: apply_gated_linear_units(m, key=R.key(0)), "GatedLinearUnits found no"),
}


@pytest.mark.parametrize("surgery", NOTHING_TO_REPLACE)
def test_a_surgery_that_finds_nothing_to_replace_warns_naming_itself_and_what_it_looks_for(surgery: str) -> None:
    rewrite, message = NOTHING_TO_REPLACE[surgery]
    model = _mlp()
    with pytest.warns(UserWarning, match=message):
        rewritten = rewrite(model)
    assert rewritten is not model and repr(rewritten) == repr(model)


@pytest.mark.parametrize("surgery", SURGERIES)
def test_applying_to_an_already_rewritten_model_is_silent(surgery: str) -> None:
    once = SURGERIES[surgery](_ListedOnce())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SURGERIES[surgery](once)


def test_a_standardized_convolution_exposes_the_weight_it_convolves_with() -> None:
    conv = apply_weight_standardization(nn.Sequential(nn.Conv2d(3, 4, 3)))[0]
    assert torch.equal(conv.standardized_weight, standardize_weight(conv.weight))
    x = torch.ones(1, 3, 5, 5)
    assert torch.allclose(conv(x), nn.functional.conv2d(x, conv.standardized_weight, conv.bias))


def test_loading_the_state_into_a_tied_model_for_surgery_keeps_the_tie() -> None:
    model = _tied_lm()
    params = {name: p.detach() + 1 for name, p in model.named_parameters()}
    loaded = module_with_tensors(model, params, dict(model.named_buffers()))
    assert loaded.head.weight is loaded.token_embedding.weight
    assert torch.equal(loaded.head.weight, params["token_embedding.weight"])


def _check_model(name: str) -> nn.Module:
    settings = settings_for(name)
    if settings.model is not None:
        return settings.model()
    if settings.modality == "tokens":
        return CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    return SmallCNN(in_channels=3, num_classes=4, width=8)


DECLARING = sorted(name for name, cls in REGISTRY.items() if issubclass(cls, Surgery) and cls.layers is not None)


@pytest.mark.parametrize("name", DECLARING)
def test_a_surgery_rewrites_only_layers_of_the_kinds_its_record_declares(name: str) -> None:
    surgery = example(name)
    model = _check_model(name)
    declared = [kinds for kinds in (getattr(type(surgery), a) for a in dir(type(surgery))) if isinstance(kinds, LayerKinds)]
    targets = surgery.targets(model)
    assert targets, f"{name} finds nothing to rewrite in its check model"
    for target in targets:
        layer = model.get_submodule(target)
        assert any(kinds.kind(layer) is not None for kinds in declared), (target, type(layer).__name__)


def test_every_surgery_that_looks_for_layers_by_class_declares_them_on_its_record() -> None:
    assert DECLARING == [
        "blurpool",
        "factorize",
        "ghost_batchnorm",
        "low_precision_groupnorm",
        "low_precision_layernorm",
        "squeeze_excite",
        "weight_standardization",
    ]
    assert set(StochasticDepth.blocks) == {"BasicBlock", "Bottleneck"}
