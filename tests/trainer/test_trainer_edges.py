"""The Trainer's arguments, evaluators, stoppers, checkpoints and ``predict`` as a user who makes every mistake once
meets them: good input (NumPy numbers, a list of tensors) is accepted; bad input is refused before the first step,
naming the argument, the value and what is accepted; an option without the one it needs is refused; a setting that
makes something do nothing says so."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchmetrics
from torch import nn

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.algorithms import EMA, SWA, EarlyStopper, GhostBatchNorm, LayerFreezing, ThresholdStopper
from composer_fn.callbacks import NaNMonitor, RuntimeEstimator, SpeedMonitor
from composer_fn.core.algorithm import Algorithm, ChangesNothing, HostHook, UnfitForTheRun
from composer_fn.core.event import Event
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.trainer import Evaluator, load_model
from composer_fn.trainer.checkpoint import checkpoint_metadata, read_checkpoint

ROWS = (R.normal(R.key(0), (16, 6)), R.randint(R.key(1), 0, 2, (16,)))
TEN = (R.normal(R.key(2), (16, 6)), R.randint(R.key(3), 0, 10, (16,)))


def _loader(rows: tuple[torch.Tensor, ...] = ROWS, batch_size: int = 8) -> TensorLoader:
    return TensorLoader(rows, batch_size, shuffle=False)


def _trainer(model: nn.Module | None = None, loader: Any = None, **arguments: Any) -> Trainer:
    settings: dict[str, Any] = {"max_duration": "2ba", "optimizer": optim.sgd(0.1), "progress_bar": False, **arguments}
    loader = settings.pop("loader", loader)
    return Trainer(model if model is not None else MLP(6, 2), loader if loader is not None else _loader(), **settings)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full checkpoint of a two-class MLP(6, 2) after one step."""
    trainer = _trainer(max_duration="1ba")
    trainer.fit()
    return trainer.save_checkpoint(tmp_path_factory.mktemp("run") / "run.pt")


# -- good input accepted ----------------------------------------------------------------------------------------


def test_a_list_of_tensors_is_a_tensor_loader_like_a_tuple() -> None:
    listed, tupled = TensorLoader(list(ROWS), 8, shuffle=False), _loader()
    assert all(isinstance(b, tuple) for b in listed)
    assert all(torch.equal(a, b) for x, y in zip(listed, tupled, strict=True) for a, b in zip(x, y, strict=True))


def test_numpy_numbers_are_accepted_for_every_number_of_the_trainer_and_held_as_python_numbers(tmp_path: Path) -> None:
    trainer = _trainer(
        eval_dataloader=Evaluator("held", _loader(), subset_num_batches=np.int64(1), eval_interval=np.int64(2)),
        max_duration=np.int64(1),
        seed=np.int64(1),
        eval_interval=np.int64(1),
        save_folder=tmp_path,
        save_interval=np.int64(1),
        save_num_checkpoints_to_keep=np.int64(1),
        dist_timeout=np.float32(30),
        device_train_microbatch_size=np.int64(4),
        scale_schedule_ratio=np.float32(1.0),
        log_interval=np.int64(1),
        callbacks=[NaNMonitor(np.int64(1)), SpeedMonitor(np.int64(2), np.float32(1e3)), RuntimeEstimator(np.int64(0))],
        algorithms=[EarlyStopper(patience=np.int64(2), min_delta=np.float32(0.1), dataloader_label="held")],
    )
    assert type(trainer.evaluators[0].subset_num_batches) is int
    assert type(trainer.options.checkpointing.keep) is int
    assert trainer.fit()["loss"] > 0


@pytest.mark.parametrize(
    "loss_fn",
    [
        lambda outputs, batch, weight=1.0: weight * nn.functional.cross_entropy(outputs, batch[1]),
        lambda *arguments: nn.functional.cross_entropy(arguments[0], arguments[1][1]),
        nn.CrossEntropyLoss(),  # a module: its call signature is (*args, **kwargs)
    ],
    ids=["a third argument with a default", "varargs", "a module"],
)
def test_a_loss_callable_with_two_positional_arguments_is_accepted(loss_fn: Any) -> None:
    _trainer(loss_fn=loss_fn)


def test_numpy_numbers_in_save_metadata_are_stored_as_python_numbers(tmp_path: Path) -> None:
    trainer = _trainer(save_folder=tmp_path, max_duration="1ba", save_metadata={"width": np.int64(4), "rate": [np.float32(0.5)]})
    trainer.fit()
    assert checkpoint_metadata(tmp_path / "latest.pt") == {"width": 4, "rate": [0.5]}


# -- refused when the trainer is built --------------------------------------------------------------------------


