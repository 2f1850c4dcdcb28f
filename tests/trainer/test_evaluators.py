"""Named evaluators: each is logged as eval/<label>/<metric>, torchmetrics metrics equal their own computation
on the same outputs, a regression model can be evaluated, and a bad evaluator is refused naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.func import functional_call
from torchmetrics import MeanSquaredError
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from composer_fn import Evaluator, Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.loggers import InMemoryLogger
from composer_fn.models import MLP

DATA = (R.normal(R.key(0), (64, 6)), R.randint(R.key(1), 0, 3, (64,)))
HELD_OUT = (R.normal(R.key(2), (40, 6)), R.randint(R.key(3), 0, 3, (40,)))


def _trainer(eval_dataloader: Any, **arguments: Any) -> Trainer:
    return Trainer(
        MLP(6, 3),
        TensorLoader(DATA, batch_size=8),
        eval_dataloader,
        optimizer=optim.sgd(0.1),
        progress_bar=False,
        **{"max_duration": "2ep", **arguments},
    )


def test_named_evaluators_are_logged_under_their_labels_and_equal_the_metric_on_the_outputs() -> None:
    memory = InMemoryLogger()
    f1 = MulticlassF1Score(num_classes=3, average="macro")
    trainer = _trainer(
        [
            Evaluator("val", TensorLoader(HELD_OUT, 16, shuffle=False), {"f1": f1, "acc": MulticlassAccuracy(3)}),
            Evaluator("first", TensorLoader(HELD_OUT, 16, shuffle=False), subset_num_batches=1),
        ],
        loggers=[memory],
    )
    metrics = trainer.fit()
    records = [r for r in memory.records if r["kind"] == "eval"]
    assert len(records) == 2
    assert set(records[-1]) >= {"eval/val/f1", "eval/val/acc", "eval/first/accuracy", "eval/first/loss"}
    # The reference: the metric computed afresh on the model's outputs at the end.
    model = trainer.static.module.eval()
    outputs = functional_call(model, ({**trainer.state.params, **trainer.state.buffers},), (HELD_OUT[0],))
    reference = MulticlassF1Score(num_classes=3, average="macro")(outputs, HELD_OUT[1])
    assert metrics["eval/val/f1"] == pytest.approx(float(reference), abs=1e-6)
    # The first evaluator saw only its first batch of 16: its accuracy is that batch's.
    first = (outputs[:16].argmax(1) == HELD_OUT[1][:16]).float().mean()
    assert metrics["eval/first/accuracy"] == pytest.approx(float(first), abs=1e-6)
    assert trainer.eval() == {k: v for k, v in metrics.items() if k.startswith("eval/")}


def test_a_regression_model_is_evaluated_with_its_own_metric() -> None:
    targets = (HELD_OUT[0] ** 2).sum(1, keepdim=True)
    trainer = Trainer(
        MLP(6, 1),
        TensorLoader((DATA[0], (DATA[0] ** 2).sum(1, keepdim=True)), batch_size=8),
        Evaluator("val", TensorLoader((HELD_OUT[0], targets), 16, shuffle=False), {"mse": MeanSquaredError()}),
        max_duration="3ep",
        optimizer=optim.sgd(0.01),
        loss_fn=lambda outputs, batch: torch.nn.functional.mse_loss(outputs, batch[1]),
        progress_bar=False,
    )
    metrics = trainer.fit()
    model = trainer.static.module.eval()
    outputs = functional_call(model, ({**trainer.state.params, **trainer.state.buffers},), (HELD_OUT[0],))
    assert metrics["eval/val/mse"] == pytest.approx(float(((outputs - targets) ** 2).mean()), rel=1e-5)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: Evaluator("", [1]), ValueError, "label=''"),
        (lambda: Evaluator("a/b", [1]), ValueError, "label='a/b'"),
        (lambda: Evaluator("val", iter([1])), TypeError, "dataloader of type list_iterator"),
        (lambda: Evaluator("val", [1], {"f1": 3}), TypeError, r"metrics\['f1'\] of type int: expected a torchmetrics.Metric"),
        (lambda: Evaluator("val", [1], {"a/b": MeanSquaredError()}), ValueError, "metrics has the name 'a/b'"),
        (lambda: Evaluator("val", [1], subset_num_batches=0), ValueError, "subset_num_batches=0"),
        (
            lambda: _trainer([Evaluator("val", [1]), Evaluator("val", [2])]),
            ValueError,
            "names the evaluator label 'val' twice",
        ),
    ],
)
def test_a_bad_evaluator_is_refused_naming_what_is_wrong(build: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_a_per_class_metric_asks_for_an_average() -> None:
    trainer = _trainer(Evaluator("val", TensorLoader(HELD_OUT, 16), {"f1": MulticlassF1Score(3, average=None)}))
    with pytest.raises(ValueError, match=r"metrics\['f1'\] \(MulticlassF1Score\) computes shape \(3,\) .*: expected one number"):
        trainer.fit()
    assert trainer.timestamp.batch == 0  # refused before the first step


def test_an_evaluator_with_its_own_interval_runs_at_every_such_evaluation_and_at_the_end() -> None:
    memory = InMemoryLogger()
    loader = TensorLoader(HELD_OUT, 16, shuffle=False)
    trainer = _trainer(
        [Evaluator("often", loader), Evaluator("rare", loader, eval_interval="3ba")],
        eval_interval="1ba",
        max_duration="10ba",
        loggers=[memory],
    )
    trainer.fit()
    records = [r for r in memory.records if r["kind"] == "eval"]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert [r["step"] for r in records if "eval/rare/accuracy" in r] == [3, 6, 9, 10]
    with pytest.raises(ValueError, match=r"Evaluator\('rare'\).eval_interval='1ep': expected a multiple"):
        _trainer([Evaluator("rare", loader, eval_interval="1ep")], eval_interval="2ba")
