"""The contract suite on the models users bring: timm and torchvision networks on images, Hugging Face language
models on padded token batches given as keyword arguments, each algorithm with its suite example.

The suite's own models check every property on layers built for it; these check that purity, determinism,
the checkpoint round trip and the surgeries' rules hold on third-party layers too (timm's ``BatchNormAct2d`` and
squeeze-excitation, torchvision's ``LayerNorm2d``; BERT's, GPT-2's and Llama's attention, feed-forward and norms).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing import (
    check_checkpoint_round_trip,
    check_determinism,
    check_purity,
    check_surgery,
    make_setup,
    train_steps,
)
from composer_fn.testing.differential import timm_models, torchvision_models
from composer_fn.testing.models import language_model, token_batches
from composer_fn.testing.settings import example, settings_for

pytest.importorskip("timm")
pytest.importorskip("transformers")

STOPPERS = {"early_stopper", "threshold_stopper"}
IMAGE = sorted(n for n in REGISTRY if settings_for(n).modality == "image" and n not in STOPPERS)
TOKENS = sorted(n for n in REGISTRY if settings_for(n).modality == "tokens") + [
    "ema", "gradient_clipping", "label_smoothing", "sam", "selective_backprop",
]  # fmt: skip


def _images(image_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.rand(4, 3, image_size, image_size, generator=generator),
            torch.randint(0, 10, (4,), generator=generator),
        )
        for _ in range(3)
    ]


def _vision(name: str) -> Callable[[], tuple[Any, Any]]:
    library, _, architecture = name.partition("/")
    case = (timm_models() if library == "timm" else torchvision_models())[architecture]

    def on() -> tuple[Any, Any]:
        torch.manual_seed(0)
        return case.build(), _images(case.image_size)

    return on


def _language(name: str) -> Callable[[], tuple[Any, Any]]:
    def on() -> tuple[Any, Any]:
        kind = "masked" if name == "bert-mlm" else "causal"
        return language_model(name), token_batches(3, length=16, kind=kind)

    return on


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Methods that find nothing to change on a model say so; that is the matrix's business, not these checks'.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


CHECKS = (check_surgery, check_purity, check_determinism, check_checkpoint_round_trip)


def _skip_a_surgery_without_layers(algorithm: Any, on: Callable[[], tuple[Any, Any]], check: Any) -> None:
    # check_surgery asks a surgery to claim a layer of the model; models without its layers are the matrix's
    # warned cells (GhostBatchNorm on ConvNeXt, GatedLinearUnits on Llama's gated MLP).
    rewrites = algorithm.capabilities().rewrites
    if check is check_surgery and (rewrites is None or not rewrites(on()[0])):
        pytest.skip(f"{algorithm.name} rewrites no layer of this model")


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("model", ["timm/efficientnet_b0", "torchvision/convnext_tiny"])
@pytest.mark.parametrize("name", IMAGE)
def test_an_image_algorithm_honours_the_contract_on_a_third_party_network(
    name: str, model: str, check: Any
) -> None:
    _skip_a_surgery_without_layers(example(name), _vision(model), check)
    check(example(name), on=_vision(model))


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("model", ["gpt2", "bert-mlm", "llama"])
@pytest.mark.parametrize("name", TOKENS)
def test_a_language_algorithm_honours_the_contract_on_a_hugging_face_model(
    name: str, model: str, check: Any
) -> None:
    _skip_a_surgery_without_layers(example(name), _language(model), check)
    check(example(name), on=_language(model))


@pytest.mark.slow
def test_a_compiled_gpt2_step_with_the_nlp_methods_together_equals_the_eager_one() -> None:
    # One compiled run for the four (each compile costs seconds): ALiBi's rows, the gated feed-forward, the
    # low-precision norms and the warm-up's shorter sequences, through aot_eager, against the eager steps.
    algorithms = [
        example(n) for n in ("alibi", "gated_linear_units", "low_precision_layernorm", "seq_length_warmup")
    ]
    eager, eager_losses = train_steps(make_setup(algorithms, **_setup(_language("gpt2"))))
    compiled, compiled_losses = train_steps(
        make_setup(algorithms, **_setup(_language("gpt2"))), compile_backend="aot_eager"
    )
    torch.testing.assert_close(torch.stack(compiled_losses), torch.stack(eager_losses), rtol=1e-6, atol=1e-6)
    for name in eager.params:
        torch.testing.assert_close(compiled.params[name], eager.params[name], rtol=1e-5, atol=1e-6)


def _setup(on: Callable[[], tuple[Any, Any]]) -> dict[str, Any]:
    model, batches = on()
    return {"model": model, "batches": batches}