def _devices_refused() -> list[Any]:
    cases = [pytest.param({"device": "cuda:99"}, ValueError, r"device='cuda:99': .*; available: 'cpu'", id="cuda:99")]
    if not torch.cuda.is_available():
        cases.append(pytest.param({"device": "cuda"}, ValueError, r"device='cuda': no cuda device is available.*'cpu'", id="cuda"))
    if not (torch.backends.mps.is_available()):
        cases.append(pytest.param({"device": "mps"}, ValueError, r"device='mps': no mps device is available", id="mps"))
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        cases.append(pytest.param({"device": "xpu"}, ValueError, r"device='xpu': no xpu device is available", id="xpu"))
    return cases


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        *_devices_refused(),
        ({"eval_dataloader": []}, ValueError, r"eval_dataloader is empty: an evaluation needs at least one batch"),
        ({"eval_dataloader": Evaluator("held", [])}, ValueError, r"eval_dataloader \(held\) is empty"),
        ({"loss_fn": lambda outputs: outputs.sum()}, TypeError, r"loss_fn=<lambda>\(outputs\) cannot be called as loss_fn\(outputs, batch\)"),
        ({"loss_fn": lambda o, b, c: o.sum()}, TypeError, r"loss_fn=<lambda>\(o, b, c\) cannot be called .*missing a required argument: 'c'"),
        ({"per_sample_loss_fn": lambda *, o, b: o}, TypeError, r"per_sample_loss_fn=<lambda>\(\*, o, b\) cannot be called"),
        ({"save_num_checkpoints_to_keep": 2}, ValueError, r"save_num_checkpoints_to_keep=2 needs save_folder"),
        ({"save_weights_only": True}, ValueError, r"save_weights_only=True needs save_folder"),
        ({"save_interval": "1ba"}, ValueError, r"save_interval='1ba' needs save_folder"),
        ({"eval_interval": "1ba"}, ValueError, r"eval_interval='1ba' needs eval_dataloader"),
        ({"load_weights_only": True}, ValueError, r"load_weights_only=True needs load_path"),
        ({"load_ignore_keys": ["head.*"]}, ValueError, r"load_ignore_keys=\['head.\*'\] applies only with load_path and load_weights_only=True"),
        ({"load_strict_model_weights": False}, ValueError, r"load_strict_model_weights=False applies only with load_path and"),
        ({"progress_bar": "no"}, TypeError, r"progress_bar='no' must be True or False"),
        ({"precision": "bf16"}, ValueError, r"precision='bf16' must be one of fp32, bf16-mixed, fp16-mixed \(did you mean 'bf16-mixed'\?\)"),
        ({"optimizer": optim.sgd}, TypeError, r"optimizer=composer_fn.optim.sgd is the function .*; call it: optimizer=composer_fn.optim.sgd\(0.1\)"),
        ({"callbacks": [NaNMonitor]}, TypeError, r"callbacks\[0\] is the class NaNMonitor; pass an instance: NaNMonitor\(...\)"),
        ({"save_folder": ""}, ValueError, r"save_folder='': expected a folder path \(or None to save nothing\)"),
        ({"load_path": ""}, ValueError, r"load_path='': expected the path of a checkpoint file"),
        ({"eval_dataloader": {"val": _loader()}}, TypeError, r"eval_dataloader is a mapping of 1 entries: .*pass a list of Evaluators"),
        ({"eval_dataloader": ROWS}, TypeError, r"eval_dataloader is a tuple of 2 tensors, so each tensor would be a batch"),
        ({"loader": list(ROWS)}, TypeError, r"train_dataloader is a list of 2 tensors, so each tensor would be a batch; .*TensorLoader"),
        ({"passes": [1]}, TypeError, r"passes\[0\]=1: expected a pass"),
        ({"passes": "default"}, TypeError, r"passes='default': expected a sequence of passes"),
        ({"save_metadata": {"model": object()}}, TypeError, r"save_metadata\['model'\]=<object .*: expected plain values"),
        (
            {"eval_dataloader": _loader(), "algorithms": [EarlyStopper("f1")]},
            ValueError,
            r"EarlyStopper\(monitor='f1'\) reads 'eval/eval/f1', which the run never logs at the evaluations of 'eval'; "
            r"it logs eval/eval/accuracy, eval/eval/loss",
        ),
        (
            {"algorithms": [EarlyStopper("accuracy", dataloader_label="train")]},
            ValueError,
            r"reads 'accuracy', which the run never logs at its log steps \(dataloader_label='train'\); it logs loss, "
            r"lr_multiplier, samples_per_second",
        ),
        (
            {"eval_dataloader": _loader(), "algorithms": [EarlyStopper("eval/eval/accuracy", dataloader_label="train")]},
            ValueError,
            r"an evaluator's metric is read after its evaluations, so pass dataloader_label='eval'",
        ),
        (
            {"eval_dataloader": _loader(), "algorithms": [ThresholdStopper("accuracy", threshold=1.5, comp="gt")]},
            ValueError,
            r"ThresholdStopper\(threshold=1.5\): 'eval/eval/accuracy' lies in \[0, 1\], so it never becomes > 1.5",
        ),
        (
            {"eval_dataloader": _loader(), "algorithms": [ThresholdStopper("accuracy", threshold=1.0, comp="gt")]},
            ValueError,
            r"never becomes > 1.0",
        ),
        (
            {"algorithms": [ThresholdStopper("loss", dataloader_label="train", threshold=-0.5)]},
            ValueError,
            r"'loss' lies in \[0, inf\], so it never becomes <= -0.5",
        ),
        (
            {
                "eval_dataloader": Evaluator("held", _loader(), {"mse": torchmetrics.MeanSquaredError()}),
                "algorithms": [ThresholdStopper("mse", dataloader_label="held", threshold=-1.0, comp="lt")],
            },
            ValueError,
            r"'eval/held/mse' lies in \[0, inf\], so it never becomes < -1.0",
        ),
    ],
)
def test_a_bad_argument_is_refused_when_the_trainer_is_built(arguments: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _trainer(**arguments)


def test_a_metric_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(TypeError, match=r"metrics\['accuracy'\] is the class MulticlassAccuracy; pass an instance"):
        Evaluator("held", _loader(), {"accuracy": torchmetrics.classification.MulticlassAccuracy})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"input_key": 5}, r"input_key=5: train_dataloader's first batch has no item 5 \(it holds 2 items\)"),
        ({"target_key": "label"}, r"target_key='label': train_dataloader's first batch has no item 'label'"),
        (
            {"eval_dataloader": [{"x": ROWS[0][:4], "y": ROWS[1][:4]}]},
            r"input_key=None: eval_dataloader's first batch is a mapping with keys \['x', 'y'\], given to the model as "
            r"keyword arguments, but MLP.forward takes no input among them \(it takes \['input'\]\)",
        ),
    ],
)
def test_a_batch_key_the_batches_lack_is_refused_before_the_first_step(arguments: dict[str, Any], message: str) -> None:
    trainer = _trainer(**arguments)
    with pytest.raises(ValueError, match=message):
        trainer.fit()
    assert trainer.timestamp.batch == 0


