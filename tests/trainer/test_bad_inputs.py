"""Inputs a new user gets wrong: each is refused (or, when it would do nothing, warned about) before any data is
touched, naming the argument, the value and what to pass instead."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn import MixUp, Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.models.lm import CausalLM

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))


def _trainer(**options) -> Trainer:
    arguments = {
        "max_duration": "1ep",
        "optimizer": optim.sgd(0.1),
        "progress_bar": False,
        **options,
    }
    return Trainer(arguments.pop("model", MLP(6, 2)), arguments.pop("loader", TensorLoader(DATA, batch_size=8)), **arguments)


@pytest.mark.parametrize("given_optimizer", ["instance", "class"])
def test_a_torch_optimizer_is_refused_with_what_to_pass_instead(given_optimizer: str) -> None:
    model = MLP(6, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if given_optimizer == "instance" else torch.optim.SGD
    with pytest.raises(TypeError, match=r"optimizer=SGD is a torch\.optim optimizer.*composer_fn\.optim\.sgd"):
        _trainer(model=model, optimizer=optimizer)


def test_an_optimizer_that_is_not_a_gradient_transformation_is_refused() -> None:
    with pytest.raises(TypeError, match="optimizer=0.1: expected a gradient transformation"):
        _trainer(optimizer=0.1)


def test_one_algorithm_instead_of_a_list_is_refused() -> None:
    with pytest.raises(TypeError, match=r"is one algorithm; pass a sequence of them: \[MixUp\("):
        _trainer(algorithms=MixUp())


def test_an_algorithm_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(TypeError, match=r"algorithms\[0\] is the class MixUp; pass an instance: MixUp\(\)"):
        _trainer(algorithms=[MixUp])


def test_something_that_is_not_an_algorithm_is_refused_by_position() -> None:
    with pytest.raises(TypeError, match=r"algorithms\[1\]='mixup': expected an algorithm record"):
        _trainer(algorithms=[MixUp(), "mixup"])


def test_a_model_without_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match="model=Flatten has no parameters to train"):
        _trainer(model=torch.nn.Flatten())


def test_a_one_shot_evaluation_iterator_is_refused() -> None:
    with pytest.raises(TypeError, match="eval_dataloader is a one-shot iterator"):
        _trainer(eval_dataloader=iter([DATA]))


class Lying:
    """A loader of ``yielded`` batches of 8 that claims ``claimed`` batches."""

    def __init__(self, yielded: int, claimed: int) -> None:
        self.yielded, self.claimed = yielded, claimed

    def __len__(self) -> int:
        return self.claimed

    def __iter__(self):
        return iter([(DATA[0][:8], DATA[1][:8])] * self.yielded)


@settings(max_examples=12, deadline=None)
@given(claimed=st.integers(1, 4), off_by=st.integers(-3, 3).filter(lambda d: d != 0))
def test_a_loader_whose_length_lies_is_refused_in_its_first_epoch(claimed: int, off_by: int) -> None:
    yielded = max(claimed + off_by, 0)
    trainer = _trainer(loader=Lying(yielded, claimed), max_duration="3ep")
    words = "more than its length" if yielded > claimed else ("no batch" if yielded == 0 else "only")
    with pytest.raises(ValueError, match=f"yielded {words}.*epoch 0"):
        trainer.fit()
    assert trainer.timestamp.epoch == 0


def test_resuming_a_run_that_is_already_over_warns_that_nothing_will_train(tmp_path: Path) -> None:
    finished = _trainer(max_duration="2ep")
    finished.fit()
    path = finished.save_checkpoint(tmp_path / "done.pt")
    with pytest.warns(UserWarning, match=r"holds a run at batch 8, which max_duration=1ep \(4 batches\)"):
        resumed = _trainer(load_path=path)
    assert resumed.fit()["wall_time"] >= 0 and resumed.timestamp.batch == 8


def test_an_empty_checkpoint_is_refused_naming_its_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=f"load_path='{empty}' is not a checkpoint: it is an empty file"):
        _trainer(load_path=empty)


@given(fraction=st.floats(0.05, 0.95))
@settings(max_examples=5, deadline=None)
def test_a_truncated_checkpoint_is_refused_naming_its_path_without_unsafe_advice(tmp_path_factory, fraction) -> None:
    folder = tmp_path_factory.mktemp("truncated")
    whole = _trainer().save_checkpoint(folder / "whole.pt").read_bytes()
    cut = folder / "cut.pt"
    cut.write_bytes(whole[: int(len(whole) * fraction)])
    with pytest.raises(ValueError, match=f"load_path='{cut}' is not a checkpoint: it cannot be read") as refused:
        _trainer(load_path=cut)
    assert "weights_only" not in str(refused.value)


def test_a_causal_lm_trains_with_the_default_loss() -> None:
    # The logits are class-last ([B, S, V] against [B, S] targets), as evaluation already reads them.
    rows = R.randint(R.key(0), 0, 16, (32, 9))
    data = (rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
    model = CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    trainer = Trainer(
        model,
        TensorLoader(data, batch_size=16, seed=0),
        TensorLoader(data, batch_size=32, shuffle=False),
        max_duration="2ba",
        optimizer=optim.adamw(1e-2),
        progress_bar=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = trainer.fit()
    assert torch.isfinite(torch.tensor(metrics["loss"])) and 0.0 <= metrics["eval/eval/accuracy"] <= 1.0


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"loss_fn": 1}, TypeError, r"loss_fn=1: expected a function"),
        ({"per_sample_loss_fn": "mean"}, TypeError, r"per_sample_loss_fn='mean': expected a function"),
        ({"callbacks": [1]}, TypeError, r"callbacks\[0\]=1: expected a Callback instance"),
        ({"loggers": [object]}, TypeError, r"loggers\[0\]=<class 'object'>: expected a Logger instance"),
        ({"grad_mode": "reverse"}, ValueError, r"grad_mode='reverse' must be one of 'autograd', 'func'"),
        ({"compile": "fastest"}, ValueError, r"compile='fastest' is not a torch.compile backend"),
        ({"device": "gpu"}, ValueError, r"device='gpu' is not a device"),
    ],
)
def test_arguments_of_the_wrong_kind_are_refused_when_the_trainer_is_built(options, error, message) -> None:
    with pytest.raises(error, match=message):
        _trainer(**options)


def test_a_save_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    taken = tmp_path / "runs"
    taken.write_text("")
    with pytest.raises(ValueError, match=f"save_folder='{taken}' is a file"):
        _trainer(save_folder=taken)


@pytest.mark.parametrize("duration", ["10", -1, 1.5, "5sp", "0ep", "0.5dur", True])
def test_a_run_length_that_is_not_epochs_or_batches_is_refused_naming_it(duration) -> None:
    with pytest.raises(ValueError, match=rf"max_duration={duration!r} must be a (time string in ep, ba|positive amount of epochs or batches)"):
        _trainer(max_duration=duration)


@pytest.mark.parametrize("interval", ["x", "0ba", "3sp", 2.5])
def test_an_interval_that_is_not_epochs_or_batches_is_refused_naming_it(interval) -> None:
    with pytest.raises(ValueError, match=rf"eval_interval={interval!r} must be a (time string in ep, ba|positive amount of epochs or batches)"):
        _trainer(eval_dataloader=[DATA], eval_interval=interval)


def test_a_learning_rate_given_as_the_schedule_is_refused() -> None:
    with pytest.raises(TypeError, match=r"schedule=0.1: expected a schedule such as"):
        _trainer(schedule=0.1)


def test_a_loader_of_bare_tensors_is_refused_instead_of_reading_rows_as_items() -> None:
    with pytest.raises(TypeError, match="train_dataloader is a list of 4 tensors, so each tensor would be a batch"):
        _trainer(loader=[DATA[0][:8]] * 4)

    class Inputs:
        def __iter__(self):
            return iter([DATA[0][:8]] * 4)

        def __len__(self) -> int:
            return 4

    trainer = _trainer(loader=Inputs())
    with pytest.raises(TypeError, match="train_dataloader yields Tensor batches; expected tuples"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def test_an_evaluation_loader_without_batches_is_refused_instead_of_giving_nan() -> None:
    with pytest.raises(ValueError, match="eval_dataloader is empty: an evaluation needs at least one batch"):
        _trainer(eval_dataloader=[])


def test_label_smoothing_trains_a_causal_lm_with_its_own_loss() -> None:
    from composer_fn import LabelSmoothing
    from composer_fn.models.lm import causal_lm_loss

    rows = R.randint(R.key(1), 0, 16, (32, 9))
    data = (rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
    trainer = Trainer(
        CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8),
        TensorLoader(data, batch_size=16, seed=0),
        max_duration="2ba",
        optimizer=optim.adamw(1e-2),
        algorithms=[LabelSmoothing(0.1)],
        loss_fn=causal_lm_loss(),
        progress_bar=False,
    )
    assert torch.isfinite(torch.tensor(trainer.fit()["loss"]))


def test_a_save_folder_that_cannot_be_created_is_refused_before_training(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ValueError, match=f"save_folder='{blocked / 'runs'}' cannot be created"):
        _trainer(save_folder=blocked / "runs")


@pytest.mark.parametrize(
    ("labels", "classes", "named"),
    [
        (R.randint(R.key(2), 0, 3, (32,)).index_fill(0, torch.tensor([5]), 7), 3, "class 7"),
        (R.randint(R.key(3), 0, 3, (32,)).index_fill(0, torch.tensor([9]), -2), 3, "class -2"),
    ],
)
def test_class_targets_the_model_has_no_output_for_are_refused_naming_the_count(labels, classes, named) -> None:
    # The first batch is checked before any step: the parameters stay as they were.
    inputs = DATA[0]
    trainer = _trainer(model=MLP(6, classes), loader=TensorLoader((inputs, labels), batch_size=32, shuffle=False))
    before = {name: p.clone() for name, p in trainer.state.params.items()}
    with pytest.raises(ValueError, match=rf"batch\[1\]\) hold {named}, but the model's outputs have {classes} classes"):
        trainer.fit()
    assert all(torch.equal(p, before[name]) for name, p in trainer.state.params.items())


def test_sequence_targets_are_checked_against_the_vocabulary_and_minus_100_is_a_missing_label() -> None:
    rows = R.randint(R.key(0), 0, 16, (8, 9))
    targets = rows[:, 1:].contiguous().index_fill(1, torch.tensor([0]), -100)
    model = CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    loader = TensorLoader((rows[:, :-1].contiguous(), targets), batch_size=8)
    trainer = Trainer(model, loader, max_duration="1ba", optimizer=optim.adamw(1e-2), progress_bar=False)
    assert math.isfinite(trainer.fit()["loss"])
    too_large = TensorLoader((rows[:, :-1].contiguous(), targets.index_fill(1, torch.tensor([3]), 16)), batch_size=8)
    trainer = Trainer(model, too_large, max_duration="1ba", optimizer=optim.adamw(1e-2), progress_bar=False)
    with pytest.raises(ValueError, match="hold class 16, but the model's outputs have 16 classes"):
        trainer.fit()
