"""EarlyStopper and ThresholdStopper: a run ends at the check the rule names, a resumed run where the
uninterrupted one did, and a bad argument or an unlogged metric is refused naming it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.algorithms import EarlyStopper, ThresholdStopper
from composer_fn.algorithms.stopping import StopperState
from composer_fn.core.time import Timestamp
from composer_fn.data import TensorLoader
from composer_fn.loggers import InMemoryLogger
from composer_fn.models import MLP

DATA = (R.normal(R.key(0), (96, 6)), R.randint(R.key(1), 0, 3, (96,)))
HELD_OUT = (R.normal(R.key(2), (48, 6)), R.randint(R.key(3), 0, 3, (48,)))


def _run(*algorithms: Any, max_duration: str = "30ba", **arguments: Any) -> tuple[Trainer, list[dict[str, Any]]]:
    memory = InMemoryLogger()
    options: dict[str, Any] = {
        "eval_dataloader": TensorLoader(HELD_OUT, batch_size=16, shuffle=False),
        "eval_interval": "2ba",
        "log_interval": "1ba",
        **arguments,
    }
    trainer = Trainer(
        MLP(6, 3, hidden=(32,)),
        TensorLoader(DATA, batch_size=8, seed=4),
        max_duration=max_duration,
        optimizer=optim.sgd(0.5, momentum=0.9),
        algorithms=list(algorithms),
        loggers=[memory],
        progress_bar=False,
        **options,
    )
    trainer.fit()
    return trainer, memory.records


def _reference_early_stop(values: list[float], patience: int, min_delta: float, lower: bool) -> int | None:
    # The index of the check at which ``patience`` checks in a row failed to beat the best by more than min_delta.
    best, waited = math.nan, 0
    for index, value in enumerate(values):
        improved = math.isfinite(value) and (
            math.isnan(best) or (value + min_delta < best if lower else value - min_delta > best)
        )
        best, waited = (value, 0) if improved else (best, waited + 1)
        if waited >= patience:
            return index
    return None


def test_early_stopping_ends_the_run_at_the_evaluation_the_rule_names() -> None:
    _, full = _run(max_duration="60ba")
    losses = [r["eval/eval/loss"] for r in full if r["kind"] == "eval"]
    stop = _reference_early_stop(losses, 2, 0.0, lower=True)
    assert stop is not None, "the held-out loss must stop improving within the run for this test to mean anything"
    trainer, records = _run(EarlyStopper("loss", patience=2), max_duration="60ba")
    assert trainer.timestamp.batch == 2 * (stop + 1)
    assert [r for r in records if r["kind"] == "stop"] == [{"kind": "stop", "step": 2 * (stop + 1), "by": "early_stopper"}]
    # What was trained until then is the unstopped run's.
    assert [r["eval/eval/loss"] for r in records if r["kind"] == "eval"] == losses[: stop + 1]


def test_threshold_stopping_on_the_training_loss_ends_at_the_first_log_step_below_it() -> None:
    _, full = _run()
    losses = [r["loss"] for r in full if r["kind"] == "train"]
    threshold = sorted(losses)[len(losses) // 2]
    first = next(index for index, loss in enumerate(losses) if loss < threshold)
    trainer, _ = _run(ThresholdStopper("loss", dataloader_label="train", threshold=threshold))
    assert trainer.timestamp.batch == first + 1


def test_a_resumed_run_stops_where_the_uninterrupted_one_did(tmp_path: Path) -> None:
    stopper = EarlyStopper("accuracy", patience=3, min_delta=0.01)
    whole, _ = _run(stopper, max_duration="60ba")
    assert whole.timestamp.batch < 60
    _run(stopper, max_duration="60ba", save_folder=str(tmp_path), save_interval="4ba")
    latest = sorted(tmp_path.glob("ep*-ba*.pt"), key=lambda p: int(p.stem.split("ba")[1]))
    middle = next(path for path in latest if int(path.stem.split("ba")[1]) >= whole.timestamp.batch // 2)
    resumed, _ = _run(stopper, max_duration="60ba", load_path=str(middle))
    assert resumed.timestamp.batch == whole.timestamp.batch
    remembered, expected = resumed.state.algos["early_stopper"], whole.state.algos["early_stopper"]
    assert isinstance(remembered, StopperState)
    for field in dataclasses.fields(StopperState):
        assert torch.equal(getattr(remembered, field.name), getattr(expected, field.name)), field.name


@given(
    st.lists(st.one_of(st.floats(-5, 5), st.just(math.nan)), min_size=1, max_size=20),
    st.integers(1, 4),
    st.floats(0, 0.5),
    st.booleans(),
)
def test_the_early_stopping_rule_is_its_definition(values: list[float], patience: int, min_delta: float, lower: bool) -> None:
    stopper = EarlyStopper("score", comp="lt" if lower else "gt", min_delta=min_delta, patience=patience)
    rule = stopper.capabilities().stops
    assert rule is not None
    entry, stopped_at = stopper.init(None, None), None  # type: ignore[arg-type]
    for index, value in enumerate(values):
        entry, stop = rule(entry, {"eval/eval/score": value}, "eval", Timestamp(batch=index))
        if stop:
            stopped_at = index
            break
    assert stopped_at == _reference_early_stop(values, patience, min_delta, lower)


def test_an_unlogged_metric_is_refused_when_the_trainer_is_built_naming_what_is_logged() -> None:
    with pytest.raises(ValueError, match=r"EarlyStopper\(monitor='f1'\) reads 'eval/eval/f1', which the run never logs .*eval/eval/accuracy"):
        Trainer(
            MLP(6, 3),
            TensorLoader(DATA, batch_size=8),
            TensorLoader(HELD_OUT, batch_size=16),
            max_duration="1ba",
            optimizer=optim.sgd(0.1),
            algorithms=[EarlyStopper("f1")],
            progress_bar=False,
        )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EarlyStopper(""), "monitor=''"),
        (lambda: EarlyStopper(dataloader_label=""), "dataloader_label=''"),
        (lambda: EarlyStopper(patience="2dur"), "patience='2dur'"),
        (lambda: EarlyStopper(patience="0ep"), "patience='0ep'"),
        (lambda: EarlyStopper(comp="eq"), "comp='eq' must be one of"),
        (lambda: EarlyStopper(patience=0), "patience=0"),
        (lambda: EarlyStopper(min_delta=-1.0), "min_delta=-1.0"),
        (lambda: ThresholdStopper(threshold=math.nan), "threshold=nan"),
        (lambda: ThresholdStopper(comp=">"), "comp='>' must be one of"),
    ],
)
def test_bad_arguments_are_refused_naming_them(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=20),
    st.integers(1, 12),
    st.integers(1, 3),
)
def test_a_patience_in_batches_is_the_span_since_the_best_check(values: list[float], patience: int, every: int) -> None:
    # Checks every ``every`` batches: the run ends at the first check not improving that is ``patience`` batches
    # or more after the best one (or after the start, before any).
    stopper = EarlyStopper("score", comp="lt", patience=f"{patience}ba")
    rule = stopper.capabilities().stops
    assert rule is not None
    entry, stopped_at = stopper.init(None, None), None  # type: ignore[arg-type]
    for index, value in enumerate(values):
        entry, stop = rule(entry, {"eval/eval/score": value}, "eval", Timestamp(batch=every * (index + 1)))
        if stop:
            stopped_at = index
            break
    best_batch, expected = 0, None
    for index, value in enumerate(values):
        if index == 0 or value < min(values[:index]):
            best_batch = every * (index + 1)
        elif every * (index + 1) - best_batch >= patience:
            expected = index
            break
    assert stopped_at == expected


def test_a_patience_in_epochs_counts_epochs_since_the_best_evaluation() -> None:
    _, full = _run(max_duration="60ba", eval_interval="1ep")  # 12 batches an epoch
    losses = [r["eval/eval/loss"] for r in full if r["kind"] == "eval"]
    in_checks = _reference_early_stop(losses, 2, 0.0, lower=True)
    trainer, _ = _run(EarlyStopper("loss", patience="2ep"), max_duration="60ba", eval_interval="1ep")
    stopped = trainer.timestamp.batch
    # One evaluation an epoch: two epochs since the best are two checks.
    assert stopped == (12 * (in_checks + 1) if in_checks is not None else 60)


def test_a_stopper_watching_an_evaluator_the_run_lacks_is_refused_when_the_trainer_is_built() -> None:
    with pytest.raises(ValueError, match=r"EarlyStopper\(dataloader_label='eval'\).*has no eval_dataloader"):
        Trainer(
            MLP(6, 3),
            TensorLoader(DATA, batch_size=8),
            max_duration="2ba",
            optimizer=optim.sgd(0.1),
            algorithms=[EarlyStopper("loss")],
            progress_bar=False,
        )
    with pytest.raises(ValueError, match=r"ThresholdStopper\(dataloader_label='val'\).*labelled 'eval'"):
        _run(ThresholdStopper("accuracy", dataloader_label="val", threshold=0.5))


def test_a_stopper_watches_the_named_evaluator_it_is_given() -> None:
    from composer_fn import Evaluator

    evaluators = [
        Evaluator("whole", TensorLoader(HELD_OUT, batch_size=16, shuffle=False)),
        Evaluator("first", TensorLoader(HELD_OUT, batch_size=16, shuffle=False), subset_num_batches=1),
    ]
    _, full = _run(max_duration="40ba", eval_dataloader=evaluators)
    first = [r["eval/first/accuracy"] for r in full if r["kind"] == "eval"]
    whole = [r["eval/whole/accuracy"] for r in full if r["kind"] == "eval"]
    assert first != whole, "the two evaluators must differ for this test to mean anything"
    threshold = sorted(first)[len(first) // 2]
    expected = next(index for index, value in enumerate(first) if value >= threshold)
    trainer, _ = _run(
        ThresholdStopper("accuracy", dataloader_label="first", threshold=threshold),
        max_duration="40ba",
        eval_dataloader=evaluators,
    )
    assert trainer.timestamp.batch == 2 * (expected + 1)


def test_a_train_stopper_beside_an_evaluator_labelled_train_is_refused_as_ambiguous() -> None:
    from composer_fn import Evaluator

    evaluators = [Evaluator("train", TensorLoader(DATA, batch_size=16, shuffle=False))]
    with pytest.raises(ValueError, match=r"ThresholdStopper\(dataloader_label='train'\).*labelled 'train' too"):
        _run(ThresholdStopper("loss", dataloader_label="train", threshold=0.1), eval_dataloader=evaluators)


def test_a_patience_as_long_as_the_run_warns_that_it_never_stops() -> None:
    import warnings as _warnings

    from composer_fn import EarlyStopper, Trainer, optim
    from composer_fn.data import TensorLoader
    from composer_fn.models import MLP

    rows = (torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))

    def build(patience: str) -> None:
        Trainer(
            MLP(2, 2), TensorLoader(rows, 4), TensorLoader(rows, 4), max_duration="2ep", optimizer=optim.sgd(0.1),
            algorithms=[EarlyStopper("loss", patience=patience)], progress_bar=False,
        )

    with pytest.warns(UserWarning, match=r"EarlyStopper\(patience='2ep'\) waits at least 4 batches, and the whole run is 4") as caught:
        build("2ep")
    assert [w.filename for w in caught if "never stop" in str(w.message)] == [__file__]  # the user's own line
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        build("3ba")