@pytest.mark.parametrize(
    ("loss_fn", "returned"),
    [(lambda outputs, batch: outputs.sum(1), r"shape \(8,\) \(float32\)"), (lambda outputs, batch: (outputs.sum(), 1), "type tuple")],
)
def test_a_loss_that_is_not_one_number_is_refused_at_the_first_step(loss_fn: Any, returned: str) -> None:
    trainer = _trainer(loss_fn=loss_fn)
    before = {name: p.clone() for name, p in trainer.state.params.items()}
    with pytest.raises(TypeError, match=rf"loss_fn returned {returned}: expected a 0-dim tensor"):
        trainer.fit()
    assert all(torch.equal(before[name], p) for name, p in trainer.state.params.items())


def test_saving_a_checkpoint_onto_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"path='{tmp_path}' is a folder: expected the path of the checkpoint file"):
        _trainer().save_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "algorithm",
    [
        EarlyStopper("throughput/samples_per_second", dataloader_label="train"),  # a monitor that says what it logs
        EarlyStopper("anything", dataloader_label="train"),  # a callback that does not say: not refused
        ThresholdStopper("accuracy", threshold=1.0),  # reachable at equality
    ],
)
def test_a_stopper_watching_what_the_run_may_log_is_accepted(algorithm: Any) -> None:
    from composer_fn.callbacks.base import Callback

    class Unsaid(Callback):
        def log_metrics(self, view: Any) -> dict[str, float]:
            return {"anything": 1.0}

    _trainer(eval_dataloader=_loader(), algorithms=[algorithm], callbacks=[SpeedMonitor(), Unsaid()])


def test_options_that_need_a_weights_only_load_are_refused_with_a_full_resume(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match=r"load_ignore_keys=\['3\.\*'\] applies only with load_weights_only=True \(a full resume"):
        _trainer(load_path=checkpoint, load_ignore_keys=["3.*"])
    with pytest.raises(ValueError, match=r"load_strict_model_weights=False applies only with load_weights_only=True"):
        _trainer(load_path=checkpoint, load_strict_model_weights=False)


def test_an_ignore_pattern_that_matches_no_name_is_refused_naming_the_checkpoints_names(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match=r"load_ignore_keys has the pattern 'head\.\*', which matches no name .*1\.weight"):
        _trainer(load_path=checkpoint, load_weights_only=True, load_ignore_keys=["head.*"])


def test_a_loose_load_that_would_load_no_parameter_is_refused(checkpoint: Path) -> None:
    convolutional = nn.Sequential(nn.Conv1d(6, 2, 1), nn.Flatten())
    images = (torch.zeros(16, 6, 1), ROWS[1])
    with pytest.raises(ValueError, match=r"has no parameter the model has \(checkpoint: 1\.weight.*; model: 0\.weight, 0\.bias\)"):
        _trainer(convolutional, _loader(images), load_path=checkpoint, load_weights_only=True, load_strict_model_weights=False)


def test_autoresume_resumes_the_whole_run_even_with_load_weights_only(tmp_path: Path, checkpoint: Path) -> None:
    # load_weights_only is for the first start from load_path; a restart continues its own run.
    first = _trainer(save_folder=tmp_path, autoresume=True, load_path=checkpoint, load_weights_only=True, max_duration="4ba")
    assert first.timestamp.batch == 0
    first.save_checkpoint(tmp_path / "ep0-ba0.pt")
    first.fit()
    with pytest.warns(UserWarning, match=r"save_folder's newest checkpoint='.*ep2-ba4\.pt' holds a run at batch 4"):
        again = _trainer(save_folder=tmp_path, autoresume=True, load_path=checkpoint, load_weights_only=True, max_duration="4ba")
    assert again.timestamp.batch == 4


