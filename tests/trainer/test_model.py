"""The trained model back: ``Trainer.model`` gives the evaluation's outputs (EMA's average where the run has it),
``load_model`` rebuilds it from a checkpoint and the untrained architecture (surgeries replayed), and each export
format gives the module's outputs back."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from composer_fn import Trainer, export_model, load_model, optim
from composer_fn import random as R
from composer_fn.algorithms import EMA, SWA, BlurPool, ChannelsLast, SqueezeExcite
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.export import run_exported
from composer_fn.models import SmallCNN
from composer_fn.models.zoo import build_model

TASK = load_digits_task(upsample=2)
HELDOUT_IMAGES, HELDOUT_LABELS = TASK.heldout


def _trainer(algorithms=(), model=None, **options) -> Trainer:
    return Trainer(
        model if model is not None else SmallCNN(1, 10, width=8),
        TensorLoader(TASK.train, 64, seed=0),
        TensorLoader(TASK.heldout, 512, shuffle=False),
        max_duration=options.pop("max_duration", "20ba"),
        optimizer=optim.sgd(0.1, momentum=0.9),
        algorithms=algorithms,
        progress_bar=False,
        **options,
    )


def _outputs(module: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return module(HELDOUT_IMAGES)


def _assert_outputs_are_the_evaluations(trainer: Trainer, outputs: torch.Tensor) -> None:
    metrics = trainer.eval()
    accuracy = (outputs.argmax(1) == HELDOUT_LABELS).double().mean().item()
    assert accuracy == metrics["eval/eval/accuracy"]
    assert F.cross_entropy(outputs, HELDOUT_LABELS).item() == pytest.approx(metrics["eval/eval/loss"], rel=1e-6)


@pytest.mark.parametrize(
    "algorithms",
    [(), (EMA(half_life="3ba"),), (SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="1ba"),)],
    ids=["plain", "ema", "swa"],
)
def test_the_trained_model_gives_the_evaluations_outputs(algorithms) -> None:
    trainer = _trainer(algorithms)
    trainer.fit()
    model = trainer.model
    assert not model.training
    _assert_outputs_are_the_evaluations(trainer, _outputs(model))


def test_with_ema_the_model_holds_the_average_and_the_run_keeps_training_weights() -> None:
    trainer = _trainer((EMA(half_life="3ba"),))
    trainer.fit()
    before = {name: tensor.clone() for name, tensor in trainer.state.params.items()}
    model = trainer.model
    average = trainer.state.algos["ema"].params
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, average[name])
        assert not torch.equal(parameter, trainer.state.params[name])
    # The module is the user's: changing it leaves the run as it was.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    for name, tensor in trainer.state.params.items():
        assert torch.equal(tensor, before[name])


def test_the_model_passed_in_is_left_untrained_and_each_call_is_a_new_module() -> None:
    given = SmallCNN(1, 10, width=8)
    initial = {name: tensor.clone() for name, tensor in given.state_dict().items()}
    trainer = _trainer(model=given)
    trainer.fit()
    assert all(torch.equal(tensor, initial[name]) for name, tensor in given.state_dict().items())
    assert trainer.model is not trainer.model
    assert not torch.equal(_outputs(trainer.model), _outputs(given.eval()))


def test_a_channels_last_runs_model_keeps_its_layout_and_outputs() -> None:
    trainer = _trainer((ChannelsLast(),))
    trainer.fit()
    model = trainer.model
    weight = model.features[0][0].weight  # one input channel: only its strides say channels-last
    assert weight.shape[1] == 1 and weight.stride() == torch.empty(weight.shape, memory_format=torch.channels_last).stride()
    _assert_outputs_are_the_evaluations(trainer, _outputs(model))


SURGERIES = (BlurPool(min_channels=8), SqueezeExcite(min_channels=16, latent_channels=4), EMA(half_life="3ba"))


def test_load_model_rebuilds_a_surgery_and_ema_run_from_its_checkpoint(tmp_path: Path) -> None:
    untrained = SmallCNN(1, 10, width=8)
    trainer = _trainer(SURGERIES, model=untrained, save_folder=tmp_path)
    trainer.fit()
    rebuilt = load_model(tmp_path / "latest.pt", untrained)
    assert torch.equal(_outputs(rebuilt), _outputs(trainer.model))
    # Both surgeries were replayed: the strided convolution is blurred, the last one has its block.
    assert type(rebuilt.features[1][0]).__name__ == "BlurConv2d"
    assert type(rebuilt.features[2][0]).__name__ == "SqueezeExciteConv2d"
    _assert_outputs_are_the_evaluations(trainer, _outputs(rebuilt))
    # The training weights, for those who want them instead of the average.
    training = load_model(tmp_path / "latest.pt", untrained, evaluation_weights=False)
    for name, parameter in training.named_parameters():
        assert torch.equal(parameter, trainer.state.params[name])


def test_load_model_refuses_another_architecture_naming_the_tensors(tmp_path: Path) -> None:
    _trainer(SURGERIES, model=SmallCNN(1, 10, width=8), save_folder=tmp_path).fit()
    with pytest.raises(ValueError, match=r"checkpoint=.*latest\.pt.*does not fit the model: params 'head\.weight' is \(10, 16\)"):
        load_model(tmp_path / "latest.pt", SmallCNN(1, 7, width=8))
    with pytest.raises(TypeError, match="expected the untrained torch.nn.Module"):
        load_model(tmp_path / "latest.pt", "small_cnn")  # type: ignore[arg-type]
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"checkpoint='.*empty\.pt' is not a checkpoint: it is an empty file"):
        load_model(tmp_path / "empty.pt", SmallCNN(1, 10, width=8))


FORMATS = ["torchscript", "pt2"] + (["onnx"] if importlib.util.find_spec("onnxscript") else [])


@pytest.mark.parametrize("format", FORMATS)
def test_each_export_format_gives_the_modules_outputs_on_the_heldout_batch(tmp_path: Path, format: str) -> None:
    trainer = _trainer(SURGERIES)
    trainer.fit()
    model = trainer.model
    batch = HELDOUT_IMAGES[:64]
    path = tmp_path / f"model.{format}"
    check = export_model(model, batch, path, format=format)
    assert check.path == path and path.is_file()
    assert check.max_difference <= 1e-5
    expected = _outputs(model)
    assert (run_exported(path, format, batch) - expected[:64]).abs().max() <= 1e-5
    if format != "torchscript":
        # The batch dimension is free: another batch size runs.
        assert (run_exported(path, format, HELDOUT_IMAGES[:5]) - expected[:5]).abs().max() <= 1e-5
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


class _Branching(torch.nn.Module):
    """Doubles its output when the batch's mean is positive: a branch on a value, which a trace fixes."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(16 * 16, 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(images.flatten(1))
        if images.mean() > 0:
            logits = logits * 2
        return logits


