"""The Trainer's option records: checked when built, Composer's flat names mapped onto them through one table."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn import optim
from composer_fn.core.time import Time, TimeUnit
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import SmallCNN
from composer_fn.trainer import BatchLayout, Checkpointing, Execution, Reporting, Resume, Trainer
from composer_fn.trainer.options import _RECORDS, COMPOSER_NAMES, options_from

# Valid values for each flat argument, with no side effect when built.
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "device": st.sampled_from([None, "cpu", torch.device("cpu")]),
    "precision": st.sampled_from(["fp32", "bf16-mixed", "fp16-mixed"]),
    "compile": st.sampled_from([False, True, "eager", "aot_eager"]),
    "grad_mode": st.sampled_from([None, "autograd", "func"]),
    "device_train_microbatch_size": st.one_of(st.none(), st.just("auto"), st.integers(1, 64)),
    "dist_timeout": st.floats(0.5, 1e4),
    "input_key": st.one_of(st.none(), st.integers(0, 3), st.sampled_from(["image", "input_ids"])),
    "target_key": st.one_of(st.none(), st.integers(0, 3), st.sampled_from(["label", "labels"])),
    "save_interval": st.sampled_from(["1ep", "20ba", 2, Time(5, TimeUnit.BATCH)]),
    "save_num_checkpoints_to_keep": st.one_of(st.just(-1), st.integers(1, 9)),
    "save_metadata": st.dictionaries(st.sampled_from(["model", "width"]), st.integers(0, 9) | st.text(max_size=3)),
    "log_interval": st.sampled_from(["50ba", "1ep", 3]),
    "progress_bar": st.booleans(),
    "load_path": st.sampled_from([None, "runs/a/latest.pt"]),
}


@given(st.fixed_dictionaries({"save_folder": st.sampled_from(["runs/a", Path("runs/b")])}, optional=_VALUES))
@settings(max_examples=60, deadline=None)
def test_flat_arguments_build_the_records_their_fields_would(flat: dict[str, Any]) -> None:
    options = options_from({}, flat)
    for name, kind in _RECORDS.items():
        fields = {COMPOSER_NAMES[f][1]: v for f, v in flat.items() if COMPOSER_NAMES[f][0] == name}
        assert getattr(options, name) == kind(**fields)


def test_every_flat_name_sets_a_field_of_its_record_and_every_field_has_one() -> None:
    fields = {(record, f.name) for record, kind in _RECORDS.items() for f in dataclasses.fields(kind)}
    assert set(COMPOSER_NAMES.values()) == fields
    assert len(set(COMPOSER_NAMES.values())) == len(COMPOSER_NAMES)


def test_the_trainer_takes_at_most_twenty_parameters() -> None:
    parameters = list(inspect.signature(Trainer.__init__).parameters)[1:]
    assert len(parameters) <= 20, parameters


def _run(**options: Any) -> Trainer:
    task = load_digits_task()
    torch.manual_seed(0)
    trainer = Trainer(
        SmallCNN(1, 10, width=8), TensorLoader(task.train, 64, seed=0), max_duration="4ba", optimizer=optim.sgd(0.1),
        **options,
    )  # fmt: skip
    trainer.fit()
    return trainer


def test_a_composer_users_flat_call_and_the_records_train_the_same_run(tmp_path: Path) -> None:
    flat = _run(
        device="cpu", device_train_microbatch_size=16, input_key=0, target_key=1, save_folder=tmp_path / "flat",
        save_interval="2ba", save_num_checkpoints_to_keep=1, progress_bar=False, log_interval="1ba",
    )  # fmt: skip
    records = _run(
        execution=Execution(device="cpu", microbatch_size=16),
        layout=BatchLayout(input_key=0, target_key=1),
        checkpointing=Checkpointing(tmp_path / "records", interval="2ba", keep=1),
        reporting=Reporting(progress_bar=False, log_interval="1ba"),
    )
    assert all(torch.equal(a, b) for a, b in zip(pytree.tree_leaves(flat.state), pytree.tree_leaves(records.state), strict=True))
    assert sorted(p.name for p in (tmp_path / "flat").iterdir()) == sorted(p.name for p in (tmp_path / "records").iterdir())
    assert (flat.options.execution, flat.options.layout) == (records.options.execution, records.options.layout)


@pytest.mark.parametrize(
    ("flat", "records", "message"),
    [
        ({"save_num_checkpoints_to_keep": 0}, {}, r"^save_num_checkpoints_to_keep=0 must be an int >= 1"),
        ({"device_train_microbatch_size": 0}, {}, r"device_train_microbatch_size=0"),
        ({"save_interval": "1ba"}, {}, r"^save_interval='1ba' needs save_folder"),
        ({"precision": "bf16"}, {}, r"precision='bf16' must be one of .*did you mean 'bf16-mixed'"),
        ({"autoresume": True}, {}, r"^autoresume=True needs a save_folder"),
        ({}, {"resume": Resume(autoresume=True)}, r"^Resume\.autoresume=True needs a Checkpointing\.folder"),
    ],
)
def test_an_error_names_the_argument_as_the_caller_wrote_it(
    flat: dict[str, Any], records: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        options_from(records, flat)


def test_a_record_names_its_own_field_when_built_alone() -> None:
    with pytest.raises(ValueError, match=r"^Checkpointing\.keep=0 must be an int >= 1"):
        Checkpointing("runs/x", keep=0)
    with pytest.raises(ValueError, match=r"^Execution\.precision='fp64' must be one of"):
        Execution(precision="fp64")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^Checkpointing\.weights_only=True needs Checkpointing\.folder"):
        Checkpointing(weights_only=True)
    with pytest.raises(ValueError, match=r"^Resume\.weights_only=True needs Resume\.path"):
        Resume(weights_only=True)
    with pytest.raises(TypeError, match=r"^Reporting\.loggers\[0\]=1: expected a Logger instance"):
        Reporting(loggers=[1])  # type: ignore[list-item]


def test_an_unknown_flat_name_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'save_fodler'; did you mean 'save_folder'"):
        options_from({}, {"save_fodler": "runs"})


def test_a_record_and_a_flat_name_for_it_are_refused_together() -> None:
    with pytest.raises(TypeError, match=r"execution=Execution\(\.\.\.\) and precision both set the run's execution"):
        options_from({"execution": Execution()}, {"precision": "bf16-mixed"})
    with pytest.raises(TypeError, match=r"checkpointing=\{'folder': 'x'\}: expected a composer_fn\.trainer\.Checkpointing"):
        options_from({"checkpointing": {"folder": "x"}}, {})


def test_records_hold_their_settings_normalised_and_frozen() -> None:
    saving = Checkpointing("runs/a")
    assert saving.folder == Path("runs/a") and saving.interval == Time(1, TimeUnit.EPOCH)
    assert Execution(compile=True).compile == "inductor" and Execution(compile=True).step_grad_mode == "func"
    assert Execution().step_grad_mode == "autograd"
    assert Reporting(log_interval=3).log_interval == Time(3, TimeUnit.EPOCH)
    with pytest.raises(dataclasses.FrozenInstanceError):
        saving.keep = 3  # type: ignore[misc]