# -- unreadable checkpoints -------------------------------------------------------------------------------------


def _unreadable(folder: Path, kind: str, whole: bytes) -> Path:
    contents = {
        "random bytes": np.random.default_rng(0).bytes(4096),
        "text": b"epoch,loss\n1,0.5\n2,0.4\n",
        "empty": b"",
        "truncated": whole[: len(whole) // 2],
    }
    if kind in contents:
        path = folder / f"{kind.replace(' ', '_')}.pt"
        path.write_bytes(contents[kind])
        return path
    path = folder / f"{kind.replace(' ', '_')}.pt"
    torch.save({"a tensor": torch.zeros(2), "format only": {"format": 1}}[kind], path)
    return path


@pytest.mark.parametrize("kind", ["random bytes", "text", "empty", "truncated", "a tensor", "format only"])
def test_every_unreadable_checkpoint_is_one_value_error_naming_the_file(tmp_path: Path, checkpoint: Path, kind: str) -> None:
    path = _unreadable(tmp_path, kind, checkpoint.read_bytes())
    named = rf"='{path}' is not a checkpoint: "
    readers = [
        lambda: _trainer(load_path=path),
        lambda: _trainer(load_path=path, load_weights_only=True),
        lambda: load_model(path, MLP(6, 2)),
        lambda: read_checkpoint(path, "cpu"),
        lambda: checkpoint_metadata(path),
    ]
    for read in readers:
        with pytest.raises(ValueError, match=named):
            read()


def test_an_unreadable_checkpoint_in_the_save_folder_is_named_by_autoresume(tmp_path: Path) -> None:
    (tmp_path / "ep0-ba1.pt").write_bytes(b"not a checkpoint\n")
    with pytest.raises(ValueError, match=r"save_folder's newest checkpoint='.*ep0-ba1\.pt' is not a checkpoint"):
        _trainer(save_folder=tmp_path, autoresume=True)


# -- evaluators checked before the first step -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "reason"),
    [
        (torchmetrics.classification.BinaryAccuracy(), r"Predictions and targets are expected to have the same shape"),
        (torchmetrics.classification.MulticlassAccuracy(num_classes=3), r"should be equal to number of classes"),
        (torchmetrics.MeanSquaredError(), r"Predictions and targets are expected to have the same shape"),
    ],
    ids=["BinaryAccuracy", "MulticlassAccuracy(3)", "MeanSquaredError"],
)
def test_a_metric_that_does_not_fit_the_outputs_is_refused_before_the_first_step(metric: Any, reason: str) -> None:
    trainer = _trainer(MLP(6, 10), _loader(TEN), eval_dataloader=Evaluator("held", _loader(TEN), {"score": metric}))
    before = {name: p.clone() for name, p in trainer.state.params.items()}
    name = type(metric).__name__
    with pytest.raises(ValueError, match=rf"Evaluator\('held'\): metrics\['score'\] \({name}\) cannot measure the model's "
                       rf"outputs of shape \(8, 10\) \(float32\) against targets of shape \(8,\) \(int64\): .*{reason}"):
        trainer.fit()
    assert trainer.timestamp.batch == 0
    assert all(torch.equal(before[name], p) for name, p in trainer.state.params.items())
    assert metric._update_count == 0  # a clone was measured, not the user's metric


def test_checking_an_evaluator_changes_nothing_of_the_run() -> None:
    metric = torchmetrics.classification.MulticlassAccuracy(num_classes=10)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*TEN), batch_size=8, shuffle=True)
    trainer = _trainer(MLP(6, 10), _loader(TEN), eval_dataloader=Evaluator("held", loader, {"accuracy": metric}))
    random_state, params = torch.get_rng_state(), {n: p.clone() for n, p in trainer.state.params.items()}
    trainer._check_evaluators()
    assert torch.equal(torch.get_rng_state(), random_state)
    assert all(torch.equal(params[n], p) for n, p in trainer.state.params.items())
    assert metric._update_count == 0 and trainer.static.module.training


def test_evaluation_labels_outside_the_models_classes_are_refused_before_the_first_step() -> None:
    trainer = _trainer(eval_dataloader=_loader(TEN))
    with pytest.raises(ValueError, match=r"eval_dataloader's first batch's targets \(batch\[1\]\) hold class \d, but the model's outputs have 2 classes"):
        trainer.fit()
    assert trainer.timestamp.batch == 0
    with pytest.raises(ValueError, match=r"eval_dataloader's first batch's targets"):
        trainer.eval()
    with pytest.raises(ValueError, match=r"train_dataloader's first batch's targets \(batch\[1\]\) hold class \d, but"):
        _trainer(loader=_loader(TEN)).fit()