def test_a_trace_that_the_example_specialised_is_refused_on_another_batch_and_says_what_it_fixed(tmp_path: Path) -> None:
    model = _Branching()
    positive, negative = HELDOUT_IMAGES[:8].abs() + 0.1, -HELDOUT_IMAGES[8:13].abs() - 0.1
    with pytest.raises(ValueError, match=r"on check batch 1 \(5 samples\) .*the trace fixed to the example: Converting a tensor to a Python boolean"):
        export_model(model, positive, tmp_path / "m.ts", check_batches=[negative])
    assert not any(tmp_path.iterdir())
    # Checked on the example alone, the same program passes, and says what the trace fixed.
    check = export_model(model, positive, tmp_path / "m.ts")
    assert check.batches == 1 and check.specialised and "Python boolean" in check.specialised[0]
    # A model without such a branch passes on batches of every size, and nothing was fixed.
    plain = export_model(SmallCNN(1, 10, width=8), HELDOUT_IMAGES[:8], tmp_path / "p.ts", check_batches=[HELDOUT_IMAGES[8:13]])
    assert plain.batches == 2 and plain.specialised == ()


def test_an_export_is_refused_before_writing_for_bad_arguments(tmp_path: Path) -> None:
    model = SmallCNN(1, 10, width=8)
    with pytest.raises(ValueError, match="format='tflite' is not an export format; accepted: torchscript, pt2, onnx"):
        export_model(model, HELDOUT_IMAGES[:4], tmp_path / "m", format="tflite")
    with pytest.raises(ValueError, match=r"example=\(1, 1, 16, 16\): expected a batch tensor of at least 2 samples"):
        export_model(model, HELDOUT_IMAGES[:1], tmp_path / "m.ts")
    # Inputs the module cannot take: named with their shape, before anything is written.
    with pytest.raises(ValueError, match=r"^example of shape \(4, 3, 16, 16\) \(torch.float32\): SmallCNN fails on it \("):
        export_model(model, HELDOUT_IMAGES[:4].expand(-1, 3, -1, -1), tmp_path / "m.ts")
    with pytest.raises(ValueError, match=r"^check_batches\[0\] of shape \(2, 1, 9, 9\)"):
        export_model(nn.Sequential(nn.Flatten(), nn.Linear(256, 2)), HELDOUT_IMAGES[:4], tmp_path / "m.ts", check_batches=[torch.zeros(2, 1, 9, 9)])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["small_cnn", "two_conv_bn", "mlp", "cifar_resnet20", "resnet18", "mobilenet_v3_small", "regnet_x_400mf"])
def test_a_model_by_name_takes_the_datas_channels_and_classes(name: str) -> None:
    state = torch.random.get_rng_state()
    model = build_model(name, (1, 32, 32), 7, key=R.key(3))
    again = build_model(name, (1, 32, 32), 7, key=R.key(3))
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.no_grad():
        outputs = model.eval()(torch.zeros(3, 1, 32, 32))
    assert outputs.shape == (3, 7)
    for (key, tensor), other in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(tensor, other), key
    # Another key, other weights: a run's seed reaches its initialisation.
    other = build_model(name, (1, 32, 32), 7, key=R.key(4))
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))


def test_a_model_that_cannot_take_the_images_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"model='convnext_tiny' does not take 1x8x8 images \(.*\); pick a model"):
        build_model("convnext_tiny", (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"model='resnet_9000' is not a model we build; accepted: small_cnn"):
        build_model("resnet_9000", (1, 8, 8), 10)


def test_load_model_of_a_channels_last_run_gives_its_layout_and_outputs(tmp_path: Path) -> None:
    untrained = SmallCNN(1, 10, width=8)
    trainer = _trainer((ChannelsLast(), EMA(half_life="3ba")), model=untrained, save_folder=tmp_path)
    trainer.fit()
    rebuilt = load_model(tmp_path / "latest.pt", untrained)
    for weight in (rebuilt.features[0][0].weight, rebuilt.features[1][0].weight):
        assert weight.stride() == torch.empty(weight.shape, memory_format=torch.channels_last).stride()
    assert torch.equal(_outputs(rebuilt), _outputs(trainer.model))