def test_the_default_evaluation_of_a_regression_is_refused_with_what_to_pass_instead() -> None:
    class Regression(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(6, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x).squeeze(-1)

    rows = (ROWS[0], ROWS[0].sum(1))
    trainer = _trainer(Regression(), _loader(rows), eval_dataloader=_loader(rows), loss_fn=lambda y, b: ((y - b[1]) ** 2).mean())
    with pytest.raises(ValueError, match=r"eval_dataloader: the default evaluation .* fails on the model's outputs of shape \(8,\).*pass an Evaluator with metrics"):
        trainer.fit()


# -- predict ----------------------------------------------------------------------------------------------------


def test_predict_refuses_what_is_not_a_loader_of_batches() -> None:
    trainer = _trainer()
    with pytest.raises(TypeError, match=r"dataloader of type str: expected an iterable of batches"):
        trainer.predict("images.npy")
    with pytest.raises(TypeError, match=r"dataloader is a tensor of shape \(4, 6\), whose rows would be taken as batches: pass a list of batches, e\.g\. \[inputs\]"):
        trainer.predict(torch.zeros(4, 6))
    with pytest.raises(TypeError, match=r"predict: dataloader's batch 0 is a str: expected a tensor of inputs"):
        trainer.predict(["images.npy"])


def test_predict_refuses_inputs_unlike_the_training_batches_naming_the_shape() -> None:
    trainer = _trainer()
    trainer.fit()
    with pytest.raises(ValueError, match=r"batch 0 has inputs of shape \(6,\) \(1 dims instead of 2\); the model trained on inputs of shape \(B, 6\).*unsqueeze\(0\)"):
        trainer.predict([torch.zeros(6)])
    with pytest.raises(ValueError, match=r"batch 1 has inputs of shape \(2, 5\) \(5 features instead of 6\)"):
        trainer.predict([torch.zeros(2, 6), torch.zeros(2, 5)])
    assert trainer.predict([torch.zeros(3, 6)])[0].shape == (3, 2)


def test_predict_before_fit_names_what_the_first_layer_takes() -> None:
    from composer_fn.models import SmallCNN

    with pytest.raises(ValueError, match=r"the model fails on predict's dataloader batch 0 \(inputs of shape \(2, 5\).*Linear, takes 6 features once flattened"):
        _trainer().predict([torch.zeros(2, 5)])
    images = (torch.zeros(8, 1, 8, 8), torch.zeros(8, dtype=torch.long))
    cnn = _trainer(SmallCNN(1, 10, width=4), _loader(images))
    with pytest.raises(ValueError, match=r"inputs of shape \(2, 3, 8, 8\).*Conv2d, takes 1 channels: inputs of shape \(B, 1, \.\.\., \.\.\.\)"):
        cnn.predict([torch.zeros(2, 3, 8, 8)])


def test_predict_takes_input_tensors_alone_with_a_named_input_key() -> None:
    batches = [{"x": ROWS[0][:8], "y": ROWS[1][:8]}]
    trainer = _trainer(loader=batches, input_key="x", target_key="y", max_duration="1ba")
    assert trainer.predict([ROWS[0][:3]])[0].shape == (3, 2)


# -- settings that make something do nothing --------------------------------------------------------------------


def test_a_nan_monitor_whose_interval_the_run_never_reaches_warns_once() -> None:
    trainer = _trainer(callbacks=[NaNMonitor(interval=10)])
    with pytest.warns(UserWarning, match=r"NaNMonitor\(interval=10\) .* trains steps 1 to 2 \(a run of 2 steps\): it never checks") as caught:
        trainer.fit()
    assert sum("NaNMonitor" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(callbacks=[NaNMonitor(interval=2)]).fit()


def test_a_runtime_estimator_that_skips_the_whole_run_warns() -> None:
    with pytest.warns(UserWarning, match=r"RuntimeEstimator\(skip_batches=5\) skips at least the 2 batches"):
        _trainer(callbacks=[RuntimeEstimator(skip_batches=5)]).fit()


def test_an_algorithm_that_changes_nothing_is_named_in_no_effect() -> None:
    from composer_fn.algorithms import LowPrecisionLayerNorm, MixUp

    with pytest.warns(UserWarning, match="LowPrecisionLayerNorm found no torch.nn.LayerNorm .*in MLP, so it changes nothing"):
        trainer = _trainer(algorithms=[LowPrecisionLayerNorm(), MixUp()])
    assert trainer.no_effect == ("low_precision_layernorm",)
    with pytest.warns(UserWarning, match=r"MixUp\(alpha=0\) changes nothing"):
        inert = MixUp(alpha=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, at construction
        assert _trainer(algorithms=[inert]).no_effect == ("mixup",)


def test_emas_default_half_life_on_a_short_run_is_named_before_the_first_step_with_one_that_acts() -> None:
    # 20 steps: the default half-life of 1000 batches leaves the first weights 99% of the average at the end.
    with pytest.warns(UnfitForTheRun, match=r"EMA\(half_life='1000ba'\) averages over 20 steps .* still hold 99% .*half_life='2ba'"):
        trainer = _trainer(algorithms=[EMA()], max_duration="20ba")
    assert trainer.state.step == 0  # said when the Trainer is built
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(algorithms=[EMA(half_life="2ba")], max_duration="20ba")  # the value the message names
        _trainer(algorithms=[EMA(half_life="5ba")], max_duration="20ba")  # a quarter of the run
        _trainer(algorithms=[EMA(half_life="1000ba")], max_duration="8000ba")
    # In epochs, and from a later start: the span is what is left after ema_start.
    with pytest.warns(UnfitForTheRun, match=r"EMA\(half_life='1ep'\) averages over 4 steps .* 25% .*half_life='1ba' leaves them 6.2%"):
        _trainer(algorithms=[EMA(half_life="1ep", ema_start="0.5dur")], max_duration="4ep")
    with pytest.warns(UnfitForTheRun, match=r"EMA\(smoothing=0.999\)"):
        _trainer(algorithms=[EMA(half_life=None, smoothing=0.999)], max_duration="20ba")
    with pytest.warns(ChangesNothing, match=r"EMA\(ema_start='30ba'\) starts at step 30, and the whole run is 20: it never"):
        trainer = _trainer(algorithms=[EMA(ema_start="30ba")], max_duration="20ba")
    assert trainer.no_effect == ("ema",)


def test_a_threshold_only_a_perfect_score_reaches_is_named_with_one_inside_the_range() -> None:
    evaluation = {"eval_dataloader": _loader(), "max_duration": "4ba"}
    with pytest.warns(UnfitForTheRun, match=r"ThresholdStopper\(threshold=1.0\): 'eval/eval/accuracy' reaches 1 only at .*threshold=0.99\)"):
        _trainer(algorithms=[ThresholdStopper()], **evaluation)
    with pytest.warns(UnfitForTheRun, match=r"'loss' reaches 0 only at its bound .* a threshold above 0, the value aimed for"):
        _trainer(algorithms=[ThresholdStopper("loss", dataloader_label="train", threshold=0.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(algorithms=[ThresholdStopper(threshold=0.99)], **evaluation)


@pytest.mark.parametrize(
    "schedule",
    [
        optim.LinearWithWarmupScheduler(t_warmup="30ba", t_max="100ba"),
        optim.MultiStepWithWarmupScheduler(t_warmup="2ep", milestones=["1ep"]),
    ],
    ids=["linear", "multistep"],
)
def test_a_warm_up_longer_than_the_run_is_named_with_one_that_ends_inside_it(schedule: Any) -> None:
    with pytest.warns(UnfitForTheRun, match=r"WithWarmupScheduler\(t_warmup='(30ba|2ep)'\) warms up over (30|4) steps, and the whole run is 2: .*t_warmup='0.1dur'"):
        _trainer(schedule=schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(schedule=optim.LinearWithWarmupScheduler(t_warmup="0.1dur"), max_duration="20ba")


@pytest.mark.parametrize(
    ("algorithm", "name", "message"),
    [
        (EarlyStopper("loss", dataloader_label="train", patience="5ba"), "early_stopper", "can never stop this run"),
        (SWA(swa_start="2ep", swa_end="4ep"), "swa", "takes in no weights"),
        (LayerFreezing(freeze_start=0.9), "layer_freezing", "freezes no layer"),
    ],
    ids=["stopper", "swa", "layer_freezing"],
)
def test_an_algorithm_that_cannot_act_in_a_run_this_short_is_named_in_no_effect(
    algorithm: Algorithm, name: str, message: str
) -> None:
    acting = ThresholdStopper("loss", dataloader_label="train", threshold=0.0)
    with pytest.warns(ChangesNothing, match=message):
        trainer = _trainer(algorithms=[acting, algorithm])
    assert trainer.no_effect == (name,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _trainer(algorithms=[acting, algorithm], max_duration="40ba").no_effect == ()


@dataclass(frozen=True)
class Watchful(Algorithm):
    """Warns at INIT and at the run's first batch: ``ChangesNothing`` when ``told``, else a ``UserWarning`` whose
    words say it changes nothing."""

    told: bool = True

    def host_hooks(self) -> dict[Event, HostHook]:
        return {Event.INIT: self._look, Event.BATCH_START: self._look}

    def _look(self, static: Any, state: Any, timestamp: Any, meta: Any) -> tuple[Any, Any]:
        if timestamp.batch == 0:
            where = "INIT" if meta is None else "the first batch"
            warning = (
                ChangesNothing(f"Watchful found its work done at {where}", "Watchful")
                if self.told
                else UserWarning(f"Watchful changes nothing at {where}")
            )
            warnings.warn(warning, stacklevel=2)
        return static, state


def test_no_effect_reads_the_warning_category_not_its_words() -> None:
    with pytest.warns(ChangesNothing, match="Watchful found its work done at INIT"):
        told = _trainer(algorithms=[Watchful()])
    assert told.no_effect == ("watchful",)
    with pytest.warns(ChangesNothing, match="Watchful found its work done at the first batch"):
        told.fit()
    assert told.no_effect == ("watchful",)
    with pytest.warns(UserWarning, match="Watchful changes nothing at INIT"):
        worded = _trainer(algorithms=[Watchful(told=False)])
    assert worded.no_effect == ()
    with pytest.warns(UserWarning, match="Watchful changes nothing at the first batch"):
        worded.fit()
    assert worded.no_effect == ()


def test_no_effect_names_what_a_host_hook_finds_at_the_first_batch() -> None:
    with pytest.warns(ChangesNothing, match=r"GhostBatchNorm\(ghost_batch_size=8\) changes nothing on batches of 8"):
        trainer = _trainer(_batch_normed(), algorithms=[GhostBatchNorm(8)])
        assert trainer.no_effect == ()
        trainer.fit()
    assert trainer.no_effect == ("ghost_batchnorm",)


def _batch_normed() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_an_optimizer_chained_after_clipping_keeps_its_rate_for_monitors_and_its_in_place_step() -> None:
    from composer_fn.callbacks import LRMonitor
    from composer_fn.loggers import InMemoryLogger

    chained = optim.chain(optim.clip_by_global_norm(0.5), optim.sgd(0.1, momentum=0.9))
    assert chained.fused is not None and chained.learning_rate == 0.1
    steps: list[float] = []

    def counted(params: Any, grads: Any, state: Any, scale: float) -> Any:
        steps.append(scale)
        return chained.fused(params, grads, state, scale)  # type: ignore[misc]

    memory = InMemoryLogger()
    in_place = _trainer(
        optimizer=chained._replace(fused=counted), max_duration="4ba", callbacks=[LRMonitor()], loggers=[memory],
        log_interval="1ba",
    )
    in_place.fit()
    assert steps == [1.0] * 4
    assert [r["lr"] for r in memory.records if r["kind"] == "train"] == [pytest.approx(0.1)] * 4
    functional = _trainer(optimizer=chained._replace(fused=None), max_duration="4ba")
    functional.fit()
    for name, tensor in functional.state.params.items():
        torch.testing.assert_close(in_place.state.params[name], tensor, rtol=1e-6, atol=1e-7)
        assert not torch.equal(tensor, MLP(6, 2).state_dict()[name])


def test_a_model_that_cannot_take_the_training_batch_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"the model fails on train_dataloader's first batch \(inputs of shape \(1, 6\).*Linear, takes 5 features once flattened"):
        _trainer(MLP(5, 2)).fit()


@pytest.mark.parametrize("algorithms", [[], [EMA(half_life="1ba")]], ids=["run-of-steps", "step-by-step"])
def test_a_loss_that_is_not_finite_stops_the_run_naming_its_first_step_before_any_checkpoint_of_it(
    tmp_path: Path, algorithms: list[Any]
) -> None:
    # Rows 24.. hold an infinity: batches of 8, so step 4 (of 6) is the first to read one; checked only at the end.
    images, labels = R.normal(R.key(4), (48, 6)), R.randint(R.key(5), 0, 2, (48,))
    images[24:, 0] = float("inf")
    loader = TensorLoader((images, labels), 8, shuffle=False)
    with pytest.raises(FloatingPointError, match=r"^step 4: the loss is NaN or infinite \(found before the log at step 6\)"):
        _trainer(loader=loader, max_duration="6ba", algorithms=algorithms, log_interval="10ba").fit()
    # With checkpoints every 2 steps: found before the one at step 4, which is never written.
    folder = tmp_path / "run"
    with pytest.raises(FloatingPointError, match=r"^step 4: .* \(found before the checkpoint at step 4\)"):
        _trainer(loader=loader, max_duration="6ba", algorithms=algorithms, save_folder=str(folder), save_interval="2ba").fit()
    assert sorted(path.name for path in folder.glob("*.pt")) == ["ep0-ba2.pt", "latest.pt"]
    # All NaN: the first step, at its log step.
    nan = TensorLoader((torch.full((16, 6), float("nan")), labels[:16]), 8, shuffle=False)
    with pytest.raises(FloatingPointError, match=r"^step 1: .* \(found before the log at step 1\)"):
        _trainer(loader=nan, max_duration="2ba", algorithms=algorithms, log_interval="1ba").fit()
    # Finite inputs train as before.
    _trainer(loader=TensorLoader((images[:24], labels[:24]), 8, shuffle=False), max_duration="6ba", algorithms=algorithms).fit()


def test_the_loss_watch_folds_long_runs_and_names_the_first_bad_step() -> None:
    from composer_fn.trainer.finite import LossWatch

    watch = LossWatch()
    for step in range(1, 1001):
        watch.add(step, torch.tensor(float("nan") if step in (700, 900) else 1.0))
    assert watch.first_bad() == 700
    clean = LossWatch()
    for step in range(1, 600):
        clean.add(step, torch.tensor(0.5))
    assert clean.first_bad() is None


def _good_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return R.normal(R.key(seed), (8, 6)), R.randint(R.key(seed + 1), 0, 2, (8,))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ((R.normal(R.key(9), (8, 6)), torch.tensor([0, 1, 5, 0, 1, 0, 1, 0])), r"the batch's targets \(batch\[1\]\) hold class 5, but the model's outputs have 2 classes"),
        ((R.normal(R.key(9), (8, 6)), torch.zeros(8, dtype=torch.int32)), r"item 1 is torch.int32, and the first batch's was torch.int64"),
        ((R.normal(R.key(9), (8, 6)), torch.zeros(8, 1, dtype=torch.int64)), r"item 1 has shape \[B, 1\], and the first batch's had \[B\]"),
        ((R.normal(R.key(9), (8, 6)), torch.zeros(6, dtype=torch.int64)), r"different numbers of samples \(item 0 8, item 1 6\)"),
        ((R.normal(R.key(9), (8, 7)), torch.zeros(8, dtype=torch.int64)), r"item 0 has shape \[B, 7\], and the first batch's had \[B, 6\]"),
        ([R.normal(R.key(9), (8, 6))], r"it is a list of items \[0\], and the first batch was a tuple of items \[0, 1\]"),
    ],
    ids=["class", "int32", "column", "lengths", "width", "items"],
)
@pytest.mark.parametrize("algorithms", [[], [EMA(half_life="1ba")]], ids=["run-of-steps", "step-by-step"])
def test_a_later_batch_that_breaks_the_step_is_named_with_its_item_and_what_was_expected(
    bad: Any, message: str, algorithms: list[Any]
) -> None:
    batches = [_good_batch(0), _good_batch(2), bad, _good_batch(4)]
    with pytest.raises(ValueError, match=rf"^the train batch of step 3 \(epoch 0\): .*{message}") as raised:
        _trainer(loader=batches, max_duration="4ba", algorithms=algorithms).fit()
    assert raised.value.__cause__ is not None  # torch's own error, kept as the cause


class _OutputsGoWrong(nn.Module):
    """MLP(6, 2) whose outputs go wrong (as ``wrong`` says) on a batch whose first input is over 100."""

    def __init__(self, wrong: str) -> None:
        super().__init__()
        self.mlp, self.wrong = MLP(6, 2), wrong

    def forward(self, x: torch.Tensor) -> Any:
        logits = self.mlp(x)
        if float(x[0, 0]) <= 100:
            return logits
        return {"short": logits[:-1], "dict": {"scores": logits}, "none": None, "flat": logits.reshape(-1)}[self.wrong]


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        ("short", r"the model's logits on it have shape \[7, 2\] \(torch.float32\), for targets \(item 1\) of shape \[8\] .*: expected one row of logits per sample \(8\)"),
        ("dict", r"the model returned a dict of keys \['scores'\] on it, holding neither 'loss' nor 'logits'"),
        ("none", r"the model returned None on it: expected a logits tensor, or a mapping or record holding 'logits'"),
        ("flat", r"the model's logits on it have shape \[16\] .*expected one row of logits per sample \(8\)"),
    ],
)
@pytest.mark.parametrize("algorithms", [[], [EMA(half_life="1ba")]], ids=["run-of-steps", "step-by-step"])
def test_model_outputs_that_go_wrong_on_a_later_batch_are_named_with_what_the_loss_takes(
    wrong: str, message: str, algorithms: list[Any]
) -> None:
    marked = _good_batch(6)
    marked[0][0, 0] = 1000.0
    batches = [_good_batch(0), _good_batch(2), marked, _good_batch(4)]
    with pytest.raises(ValueError, match=rf"^the train batch of step 3 \(epoch 0\): {message}") as raised:
        _trainer(_OutputsGoWrong(wrong), loader=batches, max_duration="4ba", algorithms=algorithms).fit()
    assert raised.value.__cause__ is not None
    # The same batches with outputs that stay right train through.
    _trainer(_OutputsGoWrong(wrong), loader=batches[:2] + batches[3:], max_duration="3ba", algorithms=algorithms).fit()


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (torch.zeros(8, dtype=torch.int32), r"item 1 \(the targets\) is torch.int32: the default loss takes int64 class indices"),
        (torch.zeros(8), r"item 1 \(the targets\) is torch.float32 of shape \[8\]: the default loss takes class indices"),
        (torch.zeros(8, 1, dtype=torch.int64), r"item 1 \(the targets\) has shape \[8, 1\]: expected \[B\] class indices"),
    ],
    ids=["int32", "float", "column"],
)
def test_first_batch_targets_the_default_loss_cannot_take_are_named(labels: torch.Tensor, message: str) -> None:
    batches = [(R.normal(R.key(9), (8, 6)), labels)] * 2
    with pytest.raises(ValueError, match=rf"^the train batch of step 1 \(epoch 0\): {message}"):
        _trainer(loader=batches, max_duration="2ba").fit()


@pytest.mark.parametrize("algorithms", [[], [EMA(half_life="1ba")]], ids=["run-of-steps", "step-by-step"])
def test_fit_with_a_duration_trains_further_as_the_one_longer_run_does(algorithms: list[Any]) -> None:
    # 16 rows in batches of 8: 2 steps an epoch. 4 steps, then 4 more, against 8 steps in one fit.
    whole = _trainer(max_duration="8ba", algorithms=algorithms, eval_dataloader=_loader())
    whole.fit()
    split = _trainer(max_duration="4ba", algorithms=algorithms, eval_dataloader=_loader())
    first = split.fit()
    before = {name: value.clone() for name, value in split.state.params.items()}
    with pytest.warns(UserWarning, match=r"fit\(\): the run has trained its whole length \(4 steps\), so nothing more was trained"):
        assert split.fit() == first
    assert all(torch.equal(split.state.params[name], value) for name, value in before.items())
    again = split.fit(duration="2ep")
    assert split.timestamp.batch == 8 and split.max_steps == 8
    for name, value in whole.state.params.items():
        assert torch.equal(split.state.params[name], value), name
    assert again["eval/eval/loss"] == whole.metrics["eval/eval/loss"] != first["eval/eval/loss"]
    with pytest.raises(ValueError, match="duration="):
        split.fit(duration="0ba")
